// The fast CPU engine: the host plan (which remains complete: the reference kernels can run every
// step) and the CPU plan that runs its convolutions, GEMMs and pooling as oneDNN primitives with
// their epilogues fused (backends/cpu/fast_plan.h). Its engine file adds the CPU plan as section
// CPUF; the primitives themselves are made when a session starts, for this machine's instruction
// set.
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>

#include "api/engine_impl.h"
#include "backends/backend.h"
#include "backends/cpu/fast_session.h"
#include "ops/op_kind.h"
#include "passes/derived_constants.h"
#include "runtime/node_cost.h"

namespace kiln {

namespace {

class FastCpuSession : public HostSession {
 public:
  FastCpuSession(std::unique_ptr<CpuRunner> r, std::shared_ptr<const Plan> plan, std::shared_ptr<const CpuPlan> cp)
      : r_(std::move(r)), plan_(std::move(plan)), cp_(std::move(cp)) {}
  Expected<std::vector<Data>> run(std::vector<Data> inputs) override { return r_->run(std::move(inputs)); }
  Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) override {
    std::vector<double> ms;
    KILN_ASSIGN_OR_RETURN(auto warm, r_->run(inputs));
    KILN_ASSIGN_OR_RETURN(auto out, r_->run(inputs, &ms));
    std::vector<StepTime> st;
    const Graph& g = *plan_->graph;
    const ValueReaders readers = value_readers(g);
    for (size_t i = 0; i < cp_->steps.size(); ++i) {
      const CpuStep& s = cp_->steps[i];
      const Node& n = *g.nodes[s.kind == CpuStepKind::kHost ? plan_->steps[s.index].node : s.index];
      StepTime t;
      t.step = fmt::format("{}: {}", describe_cpu_step(s, *plan_), r_->impls()[i]);
      t.ms = ms[i];
      t.node = n.describe();
      t.op = std::string(op_name(n.op));
      // The step's work: its node and the nodes its post-ops came from, as one kernel.
      std::vector<const Node*> group = {&n};
      for (const CpuPostOp& p : s.post) {
        if (p.node < g.nodes.size() && g.nodes[p.node].get() != &n) group.push_back(g.nodes[p.node].get());
      }
      const NodeCost c = group_cost(group, readers, 4);
      t.flops = c.flops;
      t.bytes = c.bytes;
      st.push_back(std::move(t));
    }
    return st;
  }
  size_t device_bytes() const override { return r_->weight_bytes(); }

 private:
  std::unique_ptr<CpuRunner> r_;
  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<const CpuPlan> cp_;
};

bool has_symbolic_inputs(const Graph& g) {
  for (const Value* v : g.inputs) {
    if (v->type.shape && !v->type.shape->is_static()) return true;
  }
  return false;
}

// A session of a plan with symbolic input dims: each distinct set of input shapes gets the plan a
// static build of that shape would make (the graph specialized, the passes run again, a CPU plan
// and its primitives), at its first run; later runs of that shape reuse it.
class DynamicFastCpuSession : public HostSession {
 public:
  DynamicFastCpuSession(std::shared_ptr<const Plan> plan, BuildConfig config)
      : plan_(std::move(plan)), config_(std::move(config)) {}
  Expected<std::vector<Data>> run(std::vector<Data> inputs) override {
    KILN_RETURN_IF_ERROR(check_inputs(*plan_->graph, inputs));
    KILN_ASSIGN_OR_RETURN(ShapePlan * sp, plan_for(inputs));
    if (!sp->runner) return run_plan(*sp->plan, std::move(inputs));
    return sp->runner->run(std::move(inputs));
  }

 private:
  // Bounds what a stream of ever-new shapes can hold: past this many, the plans start over.
  static constexpr size_t kMaxShapePlans = 32;

  // One input shape's plan; no runner where oneDNN declined a step (the reference kernels run it
  // all, as a static session of that shape would after its one-line warning).
  struct ShapePlan {
    std::shared_ptr<const Plan> plan;
    std::unique_ptr<CpuRunner> runner;
  };

  Expected<ShapePlan*> plan_for(const std::vector<Data>& inputs) {
    std::vector<std::vector<int64_t>> shapes;
    for (const Data& d : inputs) shapes.push_back(d.is_tensor() ? d.tensor.dims() : std::vector<int64_t>{});
    auto it = plans_.find(shapes);
    if (it != plans_.end()) return &it->second;
    if (plans_.size() >= kMaxShapePlans) plans_.clear();
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, specialize_graph(*plan_->graph, shapes, config_, {}, &derived_,
                                                                               nullptr, /*provenance=*/false));
    KILN_ASSIGN_OR_RETURN(Plan p, plan_host(std::move(g)));
    ShapePlan sp;
    sp.plan = std::make_shared<const Plan>(std::move(p));
    KILN_ASSIGN_OR_RETURN(CpuPlan cp, plan_fast_cpu(*sp.plan, config_.deterministic));
    auto r = CpuRunner::create(sp.plan, std::make_shared<const CpuPlan>(std::move(cp)));
    if (r) {
      sp.runner = std::move(*r);
    } else if (r.status().code() != ErrorCode::kUnsupported) {
      return r.status();
    } else {
      std::fprintf(stderr, "kiln: warning: the CPU runs this input shape on the reference kernels: %s\n",
                   r.status().message().c_str());
    }
    return &(plans_[shapes] = std::move(sp));
  }

  std::shared_ptr<const Plan> plan_;
  BuildConfig config_;
  std::map<std::vector<std::vector<int64_t>>, ShapePlan> plans_;
  DerivedConstants derived_;  // weights the passes make, shared by the shape plans
};

class FastCpuEngine : public DeviceEngine {
 public:
  FastCpuEngine(std::shared_ptr<const Plan> plan, std::shared_ptr<const CpuPlan> cp, BuildConfig config)
      : plan_(std::move(plan)), cp_(std::move(cp)), config_(std::move(config)) {}

  // Makes a runner to name each step's implementation in the report (kept for the first session,
  // so its primitives and reordered weights are not made twice); without oneDNN the report says
  // why every step runs on the reference kernels.
  // `note` starts the report (how the plan came to be, when not as usual).
  void describe(const std::string& note = "") {
    auto r = CpuRunner::create(plan_, cp_);
    std::string lib;
    fast_cpu_available(&lib);
    std::map<std::string, int> prims, host;
    size_t fused = 0, nprim = 0;
    for (size_t i = 0; i < cp_->steps.size(); ++i) {
      const CpuStep& s = cp_->steps[i];
      const std::string what = describe_cpu_step(s, *plan_);
      if (s.kind == CpuStepKind::kHost) {
        host[what]++;
        continue;
      }
      ++nprim;
      fused += s.post.size();
      prims[fmt::format("{} [{}]", what, r ? (*r)->impls()[i] : std::string("reference kernels"))]++;
    }
    report_ = note + fmt::format("device: cpu ({})\n", r ? lib : "reference kernels: " + r.status().message());
    if (r) {
      reordered_ = (*r)->weight_bytes();
      spare_ = std::move(*r);
    }
    if (has_symbolic_inputs(*plan_->graph)) {
      report_ += "symbolic input dims: each input shape runs on a plan of its own, made at its first run; the steps "
                 "below are the symbolic plan's\n";
    }
    size_t weight_bytes = 0;
    for (const Value* c : plan_->constants) weight_bytes += c->constant->nbytes();
    report_ += fmt::format("steps: {} ({} oneDNN primitives with {} fused post-ops, {} on the reference kernels), {} value slots\n",
                           cp_->steps.size(), nprim, fused, cp_->steps.size() - nprim, plan_->slots);
    report_ += fmt::format("weights: {:.1f} MiB\n", double(weight_bytes) / (1 << 20));
    if (config_.deterministic) {
      report_ += "deterministic: yes (the same bits whatever the thread count; group and instance normalization "
                 "statistics on the reference kernels)\n";
    }
    if (!prims.empty()) {
      report_ += "oneDNN:";
      for (const auto& [k, c] : prims) report_ += fmt::format(" {} x{};", k, c);
      report_.back() = '\n';
    }
    if (!host.empty()) {
      report_ += "reference kernels:";
      for (const auto& [k, c] : host) report_ += fmt::format(" {} x{}", k, c);
      report_ += "\n";
    }
  }

  std::string report() const override { return report_; }
  size_t reordered_weight_bytes() const override { return reordered_; }
  size_t weight_bytes() const override {
    size_t b = 0;
    for (const Value* c : plan_->constants) b += c->constant->nbytes();
    return b;
  }
  double build_ms() const override { return 0; }
  nlohmann::json target() const override {
    std::string lib;
    fast_cpu_available(&lib);
    return {{"cpu", "x86_64"}, {"library", lib}};
  }
  Expected<std::map<std::string, std::string>> sections() const override {
    return std::map<std::string, std::string>{{"CPUF", write_cpu_plan(*cp_)}};
  }
  Expected<std::unique_ptr<Session::Impl>> create_session(void*) const override {
    if (has_symbolic_inputs(*plan_->graph) && fast_cpu_available(nullptr)) {
      return std::unique_ptr<Session::Impl>(new DynamicFastCpuSession(plan_, config_));
    }
    std::unique_ptr<CpuRunner> spare;
    {
      std::lock_guard<std::mutex> lock(spare_mu_);
      spare = std::move(spare_);
    }
    if (spare) return std::unique_ptr<Session::Impl>(new FastCpuSession(std::move(spare), plan_, cp_));
    auto r = CpuRunner::create(plan_, cp_);
    if (r) return std::unique_ptr<Session::Impl>(new FastCpuSession(std::move(*r), plan_, cp_));
    if (r.status().code() != ErrorCode::kUnsupported) return r.status();
    // Without oneDNN the plan still runs, every step on the reference kernels.
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr, "kiln: warning: the CPU runs on the reference kernels: %s\n", r.status().message().c_str());
    });
    KILN_RETURN_IF_ERROR(verify_cpu_kernels(*plan_));
    return cpu_session(plan_);
  }

 private:
  std::shared_ptr<const Plan> plan_;
  std::shared_ptr<const CpuPlan> cp_;
  BuildConfig config_;
  std::string report_;
  mutable std::mutex spare_mu_;
  mutable std::unique_ptr<CpuRunner> spare_;  // describe()'s runner, until the first session takes it
  size_t reordered_ = 0;                      // its reordered weights' bytes (each session has its own)
};

}  // namespace

Expected<std::shared_ptr<DeviceEngine>> build_fast_cpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& config) {
  KILN_ASSIGN_OR_RETURN(CpuPlan cp, plan_fast_cpu(*plan, config.deterministic));
  auto e = std::make_shared<FastCpuEngine>(plan, std::make_shared<const CpuPlan>(std::move(cp)), config);
  e->describe();
  return std::shared_ptr<DeviceEngine>(e);
}

// The file's CPU plan when it is the one this kiln makes for the graph; otherwise (a file from a
// kiln whose fast backend claimed other ops: the whole file passed its checksum, so not damage) the
// plan is made again from the graph, which it is a function of, and the report says so.
Expected<std::shared_ptr<DeviceEngine>> load_fast_cpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& config,
                                                             std::string_view cpuf, const std::string& name) {
  Expected<CpuPlan> cp = read_cpu_plan(cpuf, *plan, name, config.deterministic);
  std::string note;
  if (!cp) {
    note = fmt::format("CPU plan made again at load ({})\n", cp.status().message());
    cp = plan_fast_cpu(*plan, config.deterministic);
    if (!cp) return cp.status();
  }
  auto e = std::make_shared<FastCpuEngine>(plan, std::make_shared<const CpuPlan>(std::move(*cp)), config);
  e->describe(note);
  return std::shared_ptr<DeviceEngine>(e);
}

}  // namespace kiln
