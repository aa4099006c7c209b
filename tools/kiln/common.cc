#include <algorithm>
#include <limits>
#include <random>

#include "cli.h"
#include "support/npy.h"

namespace kiln::cli {

int fail(const Status& s) {
  std::fprintf(stderr, "kiln: error: %s\n", s.message().c_str());
  return 1;
}

Expected<ShapeFlag> parse_shape_spec(const std::string& flag) {
  size_t colon = flag.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return KILN_ERROR(kInvalidArgument, "--shapes '{}': expected NAME:DIMS, e.g. input:1x3x224x224 or ids:1..64x16..512", flag);
  }
  ShapeFlag out;
  out.name = flag.substr(0, colon);
  const std::string spec = flag.substr(colon + 1);
  auto number = [&](const std::string& item, const std::string& text) -> Expected<int64_t> {
    if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) {
      return KILN_ERROR(kInvalidArgument, "--shapes '{}': dimension '{}' is not a non-negative integer or a range MIN..MAX[@OPT]",
                        flag, item);
    }
    return int64_t(std::stoll(text));
  };
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t x = spec.find('x', pos);
    std::string item = spec.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    size_t dots = item.find("..");
    DimRange r;
    if (dots == std::string::npos) {
      KILN_ASSIGN_OR_RETURN(r.min, number(item, item));
      r.max = r.min;
    } else {
      size_t at = item.find('@', dots);
      KILN_ASSIGN_OR_RETURN(r.min, number(item, item.substr(0, dots)));
      KILN_ASSIGN_OR_RETURN(r.max, number(item, item.substr(dots + 2, at == std::string::npos ? std::string::npos : at - dots - 2)));
      if (at != std::string::npos) {
        KILN_ASSIGN_OR_RETURN(r.opt, number(item, item.substr(at + 1)));
      }
      out.ranged = true;
    }
    out.dims.push_back(r);
    if (x == std::string::npos) break;
    pos = x + 1;
    if (pos == spec.size()) return KILN_ERROR(kInvalidArgument, "--shapes '{}': trailing 'x'", flag);
  }
  return out;
}

Expected<std::pair<std::string, std::vector<int64_t>>> parse_shape_flag(const std::string& flag) {
  KILN_ASSIGN_OR_RETURN(ShapeFlag f, parse_shape_spec(flag));
  if (f.ranged) {
    return KILN_ERROR(kInvalidArgument, "--shapes '{}': ranges are for building an engine (kiln build, run, bench); give exact "
                      "dims here", flag);
  }
  std::vector<int64_t> dims;
  for (const DimRange& r : f.dims) dims.push_back(r.min);
  return std::make_pair(f.name, dims);
}

Expected<Model> load_model(const LoadOptions& load) {
  ImportOptions opt;
  for (const auto& f : load.shapes) {
    KILN_ASSIGN_OR_RETURN(auto s, parse_shape_flag(f));
    if (!opt.input_shapes.emplace(s.first, s.second).second) {
      return KILN_ERROR(kInvalidArgument, "--shapes names input '{}' twice", s.first);
    }
  }
  return import_onnx_file(load.model, opt);
}

std::string file_name_for(const std::string& tensor_name) { return npy_file_stem(tensor_name); }

std::string info_string(const TensorInfo& t) {
  std::string s = std::string(dtype_name(t.dtype)) + "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? "," : "") + (t.shape[i] < 0 ? std::string("?") : std::to_string(t.shape[i]));
  return s + "]";
}

// Seeded random data of v's dtype and the given dims.
Expected<Tensor> random_tensor(const TensorInfo& v, const std::vector<int64_t>& dims, uint64_t seed) {
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(v.dtype, dims));
  // One stream per input, so adding an input does not change the others' values.
  std::seed_seq seq{seed, uint64_t(std::hash<std::string>{}(v.name))};
  std::mt19937_64 rng(seq);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int> small(0, 9);
  visit_dtype(t.dtype(), [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, std::string>) p[i] = "s" + std::to_string(small(rng));
      else if constexpr (std::is_same_v<T, bool>) p[i] = small(rng) & 1;
      else if constexpr (is_float_v<T>) p[i] = T(compute_t<T>(real(rng)));
      else p[i] = T(small(rng));  // small non-negative ints: valid as indices into most axes
    }
  });
  return t;
}

Expected<std::map<std::string, std::vector<int64_t>>> engine_run_shapes(const Engine& e, const LoadOptions& load) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const std::string& f : load.shapes) {
    KILN_ASSIGN_OR_RETURN(auto s, parse_shape_flag(f));
    auto it = std::find_if(e.inputs().begin(), e.inputs().end(), [&](const TensorInfo& t) { return t.name == s.first; });
    if (it == e.inputs().end()) return KILN_ERROR(kInvalidArgument, "--shapes names input '{}', which the engine does not have", s.first);
    const TensorInfo& t = *it;
    bool ranged = false;
    for (size_t k = 0; k < t.shape.size(); ++k) ranged = ranged || (t.shape[k] < 0 && k < t.max_shape.size());
    if (!ranged) {
      return KILN_ERROR(kInvalidArgument, "{}: an engine file's input shapes are fixed when it is built (--shapes); build "
                        "another engine from the ONNX model for that, or build it with shape ranges", load.model);
    }
    if (s.second.size() != t.shape.size()) {
      return KILN_ERROR(kInvalidArgument, "--shapes gives input '{}' {} dims, the engine takes {}", s.first, s.second.size(),
                        t.shape.size());
    }
    for (size_t k = 0; k < t.shape.size(); ++k) {
      const int64_t lo = t.shape[k] >= 0 ? t.shape[k] : t.min_shape[k], hi = t.shape[k] >= 0 ? t.shape[k] : t.max_shape[k];
      if (s.second[k] < lo || s.second[k] > hi) {
        return KILN_ERROR(kInvalidArgument, "--shapes gives input '{}' dimension {} = {}, outside the engine's {}..{}", s.first,
                          k, s.second[k], lo, hi);
      }
    }
    if (!out.emplace(s.first, s.second).second) return KILN_ERROR(kInvalidArgument, "--shapes names input '{}' twice", s.first);
  }
  return out;
}

Expected<Tensor> random_input(const TensorInfo& v, uint64_t seed, const std::vector<int64_t>* given) {
  if (given) return random_tensor(v, *given, seed);
  std::vector<int64_t> dims;
  for (size_t k = 0; k < v.shape.size(); ++k) {
    int64_t d = v.shape[k];
    // A ranged dim of a dynamic engine: its largest value.
    if (d < 0 && k < v.max_shape.size() && v.max_shape[k] != std::numeric_limits<int64_t>::max()) d = v.max_shape[k];
    if (d < 0) {
      return KILN_ERROR(kInvalidArgument, "input '{}' has shape {}: bind its dims with --shapes {}:{}", v.name,
                        info_string(v), v.name, "1x...");
    }
    dims.push_back(d);
  }
  return random_tensor(v, dims, seed);
}

Status check_input_tensor(const TensorInfo& v, const Tensor& t, const std::string& source) {
  if (t.dtype() != v.dtype) {
    return KILN_ERROR(kInvalidArgument, "input '{}' ({}): got {} but the model expects {}", v.name, source, t.summary(),
                      info_string(v));
  }
  if (v.shape.size() != t.rank()) {
    return KILN_ERROR(kInvalidArgument, "input '{}' ({}): got shape {} but the model expects {}", v.name, source,
                      dims_to_string(t.dims()), info_string(v));
  }
  for (size_t i = 0; i < t.rank(); ++i) {
    if (v.shape[i] >= 0 && v.shape[i] != t.dim(i)) {
      return KILN_ERROR(kInvalidArgument, "input '{}' ({}): got shape {} but the model expects {} (dim {})", v.name,
                        source, dims_to_string(t.dims()), info_string(v), i);
    }
  }
  return Status::ok();
}

std::vector<TensorView> views(const std::vector<Tensor>& tensors) {
  std::vector<TensorView> v;
  for (const Tensor& t : tensors) v.push_back(TensorView{t.dtype(), t.dims(), const_cast<void*>(t.raw()), false});
  return v;
}

Tensor from_host(HostTensor t) {
  auto keep = std::make_shared<HostTensor>(std::move(t));
  if (keep->dtype() == DType::kString) {  // Tensor views cannot hold strings: copy them
    Tensor s = Tensor::create(DType::kString, keep->shape()).value();
    for (int64_t i = 0; i < s.numel(); ++i) s.data<std::string>()[i] = keep->data<std::string>()[i];
    return s;
  }
  return Tensor::view(keep->dtype(), keep->shape(), keep, keep->raw());
}

}  // namespace kiln::cli
