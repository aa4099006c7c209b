// Which engine a subcommand runs: an engine file as it was built, or an ONNX model built now with
// the command line's options (kiln::build picks the GPU when one is usable, else the CPU with one
// warning line).
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>

#include "cli.h"
#include "api/engine_impl.h"
#include "runtime/engine_file.h"
#include "support/npy.h"

namespace kiln::cli {

Expected<Precision> parse_precision(const std::string& p) {
  for (Precision x : {Precision::kFp32, Precision::kTf32, Precision::kFp16, Precision::kBf16}) {
    if (p == precision_name(x)) return x;
  }
  return KILN_ERROR(kInvalidArgument, "unknown precision '{}' (fp32, tf32, fp16, bf16)", p);
}

Expected<Device> parse_device(const std::string& d) {
  for (Device x : {Device::kAuto, Device::kCpu, Device::kCuda, Device::kCpuRef}) {
    if (d == device_name(x)) return x;
  }
  return KILN_ERROR(kInvalidArgument, "--device '{}': expected auto, cpu, cpu-ref or cuda", d);
}

namespace {

// An engine file fixes its shapes, device and precision: flags that ask for others are errors
// (rebuilding is what would honour them).
Status check_loaded(const Engine& e, const std::string& path, const LoadOptions& load, const EngineOptions& eng,
                    int64_t batch) {
  auto rebuild = [&](const std::string& what) {
    return KILN_ERROR(kInvalidArgument, "{}: {}; build another engine from the ONNX model for that", path, what);
  };
  if (!load.shapes.empty()) KILN_RETURN_IF_ERROR(engine_run_shapes(e, load).status());  // a dynamic engine's run shapes
  if (!load.warm_shapes.empty()) return rebuild("--warm-shapes: an engine's warm shapes are fixed when it is built");
  if (batch > 0) {
    for (const TensorInfo& t : e.inputs()) {
      if (!t.shape.empty() && t.shape[0] != batch) {
        return rebuild(fmt::format("--batch {}: the engine's input '{}' is {}", batch, t.name, info_string(t)));
      }
    }
  }
  // --device cpu takes any CPU engine: one of the reference kernels (an older file, or the ranks of
  // a tensor-parallel CPU engine) runs on the CPU as built.
  const bool cpu_asked_cpu_ref = eng.device == "cpu" && e.device() == Device::kCpuRef;
  if (eng.device != "auto" && eng.device != device_name(e.device()) && !cpu_asked_cpu_ref) {
    return rebuild(fmt::format("--device {}: the engine was built for {}", eng.device, device_name(e.device())));
  }
  if (eng.precision != "fp32" && eng.precision != precision_name(e.config().precision)) {
    return rebuild(fmt::format("--{}: the engine was built with {}", eng.precision, precision_name(e.config().precision)));
  }
  if (eng.tensor_parallel != 1 && eng.tensor_parallel != e.config().tensor_parallel) {
    return rebuild(fmt::format("--tensor-parallel {}: the engine was built for {} rank(s)", eng.tensor_parallel,
                               e.config().tensor_parallel));
  }
  if (eng.deterministic && !e.config().deterministic) return rebuild("--deterministic: the engine was built without it");
  if (eng.target == "edge" && e.config().target != Target::kEdge) return rebuild("--target edge: the engine was built for a server");
  return Status::ok();
}

}  // namespace

void print_load_note(const Engine& e) {
  const std::string r = e.report();
  if (r.rfind("loaded in ", 0) == 0) std::printf("  %s", r.substr(0, r.find('\n') + 1).c_str());
}

bool is_engine_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string head(16, '\0');
  if (!f.read(head.data(), std::streamsize(head.size()))) head.resize(size_t(std::max<std::streamsize>(f.gcount(), 0)));
  return looks_like_engine_file(head) || is_tensor_parallel_file(head) || (path.size() > 5 && path.substr(path.size() - 5) == ".kiln");
}

Expected<BuildConfig> build_config(const LoadOptions& load, const EngineOptions& eng, int64_t batch) {
  BuildConfig c;
  KILN_ASSIGN_OR_RETURN(c.device, parse_device(eng.device));
  KILN_ASSIGN_OR_RETURN(c.precision, parse_precision(eng.precision));
  for (const auto& f : load.shapes) {
    KILN_ASSIGN_OR_RETURN(ShapeFlag s, parse_shape_spec(f));
    if (c.shapes.count(s.name) || c.shape_ranges.count(s.name)) {
      return KILN_ERROR(kInvalidArgument, "--shapes names input '{}' twice", s.name);
    }
    if (s.ranged) {
      c.shape_ranges[s.name] = s.dims;
    } else {
      for (const DimRange& r : s.dims) c.shapes[s.name].push_back(r.min);
    }
  }
  for (const std::string& f : load.warm_shapes) {
    std::map<std::string, std::vector<int64_t>> warm;
    for (size_t at = 0; at <= f.size();) {
      const size_t comma = std::min(f.find(',', at), f.size());
      auto s = parse_shape_flag(f.substr(at, comma - at));
      if (!s) return KILN_ERROR(kInvalidArgument, "--warm-shapes '{}': expected NAME:DIMS[,NAME:DIMS...] with exact dims, "
                                "e.g. ids:8x128", f);
      if (!warm.emplace(s->first, s->second).second) {
        return KILN_ERROR(kInvalidArgument, "--warm-shapes '{}': input '{}' given twice", f, s->first);
      }
      at = comma + 1;
    }
    c.warm_shapes.push_back(std::move(warm));
  }
  c.batch = batch;
  c.tensor_parallel = eng.tensor_parallel;
  c.micro_batches = eng.micro_batches;
  c.deterministic = eng.deterministic;
  c.target = eng.target == "edge" ? Target::kEdge : Target::kServer;
  c.cuda_graph = !eng.no_cuda_graph;
  c.autotune = !eng.no_autotune;
  c.timing_cache = eng.timing_cache;
  c.memory_budget_bytes = size_t(eng.memory_budget_mib) << 20;
  c.disabled_passes = eng.optimize.disabled;
  c.dump_ir_after = eng.optimize.dump_ir_after;
  c.print_pass_report = eng.optimize.report;
  if ((c.device == Device::kCpu || c.device == Device::kCpuRef) && c.precision != Precision::kFp32) {
    std::fprintf(stderr, "kiln: warning: --%s ignored: the CPU backend computes in fp32\n", eng.precision.c_str());
  }
  return c;
}

Expected<Engine> open_engine(const LoadOptions& load, const EngineOptions& eng, int64_t batch) {
  if (is_engine_file(load.model)) {
    KILN_ASSIGN_OR_RETURN(Engine e, Engine::load(load.model));
    KILN_RETURN_IF_ERROR(check_loaded(e, load.model, load, eng, batch));
    return e;
  }
  KILN_ASSIGN_OR_RETURN(BuildConfig c, build_config(load, eng, batch));
  return build(load.model, c);
}

Expected<Engine> open_engine_for_files(const LoadOptions& load, const EngineOptions& eng, int64_t batch,
                                       const std::map<std::string, std::string>& files) {
  if (is_engine_file(load.model) || batch > 0 || files.empty()) return open_engine(load, eng, batch);
  std::set<std::string> named;
  for (const std::string& f : load.shapes) {
    if (auto s = parse_shape_spec(f)) named.insert(s->name);
  }
  std::map<std::string, std::optional<std::vector<int64_t>>> read;  // path -> dims (none: does not read)
  auto dims_of = [&](const std::string& path) -> const std::optional<std::vector<int64_t>>& {
    auto [it, fresh] = read.try_emplace(path);
    if (fresh) {
      if (auto t = read_npy(path)) it->second = t->dims();
    }
    return it->second;
  };
  auto spec = [](const std::string& name, const std::vector<int64_t>& dims) {
    std::string s = name + ":";
    for (size_t k = 0; k < dims.size(); ++k) s += fmt::format("{}{}", k ? "x" : "", dims[k]);
    return s;
  };
  LoadOptions bound = load;
  for (const auto& [name, path] : files) {
    const auto& d = dims_of(path);
    if (!named.count(name) && d && !d->empty()) bound.shapes.push_back(spec(name, *d));
  }
  if (bound.shapes.size() == load.shapes.size()) return open_engine(load, eng, batch);
  auto e = open_engine(bound, eng, batch);
  if (e || e.status().code() != ErrorCode::kInvalidArgument) return e;
  // Some file does not fit: a name the model lacks (compare's folder names files by their stems), or
  // a rank or fixed dim the model does not declare. Only the files that fit the declared inputs
  // bind; the input check after the build names any other.
  auto m = import_onnx_file(load.model);
  if (!m) return open_engine(load, eng, batch);
  LoadOptions fit = load;
  for (const Value* v : m->graph->inputs) {
    if (v->constant || named.count(v->name) || !v->type.shape) continue;
    auto it = files.find(v->name);
    if (it == files.end()) it = files.find(file_name_for(v->name));
    if (it == files.end()) continue;
    const auto& d = dims_of(it->second);
    const Shape& s = *v->type.shape;
    if (!d || d->empty() || d->size() != s.rank()) continue;
    bool fits = true;
    for (size_t k = 0; k < d->size(); ++k) fits = fits && (!s[k].is_static() || s[k].value() == (*d)[k]);
    if (fits) fit.shapes.push_back(spec(v->name, *d));
  }
  return open_engine(fit, eng, batch);
}

}  // namespace kiln::cli
