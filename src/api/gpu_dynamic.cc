// Dynamic GPU engines: one engine for ranges of input shapes (BuildConfig::shape_ranges) that runs
// any shape in them. Each exact shape gets a shape plan of its own: the graph as imported (before the
// passes) copied with its inputs bound to that shape and optimized as a static build of that shape
// would be (specialize_graph: shape arithmetic folded, fusions that need static shapes made, every
// kernel's dims exact), lowered with the autotuned choices of the nearest shape the build timed
// (TimingCache::nearest: nothing is timed while serving), its weights taken from one pool that
// every plan shares (backends/cuda/weight_pool.h). Plans are made on the first run at a shape and
// kept for the most recent shapes; a session keeps a CUDA session (arena, captured graphs) per
// recent shape.
//
// The build times the choices at a grid of shapes: every symbol at its opt value, then each symbol
// in turn at its min, max and the powers of two between with their quarter points, the others at opt and
// again at their min. Those plans are made at build (the most recent of them kept), and a CUDA
// session of each is made once and dropped, which loads the kernels new shapes will launch (warm).
// A saved dynamic engine carries the graph and its weights and the timing cache the build left
// (TUNE): loading times nothing, makes the grid's plans again without timing and warms them.
//
// Value inputs (passes/value_inputs.h: a TopK's k, Slice bounds, reduction axes fed by the caller)
// key the plans too: each run reads them on the host (from device memory, a synchronisation) and a
// plan is made per distinct value with the value bound as a constant. Such an engine makes no plan
// at build (the values are not known yet); the report names the inputs.
#ifdef KILN_HAVE_CUDA
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "api/gpu_common.h"
#include "api/step_times.h"
#include "backends/cuda/device.h"
#include "backends/cuda/nvrtc.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/weight_pool.h"
#include "passes/derived_constants.h"
#include "passes/value_inputs.h"

namespace kiln {

namespace {

using Shapes = std::vector<std::vector<int64_t>>;
using Values = std::vector<std::pair<size_t, Tensor>>;  // value inputs: index into the graph's inputs, value
// A plan's key: the exact input shapes and the bytes of each value input.
using PlanKey = std::pair<Shapes, std::vector<std::string>>;

PlanKey plan_key(Shapes s, const Values& values) {
  std::vector<std::string> bytes;
  for (const auto& [i, t] : values) bytes.emplace_back(static_cast<const char*>(t.raw()), t.nbytes());
  return {std::move(s), std::move(bytes)};
}

// Shape plans an engine keeps, and CUDA sessions (each an arena and captured graphs) a session keeps.
constexpr size_t kKeptPlans = 32;
constexpr size_t kKeptSessions = 8;

struct ShapePlan {
  Shapes shapes;
  std::unique_ptr<Graph> graph;  // before the engine: its host steps read the graph's nodes
  std::shared_ptr<cuda::Engine> engine;
  double make_ms = 0, specialize_ms = 0;  // all of it; binding the shapes and the passes
  SpecializeStats stats;
  uint64_t last_use = 0;
  bool kept = false;  // the reference plan or a warm shape's (BuildConfig::warm_shapes): never dropped
};

// The shared device bytes a plan's session places its arena and workspace in (+ the session's
// alignment).
size_t shared_device_bytes(const cuda::BuildReport& r) { return r.arena_peak + r.workspace_bytes + 1024; }

// An input dim: fixed, or the symbol whose value it takes.
struct InputDim {
  int64_t fixed = -1;
  std::string symbol;
};

class DynamicGpuEngine : public DeviceEngine, public std::enable_shared_from_this<DynamicGpuEngine> {
 public:
  // Why a plan is made: at build, its choices timed where the timing cache lacks them; a loaded
  // engine's reference plan and its other grid plans; a shape met while running. Only the build's
  // plans and the reference, one of which the engine's report shows, record which pass removed each
  // node; only plans made while running count in the report's first-run line.
  enum class PlanUse { kTuned, kReference, kLoaded, kRunning };

  DynamicGpuEngine(std::shared_ptr<const Plan> plan, BuildConfig c, std::shared_ptr<cuda::TimingCache> cache)
      : plan_(std::move(plan)), config_(std::move(c)), cache_(std::move(cache)),
        pool_(std::make_shared<cuda::WeightPool>()), scratch_(std::make_shared<cuda::BuildScratch>()) {}

  // Reads the inputs' dims, the symbols' ranges and the value inputs; kUnsupported for a symbolic dim
  // with no range.
  Status init() {
    value_inputs_ = value_inputs(*plan_->graph);
    ranges_ = symbol_ranges(*plan_->graph, config_.shape_ranges);
    for (auto& [sym, r] : ranges_) {
      if (r.opt == 0) r.opt = r.max;
    }
    for (const Value* v : plan_->graph->inputs) {
      if (!v->type.shape) return KILN_ERROR(kUnsupported, "input '{}' has no known rank: give it a shape", v->name);
      std::vector<InputDim> dims;
      for (size_t k = 0; k < v->type.shape->rank(); ++k) {
        const Dim& d = v->type.shape->dims[k];
        if (d.is_static()) {
          dims.push_back({d.value(), ""});
          continue;
        }
        const std::string sym = d.to_string();
        if (!d.is_symbolic() || !ranges_.count(sym)) {
          return KILN_ERROR(kUnsupported, "input '{}' dimension {} ('{}') has no range: the GPU engine needs one (--shapes "
                            "{}:MIN..MAX per dim) or a fixed shape", v->name, k, sym, v->name);
        }
        dims.push_back({-1, sym});
      }
      dims_.push_back(std::move(dims));
    }
    if (!config_.warm_shapes.empty() && !value_inputs_.empty()) {
      return KILN_ERROR(kInvalidArgument, "warm shapes: the engine reads value inputs at each run and plans per value; "
                        "it has no shape to warm ahead");
    }
    for (const auto& given : config_.warm_shapes) {
      KILN_ASSIGN_OR_RETURN(Shapes s, warm_shape(given));
      warm_shapes_.push_back(std::move(s));
    }
    return Status::ok();
  }

  // A warm shape's every input from the dims it gives some of them (the others take the symbols
  // they share); one-line errors name the input and dim.
  Expected<Shapes> warm_shape(const std::map<std::string, std::vector<int64_t>>& given) const {
    const Graph& g = *plan_->graph;
    std::map<std::string, int64_t> bound;
    for (const auto& [name, d] : given) {
      size_t i = 0;
      while (i < g.inputs.size() && g.inputs[i]->name != name) ++i;
      if (i == g.inputs.size()) return KILN_ERROR(kInvalidArgument, "warm shape: the model has no input '{}'", name);
      if (d.size() != dims_[i].size()) {
        return KILN_ERROR(kInvalidArgument, "warm shape: input '{}' has {} dims, not {}", name, dims_[i].size(), d.size());
      }
      for (size_t k = 0; k < d.size(); ++k) {
        const InputDim& x = dims_[i][k];
        if (x.symbol.empty()) {
          if (d[k] != x.fixed) {
            return KILN_ERROR(kInvalidArgument, "warm shape: input '{}' dimension {} is {}, fixed at {}", name, k, d[k], x.fixed);
          }
          continue;
        }
        const DimRange& r = ranges_.at(x.symbol);
        if (d[k] < r.min || d[k] > r.max) {
          return KILN_ERROR(kInvalidArgument, "warm shape: input '{}' dimension {} ('{}') is {}, outside its range {}..{}",
                            name, k, x.symbol, d[k], r.min, r.max);
        }
        auto [it, fresh] = bound.emplace(x.symbol, d[k]);
        if (!fresh && it->second != d[k]) {
          return KILN_ERROR(kInvalidArgument, "warm shape: '{}' is {} in input '{}' and {} elsewhere", x.symbol, d[k], name,
                            it->second);
        }
      }
    }
    for (size_t i = 0; i < dims_.size(); ++i) {
      for (const InputDim& x : dims_[i]) {
        if (!x.symbol.empty() && !bound.count(x.symbol)) {
          return KILN_ERROR(kInvalidArgument, "warm shape: '{}' (input '{}') is not given", x.symbol, g.inputs[i]->name);
        }
      }
    }
    return shapes_of(bound);
  }

  // The build's grid of shapes: every symbol at its opt value, then each symbol in turn at its min,
  // max and the powers of two between with their quarter points, the others at opt and again at
  // their min.
  std::vector<Shapes> grid() const {
    std::map<std::string, int64_t> base, low;
    for (const auto& [sym, r] : ranges_) {
      base[sym] = r.opt;
      low[sym] = r.min;
    }
    std::vector<std::map<std::string, int64_t>> grid = {base};
    for (const auto& [sym, r] : ranges_) {
      // Powers of two and the quarter points between them (5, 6 and 7 x 2^k): a choice timed at a
      // shape within ~1.12x of the run's. GEMM tiles are chosen by how the tiles fill the SMs' waves,
      // which a few percent of rows can change: tiles chosen at m = 1024 ran BERT at m = 1365 27%
      // slower than its own, and tiles chosen at m = 3072 ran m = 2560 (5 x 512) 24% slower when the
      // grid had only the halfway points.
      std::vector<int64_t> values = {r.min, r.max};
      for (int64_t p = 1; p < r.max; p *= 2) {
        for (int64_t x : {p, p + p / 4, p + p / 2, p + 3 * p / 4}) {
          if (x > r.min && x < r.max && std::find(values.begin(), values.end(), x) == values.end()) values.push_back(x);
        }
      }
      // Along each symbol with the others at opt, and again with them at min: a GEMM's rows are the
      // product of several symbols (batch x sequence), and without the second line the smallest
      // products (a short sequence at batch 1) took tiles timed at 16x more rows.
      for (const auto* origin : {&base, &low}) {
        for (int64_t x : values) {
          auto a = *origin;
          a[sym] = x;
          if (std::find(grid.begin(), grid.end(), a) == grid.end()) grid.push_back(a);
        }
      }
    }
    std::vector<Shapes> out;
    for (const auto& a : grid) out.push_back(shapes_of(a));
    return out;
  }

  // Times the choices at the build's grid of shapes; their plans are kept. With value inputs there
  // is nothing to lower before the first run.
  Status tune(const std::string& cache_source) {
    cache_line_ = fmt::format("timing cache: {}\n", cache_source);
    if (!value_inputs_.empty()) return Status::ok();
    auto t0 = std::chrono::steady_clock::now();
    cuda::SharedSessionMemory memory;
    for (const Shapes& s : grid()) {
      KILN_ASSIGN_OR_RETURN(auto p, plan_for(s, {}, PlanUse::kTuned));
      tuned_ += fmt::format("  {}: {:.0f} ms, arena {:.1f} MiB\n", shapes_text(*plan_->graph, s), p->make_ms,
                            double(p->engine->report().arena_peak) / (1 << 20));
      if (!reference_) {
        reference_ = p;
        keep(*p);
        reserve(memory);
      }
      warm(*p, memory);
    }
    KILN_RETURN_IF_ERROR(keep_warm_shapes(PlanUse::kTuned, memory));
    tune_ms_ = ms_since(t0);
    cache_line_ = fmt::format("timing cache: {}, {} choices reused, {} timed\n", cache_source, cache_->hits(), cache_->misses());
    warn_cpu_nodes(reference_->engine->report());
    return Status::ok();
  }

  // A loaded engine: the plan at every symbol's opt value, made now (nothing timed: the file's
  // TUNE has the build's choices), so a load that cannot run fails here; then the grid warmed.
  Status prepare() {
    if (!value_inputs_.empty()) return Status::ok();
    const std::vector<Shapes> shapes = grid();
    KILN_ASSIGN_OR_RETURN(reference_, plan_for(shapes[0], {}, PlanUse::kReference));
    keep(*reference_);
    cuda::SharedSessionMemory memory;
    reserve(memory);
    for (const Shapes& s : shapes) {
      auto p = plan_for(s, {}, PlanUse::kLoaded);
      if (p) warm(**p, memory);
    }
    return keep_warm_shapes(PlanUse::kLoaded, memory);
  }

  // The warm shapes' plans, made (timed at build: their choices are their own) and kept.
  Status keep_warm_shapes(PlanUse use, cuda::SharedSessionMemory& memory) {
    for (const Shapes& s : warm_shapes_) {
      KILN_ASSIGN_OR_RETURN(auto p, plan_for(s, {}, use));
      keep(*p);
      warm(*p, memory);
    }
    return Status::ok();
  }
  const std::vector<Shapes>& warm_shapes() const { return warm_shapes_; }
  // Marks a plan as never dropped (plans are marked at build or load, before any session exists).
  void keep(ShapePlan& p) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_ += !p.kept;
    p.kept = true;
  }

  // Makes a CUDA session for a grid shape's plan (in `memory`) and drops it: capturing the plan's
  // graph launches its kernels, which loads the modules they live in. CUDA loads modules lazily, at
  // a kernel's first launch in the process, and a new shape takes the choices of the grid shapes
  // nearest it, so without this its first run loaded those kernels (cuBLASLt's and cuDNN's) itself:
  // 20-30 ms more on a BERT or a ResNet-50 whose engine was loaded or built from a timing cache
  // (bench/RESULTS.md). A shape that fails here is left to its first run, which reports the error.
  void warm(const ShapePlan& p, cuda::SharedSessionMemory& memory) {
    auto t0 = std::chrono::steady_clock::now();
    auto session = p.engine->new_session(nullptr, &memory);
    warmed_ += bool(session);
    warm_ms_ += ms_since(t0);
  }

  // The plan for exact input shapes `s` and the value inputs' `values`, made on first use.
  Expected<std::shared_ptr<ShapePlan>> plan_for(const Shapes& s, const Values& values, PlanUse use) {
    const bool time_misses = use == PlanUse::kTuned;
    const bool provenance = use == PlanUse::kTuned || use == PlanUse::kReference;
    std::lock_guard<std::mutex> lock(mu_);
    PlanKey key = plan_key(s, values);
    if (auto it = plans_.find(key); it != plans_.end()) {
      it->second->last_use = ++clock_;
      return it->second;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto p = std::make_shared<ShapePlan>();
    p->shapes = s;
    auto g = specialize_graph(*plan_->graph, s, config_, values, &derived_, &p->stats, provenance);
    if (!g) return with_shape(g.status(), s, values);
    p->graph = std::move(*g);
    p->specialize_ms = ms_since(t0);
    cuda::BuildOptions bo = build_options(config_);
    bo.timing_cache = cache_;
    bo.weight_pool = pool_;
    bo.build_scratch = scratch_;
    bo.time_misses = time_misses;
    bo.runtime_dim_kernels = true;  // one compilation of each generated kernel for every shape
    // cuDNN's operation-graph convolutions compile when finalized (a few hundred milliseconds each),
    // which a new shape's first run cannot afford: shape plans keep the legacy algorithms.
    bo.graph_conv = -1;
    auto e = cuda::Engine::build(*p->graph, bo);
    if (!e) return with_shape(e.status(), s, values);
    p->engine = std::move(*e);
    p->make_ms = ms_since(t0);
    p->last_use = ++clock_;
    if (use == PlanUse::kRunning) {  // what a new shape's first run pays
      const cuda::BuildReport& r = p->engine->report();
      ++run_made_;
      run_specialize_ms_ += p->specialize_ms;
      run_setup_ms_ += r.setup_ms;
      run_lower_ms_ += r.lower_ms;
      run_finish_ms_ += r.finish_ms;
      for (const auto& [op, ms] : r.lower_ms_by_op) run_lower_by_op_[op] += ms;
      run_last_finish_ = r.load_phases;
    }
    ++made_;
    made_ms_ += p->make_ms;
    specialize_ms_ += p->specialize_ms;
    second_rounds_ += p->stats.rounds > 1;
    clone_ms_ += p->stats.clone_ms;
    infer_ms_ += p->stats.infer_ms;
    passes_ms_ += p->stats.passes_ms;
    plans_[std::move(key)] = p;
    // The least recently used goes, never the reference or a warm shape's; sessions running a plan
    // keep it alive.
    while (plans_.size() > kKeptPlans + kept_) {
      auto lru = plans_.end();
      for (auto it = plans_.begin(); it != plans_.end(); ++it) {
        if (!it->second->kept && (lru == plans_.end() || it->second->last_use < lru->second->last_use)) lru = it;
      }
      if (lru == plans_.end()) break;
      plans_.erase(lru);
    }
    return p;
  }

  std::string report() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out = fmt::format(
        "dynamic GPU engine: one plan per exact input shape, lowered on the first run at it with the choices timed at the "
        "nearest shape below (nothing timed while running), the last {} kept; a session keeps the CUDA graphs of its last "
        "{} shapes, all in one arena (sized for the opt shape, grown for a larger one)\n",
        kKeptPlans, kKeptSessions);
    if (!value_inputs_.empty()) {
      std::string names;
      for (size_t i : value_inputs_) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", plan_->graph->inputs[i]->name);
      out += fmt::format("value inputs {}: read on the host before each run (a synchronisation when they are on the GPU); "
                         "a plan per distinct value, none made at build\n", names);
    }
    if (!tuned_.empty()) out += fmt::format("tuned at {:.0f} ms over these shapes:\n{}", tune_ms_, tuned_);
    const cuda::NvrtcStats nv = cuda::nvrtc_stats();
    const cuda::SessionInitStats si = cuda::session_init_stats();
    out += fmt::format("shape plans made so far: {} in {:.0f} ms (shapes bound and passes {:.0f}: copy {:.0f}, shape inference "
                       "{:.0f}, passes {:.0f}; lowering {:.0f}; in this "
                       "process NVRTC compiled {} generated kernels in {:.0f} ms, {} came from the disk cache); weights "
                       "{:.1f} MiB on the GPU, shared by every plan ({} derived by the passes, reused {} times); the passes ran "
                       "twice for {} of them; {} CUDA sessions made for shapes in {:.0f} ms (in this process {} sessions: "
                       "handles {:.0f} ms, memory {:.0f}, eager forward {:.0f} in {} of them, graph capture {:.0f})\n", made_,
                       made_ms_, specialize_ms_, clone_ms_, infer_ms_, passes_ms_, made_ms_ - specialize_ms_, nv.compiled, nv.compile_ms, nv.cached,
                       double(pool_->device_bytes()) / (1 << 20), derived_.made(), derived_.reused(), second_rounds_,
                       sessions_made_, sessions_ms_, si.sessions, si.handles_ms, si.memory_ms, si.eager_ms, si.eager_runs, si.capture_ms);
    if (warmed_) {
      out += fmt::format("grid warmed: a CUDA session made and dropped for {} plans (the grid's and the warm shapes') in "
                         "{:.0f} ms (loads the kernels they launch, which new shapes share)\n", warmed_, warm_ms_);
    }
    if (!warm_shapes_.empty()) {
      std::string w;
      for (const Shapes& x : warm_shapes_) w += fmt::format("{}{}", w.empty() ? "" : "; ", shapes_text(*plan_->graph, x));
      out += fmt::format("warm shapes: {} (planned at build and load and kept; a new session captures the first {} before "
                         "its first run)\n", w, kKeptSessions);
    }
    if (run_made_) {
      const double n = run_made_;
      out += fmt::format("shape plans made while running: {}, on average {:.1f} ms each (shapes bound and passes {:.1f}, "
                         "setup with the handles and workspace {:.1f}, lowering {:.1f}, weights and binding {:.1f})\n", run_made_,
                         (run_specialize_ms_ + run_setup_ms_ + run_lower_ms_ + run_finish_ms_) / n, run_specialize_ms_ / n,
                         run_setup_ms_ / n, run_lower_ms_ / n, run_finish_ms_ / n);
      std::vector<std::pair<std::string, double>> by_op(run_lower_by_op_.begin(), run_lower_by_op_.end());
      std::sort(by_op.begin(), by_op.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
      std::string ops;
      for (size_t i = 0; i < by_op.size() && i < 6; ++i) ops += fmt::format("{}{} {:.1f}", i ? ", " : "", by_op[i].first, by_op[i].second / n);
      out += fmt::format("  lowering by op, ms a plan: {}; the last one's weights and binding: {}\n", ops, run_last_finish_);
    }
    if (sessions_made_) {
      const double n = sessions_made_;
      out += fmt::format("CUDA sessions made while running: {}, on average {:.1f} ms each (handles {:.1f}, memory {:.1f}, "
                         "graph capture {:.1f}, eager forward {:.1f})\n", sessions_made_, sessions_ms_ / n,
                         session_handles_ms_ / n, session_memory_ms_ / n, session_capture_ms_ / n, session_eager_ms_ / n);
    }
    out += cache_line_;
    if (reference_) {
      out += fmt::format("reference plan ({}):\n{}", shapes_text(*plan_->graph, reference_->shapes),
                         reference_->engine->report().to_text());
    }
    return out;
  }
  size_t weight_bytes() const override { return pool_->device_bytes(); }
  // A CUDA session made for a shape while running: its time, and the process's session counters
  // before and after (cuda::session_init_stats: where it went).
  void note_session(double ms, const cuda::SessionInitStats& before, const cuda::SessionInitStats& after) const {
    std::lock_guard<std::mutex> lock(mu_);
    ++sessions_made_;
    sessions_ms_ += ms;
    session_handles_ms_ += after.handles_ms - before.handles_ms;
    session_memory_ms_ += after.memory_ms - before.memory_ms;
    session_capture_ms_ += after.capture_ms - before.capture_ms;
    session_eager_ms_ += after.eager_ms - before.eager_ms;
  }
  double build_ms() const override { return tune_ms_; }
  std::string load_phases() const override { return load_phases_; }
  nlohmann::json target() const override { return target_json(cuda::current_target()); }
  bool graph_weights() const override { return true; }
  std::shared_ptr<const Plan> engine_file_plan() const override { return plan_; }
  Expected<std::map<std::string, std::string>> sections() const override {
    std::map<std::string, std::string> m;
    m.emplace("TUNE", cache_->to_text(/*only_used=*/true));
    return m;
  }
  Expected<std::unique_ptr<Session::Impl>> create_session(void* comm) const override;

  const Graph& graph() const { return *plan_->graph; }
  const std::vector<size_t>& value_input_indices() const { return value_inputs_; }
  // The least a session's shared memory starts with: the reference plan's arena, workspace and
  // staging (every symbol at its opt value, by default its max), so that smaller shapes fit in it.
  void reserve(cuda::SharedSessionMemory& m) const {
    if (!reference_) return;
    const cuda::BuildReport& r = reference_->engine->report();
    m.reserve_device = shared_device_bytes(r);
    m.reserve_host = r.staging_bytes;
  }
  std::string load_phases_;

 private:
  Shapes shapes_of(const std::map<std::string, int64_t>& values) const {
    Shapes s;
    for (const auto& dims : dims_) {
      std::vector<int64_t> x;
      for (const InputDim& d : dims) x.push_back(d.symbol.empty() ? d.fixed : values.at(d.symbol));
      s.push_back(std::move(x));
    }
    return s;
  }
  Status with_shape(const Status& st, const Shapes& s, const Values& values) const {
    return Status(st.code(), fmt::format("shape plan for {}: {}", shapes_text(*plan_->graph, s, values), st.message()));
  }

  std::shared_ptr<const Plan> plan_;  // the graph with ranged dims before the passes, and its weights
  BuildConfig config_;
  std::shared_ptr<cuda::TimingCache> cache_;
  std::shared_ptr<cuda::WeightPool> pool_;
  std::shared_ptr<cuda::BuildScratch> scratch_;  // the lowerings' handles and workspace, kept between plans
  DerivedConstants derived_;  // weights the passes make, shared by every plan's graph
  std::map<std::string, DimRange> ranges_;
  std::vector<std::vector<InputDim>> dims_;  // per input
  std::vector<size_t> value_inputs_;
  std::vector<Shapes> warm_shapes_;  // BuildConfig::warm_shapes, every input's dims
  size_t kept_ = 0;                  // plans never dropped (ShapePlan::kept)

  mutable std::mutex mu_;
  std::map<PlanKey, std::shared_ptr<ShapePlan>> plans_;
  std::shared_ptr<ShapePlan> reference_;  // the first tuned plan (every symbol at opt): the report's
  uint64_t clock_ = 0;
  int made_ = 0;
  double made_ms_ = 0, specialize_ms_ = 0, tune_ms_ = 0;
  int second_rounds_ = 0;                      // plans whose passes ran twice
  int run_made_ = 0;                           // plans made while running, and where their time went
  double run_specialize_ms_ = 0, run_setup_ms_ = 0, run_lower_ms_ = 0, run_finish_ms_ = 0;
  std::map<std::string, double> run_lower_by_op_;  // lowering time per op kind, summed over the plans made while running
  std::string run_last_finish_;
  double clone_ms_ = 0, infer_ms_ = 0, passes_ms_ = 0;  // of specialize_ms_
  mutable int sessions_made_ = 0;              // CUDA sessions made by this engine's sessions, and their time
  mutable double sessions_ms_ = 0;
  mutable double session_handles_ms_ = 0, session_memory_ms_ = 0, session_capture_ms_ = 0, session_eager_ms_ = 0;
  int warmed_ = 0;  // grid and warm-shape plans whose sessions were made once at build or load (warm), and the time
  double warm_ms_ = 0;
  std::string tuned_, cache_line_;
};

// A session: a CUDA session per recent shape, each with its own stream and graphs, all placed in one
// arena, workspace and pinned staging (cuda::SharedSessionMemory: a session's calls never overlap),
// sized for the reference plan at first and grown when a shape needs more. Growing drops the shapes'
// sessions placed in the old memory (they are made again when their shape returns).
class DynamicGpuSession : public Session::Impl {
 public:
  explicit DynamicGpuSession(std::shared_ptr<DynamicGpuEngine> e) : e_(std::move(e)) { e_->reserve(memory_); }

  // The shared memory, then the warm shapes' CUDA sessions (BuildConfig::warm_shapes; as many as the
  // session keeps), made before the first run so that a run at one of them finds its graphs captured.
  Status start() {
    // The arena, workspace and pinned staging now, not in the first run: for the opt shape and the
    // warm shapes (so that a larger warm shape does not drop the ones captured before it).
    const std::vector<Shapes>& w = e_->warm_shapes();
    size_t device = 0, host = 0;
    for (size_t i = 0; i < w.size() && i < kKeptSessions; ++i) {
      KILN_ASSIGN_OR_RETURN(std::shared_ptr<ShapePlan> p, e_->plan_for(w[i], {}, DynamicGpuEngine::PlanUse::kLoaded));
      const cuda::BuildReport& r = p->engine->report();
      device = std::max(device, shared_device_bytes(r));
      host = std::max(host, r.staging_bytes);
    }
    if (memory_.reserve_device || device) KILN_RETURN_IF_ERROR(cuda::ensure_shared(memory_, device, host));
    for (size_t i = 0; i < w.size() && i < kKeptSessions; ++i) {
      KILN_RETURN_IF_ERROR(session_at(w[i], {}, /*running=*/false).status());
    }
    return Status::ok();
  }
  ~DynamicGpuSession() override {
    std::lock_guard<std::recursive_mutex> lock(cuda::device_mutation_mutex());
    sessions_.clear();
    memory_ = {};
  }

  Expected<std::vector<Data>> run(std::vector<Data> inputs) override {
    KILN_ASSIGN_OR_RETURN(cuda::Session * s, session_for(inputs));
    return finished(s, s->run(inputs));
  }
  // Queued runs (wait false) of different shapes use different sessions on their own streams and
  // one arena: each waits for the caller's stream, which waits for the run before, so they never
  // overlap as long as the caller queues them all on one stream (Session::enqueue says so).
  Status run_device(const std::vector<TensorView>& inputs, const std::vector<TensorView>& outputs, void* stream,
                    bool wait) override {
    Shapes shapes;
    for (const TensorView& v : inputs) shapes.push_back(v.shape);
    if (inputs.size() != this->inputs.size()) {
      return KILN_ERROR(kInvalidArgument, "expected {} inputs, got {}", this->inputs.size(), inputs.size());
    }
    KILN_RETURN_IF_ERROR(check_run_shapes(this->inputs, shapes));
    Values values;
    for (size_t i : e_->value_input_indices()) {
      const TensorView& v = inputs[i];
      if (v.dtype != this->inputs[i].dtype) {
        return KILN_ERROR(kInvalidArgument, "input '{}' is {}, the engine takes {}", this->inputs[i].name,
                          dtype_name(v.dtype), dtype_name(this->inputs[i].dtype));
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(v.dtype, v.shape));
      if (v.on_device) {
        std::string err = cuda::copy_to_host(t.raw(), v.data, t.nbytes(), stream);
        if (!err.empty()) return KILN_ERROR(kInternal, "input '{}': reading its value from the GPU: {}", this->inputs[i].name, err);
      } else {
        std::memcpy(t.raw(), v.data, t.nbytes());
      }
      values.emplace_back(i, std::move(t));
    }
    KILN_ASSIGN_OR_RETURN(cuda::Session * s, session_at(shapes, values));
    std::vector<cuda::IoBuffer> in, out;
    for (const TensorView& v : inputs) in.push_back({v.dtype, v.shape, v.data, v.on_device});
    for (const TensorView& v : outputs) out.push_back({v.dtype, v.shape, v.data, v.on_device});
    Status st = finished(s, s->run_buffers(in, out, stream, wait));
    queued_ = st && !wait ? s : nullptr;  // waited for, or failed (finished() waited)
    return st;
  }
  Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) override {
    KILN_ASSIGN_OR_RETURN(cuda::Session * s, session_for(inputs));
    return finished(s, s->benchmark(inputs, warmup, iterations));
  }
  Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) override {
    KILN_ASSIGN_OR_RETURN(cuda::Session * s, session_for(inputs));
    KILN_ASSIGN_OR_RETURN(auto steps, finished(s, s->profile(inputs)));
    for (const auto& [key, e] : sessions_) {  // the shape's plan: its graph names the steps' nodes
      if (e.session.get() == s) return step_times(std::move(steps), *e.plan->graph, e.plan->engine->report());
    }
    return KILN_ERROR(kInternal, "profile: the session of this shape is gone");
  }
  Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<Data>& inputs) override {
    KILN_ASSIGN_OR_RETURN(cuda::Session * s, session_for(inputs));
    return finished(s, nonfinite_steps(s, inputs));
  }
  size_t device_bytes() const override {
    size_t b = memory_.device_bytes;
    for (const auto& [shape, x] : sessions_) b += x.session->device_bytes();
    return b;
  }

 private:
  struct Entry {
    std::shared_ptr<ShapePlan> plan;  // before the session, which runs the plan's engine
    std::unique_ptr<cuda::Session> session;
    uint64_t last_use = 0;
  };

  // r, once s's work is done: the shapes' sessions share memory, and a failed call may return with
  // work still queued.
  template <typename R>
  R finished(cuda::Session* s, R r) {
    if (!r) s->wait();
    return r;
  }

  // The shapes' sessions share one arena, each on its own stream: a run queued without waiting
  // (Session::enqueue) ends before another session's work starts.
  void settle(cuda::Session* next) {
    if (queued_ && queued_ != next) queued_->wait();
    if (queued_ != next) queued_ = nullptr;
  }
  cuda::Session* queued_ = nullptr;  // the session whose run may still be queued

  Expected<cuda::Session*> session_for(const std::vector<Data>& inputs) {
    Shapes shapes;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].is_tensor()) return KILN_ERROR(kInvalidArgument, "input {}: the GPU engine takes tensors", i);
      shapes.push_back(inputs[i].tensor.dims());
    }
    Values values;
    for (size_t i : e_->value_input_indices()) {
      if (i < inputs.size()) values.emplace_back(i, inputs[i].tensor);
    }
    return session_at(shapes, values);
  }

  // `running`: made for a run (counted in the engine's report), not ahead of time for a warm shape.
  Expected<cuda::Session*> session_at(const Shapes& shapes, const Values& values, bool running = true) {
    PlanKey key = plan_key(shapes, values);
    if (auto it = sessions_.find(key); it != sessions_.end()) {
      it->second.last_use = ++clock_;
      settle(it->second.session.get());
      return it->second.session.get();
    }
    settle(nullptr);  // a new session readies itself with a forward in the shared arena (and may evict)
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<ShapePlan> p, e_->plan_for(shapes, values, DynamicGpuEngine::PlanUse::kRunning));
    if (sessions_.size() >= kKeptSessions) {  // the least recently used shape's arena goes first
      auto lru = std::min_element(sessions_.begin(), sessions_.end(),
                                  [](const auto& a, const auto& b) { return a.second.last_use < b.second.last_use; });
      sessions_.erase(lru);
    }
    // A shape that needs more memory than the current blocks (the session would make larger ones,
    // cuda::SharedSessionMemory): the sessions placed in them go first, so that the larger blocks
    // are not made beside them and no session is left in memory that is no longer current.
    const cuda::BuildReport& r = p->engine->report();
    if ((memory_.device && memory_.device_bytes < shared_device_bytes(r)) ||
        (memory_.host && memory_.host_bytes < r.staging_bytes)) {
      std::lock_guard<std::recursive_mutex> lock(cuda::device_mutation_mutex());
      sessions_.clear();
      memory_.device.reset();
      memory_.host.reset();
      memory_.device_bytes = memory_.host_bytes = 0;
    }
    auto t0 = std::chrono::steady_clock::now();
    const cuda::SessionInitStats before = cuda::session_init_stats();
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<cuda::Session> s, p->engine->new_session(nullptr, &memory_));
    if (running) e_->note_session(ms_since(t0), before, cuda::session_init_stats());
    Entry& e = sessions_[std::move(key)];
    e.plan = std::move(p);
    e.session = std::move(s);
    e.last_use = ++clock_;
    return e.session.get();
  }

  std::shared_ptr<DynamicGpuEngine> e_;  // makes plans as shapes arrive (an engine is shared, its plans are a cache)
  cuda::SharedSessionMemory memory_;     // before the sessions placed in it
  std::map<PlanKey, Entry> sessions_;
  uint64_t clock_ = 0;
};

Expected<std::unique_ptr<Session::Impl>> DynamicGpuEngine::create_session(void* comm) const {
  if (comm) return KILN_ERROR(kUnsupported, "a dynamic-shape engine is never one rank of a tensor-parallel engine");
  auto s = std::make_unique<DynamicGpuSession>(std::const_pointer_cast<DynamicGpuEngine>(shared_from_this()));
  KILN_RETURN_IF_ERROR(s->start());
  return std::unique_ptr<Session::Impl>(std::move(s));
}

}  // namespace

Expected<std::shared_ptr<DeviceEngine>> build_dynamic_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                                 std::shared_ptr<cuda::TimingCache> cache,
                                                                 std::string source) {
  auto e = std::make_shared<DynamicGpuEngine>(std::move(plan), c, std::move(cache));
  KILN_RETURN_IF_ERROR(e->init());
  KILN_RETURN_IF_ERROR(e->tune(source));
  return std::shared_ptr<DeviceEngine>(e);
}

Expected<std::shared_ptr<DeviceEngine>> load_dynamic_gpu_engine(std::shared_ptr<const Plan> plan, const BuildConfig& c,
                                                                std::string_view tune, const std::string& name) {
  auto t0 = std::chrono::steady_clock::now();
  auto cache = std::make_shared<cuda::TimingCache>(cuda::target_id(cuda::current_target()));
  KILN_RETURN_IF_ERROR(cache->merge_text(std::string(tune), name + " (TUNE section)"));
  auto e = std::make_shared<DynamicGpuEngine>(std::move(plan), c, std::move(cache));
  Status st = e->init();
  if (st) st = e->prepare();
  if (!st) return Status(st.code(), fmt::format("{}: {}", name, st.message()));
  e->load_phases_ = fmt::format("grid plans made and warmed in {:.1f} ms", ms_since(t0));
  return std::shared_ptr<DeviceEngine>(e);
}

}  // namespace kiln
#endif  // KILN_HAVE_CUDA
