// kiln::Engine and kiln::Session: saving and loading engine files, sessions over the plan (CPU) or
// the CUDA engine (gpu.cc), and tensors across the API boundary.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <fstream>

#include "api/engine_impl.h"
#include "support/mapped_file.h"
#include "backends/backend.h"
#include "runtime/engine_file.h"

#ifndef KILN_VERSION
#define KILN_VERSION "0.0.0"
#endif

namespace kiln {

namespace fs = std::filesystem;

namespace {

// Inputs this large and 64-byte aligned are read in place, for the run only (a server's batch of
// images: copying it took longer than the forward, bench/RESULTS.md); smaller ones, strings and unaligned buffers
// are copied into kiln's own aligned tensors. Value inputs (a TopK's k, Slice bounds: a few
// elements) are always copies, since a dynamic engine keeps the value in the plan it makes.
constexpr size_t kBorrowBytes = size_t(64) << 10;

bool borrowable(const TensorView& v) {
  return v.dtype != DType::kString && v.bytes() >= kBorrowBytes && reinterpret_cast<uintptr_t>(v.data) % 64 == 0;
}

Expected<Data> to_data(const TensorView& v, const TensorInfo& info, size_t index) {
  if (v.on_device) {
    return KILN_ERROR(kInvalidArgument, "input {} ('{}'): a device pointer needs Session::run with outputs on a GPU engine",
                      index, info.name);
  }
  for (int64_t d : v.shape) {
    if (d < 0) return KILN_ERROR(kInvalidArgument, "input {} ('{}'): negative dimension {}", index, info.name, d);
  }
  if (v.data && borrowable(v)) {
    // The caller owns the memory; nothing frees it (the tensor dies with the run).
    return Data(Tensor::view(v.dtype, v.shape, std::shared_ptr<void>(v.data, [](void*) {}), v.data));
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(v.dtype, v.shape));
  if (t.numel() > 0 && !v.data) return KILN_ERROR(kInvalidArgument, "input {} ('{}'): null data", index, info.name);
  if (v.dtype == DType::kString) {
    const auto* src = static_cast<const std::string*>(v.data);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<std::string>()[i] = src[i];
  } else if (t.nbytes()) {
    std::memcpy(t.raw(), v.data, t.nbytes());
  }
  return Data(std::move(t));
}

Expected<std::vector<Data>> to_data(const std::vector<TensorView>& views, const std::vector<TensorInfo>& infos) {
  if (views.size() != infos.size()) {
    return KILN_ERROR(kInvalidArgument, "expected {} inputs, got {}", infos.size(), views.size());
  }
  std::vector<std::vector<int64_t>> shapes;
  for (const TensorView& v : views) shapes.push_back(v.shape);
  KILN_RETURN_IF_ERROR(check_run_shapes(infos, shapes));
  std::vector<Data> out;
  for (size_t i = 0; i < views.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Data d, to_data(views[i], infos[i], i));
    out.push_back(std::move(d));
  }
  return out;
}

Expected<HostTensor> to_host(Data d, const std::string& name) {
  if (!d.is_tensor()) {
    return KILN_ERROR(kUnsupported, "output '{}' is {}; the C++ API returns tensors only", name, d.summary());
  }
  auto keep = std::make_shared<Tensor>(std::move(d.tensor));
  Tensor& t = *keep;
  return HostTensor(t.dtype(), t.dims(), std::shared_ptr<void>(keep, t.raw()), t.raw());
}

class CpuSession : public HostSession {
 public:
  explicit CpuSession(std::shared_ptr<const Plan> plan) : plan_(std::move(plan)) {}
  Expected<std::vector<Data>> run(std::vector<Data> inputs) override { return run_plan(*plan_, std::move(inputs)); }

 private:
  std::shared_ptr<const Plan> plan_;
};


}  // namespace

std::string backend_report(const Engine::Impl& e) {
  if (e.gpu) return e.gpu->report();
  if (e.fast_cpu) return e.fast_cpu->report();
  return e.report;
}

// ---- Engine ------------------------------------------------------------------------------------

const std::vector<TensorInfo>& Engine::inputs() const { return impl_->inputs; }
const std::vector<TensorInfo>& Engine::outputs() const { return impl_->outputs; }
Device Engine::device() const { return impl_->device; }
const BuildConfig& Engine::config() const { return impl_->config; }
std::string Engine::report() const {
  if (!impl_->ranks.empty()) {
    std::string r = impl_->load_note + impl_->build_note + impl_->tp_report;
    for (size_t i = 0; i < impl_->ranks.size(); ++i) {
      const Engine::Impl& ri = *impl_->ranks[i].impl();
      r += fmt::format("rank {}: weights {:.2f} MiB{}\n", i, double(impl_->ranks[i].weight_bytes()) / (1 << 20),
                       ri.gpu ? fmt::format(", activation arena {:.2f} MiB per session", double(ri.gpu->arena_bytes()) / (1 << 20))
                              : std::string());
    }
    return r + "rank 0's engine:\n" + impl_->ranks[0].report();
  }
  std::string ranges;
  for (const auto& [sym, r] : impl_->ranges) ranges += fmt::format("{}{} {}", ranges.empty() ? "" : ", ", sym, describe_range(r));
  if (!ranges.empty()) ranges = "shape ranges: " + ranges + "\n";
  return impl_->load_note + impl_->build_note + ranges + backend_report(*impl_);
}
double Engine::build_ms() const { return impl_->build_ms; }
size_t Engine::weight_bytes() const {
  if (!impl_->ranks.empty()) {
    size_t b = 0;
    for (const Engine& e : impl_->ranks) b += e.weight_bytes();
    return b;
  }
  if (impl_->gpu) return impl_->gpu->weight_bytes();
  size_t b = 0;
  for (const Value* c : impl_->plan->constants) b += c->constant->nbytes();
  return b;
}

Expected<Session> Engine::create_session() const {
  std::unique_ptr<Session::Impl> s;
  if (!impl_->ranks.empty()) {
    KILN_ASSIGN_OR_RETURN(s, tensor_parallel_session(*impl_));
  } else if (impl_->gpu) {
    KILN_ASSIGN_OR_RETURN(s, impl_->gpu->create_session());
  } else if (impl_->fast_cpu) {
    KILN_ASSIGN_OR_RETURN(s, impl_->fast_cpu->create_session());
  } else {
    KILN_RETURN_IF_ERROR(verify_cpu_kernels(*impl_->plan));
    s = std::make_unique<CpuSession>(impl_->plan);
  }
  s->inputs = impl_->inputs;
  s->outputs = impl_->outputs;
  return Session(std::move(s));
}

Expected<std::string> Engine::serialize() const {
  if (!impl_->ranks.empty()) return serialize_tensor_parallel(*impl_);
  nlohmann::json meta;
  meta["kiln_version"] = KILN_VERSION;
  meta["format_version"] = kEngineFormatVersion;
  meta["device"] = std::string(device_name(impl_->device));
  meta["config"] = config_to_json(impl_->config);
  if (impl_->gpu) {
    meta["target"] = impl_->gpu->target();
    // A static GPU engine's device plan (DWGT) holds the weights, laid out for the GPU; a dynamic
    // one lowers shape plans from the graph, whose weights it carries.
    meta["graph_weights"] = impl_->gpu->graph_weights();
  }
  meta["report"] = backend_report(*impl_);
  auto io = [](const std::vector<TensorInfo>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const TensorInfo& t : v) {
      nlohmann::json x = {{"name", t.name}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}};
      // A dynamic engine's ranged dims, for `kiln inspect` (unbounded dims have no range).
      nlohmann::json ranges = nlohmann::json::array();
      for (size_t k = 0; k < t.shape.size() && k < t.dim_names.size(); ++k) {
        if (t.shape[k] < 0 && t.max_shape[k] != std::numeric_limits<int64_t>::max()) {
          ranges.push_back({{"dim", k}, {"name", t.dim_names[k]}, {"min", t.min_shape[k]}, {"max", t.max_shape[k]}});
        }
      }
      if (!ranges.empty()) x["ranges"] = ranges;
      a.push_back(x);
    }
    return a;
  };
  meta["inputs"] = io(impl_->inputs);
  meta["outputs"] = io(impl_->outputs);
  std::map<std::string, std::string> extra;
  if (impl_->gpu) {
    KILN_ASSIGN_OR_RETURN(extra, impl_->gpu->sections());
  } else if (impl_->fast_cpu) {
    KILN_ASSIGN_OR_RETURN(extra, impl_->fast_cpu->sections());
  }
  return write_engine_file(meta, *impl_->plan, extra);
}

Status Engine::save(const std::string& path) const {
  KILN_ASSIGN_OR_RETURN(std::string bytes, serialize());
  return write_file_atomic(path, bytes);
}

namespace {

// A tensor-parallel engine's file holds its ranks' files (tensor_parallel.cc).
Expected<Engine> load_view(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& name,
                           double read_ms) {
  if (is_tensor_parallel_file(bytes)) return load_tensor_parallel(bytes, std::move(owner), name);
  return load_engine_view(bytes, std::move(owner), name, read_ms);
}

}  // namespace

std::unique_ptr<Session::Impl> cpu_session(std::shared_ptr<const Plan> plan) {
  return std::make_unique<CpuSession>(std::move(plan));
}

// The bytes are viewed, not copied: the plan's weights keep `owner` alive. read_ms: the time spent
// opening them (0 when they came from memory), for the report's load line.
Expected<Engine> load_engine_view(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& name,
                                  double read_ms) {
  auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(EngineFile f, read_engine_file(bytes, std::move(owner), name));
  const double plan_ms = ms_since(t0);
  auto err = [&](const std::string& what) { return KILN_ERROR(kInvalidModel, "{}: {}", name, what); };
  auto impl = std::make_shared<Engine::Impl>();
  if (!f.meta.contains("config")) return err("META has no build configuration");
  auto config = config_from_json(f.meta["config"]);
  if (!config) return err(config.status().message());
  impl->config = *config;
  impl->ranges = symbol_ranges(*f.plan.graph, impl->config.shape_ranges);
  impl->inputs = tensor_infos(f.plan.graph->inputs, impl->ranges);
  impl->outputs = tensor_infos(f.plan.graph->outputs, impl->ranges);
  std::string device = f.meta.value("device", "");
  impl->plan = std::make_shared<const Plan>(std::move(f.plan));
  if (device == "cpu" && f.extra.count("CPUF")) {
    KILN_ASSIGN_OR_RETURN(impl->fast_cpu, load_fast_cpu_engine(impl->plan, impl->config, f.extra.at("CPUF"), name));
    impl->device = Device::kCpu;
  } else if (device == "cpu" || device == "cpu-ref") {
    // "cpu" without a CPU plan: an engine of the reference kernels (as every CPU engine once was).
    if (Status s = verify_cpu_kernels(*impl->plan); !s) return err(s.message());
    impl->device = Device::kCpuRef;
    impl->report = plan_report(*impl->plan);
  } else if (device == "cuda") {
    if (!f.meta.contains("target")) return err("a GPU engine without its target (device and library versions)");
    KILN_ASSIGN_OR_RETURN(impl->gpu, load_gpu_engine(impl->plan, impl->config, f.meta["target"], f.extra, name));
    impl->device = Device::kCuda;
  } else {
    return err(fmt::format("unknown device '{}'", device));
  }
  impl->load_note = fmt::format("loaded in {:.1f} ms: file mapped {:.1f}, checksum and plan {:.1f}, {} {:.1f}{}\n",
                                read_ms + ms_since(t0), read_ms, plan_ms, impl->gpu ? "device plan" : "checks",
                                ms_since(t0) - plan_ms, impl->gpu ? " (" + impl->gpu->load_phases() + ")" : "");
  return Engine(std::move(impl));
}

Expected<Engine> Engine::load(const std::string& path) {
  auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> m, map_file(path));
  std::string_view bytes(static_cast<const char*>(m->p), m->size);
  return load_view(bytes, m, path, ms_since(t0));
}

Expected<Engine> Engine::load_bytes(const void* data, size_t size, const std::string& name) {
  // A copy: the caller's buffer may not outlive the engine, whose weights view these bytes.
  auto copy = std::make_shared<const std::string>(static_cast<const char*>(data), size);
  return load_view(*copy, copy, name, 0);
}

// ---- Session -----------------------------------------------------------------------------------

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;
Session::~Session() = default;

Expected<std::vector<HostTensor>> Session::run(const std::vector<TensorView>& inputs) {
  KILN_ASSIGN_OR_RETURN(std::vector<Data> in, to_data(inputs, impl_->inputs));
  KILN_ASSIGN_OR_RETURN(std::vector<Data> out, impl_->run(std::move(in)));
  std::vector<HostTensor> r;
  for (size_t i = 0; i < out.size(); ++i) {
    // An output that is (a view of) an input read in place gets memory of its own: the caller's
    // buffer may go once run returns.
    if (out[i].is_tensor() && out[i].tensor.nbytes()) {
      const char* p = static_cast<const char*>(out[i].tensor.raw());
      for (const TensorView& v : inputs) {
        const char* b = static_cast<const char*>(v.data);
        if (borrowable(v) && p >= b && p < b + v.bytes()) {
          KILN_ASSIGN_OR_RETURN(Tensor copy, Tensor::create(out[i].tensor.dtype(), out[i].tensor.dims()));
          std::memcpy(copy.raw(), out[i].tensor.raw(), copy.nbytes());
          out[i] = Data(std::move(copy));
          break;
        }
      }
    }
    KILN_ASSIGN_OR_RETURN(HostTensor t, to_host(std::move(out[i]), i < impl_->outputs.size() ? impl_->outputs[i].name : ""));
    r.push_back(std::move(t));
  }
  return r;
}

Status Session::run(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs, void* stream) {
  return impl_->run_device(inputs, outputs, stream, true);
}

Status Session::enqueue(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs, void* stream) {
  return impl_->run_device(inputs, outputs, stream, false);
}

Expected<std::vector<double>> Session::benchmark(const std::vector<TensorView>& inputs, int warmup, int iterations) {
  if (iterations < 1 || warmup < 0) return KILN_ERROR(kInvalidArgument, "iterations must be >= 1 and warmup >= 0");
  KILN_ASSIGN_OR_RETURN(std::vector<Data> in, to_data(inputs, impl_->inputs));
  return impl_->benchmark(in, warmup, iterations);
}

Expected<std::vector<StepTime>> Session::profile(const std::vector<TensorView>& inputs) {
  KILN_ASSIGN_OR_RETURN(std::vector<Data> in, to_data(inputs, impl_->inputs));
  return impl_->profile(in);
}

Expected<std::vector<NonFiniteStep>> Session::check_finite(const std::vector<TensorView>& inputs) {
  KILN_ASSIGN_OR_RETURN(std::vector<Data> in, to_data(inputs, impl_->inputs));
  return impl_->check_finite(in);
}

size_t Session::device_bytes() const { return impl_->device_bytes(); }

}  // namespace kiln
