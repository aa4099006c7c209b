#include "quant/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "support/npy.h"

namespace kiln::quant {

namespace fs = std::filesystem;

std::string_view quant_type_name(QuantType t) {
  switch (t) {
    case QuantType::kInt8: return "int8";
    case QuantType::kFp8E4M3: return "fp8";
  }
  return "?";
}

std::string_view calib_method_name(CalibMethod m) {
  switch (m) {
    case CalibMethod::kMinMax: return "minmax";
    case CalibMethod::kPercentile: return "percentile";
    case CalibMethod::kEntropy: return "entropy";
  }
  return "?";
}

double quant_type_max(QuantType t) {
  switch (t) {
    case QuantType::kInt8: return 127.0;
    case QuantType::kFp8E4M3: return 448.0;
  }
  return 1.0;
}

namespace {

std::vector<fs::path> sorted_entries(const fs::path& dir, bool folders) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (folders ? e.is_directory() : (e.is_regular_file() && e.path().extension() == ".npy")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Checks one sample tensor against the graph input it feeds.
Status check_sample(const Value& v, const Tensor& t, const std::string& file) {
  if (t.dtype() != v.type.dtype) {
    return KILN_ERROR(kInvalidArgument, "{}: input '{}' expects {}, the file holds {}", file, v.name,
                      dtype_name(v.type.dtype), dtype_name(t.dtype()));
  }
  if (v.type.shape) {
    const Shape& s = *v.type.shape;
    bool ok = s.rank() == t.rank();
    for (size_t i = 0; ok && i < s.rank(); ++i) ok = !s[i].is_static() || s[i].value() == t.dim(i);
    if (!ok) {
      return KILN_ERROR(kInvalidArgument, "{}: input '{}' expects shape {}, the file holds {}", file, v.name,
                        s.to_string(), dims_to_string(t.dims()));
    }
  }
  if (dtype_is_float(t.dtype())) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!std::isfinite(t.as_double(i))) {
        return KILN_ERROR(kInvalidArgument, "{}: value {} at flat index {} is not finite; calibration data must be", file,
                          t.as_double(i), i);
      }
    }
  }
  return Status::ok();
}

// Rows [begin, begin + count) of t along axis 0, as a tensor of its own; `drop_axis` removes the
// leading axis (count must be 1).
Expected<Tensor> slice_rows(const Tensor& t, int64_t begin, int64_t count, bool drop_axis) {
  std::vector<int64_t> dims = t.dims();
  if (drop_axis) dims.erase(dims.begin());
  else dims[0] = count;
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::create(t.dtype(), dims));
  if (t.dtype() == DType::kString) {
    int64_t row = t.dim(0) ? t.numel() / t.dim(0) : 0;
    for (int64_t i = 0; i < out.numel(); ++i) out.data<std::string>()[i] = t.data<std::string>()[begin * row + i];
    return out;
  }
  size_t row_bytes = t.dim(0) ? t.nbytes() / size_t(t.dim(0)) : 0;
  std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + size_t(begin) * row_bytes, out.nbytes());
  return out;
}

// Splits a stacked file into the samples of one input: rank + 1 stacks whole samples; the same rank
// stacks along the input's leading dim (its fixed size, or 1 when symbolic).
Expected<std::vector<Tensor>> unstack(const Value& v, const Tensor& t, const std::string& file) {
  const size_t rank = v.type.shape ? v.type.shape->rank() : t.rank();
  std::vector<Tensor> out;
  if (t.rank() == rank + 1) {
    for (int64_t i = 0; i < t.dim(0); ++i) {
      KILN_ASSIGN_OR_RETURN(Tensor s, slice_rows(t, i, 1, true));
      out.push_back(std::move(s));
    }
    return out;
  }
  if (t.rank() != rank || rank == 0) {
    return KILN_ERROR(kInvalidArgument, "{}: input '{}' has rank {}; a file of stacked samples has rank {} or {}, this "
                      "one {}", file, v.name, rank, rank, rank + 1, t.rank());
  }
  const Dim& lead = (*v.type.shape)[0];
  int64_t step = lead.is_static() ? lead.value() : 1;
  if (step <= 0 || t.dim(0) % step != 0) {
    return KILN_ERROR(kInvalidArgument, "{}: {} rows do not split into samples of {} for input '{}'", file, t.dim(0), step,
                      v.name);
  }
  for (int64_t i = 0; i < t.dim(0); i += step) {
    KILN_ASSIGN_OR_RETURN(Tensor s, slice_rows(t, i, step, false));
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

Expected<std::vector<Sample>> load_samples(const Graph& g, const std::string& dir, size_t max_samples) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return KILN_ERROR(kIo, "{}: not a folder of .npy samples", dir);
  std::vector<const Value*> ins;
  for (const Value* v : g.inputs) {
    if (!v->type.is_tensor()) return KILN_ERROR(kUnsupported, "input '{}' is not a tensor: kiln cannot calibrate it", v->name);
    ins.push_back(v);
  }
  std::vector<Sample> samples;
  auto full = [&] { return max_samples > 0 && samples.size() >= max_samples; };
  const std::vector<fs::path> folders = sorted_entries(dir, true), files = sorted_entries(dir, false);
  bool stacked = !ins.empty();
  for (const Value* v : ins) stacked = stacked && fs::exists(fs::path(dir) / (npy_file_stem(v->name) + ".npy"));
  if (stacked) {  // DIR/<input>.npy
    std::vector<std::vector<Tensor>> per_input;
    for (const Value* v : ins) {
      std::string file = (fs::path(dir) / (npy_file_stem(v->name) + ".npy")).string();
      KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(file));
      KILN_ASSIGN_OR_RETURN(auto parts, unstack(*v, t, file));
      for (const Tensor& p : parts) KILN_RETURN_IF_ERROR(check_sample(*v, p, file));
      if (!per_input.empty() && parts.size() != per_input[0].size()) {
        return KILN_ERROR(kInvalidArgument, "{}: holds {} samples, {} holds {}", file, parts.size(),
                          npy_file_stem(ins[0]->name) + ".npy", per_input[0].size());
      }
      per_input.push_back(std::move(parts));
    }
    for (size_t s = 0; s < per_input[0].size() && !full(); ++s) {
      Sample smp;
      for (auto& p : per_input) smp.inputs.push_back(std::move(p[s]));
      smp.source = fmt::format("{} sample {}", dir, s);
      samples.push_back(std::move(smp));
    }
  } else if (!folders.empty()) {  // DIR/<sample>/<input>.npy
    for (const fs::path& f : folders) {
      if (full()) break;
      Sample smp;
      smp.source = f.string();
      for (const Value* v : ins) {
        std::string file = (f / (npy_file_stem(v->name) + ".npy")).string();
        if (!fs::exists(file)) return KILN_ERROR(kInvalidArgument, "{}: missing {} for input '{}'", f.string(), file, v->name);
        KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(file));
        KILN_RETURN_IF_ERROR(check_sample(*v, t, file));
        smp.inputs.push_back(std::move(t));
      }
      samples.push_back(std::move(smp));
    }
  } else if (ins.size() == 1 && !files.empty()) {  // DIR/<anything>.npy
    for (const fs::path& f : files) {
      KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(f.string()));
      std::vector<Tensor> parts;
      if (ins[0]->type.shape && t.rank() == ins[0]->type.shape->rank() + 1) {
        KILN_ASSIGN_OR_RETURN(parts, unstack(*ins[0], t, f.string()));
      } else {
        parts.push_back(std::move(t));
      }
      for (size_t k = 0; k < parts.size() && !full(); ++k) {
        KILN_RETURN_IF_ERROR(check_sample(*ins[0], parts[k], f.string()));
        samples.push_back({{std::move(parts[k])}, parts.size() > 1 ? fmt::format("{} sample {}", f.string(), k) : f.string()});
      }
    }
  }
  if (samples.empty()) {
    std::string names;
    for (const Value* v : ins) names += fmt::format("{}{}.npy", names.empty() ? "" : ", ", npy_file_stem(v->name));
    return KILN_ERROR(kInvalidArgument, "{}: no samples: expected a folder per sample holding {}, or {} with samples "
                      "stacked{}", dir, names, names, ins.size() == 1 ? ", or one .npy file per sample" : "");
  }
  return samples;
}

Status check_not_constant(const Graph& g, const std::vector<Sample>& samples, const std::string& dir) {
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    bool any = false, varies = false;
    double first = 0;
    for (const Sample& s : samples) {
      const Tensor& t = s.inputs[i];
      if (!dtype_is_float(t.dtype())) { varies = true; break; }
      for (int64_t k = 0; k < t.numel() && !varies; ++k) {
        double x = t.as_double(k);
        if (!any) { first = x; any = true; }
        else if (x != first) varies = true;
      }
      if (varies) break;
    }
    if (any && !varies) {
      return KILN_ERROR(kInvalidArgument, "{}: every value of input '{}' over all {} sample(s) is {}: constant data gives "
                        "no ranges to calibrate on", dir, g.inputs[i]->name, samples.size(), first);
    }
  }
  return Status::ok();
}

void Observer::grow_to(double v) {
  if (top_ == 0) {
    top_ = v * 1.0000001 + 1e-30;  // just above v, so v falls in the last bin
    return;
  }
  int shift = 0;
  double top = top_;
  while (top <= v) { top *= 2; ++shift; }
  if (!shift) return;
  std::vector<double> merged(kBins, 0.0);
  const int64_t factor = int64_t(1) << std::min(shift, 30);
  for (int b = 0; b < kBins; ++b) merged[size_t(int64_t(b) / factor)] += hist_[size_t(b)];
  hist_ = std::move(merged);
  top_ = top;
}

void Observer::add(const Tensor& t) {
  if (!dtype_is_float(t.dtype())) return;
  const int64_t n = t.numel();
  std::vector<double> mags(static_cast<size_t>(n));
  double mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    double a = std::fabs(t.dtype() == DType::kFloat32 ? double(t.data<float>()[i]) : t.as_double(i));
    if (!std::isfinite(a)) { ++nonfinite_; a = 0; }
    mags[size_t(i)] = a;
    mx = std::max(mx, a);
  }
  if (mx > 0) grow_to(mx);
  amax_ = std::max(amax_, mx);
  count_ += n;
  if (top_ == 0) {
    hist_[0] += double(n);  // all zeros so far
    return;
  }
  const double scale = kBins / top_;
  for (double a : mags) hist_[size_t(std::min<double>(kBins - 1, std::floor(a * scale)))] += 1;
}

double Observer::percentile_range(double p) const {
  double total = 0;
  for (double h : hist_) total += h;
  if (total == 0 || top_ == 0) return amax_;
  const double want = total * std::clamp(p, 0.0, 100.0) / 100.0;
  double acc = 0;
  for (int b = 0; b < kBins; ++b) {
    acc += hist_[size_t(b)];
    if (acc >= want) return std::min(amax_, (b + 1) * top_ / kBins);
  }
  return amax_;
}

// TensorRT's entropy calibration: for each candidate threshold (a bin edge from `levels` bins up),
// P is the histogram below it with the mass above folded into its last bin, Q is the histogram
// below it quantized to `levels` levels (each level's mass spread evenly over its non-empty bins);
// the threshold with the smallest KL(P || Q) wins, and one where Q is empty where P is not never
// does. Bin 0 takes bin 1's count first: the exact zeros a ReLU makes would otherwise dominate P,
// and the narrower the first level the better it fits them, pulling the threshold far too low.
double Observer::entropy_range(int levels) const {
  if (top_ == 0) return amax_;
  std::vector<double> h = hist_;
  h[0] = h[1];
  int last = kBins;  // bins past the largest value seen are empty: no candidate beyond it helps
  while (last > levels && h[size_t(last - 1)] == 0) --last;
  double best_kl = INFINITY;
  int best = last;
  std::vector<double> p, q;
  for (int i = levels; i <= last; ++i) {
    p.assign(h.begin(), h.begin() + i);
    double outliers = 0;
    for (int b = i; b < kBins; ++b) outliers += h[size_t(b)];
    p[size_t(i - 1)] += outliers;
    q.assign(size_t(i), 0.0);
    const double per = double(i) / levels;
    for (int l = 0; l < levels; ++l) {
      int b0 = int(std::floor(l * per)), b1 = l + 1 == levels ? i : std::max(b0 + 1, int(std::floor((l + 1) * per)));
      double mass = 0;
      int nonzero = 0;
      for (int b = b0; b < b1; ++b) {
        mass += h[size_t(b)];
        nonzero += h[size_t(b)] != 0;
      }
      for (int b = b0; b < b1 && nonzero; ++b) {
        if (h[size_t(b)] != 0) q[size_t(b)] = mass / nonzero;
      }
    }
    double sp = 0, sq = 0;
    for (int b = 0; b < i; ++b) { sp += p[size_t(b)]; sq += q[size_t(b)]; }
    if (sp == 0 || sq == 0) continue;
    double kl = 0;
    for (int b = 0; b < i && kl < INFINITY; ++b) {
      if (p[size_t(b)] == 0) continue;
      if (q[size_t(b)] == 0) kl = INFINITY;
      else kl += p[size_t(b)] / sp * std::log((p[size_t(b)] / sp) / (q[size_t(b)] / sq));
    }
    if (kl < best_kl) { best_kl = kl; best = i; }
  }
  return std::min(amax_, (best + 0.5) * top_ / kBins);
}

double Observer::range(CalibMethod method, double percentile, QuantType type) const {
  switch (method) {
    case CalibMethod::kMinMax: return amax_;
    case CalibMethod::kPercentile: return percentile_range(percentile);
    case CalibMethod::kEntropy: return type == QuantType::kInt8 ? entropy_range(128) : amax_;
  }
  return amax_;
}

}  // namespace kiln::quant
