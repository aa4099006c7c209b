// RandomUniform(Like), RandomNormal(Like) and Bernoulli (k::random): noise for diffusion samplers
// and stochastic layers, drawn on the device. Each step has a run counter among its session's
// device words (RunCtx::counters, at the step's slot) that every forward advances, so each run
// draws anew and a session's n-th run draws the same values in every session of the engine. The
// seed is the op's `seed` attribute, or one drawn at build time and kept in the engine (ONNX:
// "auto generated" when absent), so that a loaded engine and every tensor-parallel rank agree.
#include <cstring>
#include <random>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

Status lower_random(Lowering& L, const Node& n) {
  const bool bernoulli = n.op == OpKind::kBernoulli;
  const bool normal = n.op == OpKind::kRandomNormal || n.op == OpKind::kRandomNormalLike;
  const DevValue* p = nullptr;
  if (bernoulli) {
    KILN_ASSIGN_OR_RETURN(p, L.rowmajor(n.inputs[0]));
    if (p->dt != k::DT::kF32 && p->dt != k::DT::kF16 && p->dt != k::DT::kBF16 && p->dt != k::DT::kF64) {
      KILN_UNSUPPORTED("Bernoulli probabilities of {}", dtype_name(p->ir_dtype));
    }
  }
  const DevValue& y = L.define(n.outputs[0]);
  if (!bernoulli && y.dt != k::DT::kF32 && y.dt != k::DT::kF16 && y.dt != k::DT::kBF16 && y.dt != k::DT::kF64) {
    KILN_UNSUPPORTED("{} of {}", op_name(n.op), dtype_name(y.ir_dtype));
  }
  const float a = normal ? n.attr_float("mean", 0.0f) : n.attr_float("low", 0.0f);
  const float b = normal ? n.attr_float("scale", 1.0f) : n.attr_float("high", 1.0f);
  const bool seeded = n.has_attr("seed");
  uint64_t seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  if (seeded) {  // the float's bits: seeds 1.0 and 1.5 differ
    const float f = n.attr_float("seed", 0.0f);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof(bits));
    seed = bits;
  }
  ByteWriter w;
  w.put(int32_t(y.dt));
  put(w, y.ref);
  put(w, p ? p->ref : Ref{});
  w.put(int32_t(p ? p->dt : k::DT::kF32));
  w.i64(y.numel());
  w.put(int32_t(bernoulli ? 2 : normal ? 1 : 0));
  w.put(a);
  w.put(b);
  w.u64(seed);
  const int slot = L.new_bad_index_slot();  // the run counter's word
  L.emit(&n, fmt::format("kernel random ({}{})", bernoulli ? "bernoulli" : normal ? "normal" : "uniform",
                         seeded ? "" : ", seeded at build"),
         {read_id(p)}, {y.ref.id}, StepOp::kRandom, std::move(w));
  L.steps.back().bad_index_slot = slot;
  return Status::ok();
}

Expected<StepFn> bind_random(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref yr = in.ref(), pr = in.opt_ref();
  const k::DT pdt = in.dt();
  const int64_t n = in.i64();
  const int32_t dist = in.i32();
  const float a = in.f32(), b = in.f32();
  const uint64_t seed = uint64_t(in.i64());
  const int slot = in.step().bad_index_slot;
  KILN_RETURN_IF_ERROR(in.done());
  if (n < 0 || dist < 0 || dist > 2 || (dist == 2) != (pr.id >= 0) || slot < 0) {
    return KILN_ERROR(kInvalidModel, "{}: malformed random parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::random(dt, c.ptr(yr), n, dist, a, b, seed, c.counters + slot,
                                 pr.id >= 0 ? c.ptr(pr) : nullptr, pdt, c.stream),
                       "random");
  });
}

}  // namespace

void register_random_lowerings(std::map<OpKind, LowerFn>& t) {
  for (OpKind op : {OpKind::kRandomUniform, OpKind::kRandomUniformLike, OpKind::kRandomNormal, OpKind::kRandomNormalLike,
                    OpKind::kBernoulli}) {
    t[op] = lower_random;
  }
}

void register_random_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kRandom] = bind_random; }

}  // namespace kiln::cuda
