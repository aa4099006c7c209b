// Engine::build: constant folding, lowering with CPU fallback, memory planning, weight upload.
// The order matters: folding first (shape arithmetic must be host constants before the lowering
// reads Reshape targets or Slice bounds), then lowering in topological order (fusions look
// ahead at single consumers), then planning (lifetimes come from the emitted steps).
#include <algorithm>
#include <chrono>

#include "backends/cuda/device.h"
#include "backends/cuda/engine_impl.h"
#include "ops/op_registry.h"
#include "passes/fold_constants.h"
#include "runtime/memory_planner.h"
#include "support/dtype.h"

namespace kiln::cuda {

std::string_view placement_name(Placement p) {
  switch (p) {
    case Placement::kCuda: return "cuda";
    case Placement::kCpu: return "cpu";
    case Placement::kFolded: return "folded";
    case Placement::kAlias: return "alias";
    case Placement::kPass: return "pass";
  }
  return "?";
}

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

constexpr int64_t kMaxFoldElements = int64_t(1) << 24;

bool static_shape(const Value* v) {
  if (!v->type.is_tensor() || !v->type.shape) return false;
  for (const Dim& d : v->type.shape->dims) {
    if (!d.is_static()) return false;
  }
  return true;
}

// Evaluates n on the host when every input is known at build time (see passes/fold_constants).
Expected<bool> try_fold(Lowering& L, const Node& n) {
  std::vector<std::optional<Tensor>> outs;
  auto known = [&L](const Value* v) { return L.constant(v); };
  KILN_ASSIGN_OR_RETURN(bool folded, fold_node(n, known, kMaxFoldElements, &outs));
  if (!folded) return false;
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] && outs[i]) L.set_constant(n.outputs[i], std::move(*outs[i]));
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

// What became of each node that graph passes removed (Graph::absorbed), and the kernel each node
// fused at lowering ended in: every ONNX node of the model then has a line in the report.
void add_provenance(const Graph& g, std::vector<NodePlacement>& nodes) {
  std::map<std::string, std::string> impl_of;  // describe() -> implementation
  for (const NodePlacement& p : nodes) {
    if (p.impl != "fused") impl_of[p.node] = p.impl;
  }
  const std::string into = "into ";
  for (NodePlacement& p : nodes) {  // lowering-fused nodes: their target's kernel
    if (p.impl != "fused" || p.why.rfind(into, 0) != 0) continue;
    auto it = impl_of.find(p.why.substr(into.size()));
    if (it == impl_of.end()) continue;
    p.impl = it->second;
    p.why = "fused " + p.why;
    impl_of[p.node] = p.impl;  // a graph pass's node may have been fused into this one
  }
  for (const Absorbed& a : g.absorbed) {
    NodePlacement p{a.node, Placement::kPass, "-", ""};
    if (a.into) {
      std::string target = a.into->describe();
      if (auto it = impl_of.find(target); it != impl_of.end()) p.impl = it->second;
      p.why = fmt::format("fused by graph pass {} into {}", a.pass, target);
    } else if (a.pass == "fold-constants") {
      p.why = "evaluated at build time (fold-constants)";
    } else {
      p.why = fmt::format("removed by graph pass {} (no work left)", a.pass);
    }
    nodes.push_back(std::move(p));
  }
}

// Build-time handles and autotuning scratch, freed on every path.
struct BuildResources {
  Lowering& L;
  ~BuildResources() {
    if (L.dnn) cudnnDestroy(L.dnn);
    if (L.lt) cublasLtDestroy(L.lt);
    if (L.build_workspace) cudaFree(L.build_workspace);
  }
};

// Lowers the graph to a device plan: records, memory plan, weights, I/O, placements.
Expected<DevicePlan> lower_graph(const Graph& g, const BuildOptions& opt) {
  Lowering L(g, opt);
  BuildResources res{L};
  KILN_CUDA_TRY(cudnnCreate(&L.dnn));
  KILN_CUDA_TRY(cublasLtCreate(&L.lt));
  KILN_CUDA_TRY(cudaMalloc(&L.build_workspace, opt.workspace_bytes));
  Stages e;
  KILN_RETURN_IF_ERROR(lower_inputs(L, e));
  const auto& table = lowering_table();
  find_patterns(L);
  for (const auto& up : g.nodes) {
    const Node& n = *up;
    if (L.is_fused(&n)) continue;
    KILN_ASSIGN_OR_RETURN(bool folded, try_fold(L, n));
    if (folded) {
      L.place(&n, Placement::kFolded, "constant at build time");
      continue;
    }
    if (auto rp = L.replacements.find(&n); rp != L.replacements.end()) {
      KILN_RETURN_IF_ERROR(lower_replacement(L, n, rp->second));
      L.place(&n, Placement::kCuda, L.steps.back().label.substr(n.describe().size() + 2));
      continue;
    }
    auto it = table.find(n.op);
    size_t placed = L.placements.size(), emitted = L.steps.size();
    Status s = it == table.end() ? KILN_ERROR(kUnsupported, "no CUDA lowering for {}", op_name(n.op)) : it->second(L, n);
    if (s) {
      // Placed unless lowering placed it itself (mark_fused adds the placements of fused nodes).
      bool self_placed = false;
      for (size_t i = placed; i < L.placements.size(); ++i) self_placed = self_placed || L.placements[i].node == n.describe();
      if (!self_placed) {
        std::string impl;  // every step the node became, in order
        for (size_t i = emitted; i < L.steps.size(); ++i) {
          const std::string& lb = L.steps[i].label;
          std::string prefix = n.describe() + ": ";
          impl += (impl.empty() ? "" : " + ") + (lb.rfind(prefix, 0) == 0 ? lb.substr(prefix.size()) : lb);
        }
        if (L.steps.size() == emitted) L.place(&n, Placement::kAlias, "no work (same buffer)");
        else L.place(&n, Placement::kCuda, impl);
      }
      continue;
    }
    if (s.code() != ErrorCode::kUnsupported) return s.with_context(n.describe());
    // A lowering may decline after emitting a step of its own (a patch copy before the GEMM that
    // then finds no algorithm): drop it, so the CPU kernel is the node's only work.
    L.steps.resize(emitted);
    L.placements.resize(placed);
    KILN_RETURN_IF_ERROR(lower_on_cpu(L, n));
    L.place(&n, Placement::kCpu, "cpu kernel", s.message());
  }
  KILN_RETURN_IF_ERROR(lower_outputs(L, e));
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
  std::vector<NodePlacement> rows = L.placements;
  add_provenance(g, rows);
  for (NodePlacement& r : rows) dp.placements.push_back({r.node, uint8_t(r.placement), r.impl, r.why});
  return dp;
}

}  // namespace

Expected<std::shared_ptr<Engine>> Engine::build(const Graph& g, const BuildOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  std::string why;
  if (!gpu_available(&why)) return KILN_ERROR(kUnsupported, "no usable GPU: {}", why);
  for (const auto& v : g.values) {
    if (v->constant || v->type.kind != Type::Kind::kTensor) continue;
    if (!static_shape(v.get())) {
      return KILN_ERROR(kUnsupported, "value '{}' has shape {}: the CUDA engine needs static shapes (bind them with "
                        "--shapes NAME:DIMS or --batch)", v->name, v->type.to_string());
    }
  }
  auto e = std::make_shared<EngineImpl>(&g, opt);
  KILN_ASSIGN_OR_RETURN(e->plan, lower_graph(g, opt));
  KILN_RETURN_IF_ERROR(e->finish());
  e->plan.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  e->rep.build_ms = e->plan.build_ms;
  return std::shared_ptr<Engine>(e);
}

Expected<std::shared_ptr<Engine>> Engine::load(const Graph* g, const BuildOptions& opt, std::string_view dpln,
                                               std::string_view dwgt, const std::string& name) {
  std::string why;
  if (!gpu_available(&why)) return KILN_ERROR(kUnsupported, "{}: no usable GPU: {}", name, why);
  auto e = std::make_shared<EngineImpl>(g, opt);
  KILN_ASSIGN_OR_RETURN(e->plan, read_device_plan(dpln, dwgt, name));
  if (g && (e->plan.inputs.size() != g->inputs.size() || e->plan.outputs.size() != g->outputs.size())) {
    return KILN_ERROR(kInvalidModel, "{}: the device plan's inputs and outputs are not the graph's", name);
  }
  for (const DeviceIo& io : e->plan.inputs) {
    if (io.device_dtype > uint8_t(k::DT::kBool) || io.ir_dtype < 0 || io.ir_dtype >= kNumDTypes) {
      return KILN_ERROR(kInvalidModel, "{}: an input of unknown dtype", name);
    }
  }
  for (const DeviceIo& io : e->plan.outputs) {
    if (io.device_dtype > uint8_t(k::DT::kBool) || io.ir_dtype < 0 || io.ir_dtype >= kNumDTypes) {
      return KILN_ERROR(kInvalidModel, "{}: an output of unknown dtype", name);
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
