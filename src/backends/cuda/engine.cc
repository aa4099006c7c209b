// Engine::build: constant folding, lowering with CPU fallback, memory planning, weight upload.
// The order matters: folding first (shape arithmetic must be host constants before the lowering
// reads Reshape targets or Slice bounds), then lowering in topological order (fusions look
// ahead at single consumers), then planning (lifetimes come from the emitted steps).
#include <algorithm>
#include <chrono>
#include <map>

#include "backends/cuda/device.h"
#include "backends/cuda/engine_impl.h"
#include "backends/backend.h"
#include "ops/op_registry.h"
#include "runtime/placement.h"
#include "runtime/memory_planner.h"
#include "support/dtype.h"

namespace kiln::cuda {

bool gpu_available(std::string* reason) {
  static const DeviceInfo info = probe_device();
  if (!info.available && reason) *reason = info.reason;
  return info.available;
}

namespace {

// Where the graph's inputs and outputs live on the device, as lowering defines them.
struct Stages {
  std::vector<DevValue> input_stage, output_stage;
};

bool static_shape(const Value* v) {
  if (!v->type.is_tensor() || !v->type.shape) return false;
  for (const Dim& d : v->type.shape->dims) {
    if (!d.is_static()) return false;
  }
  return true;
}

// Graph inputs arrive in their declared dtype; half builds cast them on the device.
Status lower_inputs(Lowering& L, Stages& e) {
  for (const Value* v : L.graph().inputs) {
    auto kdt = to_kdt(v->type.dtype);
    if (!kdt) return KILN_ERROR(kUnsupported, "input '{}' is {}: not supported on the GPU", v->name, v->type.to_string());
    const DevValue& stage = L.define(v, Layout::kRowMajor, *kdt);
    e.input_stage.push_back(stage);
    k::DT want = L.device_dt(v->type.dtype).value();
    if (want == *kdt) continue;
    DevValue staged = stage;
    L.staged_inputs[v] = staged;
    const DevValue& d = L.define(v, Layout::kRowMajor, want);
    emit_cast(L, nullptr, fmt::format("input '{}': kernel cast to {}", v->name, precision_name(L.options().precision)),
              *kdt, want, staged.ref, d.ref, d.numel());
    L.steps.back().drop_if_unread = true;
  }
  return Status::ok();
}

// Drops conversion steps whose output no later step reads and no output hands out (every reader
// of a converted input took the staged value itself).
void drop_unread_steps(Lowering& L, const Stages& e) {
  std::vector<bool> read(L.buffer_bytes.size(), false);
  for (const DevValue& d : e.output_stage) {
    if (!d.ref.weight) read[size_t(d.ref.id)] = true;
  }
  std::vector<Step> kept;
  for (size_t i = L.steps.size(); i-- > 0;) {  // backwards: readers are seen before writers
    Step& s = L.steps[i];
    const bool unread = std::none_of(s.writes.begin(), s.writes.end(), [&](int b) { return read[size_t(b)]; });
    if (s.drop_if_unread && unread) continue;
    for (int b : s.reads) read[size_t(b)] = true;
    kept.push_back(std::move(s));
  }
  std::reverse(kept.begin(), kept.end());
  L.steps = std::move(kept);
}

Status lower_outputs(Lowering& L, Stages& e) {
  for (const Value* v : L.graph().outputs) {
    KILN_ASSIGN_OR_RETURN(const DevValue* d, L.rowmajor(v));
    auto want = to_kdt(v->type.dtype);
    if (!want) return KILN_ERROR(kUnsupported, "output '{}' is {}: not supported on the GPU", v->name, v->type.to_string());
    if (d->dt == *want && !d->ref.weight) {
      e.output_stage.push_back(*d);
      continue;
    }
    // A separate output buffer: a dtype change, or a constant output (never hand out a weight).
    DevValue out = *d;
    out.dt = *want;
    out.ref = Ref{false, L.scratch(out.bytes())};
    emit_cast(L, nullptr, fmt::format("output '{}': kernel cast", v->name), d->dt, *want, d->ref, out.ref, out.numel());
    e.output_stage.push_back(out);
  }
  return Status::ok();
}

// Lifetimes from the steps: buffer b lives from the first step touching it to the last. Inputs
// are written before step 0 (by the host copy) and outputs read after the last step.
void plan_memory_of(const Lowering& L, const Stages& e, DevicePlan& dp) {
  size_t nb = L.buffer_bytes.size();
  int end = int(L.steps.size()) + 1;
  std::vector<BufferRequest> req(nb, BufferRequest{0, end, -1});
  auto touch = [&](int b, int at) {
    req[size_t(b)].first_step = std::min(req[size_t(b)].first_step, at);
    req[size_t(b)].last_step = std::max(req[size_t(b)].last_step, at);
  };
  for (const DevValue& d : e.input_stage) touch(d.ref.id, 0);
  for (size_t i = 0; i < L.steps.size(); ++i) {
    for (int b : L.steps[i].reads) touch(b, int(i) + 1);
    for (int b : L.steps[i].writes) touch(b, int(i) + 1);
  }
  for (const DevValue& d : e.output_stage) touch(d.ref.id, end);
  for (size_t b = 0; b < nb; ++b) {
    req[b].bytes = L.buffer_bytes[b];
    if (req[b].last_step < 0) req[b] = BufferRequest{0, 0, 0};  // never used
  }
  MemoryPlan p = plan_memory(req);
  dp.buffer_bytes.assign(L.buffer_bytes.begin(), L.buffer_bytes.end());
  dp.buffer_dtype = L.buffer_dtype;
  for (size_t b = 0; b < nb; ++b) {
    if (req[b].last_step < 0) dp.buffer_bytes[b] = 0;  // planned nowhere: holds nothing
  }
  dp.offsets.assign(p.offsets.begin(), p.offsets.end());
  dp.arena_peak = p.peak;
  dp.arena_naive = p.naive;
  dp.arena_lower_bound = p.lower_bound;
}

std::vector<DeviceIo> device_io(const std::vector<DevValue>& stages, const std::vector<Value*>& values) {
  std::vector<DeviceIo> r;
  for (size_t i = 0; i < stages.size(); ++i) {
    const DevValue& d = stages[i];
    r.push_back(DeviceIo{d.ref, uint8_t(d.dt), int32_t(values[i]->type.dtype), d.dims});
  }
  return r;
}

// The CUDA backend as the placer sees it (backends/backend.h): each node lowered by its family's
// lowering (lower_*.cc) or by a multi-node pattern rooted at it; a decline leaves no step behind.
class CudaStepBackend : public StepBackend {
 public:
  explicit CudaStepBackend(Lowering& L) : L_(L) {}
  std::string_view name() const override { return "cuda"; }
  const Node* fused_into(const Node& n) const override { return L_.fused_into(&n); }
  const Tensor* constant(const Value* v) const override { return L_.constant(v); }
  void set_constant(const Value* v, Tensor t) override { L_.set_constant(v, std::move(t)); }

  Expected<Lowered> lower(const Node& n) override {
    const auto t0 = std::chrono::steady_clock::now();
    Expected<Lowered> r = lower_timed(n);
    ms_by_op_[std::string(op_name(n.op))] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  Status lower_host(const Node& n) override { return lower_on_cpu(L_, n); }

  // Lowering time per ONNX op kind, declines included.
  const std::map<std::string, double>& ms_by_op() const { return ms_by_op_; }

 private:
  Expected<Lowered> lower_timed(const Node& n) {
    const size_t emitted = L_.steps.size();
    Status s;
    if (auto rp = L_.replacements.find(&n); rp != L_.replacements.end()) {
      s = lower_replacement(L_, n, rp->second);
    } else {
      auto it = table_.find(n.op);
      s = it == table_.end() ? KILN_ERROR(kUnsupported, "no CUDA lowering for {}", op_name(n.op)) : it->second(L_, n);
    }
    if (!s) {
      // A lowering may decline after emitting a step of its own (a patch copy before the GEMM
      // that then finds no algorithm): drop it, so the node's host step is its only work.
      L_.drop_steps_from(emitted);
      return s;
    }
    Lowered r;
    r.alias = L_.steps.size() == emitted;
    if (r.alias) r.impl = "no work (same buffer)";
    const std::string prefix = n.describe() + ": ";
    for (size_t i = emitted; i < L_.steps.size(); ++i) {  // every step the node became, in order
      const std::string& lb = L_.steps[i].label;
      r.impl += (r.impl.empty() ? "" : " + ") + (lb.rfind(prefix, 0) == 0 ? lb.substr(prefix.size()) : lb);
    }
    return r;
  }

  Lowering& L_;
  const std::map<OpKind, LowerFn>& table_ = lowering_table();
  std::map<std::string, double> ms_by_op_;
};

}  // namespace

struct BuildScratch::Impl {
  int device = -1;
  cudnnHandle_t dnn = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  ~Impl() {
    // On its own GPU and under the device lock, as every free is (a cudaFree during another
    // thread's graph capture breaks the capture).
    std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
    int current = -1;
    const bool moved = device >= 0 && cudaGetDevice(&current) == cudaSuccess && current != device &&
                       cudaSetDevice(device) == cudaSuccess;
    if (dnn) cudnnDestroy(dnn);
    if (lt) cublasLtDestroy(lt);
    if (workspace) cudaFree(workspace);
    if (moved) cudaSetDevice(current);
  }
  // Handles and a workspace of at least `bytes` on the current GPU, made on first use.
  Status ready(size_t bytes) {
    if (!dnn) KILN_CUDA_TRY(cudnnCreate(&dnn));
    if (!lt) KILN_CUDA_TRY(cublasLtCreate(&lt));
    if (workspace_bytes < bytes) {
      if (workspace) cudaFree(workspace);
      workspace = nullptr;
      workspace_bytes = 0;
      KILN_CUDA_TRY(cudaMalloc(&workspace, bytes));
      workspace_bytes = bytes;
    }
    return Status::ok();
  }
};

BuildScratch::BuildScratch() = default;
BuildScratch::~BuildScratch() = default;

namespace {

// Build-time handles and autotuning scratch: a build's own (freed on every path) or the caller's.
struct BuildResources {
  Lowering& L;
  BuildScratch::Impl own;
  BuildScratch::Impl* used = &own;
  ~BuildResources() {
    L.dnn = nullptr;  // the handles outlive the lowering only in the caller's scratch
    L.lt = nullptr;
    L.build_workspace = nullptr;
  }
  Status acquire(const BuildOptions& opt) {
    int dev = 0;
    KILN_CUDA_TRY(cudaGetDevice(&dev));
    if (BuildScratch* s = opt.build_scratch.get()) {
      if (!s->impl) s->impl = std::make_unique<BuildScratch::Impl>();
      if (s->impl->device < 0) s->impl->device = dev;
      if (s->impl->device == dev) used = s->impl.get();  // another GPU's scratch: a build of its own
    }
    KILN_RETURN_IF_ERROR(used->ready(opt.workspace_bytes));
    L.dnn = used->dnn;
    L.lt = used->lt;
    L.build_workspace = used->workspace;
    // Zeroed, as each session's workspace is: cuBLASLt's split-K reduction reads workspace bytes its
    // GEMM did not write (compute-sanitizer's initcheck), and timing should not depend on them.
    KILN_CUDA_TRY(cudaMemset(L.build_workspace, 0, opt.workspace_bytes));
    return Status::ok();
  }
};

// Lowers the graph to a device plan: records, memory plan, weights, I/O, placements.
Expected<DevicePlan> lower_graph(const Graph& g, const BuildOptions& opt, double& setup_ms,
                                 std::vector<std::pair<std::string, double>>& ms_by_op) {
  auto t0 = std::chrono::steady_clock::now();
  Lowering L(g, opt);
  BuildResources res{L};
  KILN_RETURN_IF_ERROR(res.acquire(opt));
  setup_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Stages e;
  KILN_RETURN_IF_ERROR(lower_inputs(L, e));
  find_patterns(L);
  CudaStepBackend backend(L);
  static const std::unique_ptr<Backend> cpu = make_cpu_backend();
  KILN_ASSIGN_OR_RETURN(std::vector<NodePlacement> rows, place_nodes(g, backend, *cpu));
  ms_by_op.assign(backend.ms_by_op().begin(), backend.ms_by_op().end());
  std::sort(ms_by_op.begin(), ms_by_op.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  KILN_RETURN_IF_ERROR(lower_outputs(L, e));
  std::vector<bool> pinned(L.buffer_bytes.size(), false);
  for (const DevValue& d : e.output_stage) {
    if (!d.ref.weight) pinned[size_t(d.ref.id)] = true;
  }
  compose_copy_steps(L, pinned);
  drop_unread_steps(L, e);

  DevicePlan dp;
  plan_memory_of(L, e, dp);
  dp.inputs = device_io(e.input_stage, g.inputs);
  dp.outputs = device_io(e.output_stage, g.outputs);
  dp.bad_index_slots = L.bad_index_slots();
  for (Step& st : L.steps) dp.steps.push_back(std::move(static_cast<DeviceStep&>(st)));
  for (auto& w : L.weight_data) dp.weight_store.emplace_back(w.begin(), w.end());
  L.weight_data.clear();
  dp.view_store();
  dp.pooled = std::move(L.pooled);
  add_provenance(g, rows);
  for (NodePlacement& r : rows) dp.placements.push_back({r.node, uint8_t(r.placement), r.impl, r.why});
  return dp;
}

}  // namespace

Expected<std::shared_ptr<Engine>> Engine::build(const Graph& g, const BuildOptions& opt) {
  std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
  auto t0 = std::chrono::steady_clock::now();
  std::string why;
  if (!gpu_available(&why)) return KILN_ERROR(kUnsupported, "no usable GPU: {}", why);
  for (const auto& v : g.values) {
    if (v->constant || v->type.kind != Type::Kind::kTensor) continue;
    if (!static_shape(v.get())) {
      return KILN_ERROR(kUnsupported, "value '{}' has shape {}: the CUDA engine needs static shapes (bind them with "
                        "--shapes NAME:DIMS or --batch, or give ranges: NAME:MIN..MAX per dim)", v->name,
                        v->type.to_string());
    }
  }
  auto e = std::make_shared<EngineImpl>(&g, opt);
  double setup_ms = 0;
  std::vector<std::pair<std::string, double>> ms_by_op;
  KILN_ASSIGN_OR_RETURN(e->plan, lower_graph(g, opt, setup_ms, ms_by_op));
  // The engine never lowers again: it keeps no share in the caller's scratch, which would otherwise
  // live (and be freed, outside the device lock) as long as the last engine holding it.
  e->opt.build_scratch.reset();
  auto t1 = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(e->finish());
  auto ms = [](auto from, auto to) { return std::chrono::duration<double, std::milli>(to - from).count(); };
  const auto t2 = std::chrono::steady_clock::now();
  e->plan.build_ms = ms(t0, t2);
  e->rep.build_ms = e->plan.build_ms;
  e->rep.setup_ms = setup_ms;
  e->rep.lower_ms = ms(t0, t1) - setup_ms;
  e->rep.finish_ms = ms(t1, t2);
  e->rep.lower_ms_by_op = std::move(ms_by_op);
  return std::shared_ptr<Engine>(e);
}

Expected<std::shared_ptr<Engine>> Engine::load(const Graph* g, const BuildOptions& opt, std::string_view dpln,
                                               std::string_view dwgt, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
  std::string why;
  if (!gpu_available(&why)) return KILN_ERROR(kUnsupported, "{}: no usable GPU: {}", name, why);
  auto e = std::make_shared<EngineImpl>(g, opt);
  KILN_ASSIGN_OR_RETURN(e->plan, read_device_plan(dpln, dwgt, name));
  if (g && (e->plan.inputs.size() != g->inputs.size() || e->plan.outputs.size() != g->outputs.size())) {
    return KILN_ERROR(kInvalidModel, "{}: the device plan's inputs and outputs are not the graph's", name);
  }
  for (const auto* ios : {&e->plan.inputs, &e->plan.outputs}) {
    for (const DeviceIo& io : *ios) {
      if (io.device_dtype > uint8_t(k::kLastDT) || io.ir_dtype < 0 || io.ir_dtype >= kNumDTypes) {
        return KILN_ERROR(kInvalidModel, "{}: an {} of unknown dtype", name, ios == &e->plan.inputs ? "input" : "output");
      }
    }
  }
  for (const DevicePlacement& p : e->plan.placements) {
    if (p.placement > uint8_t(Placement::kPass)) return KILN_ERROR(kInvalidModel, "{}: a placement of unknown kind", name);
  }
  // The CUDA context, created here at the latest (a cold process's largest fixed cost).
  auto t0 = std::chrono::steady_clock::now();
  KILN_CUDA_TRY(cudaFree(nullptr));
  e->rep.load_phases = fmt::format("CUDA context {:.1f} ms, ",
                                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  Status st = e->finish();
  if (!st) return st.code() == ErrorCode::kInvalidModel ? Status(st.code(), name + ": " + st.message()) : st;
  e->rep.build_ms = e->plan.build_ms;
  return std::shared_ptr<Engine>(e);
}

}  // namespace kiln::cuda
