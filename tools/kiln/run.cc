// `kiln run model.onnx --input NAME=FILE.npy ... --output-dir DIR`: runs a model on the best
// backend present and writes one .npy per output; `--iterations` times it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "cli.h"
#include "support/npy.h"

namespace kiln::cli {

namespace fs = std::filesystem;

Expected<std::vector<Tensor>> gather_inputs(const Engine& e, const RunOptions& opt, const std::string& inputs_dir) {
  const std::vector<TensorInfo>& ins = e.inputs();
  std::map<std::string, std::string> files;  // input name -> .npy path
  for (const auto& f : opt.inputs) {
    size_t eq = f.find('=');
    if (eq == std::string::npos || eq == 0) {
      return KILN_ERROR(kInvalidArgument, "--input '{}': expected NAME=FILE.npy", f);
    }
    if (!files.emplace(f.substr(0, eq), f.substr(eq + 1)).second) {
      return KILN_ERROR(kInvalidArgument, "--input names '{}' twice", f.substr(0, eq));
    }
  }
  for (const auto& file : files) {
    const std::string& name = file.first;  // not a structured binding: the lambda captures it (clang 14)
    if (std::none_of(ins.begin(), ins.end(), [&](const TensorInfo& v) { return v.name == name; })) {
      std::string names;
      for (const TensorInfo& v : ins) names += (names.empty() ? "'" : ", '") + v.name + "'";
      return KILN_ERROR(kInvalidArgument, "--input names '{}', but the model's inputs are {}", name, names);
    }
  }
  std::vector<Tensor> data;
  for (const TensorInfo& v : ins) {
    std::string path;
    if (auto it = files.find(v.name); it != files.end()) path = it->second;
    else if (!inputs_dir.empty()) path = (fs::path(inputs_dir) / (file_name_for(v.name) + ".npy")).string();
    if (path.empty()) {
      if (!opt.random_inputs) {
        return KILN_ERROR(kInvalidArgument, "input '{}' ({}) has no value: give --input {}=FILE.npy or --random-inputs",
                          v.name, info_string(v), v.name);
      }
      auto given = opt.run_shapes.find(v.name);
      KILN_ASSIGN_OR_RETURN(Tensor t, random_input(v, opt.seed, given == opt.run_shapes.end() ? nullptr : &given->second));
      data.push_back(std::move(t));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor t, read_npy(path));
    KILN_RETURN_IF_ERROR(check_input_tensor(v, t, path));
    data.push_back(std::move(t));
  }
  return data;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = size_t(std::ceil(p / 100.0 * double(v.size()))) ;
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}

namespace {

// Prints the k largest elements of a float tensor's last axis (row 0), with labels if given.
void print_top_k(const std::string& name, const Tensor& t, int k, const std::vector<std::string>& labels) {
  if (!dtype_is_float(t.dtype()) || t.numel() == 0) return;
  int64_t n = t.rank() ? t.dim(t.rank() - 1) : 1;
  std::vector<double> x(static_cast<size_t>(n));
  double mx = -INFINITY, sum = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[size_t(i)] = t.as_double(i));
  for (double v : x) sum += std::exp(v - mx);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = i;
  k = int(std::min<int64_t>(k, n));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) { return x[size_t(a)] > x[size_t(b)]; });
  std::printf("top %d of '%s' (softmax over the last axis):\n", k, name.c_str());
  for (int r = 0; r < k; ++r) {
    int64_t c = idx[size_t(r)];
    std::string label = size_t(c) < labels.size() ? labels[size_t(c)] : "";
    std::printf("  %d. class %-5lld p=%.4f  score=%8.4f  %s\n", r + 1, static_cast<long long>(c),
                std::exp(x[size_t(c)] - mx) / sum, x[size_t(c)], label.c_str());
  }
}

// Writes every file or none: all go to temporary names first and are renamed into place only
// when every one was written, so a failure never leaves a partial set of outputs behind.
Status write_all_npy(const std::vector<std::pair<std::string, const Tensor*>>& files) {
  std::set<std::string> seen;
  for (const auto& [path, t] : files) {
    if (!seen.insert(path).second) {
      return KILN_ERROR(kInvalidArgument, "two outputs would both be written to '{}' (names differ only in characters "
                        "outside [A-Za-z0-9._-])", path);
    }
    std::error_code ec;
    if (fs::is_directory(path, ec)) return KILN_ERROR(kIo, "{}: is a folder; cannot write the output there", path);
  }
  std::vector<std::string> tmps;
  auto cleanup = [&] {
    std::error_code ec;
    for (const std::string& t : tmps) fs::remove(t, ec);
  };
  for (const auto& [path, t] : files) {
    tmps.push_back(path + ".partial");
    if (Status s = write_npy(tmps.back(), *t); !s) {
      cleanup();
      return s.with_context(path);
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    fs::rename(tmps[i], files[i].first, ec);
    if (ec) {
      cleanup();
      return KILN_ERROR(kIo, "{}: cannot move the output into place: {}", files[i].first, ec.message());
    }
  }
  return Status::ok();
}

int64_t count_nonfinite(const Tensor& t) {
  if (!dtype_is_float(t.dtype())) return 0;
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += std::isfinite(t.as_double(i)) ? 0 : 1;
  return n;
}

// --check-finite: the outputs' NaN and Inf counted; when a GPU run has any, its steps are run one
// by one to name the first that wrote some, and the fp32 CPU reference (an ONNX model) says whether
// it has them too. An error when the outputs hold NaN or Inf that the reference does not (or, for
// an engine file, that no reference can be run for). A CPU run is the reference itself.
Status check_finite(const LoadOptions& load, const EngineOptions& eng, const RunOptions& opt, const Engine& engine,
                    Session& session, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outs) {
  int64_t bad = 0;
  std::string where;
  for (size_t i = 0; i < outs.size(); ++i) {
    const int64_t n = count_nonfinite(outs[i]);
    if (n == 0) continue;
    bad += n;
    where += fmt::format("{}'{}' ({} of {})", where.empty() ? "" : ", ", engine.outputs()[i].name, n, outs[i].numel());
  }
  if (bad == 0) {
    std::printf("check-finite: every output value is finite\n");
    return Status::ok();
  }
  std::printf("check-finite: NaN/Inf in %s\n", where.c_str());
  if (engine.device() == Device::kCuda) {
    KILN_ASSIGN_OR_RETURN(std::vector<NonFiniteStep> steps, session.check_finite(views(inputs)));
    for (size_t i = 0; i < steps.size() && i < 8; ++i) {
      std::printf("  %s %s: %lld NaN/Inf of %lld values\n", i == 0 ? "first:" : "then: ", steps[i].step.c_str(),
                  static_cast<long long>(steps[i].count), static_cast<long long>(steps[i].numel));
    }
    if (steps.size() > 8) std::printf("  ... %zu more step(s)\n", steps.size() - 8);
  }
  if (engine.device() == Device::kCpuRef) {
    std::printf("check-finite: this run is the fp32 CPU reference: the model makes them\n");
    return Status::ok();
  }
  if (is_engine_file(load.model)) {
    return KILN_ERROR(kInvalidModel, "{}: {} output value(s) are NaN or Inf (an engine file: no ONNX model to run the "
                      "fp32 reference of)", load.model, bad);
  }
  EngineOptions cpu = eng;
  cpu.device = "cpu-ref";
  cpu.precision = "fp32";
  KILN_ASSIGN_OR_RETURN(Engine ref, open_engine(load, cpu, opt.batch));
  KILN_ASSIGN_OR_RETURN(Session rs, ref.create_session());
  KILN_ASSIGN_OR_RETURN(std::vector<HostTensor> ro, rs.run(views(inputs)));
  int64_t ref_bad = 0;
  for (HostTensor& h : ro) ref_bad += count_nonfinite(from_host(std::move(h)));
  if (ref_bad >= bad) {
    std::printf("check-finite: the fp32 CPU reference has them too (%lld): the model makes them\n",
                static_cast<long long>(ref_bad));
    return Status::ok();
  }
  return KILN_ERROR(kInvalidModel, "{}: {} output value(s) are NaN or Inf where the fp32 CPU reference has {}{}",
                    load.model, bad, ref_bad,
                    engine.config().precision == Precision::kFp32
                        ? ""
                        : " (a 16-bit overflow? it starts at the first step listed; an fp32 build avoids it)");
}

}  // namespace

int run_main(const LoadOptions& load, const RunOptions& opt, const EngineOptions& eng) {
  if (opt.iterations < 1 || opt.warmup < 0) return fail(KILN_ERROR(kInvalidArgument, "--iterations must be >= 1 and --warmup >= 0"));
  std::vector<std::string> labels;
  if (!opt.labels.empty()) {
    std::ifstream f(opt.labels);
    if (!f) return fail(KILN_ERROR(kIo, "cannot open labels file '{}'", opt.labels));
    for (std::string l; std::getline(f, l);) labels.push_back(l);
  }
  auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, std::string> input_files;  // NAME=FILE flags; malformed ones are gather_inputs' to report
  for (const std::string& f : opt.inputs) {
    if (size_t eq = f.find('='); eq != std::string::npos && eq > 0) input_files.emplace(f.substr(0, eq), f.substr(eq + 1));
  }
  auto engine = open_engine_for_files(load, eng, opt.batch, input_files);
  if (!engine) return fail(engine.status());
  auto session = engine->create_session();
  if (!session) return fail(session.status());
  auto t1 = std::chrono::steady_clock::now();
  RunOptions run = opt;
  if (is_engine_file(load.model)) {
    auto rs = engine_run_shapes(*engine, load);
    if (!rs) return fail(rs.status());
    run.run_shapes = *rs;
  }
  auto inputs = gather_inputs(*engine, run, "");
  if (!inputs) return fail(inputs.status());
  // To a session ready to run (weights uploaded, CUDA graph captured), the first inference apart.
  std::printf("%s: %.1f ms\n", is_engine_file(load.model) ? "load" : "import + build",
              std::chrono::duration<double, std::milli>(t1 - t0).count());
  print_load_note(*engine);
  std::vector<double> times;
  std::vector<HostTensor> host;
  for (int i = 0; i < opt.warmup + opt.iterations; ++i) {
    auto r0 = std::chrono::steady_clock::now();
    auto out = session->run(views(*inputs));
    auto r1 = std::chrono::steady_clock::now();
    if (!out) return fail(out.status());
    if (i >= opt.warmup) times.push_back(std::chrono::duration<double, std::milli>(r1 - r0).count());
    host = std::move(*out);
  }
  std::vector<Tensor> outs;
  for (HostTensor& h : host) outs.push_back(from_host(std::move(h)));
  bool cuda = engine->device() == Device::kCuda;
  std::printf("backend: %s%s\n", std::string(device_name(engine->device())).c_str(),
              cuda ? (" " + std::string(precision_name(engine->config().precision))).c_str() : "");
  std::printf("latency: median %.3f ms, p99 %.3f ms, min %.3f ms over %zu run(s) after %d warm-up\n",
              percentile(times, 50), percentile(times, 99), *std::min_element(times.begin(), times.end()), times.size(),
              opt.warmup);
  if (!opt.output_dir.empty()) {
    std::error_code ec;
    fs::create_directories(opt.output_dir, ec);
    if (ec) return fail(KILN_ERROR(kIo, "cannot create output folder '{}': {}", opt.output_dir, ec.message()));
  }
  std::vector<std::pair<std::string, const Tensor*>> files;  // path, tensor
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string& name = engine->outputs()[i].name;
    const Tensor& t = outs[i];
    std::printf("output '%s': %s\n", name.c_str(), t.summary().c_str());
    if (opt.top_k > 0) print_top_k(name, t, opt.top_k, labels);
    if (opt.output_dir.empty()) continue;
    files.emplace_back((fs::path(opt.output_dir) / (file_name_for(name) + ".npy")).string(), &t);
  }
  if (Status s = write_all_npy(files); !s) return fail(s);
  if (opt.check_finite) {
    if (Status s = check_finite(load, eng, opt, *engine, *session, *inputs, outs); !s) return fail(s);
  }
  for (const auto& [path, t] : files) {
    if (!dtype_is_float(t->dtype()) || t->dtype() == DType::kFloat32 || t->dtype() == DType::kFloat64 ||
        t->dtype() == DType::kFloat16) {
      std::printf("  wrote %s\n", path.c_str());
    } else {
      std::printf("  wrote %s (as f32: numpy has no %s)\n", path.c_str(), std::string(dtype_name(t->dtype())).c_str());
    }
  }
  return 0;
}

}  // namespace kiln::cli
