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

constexpr int64_t kMaxFoldElements = int64_t(1) << 24;

bool has_subgraph(const Node& n) {
  for (const auto& [k, a] : n.attrs) {
    if (a.g || !a.graphs.empty()) return true;
  }
  return false;
}

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

// Runs n with its CPU kernel inside the GPU plan: copy inputs down, run, copy outputs up.
Status lower_on_cpu(Lowering& L, const Node& n) {
  if (!op_def(n.op).cpu) return KILN_ERROR(kUnsupported, "{}: no backend can run op {}", n.describe(), op_name(n.op));
  if (has_subgraph(n)) {
    return KILN_ERROR(kUnsupported, "{}: control flow (subgraphs) is not supported by the CUDA engine yet",
                      n.describe());
  }
  struct In { bool device; Ref ref; k::DT dt; std::vector<int64_t> dims; Tensor host; };
  std::vector<std::optional<In>> ins;
  std::vector<int> reads, writes;
  for (const Value* v : n.inputs) {
    if (!v) { ins.emplace_back(); continue; }
    if (const Tensor* c = L.constant(v)) { ins.push_back(In{false, {}, k::DT::kF32, {}, *c}); continue; }
    KILN_ASSIGN_OR_RETURN(const DevValue* d, L.rowmajor(v));
    ins.push_back(In{true, d->ref, d->dt, d->dims, {}});
    if (!d->ref.weight) reads.push_back(d->ref.id);
  }
  struct Out { Ref ref; k::DT dt; DType ir; };
  std::vector<std::optional<Out>> outs;
  for (const Value* o : n.outputs) {
    if (!o) { outs.emplace_back(); continue; }
    if (!to_kdt(o->type.dtype)) {
      return KILN_ERROR(kUnsupported, "{}: output '{}' is {}, which the GPU cannot hold", n.describe(), o->name,
                        dtype_name(o->type.dtype));
    }
    const DevValue& d = L.define(o);
    outs.push_back(Out{d.ref, d.dt, o->type.dtype});
    writes.push_back(d.ref.id);
  }
  const Node* node = &n;
  L.emit(&n, "cpu kernel (host round trip)", reads, writes, [node, ins, outs](const RunCtx& c) -> Status {
    KILN_CUDA_TRY(cudaStreamSynchronize(c.stream));
    std::vector<Data> held;
    std::vector<const Data*> ptrs;
    held.reserve(ins.size());
    for (size_t i = 0; i < ins.size(); ++i) {
      const Value* v = node->inputs[i];
      if (!ins[i]) { ptrs.push_back(nullptr); continue; }
      if (!ins[i]->device) { held.emplace_back(ins[i]->host); ptrs.push_back(&held.back()); continue; }
      KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(ir_dtype_of(ins[i]->dt), ins[i]->dims));
      KILN_CUDA_TRY(cudaMemcpy(t.raw(), c.ptr(ins[i]->ref), t.nbytes(), cudaMemcpyDeviceToHost));
      KILN_ASSIGN_OR_RETURN(Tensor ir, convert_tensor(t, v->type.dtype));
      held.emplace_back(std::move(ir));
      ptrs.push_back(&held.back());
    }
    KernelCtx ctx(*node, std::move(ptrs), nullptr);
    KILN_RETURN_IF_ERROR(op_def(node->op).cpu(ctx).with_context(node->describe()));
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i]) continue;
      KILN_ASSIGN_OR_RETURN(Tensor t, convert_tensor(ctx.outputs()[i].tensor, ir_dtype_of(outs[i]->dt)));
      KILN_CUDA_TRY(cudaMemcpy(c.ptr(outs[i]->ref), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    }
    return Status::ok();
  }, /*host=*/true);
  return Status::ok();
}

// Graph inputs arrive in their declared dtype; half builds cast them on the device.
Status lower_inputs(Lowering& L, EngineImpl& e) {
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
    int64_t n = d.numel();
    Ref s = staged.ref, o = d.ref;
    k::DT from = *kdt;
    L.emit(nullptr, fmt::format("input '{}': kernel cast to {}", v->name, precision_name(L.options().precision)),
           {s.id}, {o.id}, [=](const RunCtx& c) {
             return cuda_status(k::cast(from, want, c.ptr(s), c.ptr(o), n, c.stream), "cast (input)");
           });
    L.steps.back().drop_if_unread = true;
  }
  return Status::ok();
}

// Drops conversion steps whose output no later step reads and no output hands out (every reader
// of a converted input took the staged value itself).
void drop_unread_steps(Lowering& L, const EngineImpl& e) {
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

Status lower_outputs(Lowering& L, EngineImpl& e) {
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
    Ref s = d->ref, o = out.ref;
    k::DT from = d->dt, to = *want;
    int64_t n = out.numel();
    L.emit(nullptr, fmt::format("output '{}': kernel cast", v->name), {s.weight ? -1 : s.id}, {o.id},
           [=](const RunCtx& c) { return cuda_status(k::cast(from, to, c.ptr(s), c.ptr(o), n, c.stream), "cast (output)"); });
    e.output_stage.push_back(out);
  }
  return Status::ok();
}

// Lifetimes from the steps: buffer b lives from the first step touching it to the last. Inputs
// are written before step 0 (by the host copy) and outputs read after the last step.
void plan(const Lowering& L, EngineImpl& e) {
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
  e.offsets = p.offsets;
  e.rep.arena_peak = p.peak;
  e.rep.arena_naive = p.naive;
  e.rep.arena_lower_bound = p.lower_bound;
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
  auto e = std::make_shared<EngineImpl>(g, opt);
  KILN_RETURN_IF_ERROR(e->create_build_resources());
  Lowering& L = *e->lowering;
  KILN_RETURN_IF_ERROR(lower_inputs(L, *e));
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
  KILN_RETURN_IF_ERROR(lower_outputs(L, *e));
  drop_unread_steps(L, *e);
  plan(L, *e);
  if (opt.memory_budget_bytes) {
    size_t weights = 0;
    for (const auto& w : L.weight_data) weights += w.size();
    size_t need = weights + e->rep.arena_peak + opt.workspace_bytes;
    if (need > opt.memory_budget_bytes) {
      return KILN_ERROR(kOutOfMemory,
                        "the engine needs {:.1f} MiB of GPU memory per session (weights {:.1f}, arena {:.1f}, workspace "
                        "{:.1f}), over the memory budget of {:.1f} MiB",
                        double(need) / (1 << 20), double(weights) / (1 << 20), double(e->rep.arena_peak) / (1 << 20),
                        double(opt.workspace_bytes) / (1 << 20), double(opt.memory_budget_bytes) / (1 << 20));
    }
  }
  KILN_RETURN_IF_ERROR(e->upload_weights());
  e->finish_report(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return std::shared_ptr<Engine>(e);
}

}  // namespace kiln::cuda
