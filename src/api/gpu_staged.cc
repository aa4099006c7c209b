// Staged GPU engines: a model whose shapes depend on values it computes (NonZero, Unique, a TopK
// with a computed k, a Reshape to a computed shape... staged_split.h) runs on the GPU in three
// stages instead of on the CPU whole. Each run: the nodes before the cut as one static GPU plan;
// what the data-dependent nodes read copied to the host (the synchronisation the report names) and
// those nodes run on the CPU reference kernels; the nodes after them on a GPU plan made for the
// exact shapes the host nodes produced, at the first run that meets them (specialize_graph, lowered
// with the timing cache's nearest choices and nothing timed, as a dynamic engine's shape plans are;
// cut again when it opens shapes of its own). What the first stage makes for the last alone stays
// on the GPU between them; the rest crosses as host tensors.
//
// A plan after the cut whose inputs hold no element (NonZero found nothing) runs on the CPU
// reference kernels: empty tensors are not lowered. One the GPU backend refuses (kUnsupported) does
// too, with a warning naming why.
//
// The engine file holds the optimized graph and its weights, the timing cache the build left (TUNE)
// and a STGD section marking it staged: loading cuts the graph again and lowers the first stage
// without timing.
#ifdef KILN_HAVE_CUDA
#include <cstring>
#include <mutex>
#include <set>

#include "api/gpu_common.h"
#include "api/staged_split.h"
#include "backends/cuda/device.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/weight_pool.h"
#include "ops/op_kind.h"
#include "passes/derived_constants.h"
#include "runtime/plan.h"

namespace kiln {

namespace {

using Shapes = std::vector<std::vector<int64_t>>;

constexpr size_t kKeptPlans = 32;    // plans after the cut an engine keeps, by exact input shapes
constexpr size_t kKeptSessions = 8;  // their sessions a session keeps

// The plan of the nodes after the cut for one set of exact input shapes.
struct AfterPlan {
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<DeviceEngine> gpu;  // null: runs on the CPU reference kernels (`on_cpu` says why)
  std::string on_cpu;
  bool staged = false;  // `gpu` cuts again: its outputs' shapes are known only once it ran
  uint64_t last_use = 0;
};

class StagedGpuEngine : public DeviceEngine, public std::enable_shared_from_this<StagedGpuEngine> {
 public:
  StagedGpuEngine(std::shared_ptr<const Plan> plan, BuildConfig c, std::shared_ptr<cuda::TimingCache> cache,
                  std::shared_ptr<cuda::WeightPool> pool)
      : plan_(std::move(plan)), config_(std::move(c)), cache_(std::move(cache)), pool_(std::move(pool)) {}

  // Cuts the graph and builds the stage before the cut (timing what the cache lacks when
  // `time_misses`) and the host nodes' CPU plan.
  Status init(bool time_misses) {
    auto t0 = std::chrono::steady_clock::now();
    KILN_ASSIGN_OR_RETURN(StagedSplit split, split_at_open_shapes(*plan_->graph));
    host_nodes_ = split.host_nodes;
    if (split.before) {
      KILN_ASSIGN_OR_RETURN(Plan p, plan_host(std::move(split.before), /*require_cpu_kernels=*/false));
      before_plan_ = std::make_shared<const Plan>(std::move(p));
      KILN_ASSIGN_OR_RETURN(before_, build_stage(before_plan_, time_misses, /*runtime_dims=*/false));
    }
    Expected<Plan> host = plan_host(std::move(split.host), /*require_cpu_kernels=*/true);
    if (!host) {
      return Status(host.status().code(), fmt::format("a node whose output shape depends on computed values runs on the "
                                                      "CPU: {}", host.status().message()));
    }
    host_plan_ = std::make_shared<const Plan>(std::move(*host));
    after_ = std::move(split.after);
    build_ms_ = ms_since(t0);
    return Status::ok();
  }

  std::string report() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string nodes;
    for (size_t i = 0; i < host_nodes_.size() && i < 8; ++i) nodes += fmt::format("{}{}", i ? "; " : "", host_nodes_[i]);
    if (host_nodes_.size() > 8) nodes += "; ...";
    std::string out = fmt::format(
        "staged GPU engine: output shapes depend on computed values at {} node(s) ({}); each run computes the nodes before "
        "them on the GPU, copies what they read to the host (a synchronisation) and runs them on the CPU, then runs the "
        "nodes after them on the GPU on a plan made for the exact shapes at the first run that meets them (nothing timed "
        "while running; the last {} plans kept, {} sessions per session)\n",
        host_nodes_.size(), nodes, kKeptPlans, kKeptSessions);
    out += fmt::format("plans after the cut made so far: {} in {:.1f} ms", made_, made_ms_);
    if (on_cpu_) out += fmt::format(", {} of them on the CPU (the last: {})", on_cpu_, last_cpu_why_);
    out += "\n";
    if (!after_) out += "nothing after the cut but the model's outputs\n";
    if (before_) {
      out += "before the cut:\n" + before_->report();
    } else {
      out += "before the cut: nothing on the GPU (the data-dependent nodes read the model's inputs alone)\n";
    }
    return out;
  }
  size_t weight_bytes() const override { return pool_->device_bytes(); }
  double build_ms() const override { return build_ms_; }
  nlohmann::json target() const override { return target_json(cuda::current_target()); }
  bool graph_weights() const override { return true; }
  std::shared_ptr<const Plan> engine_file_plan() const override { return plan_; }
  Expected<std::map<std::string, std::string>> sections() const override {
    std::map<std::string, std::string> m;
    m.emplace("TUNE", cache_->to_text(/*only_used=*/true));
    m.emplace("STGD", "1\n");
    return m;
  }
  Expected<std::unique_ptr<Session::Impl>> create_session(void* comm) const override;

  const Graph& graph() const { return *plan_->graph; }
  const Plan* before_plan() const { return before_plan_.get(); }
  const DeviceEngine* before() const { return before_.get(); }
  const Plan& host_plan() const { return *host_plan_; }
  const Graph* after_graph() const { return after_.get(); }

  // The plan after the cut for exact input shapes `s`, made on first use.
  Expected<std::shared_ptr<AfterPlan>> after_for(const Shapes& s) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = plans_.find(s); it != plans_.end()) {
      it->second->last_use = ++clock_;
      return it->second;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto with_shape = [&](const Status& st) {
      return Status(st.code(), fmt::format("after {}, at {}: {}", host_nodes_.front(), shapes_text(*after_, s), st.message()));
    };
    bool empty = false;
    for (const auto& d : s) empty = empty || std::find(d.begin(), d.end(), 0) != d.end();
    auto g = specialize_graph(*after_, s, config_, {}, &derived_, nullptr, /*provenance=*/false);
    if (!g) return with_shape(g.status());
    Expected<Plan> plan = plan_host(std::move(*g), /*require_cpu_kernels=*/false);
    if (!plan) return with_shape(plan.status());
    auto p = std::make_shared<AfterPlan>();
    p->plan = std::make_shared<const Plan>(std::move(*plan));
    if (empty) {
      p->on_cpu = "an input holds no element";
    } else {
      auto e = build_stage(p->plan, /*time_misses=*/false, /*runtime_dims=*/true);
      if (e) {
        p->gpu = std::move(*e);
        p->staged = has_open_shapes(*p->plan->graph);
      } else if (e.status().code() == ErrorCode::kUnsupported) {
        p->on_cpu = e.status().message();
        std::fprintf(stderr, "kiln: warning: %s: runs on the CPU: %s\n", shapes_text(*after_, s).c_str(), p->on_cpu.c_str());
      } else {
        return with_shape(e.status());
      }
    }
    if (!p->gpu) {
      if (Status st = verify_cpu_kernels(*p->plan); !st) return with_shape(st);
      ++on_cpu_;
      last_cpu_why_ = p->on_cpu;
    }
    ++made_;
    made_ms_ += ms_since(t0);
    p->last_use = ++clock_;
    plans_[s] = p;
    while (plans_.size() > kKeptPlans) {  // sessions running a plan keep it alive
      auto lru = std::min_element(plans_.begin(), plans_.end(),
                                  [](const auto& a, const auto& b) { return a.second->last_use < b.second->last_use; });
      plans_.erase(lru);
    }
    return p;
  }

 private:
  // A GPU engine for a stage's plan: static, or staged again when it opens shapes of its own.
  Expected<std::shared_ptr<DeviceEngine>> build_stage(std::shared_ptr<const Plan> plan, bool time_misses,
                                                      bool runtime_dims) const {
    if (has_open_shapes(*plan->graph)) {
      auto e = std::make_shared<StagedGpuEngine>(std::move(plan), config_, cache_, pool_);
      KILN_RETURN_IF_ERROR(e->init(time_misses));
      return std::shared_ptr<DeviceEngine>(e);
    }
    cuda::BuildOptions bo = build_options(config_);
    bo.timing_cache = cache_;
    bo.time_misses = time_misses;
    bo.weight_pool = pool_;
    bo.runtime_dim_kernels = runtime_dims;  // plans per shape share one compilation of each generated kernel
    // cuDNN's operation graphs compile when finalized (hundreds of ms each): not while running.
    if (!time_misses) bo.graph_conv = -1;
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<cuda::Engine> e, cuda::Engine::build(*plan->graph, bo));
    warn_cpu_nodes(e->report());
    return static_gpu_engine(std::move(plan), std::move(e), "");
  }

  std::shared_ptr<const Plan> plan_;  // the whole optimized graph (what the engine file holds)
  BuildConfig config_;
  std::shared_ptr<cuda::TimingCache> cache_;
  std::shared_ptr<cuda::WeightPool> pool_;  // every stage's and plan's weights
  std::vector<std::string> host_nodes_;
  std::shared_ptr<const Plan> before_plan_;  // null when nothing comes before the cut
  std::shared_ptr<DeviceEngine> before_;
  std::shared_ptr<const Plan> host_plan_;
  std::unique_ptr<Graph> after_;  // null when nothing comes after
  double build_ms_ = 0;

  mutable std::mutex mu_;
  mutable DerivedConstants derived_;  // weights the passes derive, shared by the plans after the cut
  mutable std::map<Shapes, std::shared_ptr<AfterPlan>> plans_;
  mutable uint64_t clock_ = 0;
  mutable int made_ = 0, on_cpu_ = 0;
  mutable double made_ms_ = 0;
  mutable std::string last_cpu_why_;
};

// Values of a run by name: the model's inputs, then what each stage computes.
using Env = std::map<std::string, Data>;

TensorView view_of(const Tensor& t) { return {t.dtype(), t.dims(), const_cast<void*>(t.raw()), false}; }

Expected<std::vector<Data>> gather(const Graph& g, const Env& env) {
  std::vector<Data> in;
  for (const Value* v : g.inputs) {
    auto it = env.find(v->name);
    if (it == env.end()) return KILN_ERROR(kInternal, "staged engine: '{}' was not computed before the stage reading it", v->name);
    in.push_back(it->second);
  }
  return in;
}

Status scatter(const Graph& g, std::vector<Data> out, Env& env) {
  if (out.size() != g.outputs.size()) {
    return KILN_ERROR(kInternal, "staged engine: a stage returned {} values, not {}", out.size(), g.outputs.size());
  }
  for (size_t i = 0; i < out.size(); ++i) env[g.outputs[i]->name] = std::move(out[i]);
  return Status::ok();
}

class StagedGpuSession : public Session::Impl {
 public:
  explicit StagedGpuSession(std::shared_ptr<const StagedGpuEngine> e) : e_(std::move(e)) {}
  Status start() {
    if (!e_->before()) return Status::ok();
    const Graph& bg = *e_->before_plan()->graph;
    KILN_ASSIGN_OR_RETURN(before_, stage_session(*e_->before(), &bg));
    // What the stage before the cut makes for the nodes after it alone stays on the GPU, in buffers
    // of this session; what the host nodes or the caller read comes back to the host.
    std::set<std::string> to_host;
    for (const Value* v : e_->host_plan().graph->inputs) to_host.insert(v->name);
    for (const Value* v : e_->graph().outputs) to_host.insert(v->name);
    for (const Value* v : bg.outputs) {
      TensorView w{v->type.dtype, *v->type.shape->static_dims(), nullptr, false};
      if (!to_host.count(v->name)) {
        std::string err;
        std::shared_ptr<void> b = cuda::device_buffer(w.bytes(), &err);
        if (!b) return KILN_ERROR(kOutOfMemory, "staged engine: {} bytes on the GPU for '{}': {}", w.bytes(), v->name, err);
        w.data = b.get();
        w.on_device = true;
        buffers_.push_back(std::move(b));
      }
      before_out_.push_back(std::move(w));
    }
    return Status::ok();
  }

  Expected<std::vector<Data>> run(std::vector<Data> inputs) override { return forward(std::move(inputs), nullptr, nullptr); }

  // Through the host: the outputs' shapes are known only once the run has made them, and must be
  // the ones the caller's buffers have.
  Status run_device(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs, void* stream,
                    bool) override {
    if (inputs.size() != this->inputs.size()) {
      return KILN_ERROR(kInvalidArgument, "expected {} inputs, got {}", this->inputs.size(), inputs.size());
    }
    if (outputs.size() != this->outputs.size()) {
      return KILN_ERROR(kInvalidArgument, "expected {} outputs, got {}", this->outputs.size(), outputs.size());
    }
    std::vector<Data> in;
    Shapes shapes;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const TensorView& v = inputs[i];
      if (v.dtype != this->inputs[i].dtype) {
        return KILN_ERROR(kInvalidArgument, "input '{}' is {}, the engine takes {}", this->inputs[i].name, dtype_name(v.dtype),
                          dtype_name(this->inputs[i].dtype));
      }
      shapes.push_back(v.shape);
    }
    KILN_RETURN_IF_ERROR(check_run_shapes(this->inputs, shapes));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const TensorView& v = inputs[i];
      KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(v.dtype, v.shape));
      if (t.nbytes() && !v.data) return KILN_ERROR(kInvalidArgument, "input '{}': null data", this->inputs[i].name);
      if (t.nbytes() && v.on_device) {
        std::string err = cuda::copy_to_host(t.raw(), v.data, t.nbytes(), stream);
        if (!err.empty()) return KILN_ERROR(kInternal, "input '{}': copying it from the GPU: {}", this->inputs[i].name, err);
      } else if (t.nbytes()) {
        std::memcpy(t.raw(), v.data, t.nbytes());
      }
      in.push_back(Data(std::move(t)));
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Data> out, run(std::move(in)));
    for (size_t i = 0; i < outputs.size(); ++i) {
      const TensorView& v = outputs[i];
      const std::string& name = this->outputs[i].name;
      if (!out[i].is_tensor()) return KILN_ERROR(kInvalidArgument, "output '{}' is not a tensor", name);
      const Tensor& t = out[i].tensor;
      if (v.dtype != t.dtype() || v.shape != t.dims()) {
        return KILN_ERROR(kInvalidArgument, "output '{}' is {}{} in this run (its shape depends on the inputs' values); the "
                          "buffer given is {}{}", name, dtype_name(t.dtype()), dims_to_string(t.dims()), dtype_name(v.dtype),
                          dims_to_string(v.shape));
      }
      if (!t.nbytes()) continue;
      if (!v.data) return KILN_ERROR(kInvalidArgument, "output '{}': null data", name);
      if (!v.on_device) {
        std::memcpy(v.data, t.raw(), t.nbytes());
        continue;
      }
      std::string err = cuda::copy_to_device(v.data, t.raw(), t.nbytes(), stream);
      if (!err.empty()) return KILN_ERROR(kInternal, "output '{}': copying it to the GPU: {}", name, err);
    }
    return Status::ok();
  }

  // A run synchronises with the host between its stages.
  Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) override {
    return host_clock_benchmark(*this, inputs, warmup, iterations);
  }
  Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) override {
    std::vector<StepTime> steps;
    KILN_RETURN_IF_ERROR(forward(inputs, &steps, nullptr).status());
    return steps;
  }
  Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<Data>& inputs) override {
    std::vector<NonFiniteStep> bad;
    KILN_RETURN_IF_ERROR(forward(inputs, nullptr, &bad).status());
    return bad;
  }
  size_t device_bytes() const override {
    size_t b = before_ ? before_->device_bytes() : 0;
    for (const TensorView& w : before_out_) b += w.on_device ? w.bytes() : 0;
    for (const auto& [shape, e] : after_) b += e.session->device_bytes();
    return b;
  }

 private:
  struct Entry {
    std::shared_ptr<AfterPlan> plan;  // before the session, which runs its engine
    std::unique_ptr<Session::Impl> session;
    uint64_t last_use = 0;
  };

  static Expected<std::unique_ptr<Session::Impl>> stage_session(const DeviceEngine& e, const Graph* g) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Session::Impl> s, e.create_session());
    s->inputs = tensor_infos(g->inputs, {});
    s->outputs = tensor_infos(g->outputs, {});
    return s;
  }

  Expected<Session::Impl*> after_session(const Shapes& shapes) {
    if (auto it = after_.find(shapes); it != after_.end()) {
      it->second.last_use = ++clock_;
      return it->second.session.get();
    }
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<AfterPlan> p, e_->after_for(shapes));
    std::unique_ptr<Session::Impl> s;
    if (p->gpu) {
      KILN_ASSIGN_OR_RETURN(s, stage_session(*p->gpu, p->plan->graph.get()));
    } else {
      s = cpu_session(p->plan);
    }
    if (after_.size() >= kKeptSessions) {
      auto lru = std::min_element(after_.begin(), after_.end(),
                                  [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
      after_.erase(lru);
    }
    Entry& e = after_[shapes];
    e.plan = std::move(p);
    e.session = std::move(s);
    e.last_use = ++clock_;
    return e.session.get();
  }

  // One stage on a session: its step times or non-finite steps first when asked (each runs the
  // stage once more), then its outputs into `env`.
  static Status stage(Session::Impl& s, const Graph& g, Env& env, std::vector<StepTime>* steps,
                      std::vector<NonFiniteStep>* bad) {
    KILN_ASSIGN_OR_RETURN(std::vector<Data> in, gather(g, env));
    if (steps) {
      KILN_ASSIGN_OR_RETURN(auto st, s.profile(in));
      steps->insert(steps->end(), st.begin(), st.end());
    }
    if (bad) {
      KILN_ASSIGN_OR_RETURN(auto b, s.check_finite(in));
      bad->insert(bad->end(), b.begin(), b.end());
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Data> out, s.run(std::move(in)));
    return scatter(g, std::move(out), env);
  }

  Expected<std::vector<Data>> forward(std::vector<Data> inputs, std::vector<StepTime>* steps,
                                      std::vector<NonFiniteStep>* bad) {
    const Graph& g = e_->graph();
    if (inputs.size() != g.inputs.size()) return KILN_ERROR(kInvalidArgument, "expected {} inputs, got {}", g.inputs.size(), inputs.size());
    Env env;
    for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs[i]->name] = std::move(inputs[i]);
    // Step times and non-finite checks run every stage on host tensors (stage()); a plain run keeps
    // what crosses from before the cut to after it on the GPU (`device`).
    const bool diagnose = steps || bad;
    std::map<std::string, TensorView> device;
    if (before_ && diagnose) {
      KILN_RETURN_IF_ERROR(stage(*before_, *e_->before_plan()->graph, env, steps, bad));
    } else if (before_) {
      const Graph& bg = *e_->before_plan()->graph;
      KILN_ASSIGN_OR_RETURN(std::vector<Data> in, gather(bg, env));
      std::vector<TensorView> iv, ov = before_out_;
      for (const Data& d : in) iv.push_back(view_of(d.tensor));
      std::vector<Tensor> host(ov.size());
      for (size_t i = 0; i < ov.size(); ++i) {
        if (ov[i].on_device) continue;
        KILN_ASSIGN_OR_RETURN(host[i], Tensor::create(ov[i].dtype, ov[i].shape));
        ov[i].data = host[i].raw();
      }
      KILN_RETURN_IF_ERROR(before_->run_device(iv, ov, nullptr, true));
      for (size_t i = 0; i < ov.size(); ++i) {
        if (ov[i].on_device) {
          device[bg.outputs[i]->name] = ov[i];
        } else {
          env[bg.outputs[i]->name] = Data(std::move(host[i]));
        }
      }
    }
    {
      auto t0 = std::chrono::steady_clock::now();
      const Plan& host = e_->host_plan();
      KILN_ASSIGN_OR_RETURN(std::vector<Data> in, gather(*host.graph, env));
      KILN_ASSIGN_OR_RETURN(std::vector<Data> out, run_plan(host, std::move(in)));
      KILN_RETURN_IF_ERROR(scatter(*host.graph, std::move(out), env));
      if (steps) {
        for (const auto& n : host.graph->nodes) {
          steps->push_back({fmt::format("{} on the CPU (its output shape depends on computed values; the host nodes' "
                                        "time shared equally)", n->describe()),
                            ms_since(t0) / double(host.graph->nodes.size()), n->describe(), std::string(op_name(n->op))});
        }
      }
    }
    if (const Graph* after = e_->after_graph()) {
      Shapes shapes;
      std::vector<TensorView> iv;
      for (const Value* v : after->inputs) {
        if (auto d = device.find(v->name); d != device.end()) {
          iv.push_back(d->second);
        } else if (auto it = env.find(v->name); it != env.end() && it->second.is_tensor()) {
          iv.push_back(view_of(it->second.tensor));
        } else {
          return KILN_ERROR(kInternal, "staged engine: '{}' is not a tensor computed before the stage reading it", v->name);
        }
        shapes.push_back(iv.back().shape);
      }
      KILN_ASSIGN_OR_RETURN(Session::Impl * s, after_session(shapes));
      const AfterPlan& p = *after_.at(shapes).plan;
      const Graph& ag = *p.plan->graph;
      if (p.gpu && !p.staged && !diagnose) {  // static shapes: the caller places the outputs
        std::vector<TensorView> ov;
        std::vector<Data> out;
        for (const Value* v : ag.outputs) {
          KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(v->type.dtype, *v->type.shape->static_dims()));
          ov.push_back(view_of(t));
          out.push_back(Data(std::move(t)));
        }
        KILN_RETURN_IF_ERROR(s->run_device(iv, ov, nullptr, true));
        KILN_RETURN_IF_ERROR(scatter(ag, std::move(out), env));
      } else {
        for (const TensorView& w : iv) {  // on the CPU, or cut again: every input on the host
          if (!w.on_device) continue;
          KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(w.dtype, w.shape));
          std::string err = t.nbytes() ? cuda::copy_to_host(t.raw(), w.data, t.nbytes(), nullptr) : "";
          if (!err.empty()) return KILN_ERROR(kInternal, "staged engine: copying a value to the host: {}", err);
          for (const auto& [name, d] : device) {
            if (d.data == w.data) env[name] = Data(t);
          }
        }
        KILN_RETURN_IF_ERROR(stage(*s, ag, env, steps, bad));
      }
    }
    std::vector<Data> out;
    for (const Value* v : g.outputs) {
      if (auto it = env.find(v->name); it != env.end()) {
        out.push_back(it->second);
      } else if (v->constant) {
        out.push_back(Data(*v->constant));
      } else {
        return KILN_ERROR(kInternal, "staged engine: output '{}' was computed by no stage", v->name);
      }
    }
    return out;
  }

  std::shared_ptr<const StagedGpuEngine> e_;
  std::unique_ptr<Session::Impl> before_;
  std::vector<TensorView> before_out_;  // per output of the stage before the cut: on the GPU, or not placed yet
  std::vector<std::shared_ptr<void>> buffers_;
  std::map<Shapes, Entry> after_;
  uint64_t clock_ = 0;
};

Expected<std::unique_ptr<Session::Impl>> StagedGpuEngine::create_session(void* comm) const {
  if (comm) return KILN_ERROR(kUnsupported, "a staged engine (shapes that depend on computed values) is never one rank of a "
                              "tensor-parallel engine");
  auto s = std::make_unique<StagedGpuSession>(shared_from_this());
  KILN_RETURN_IF_ERROR(s->start());
  return std::unique_ptr<Session::Impl>(std::move(s));
}

}  // namespace

Expected<std::shared_ptr<DeviceEngine>> build_staged_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                                std::shared_ptr<cuda::TimingCache> cache, bool time_misses) {
  auto e = std::make_shared<StagedGpuEngine>(std::move(plan), c, std::move(cache), std::make_shared<cuda::WeightPool>());
  KILN_RETURN_IF_ERROR(e->init(time_misses));
  return std::shared_ptr<DeviceEngine>(e);
}

Expected<std::shared_ptr<DeviceEngine>> load_staged_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                               std::string_view tune, const std::string& name) {
  auto cache = std::make_shared<cuda::TimingCache>(cuda::target_id(cuda::current_target()));
  KILN_RETURN_IF_ERROR(cache->merge_text(std::string(tune), name + " (TUNE section)"));
  auto e = build_staged_gpu_engine(std::move(plan), c, std::move(cache), /*time_misses=*/false);
  if (!e) return Status(e.status().code(), fmt::format("{}: {}", name, e.status().message()));
  return e;
}

}  // namespace kiln
#endif  // KILN_HAVE_CUDA
