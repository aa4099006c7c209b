// The GPU side of the public API: a CUDA engine built from a plan's graph, its sessions, and the
// target check for loaded engines. Compiled with KILN_HAVE_CUDA when the CUDA backend is built;
// without it, a GPU is never usable and a GPU engine file says this kiln cannot run it.
#include <cstdio>

#include "api/engine_impl.h"

#ifdef KILN_HAVE_CUDA
#include "api/gpu_common.h"
#include "api/step_times.h"
#include "backends/cuda/device.h"
#include "backends/cuda/nccl.h"
#include "backends/cuda/nvrtc.h"
#include "backends/cuda/timing_cache.h"
#include "passes/value_inputs.h"
#include "api/staged_split.h"
#endif

namespace kiln {

#ifdef KILN_HAVE_CUDA

nlohmann::json target_json(const cuda::TargetInfo& t) {
  return {{"gpu", t.gpu},           {"sm_major", t.sm_major}, {"sm_minor", t.sm_minor},
          {"cuda_runtime", t.cuda_runtime}, {"cublaslt", t.cublaslt}, {"cudnn", t.cudnn}};
}

void warn_cpu_nodes(const cuda::BuildReport& r) {
  std::vector<const cuda::NodePlacement*> cpu;
  for (const auto& n : r.nodes) {
    if (n.placement == cuda::Placement::kHost) cpu.push_back(&n);
  }
  if (cpu.empty()) return;
  std::string list;
  for (size_t i = 0; i < cpu.size() && i < 3; ++i) list += fmt::format("{}{} [{}]", i ? "; " : "", cpu[i]->node, cpu[i]->why);
  std::fprintf(stderr, "kiln: warning: %zu node(s) fall back to the CPU (%s%s); `kiln build --report` lists them\n",
               cpu.size(), list.c_str(), cpu.size() > 3 ? "; ..." : "");
}

Expected<std::vector<NonFiniteStep>> nonfinite_steps(cuda::Session* s, const std::vector<Data>& inputs) {
  KILN_ASSIGN_OR_RETURN(auto steps, s->check_finite(inputs));
  std::vector<NonFiniteStep> r;
  for (auto& st : steps) r.push_back({std::move(st.label), st.count, st.numel});
  return r;
}

namespace {

class GpuSession : public Session::Impl {
 public:
  GpuSession(std::shared_ptr<const Plan> plan, const cuda::BuildReport& report, std::unique_ptr<cuda::Session> s)
      : plan_(std::move(plan)), report_(report), s_(std::move(s)) {}
  Expected<std::vector<Data>> run(std::vector<Data> inputs) override { return s_->run(inputs); }
  Status run_device(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs, void* stream,
                    bool wait) override {
    // Counts, dtypes and shapes are checked by the CUDA session, against its staged buffers.
    std::vector<cuda::IoBuffer> in, out;
    for (const TensorView& v : inputs) in.push_back({v.dtype, v.shape, v.data, v.on_device});
    for (const TensorView& v : outputs) out.push_back({v.dtype, v.shape, v.data, v.on_device});
    return s_->run_buffers(in, out, stream, wait);
  }
  Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) override {
    return s_->benchmark(inputs, warmup, iterations);
  }
  Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) override {
    KILN_ASSIGN_OR_RETURN(auto steps, s_->profile(inputs));
    return step_times(std::move(steps), *plan_->graph, report_);
  }
  Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<Data>& inputs) override {
    return nonfinite_steps(s_.get(), inputs);
  }
  size_t device_bytes() const override { return s_->device_bytes(); }

 private:
  std::shared_ptr<const Plan> plan_;  // the plan whose graph the CUDA engine reads
  const cuda::BuildReport& report_;   // the engine's, which outlives its sessions
  std::unique_ptr<cuda::Session> s_;
};

class GpuEngine : public DeviceEngine {
 public:
  GpuEngine(std::shared_ptr<const Plan> plan, std::shared_ptr<cuda::Engine> e, std::string cache_line)
      : plan_(std::move(plan)), e_(std::move(e)), cache_line_(std::move(cache_line)) {}
  std::string report() const override { return cache_line_ + e_->report().to_text(); }
  Expected<std::map<std::string, std::string>> sections() const override {
    KILN_ASSIGN_OR_RETURN(auto s, e_->serialize());
    std::map<std::string, std::string> m;  // moved in: an initializer list would copy the weights
    m.emplace("DPLN", std::move(s.first));
    m.emplace("DWGT", std::move(s.second));
    return m;
  }
  size_t weight_bytes() const override { return e_->report().weight_bytes; }
  size_t arena_bytes() const override { return e_->report().arena_peak; }
  double build_ms() const override { return e_->report().build_ms; }
  std::string load_phases() const override { return e_->report().load_phases; }
  nlohmann::json target() const override { return target_json(cuda::current_target()); }
  Expected<std::unique_ptr<Session::Impl>> create_session(void* comm) const override {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<cuda::Session> s, e_->new_session(comm));
    return std::unique_ptr<Session::Impl>(new GpuSession(plan_, e_->report(), std::move(s)));
  }
  Expected<std::unique_ptr<Session::Impl>> create_lanes_session(void* comm, int micro, std::vector<bool> batched) const override {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<cuda::Session> s, e_->new_lanes_session(comm, micro, std::move(batched)));
    return std::unique_ptr<Session::Impl>(new GpuSession(plan_, e_->report(), std::move(s)));
  }

 private:
  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<cuda::Engine> e_;
  std::string cache_line_;  // "timing cache: ..." for the report (empty for a loaded engine)
};

}  // namespace

std::string shapes_text(const Graph& g, const std::vector<std::vector<int64_t>>& s,
                        const std::vector<std::pair<size_t, Tensor>>& values) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < g.inputs.size(); ++i) {
    out += fmt::format("{}{}:", i ? " " : "", g.inputs[i]->name);
    for (size_t k = 0; k < s[i].size(); ++k) out += fmt::format("{}{}", k ? "x" : "", s[i][k]);
  }
  for (const auto& [i, t] : values) {
    out += fmt::format(" {}=", g.inputs[i]->name);
    for (int64_t k = 0; k < t.numel(); ++k) out += fmt::format("{}{}", k ? "," : "", t.as_double(k));
  }
  return out;
}

std::shared_ptr<DeviceEngine> static_gpu_engine(std::shared_ptr<const Plan> plan, std::shared_ptr<cuda::Engine> e,
                                                std::string cache_line) {
  return std::make_shared<GpuEngine>(std::move(plan), std::move(e), std::move(cache_line));
}

cuda::BuildOptions build_options(const BuildConfig& c) {
  cuda::BuildOptions bo;
  bo.precision = c.precision;
  bo.cuda_graph = c.cuda_graph;
  bo.autotune = c.autotune;
  bo.workspace_bytes = c.workspace_bytes;
  bo.memory_budget_bytes = c.memory_budget_bytes;
  bo.gemm_sm90 = c.gemm_sm90;
  bo.gemm_sm90_tile = c.gemm_sm90_tile;
  return bo;
}

namespace {

// Builds the CUDA engine with `cache` consulted before anything is timed.
Expected<std::shared_ptr<DeviceEngine>> build_with_cache(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                         std::shared_ptr<cuda::TimingCache> cache, std::string source,
                                                         std::unique_ptr<Graph> unoptimized) {
  cuda::BuildOptions bo = build_options(c);
  bo.timing_cache = cache;
  // Ranged input dims, or inputs whose values the plan needs (value inputs), make a dynamic engine.
  bool dynamic = !value_inputs(unoptimized ? *unoptimized : *plan->graph).empty();
  for (const Value* v : plan->graph->inputs) dynamic |= v->type.shape && !v->type.shape->is_static();
  if (dynamic) {
    if (unoptimized) {
      KILN_ASSIGN_OR_RETURN(Plan p, plan_host(std::move(unoptimized), /*require_cpu_kernels=*/false));
      plan = std::make_shared<const Plan>(std::move(p));
    }
    return build_dynamic_gpu_engine(std::move(plan), c, std::move(cache), std::move(source));
  }
  // Shapes that depend on values the model computes (NonZero, a computed TopK k...): staged.
  if (has_open_shapes(*plan->graph)) return build_staged_gpu_engine(std::move(plan), c, std::move(cache), true);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<cuda::Engine> e, cuda::Engine::build(*plan->graph, bo));
  warn_cpu_nodes(e->report());
  std::string line = fmt::format("timing cache: {}, {} choices reused, {} timed\n", source, cache->hits(), cache->misses());
  return std::shared_ptr<DeviceEngine>(new GpuEngine(std::move(plan), std::move(e), line));
}

std::string cache_path(const BuildConfig& c) {
  if (c.timing_cache == "none") return "";
  return c.timing_cache.empty() ? cuda::default_cache_dir() + "/timing.cache" : c.timing_cache;
}

}  // namespace

bool gpu_usable(std::string* why) { return cuda::gpu_available(why); }

int gpu_count() { return cuda::device_count(); }

Status gpu_select(int ordinal) {
  if (!cuda::select_device(ordinal)) return KILN_ERROR(kUnsupported, "cannot use GPU {} of {}", ordinal, gpu_count());
  return Status::ok();
}

Expected<std::vector<std::shared_ptr<void>>> gpu_communicators(int n) { return cuda::nccl_comms(n); }

void gpu_abort_communicators(const std::vector<std::shared_ptr<void>>& comms) { cuda::nccl_abort(comms); }

Expected<double> gpu_all_reduce_ms(int n, size_t bytes, int iterations) { return cuda::nccl_all_reduce_ms(n, bytes, iterations); }

Expected<std::shared_ptr<DeviceEngine>> build_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                         std::unique_ptr<Graph> unoptimized) {
  auto cache = std::make_shared<cuda::TimingCache>(cuda::target_id(cuda::current_target()));
  const std::string path = cache_path(c);
  // A cache file that cannot be read or written costs time, never the build: say so and go on.
  if (!path.empty()) {
    if (Status s = cache->merge_file(path); !s) {
      std::fprintf(stderr, "kiln: warning: timing cache ignored: %s\n", s.message().c_str());
      cache = std::make_shared<cuda::TimingCache>(cuda::target_id(cuda::current_target()));
    }
  }
  KILN_ASSIGN_OR_RETURN(auto e, build_with_cache(std::move(plan), c, cache, path.empty() ? "none" : path,
                                                 std::move(unoptimized)));
  if (!path.empty() && cache->misses() > 0) {
    if (Status s = cache->save_file(path); !s) std::fprintf(stderr, "kiln: warning: %s\n", s.message().c_str());
  }
  return e;
}

Expected<std::shared_ptr<DeviceEngine>> load_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& config,
                                                        const nlohmann::json& target,
                                                        const std::map<std::string, std::string_view>& sections,
                                                        const std::string& name) {
  cuda::TargetInfo built;
  try {
    built.gpu = target.at("gpu").get<std::string>();
    built.sm_major = target.at("sm_major").get<int>();
    built.sm_minor = target.at("sm_minor").get<int>();
    built.cuda_runtime = target.at("cuda_runtime").get<int>();
    built.cublaslt = target.at("cublaslt").get<size_t>();
    built.cudnn = target.at("cudnn").get<size_t>();
  } catch (const nlohmann::json::exception& e) {
    return KILN_ERROR(kInvalidModel, "{}: the engine's target record is malformed: {}", name, e.what());
  }
  std::string why = cuda::target_mismatch(built, cuda::current_target());
  if (!why.empty()) return KILN_ERROR(kUnsupported, "{}: this GPU engine cannot run here: {}", name, why);
  if (sections.count("STGD")) {
    auto tune = sections.find("TUNE");
    if (tune == sections.end()) return KILN_ERROR(kInvalidModel, "{}: a staged GPU engine without its TUNE section", name);
    return load_staged_gpu_engine(std::move(plan), config, tune->second, name);
  }
  auto dpln = sections.find("DPLN");
  auto dwgt = sections.find("DWGT");
  if (auto tune = sections.find("TUNE"); tune != sections.end() && dpln == sections.end()) {
    return load_dynamic_gpu_engine(std::move(plan), config, tune->second, name);
  }
  if (dpln == sections.end() || dwgt == sections.end()) {
    return KILN_ERROR(kInvalidModel, "{}: a GPU engine without its device plan (DPLN and DWGT sections)", name);
  }
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<cuda::Engine> e,
                        cuda::Engine::load(plan->graph.get(), build_options(config), dpln->second, dwgt->second, name));
  return std::shared_ptr<DeviceEngine>(new GpuEngine(std::move(plan), std::move(e), ""));
}

#else  // no CUDA in this build

bool gpu_usable(std::string* why) {
  if (why) *why = "this kiln was built without CUDA";
  return false;
}

int gpu_count() { return 0; }

Status gpu_select(int) { return KILN_ERROR(kUnsupported, "this kiln was built without CUDA"); }

Expected<std::vector<std::shared_ptr<void>>> gpu_communicators(int) {
  return KILN_ERROR(kUnsupported, "this kiln was built without CUDA");
}

void gpu_abort_communicators(const std::vector<std::shared_ptr<void>>&) {}

Expected<double> gpu_all_reduce_ms(int, size_t, int) { return KILN_ERROR(kUnsupported, "this kiln was built without CUDA"); }

Expected<std::shared_ptr<DeviceEngine>> build_gpu_engine(std::shared_ptr<const Plan>, const BuildConfig&,
                                                         std::unique_ptr<Graph>) {
  return KILN_ERROR(kUnsupported, "this kiln was built without CUDA");
}

Expected<std::shared_ptr<DeviceEngine>> load_gpu_engine(std::shared_ptr<const Plan>, const BuildConfig&,
                                                        const nlohmann::json& target, const std::map<std::string, std::string_view>&,
                                                        const std::string& name) {
  return KILN_ERROR(kUnsupported, "{}: a GPU engine (built for {}); this kiln was built without CUDA", name,
                    target.value("gpu", std::string("a GPU")));
}

#endif

}  // namespace kiln
