// NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss -> k::loss (kernels/loss.cu): per-position
// terms in one kernel (the log-softmax over the classes inside it for SCE, and its log_prob output
// when read), the sum or mean in a second, one-block kernel. An out-of-range target is counted in
// the step's index-check slot and reported after the run, as Gather's indices are.
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {


Status lower_loss(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* t, L.rowmajor(n.inputs[1]));
  const DevValue* w = nullptr;
  if (n.inputs.size() > 2 && n.inputs[2]) {
    KILN_ASSIGN_OR_RETURN(w, L.rowmajor(n.inputs[2]));
  }
  if (x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16) KILN_UNSUPPORTED("scores of {}", dtype_name(x->ir_dtype));
  if (t->dt != k::DT::kI64 && t->dt != k::DT::kI32) KILN_UNSUPPORTED("targets of {}", dtype_name(t->ir_dtype));
  if (w && w->dt != x->dt) KILN_UNSUPPORTED("weights of another dtype than the scores");
  if (x->dims.size() < 2) KILN_UNSUPPORTED("scores of rank {}", x->dims.size());
  const std::string red = n.attr_string("reduction", "mean");
  k::LossShape sh;
  sh.n = x->dims[0];
  sh.classes = x->dims[1];
  for (size_t i = 2; i < x->dims.size(); ++i) sh.inner *= x->dims[i];
  sh.softmax = n.op == OpKind::kSoftmaxCrossEntropyLoss;
  if (const Attribute* ig = n.attr("ignore_index")) {
    sh.has_ignore = true;
    sh.ignore_index = ig->i;
  }
  sh.reduction = red == "none" ? 0 : red == "sum" ? 1 : red == "mean" ? 2 : -1;
  if (sh.reduction < 0) KILN_UNSUPPORTED("reduction '{}'", red);
  if (t->numel() != sh.n * sh.inner || sh.classes < 1) KILN_UNSUPPORTED("targets {} for scores {}", t->numel(), x->numel());
  if (w && w->numel() != sh.classes) KILN_UNSUPPORTED("weight of {} elements for {} classes", w->numel(), sh.classes);
  const DevValue& y = L.define(n.outputs[0]);
  const DevValue* lp = nullptr;
  if (sh.softmax && n.outputs.size() > 1 && n.outputs[1]) lp = &L.define(n.outputs[1]);
  const int scratch = sh.reduction ? L.scratch(size_t(std::max<int64_t>(1, 2 * sh.n * sh.inner)) * 4) : -1;
  ByteWriter p;
  p.put(int32_t(x->dt));
  p.put(int32_t(t->dt));
  for (int64_t v : {sh.n, sh.classes, sh.inner, sh.ignore_index}) p.i64(v);
  p.u8(sh.softmax);
  p.u8(sh.has_ignore);
  p.put(int32_t(sh.reduction));
  put(p, x->ref);
  put(p, t->ref);
  put(p, w ? w->ref : Ref{});
  put(p, y.ref);
  put(p, lp ? lp->ref : Ref{});
  put(p, scratch >= 0 ? Ref{false, scratch} : Ref{});
  std::vector<int> writes = {y.ref.id};
  if (lp) writes.push_back(lp->ref.id);
  if (scratch >= 0) writes.push_back(scratch);
  const int slot = L.new_bad_index_slot();
  L.emit(&n, fmt::format("kernel loss ({}{})", sh.softmax ? "log-softmax, " : "", red), {read_id(x), read_id(t), read_id(w)},
         writes, StepOp::kLoss, std::move(p));
  L.steps.back().bad_index_slot = slot;
  return Status::ok();
}

Expected<StepFn> bind_loss(Params& in, BindCtx&) {
  const k::DT dt = in.dt(), tdt = in.dt();
  k::LossShape sh;
  sh.n = in.i64();
  sh.classes = in.i64();
  sh.inner = in.i64();
  sh.ignore_index = in.i64();
  sh.softmax = in.flag();
  sh.has_ignore = in.flag();
  sh.reduction = in.i32();
  const Ref x = in.ref(), t = in.ref(), w = in.opt_ref(), y = in.ref(), lp = in.opt_ref(), scratch = in.opt_ref();
  const int slot = in.step().bad_index_slot;
  KILN_RETURN_IF_ERROR(in.done());
  if (slot < 0 || sh.n < 0 || sh.classes < 1 || sh.inner < 1 || sh.reduction < 0 || sh.reduction > 2 ||
      (sh.reduction && scratch.id < 0)) {
    return KILN_ERROR(kInvalidModel, "step '{}': a malformed loss", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::loss(dt, c.ptr(x), c.ptr(t), tdt, w.id >= 0 ? c.ptr(w) : nullptr, sh, c.ptr(y),
                               lp.id >= 0 ? c.ptr(lp) : nullptr, scratch.id >= 0 ? static_cast<float*>(c.ptr(scratch)) : nullptr,
                               c.bad_index + slot, c.stream),
                       "loss");
  });
}

}  // namespace

void register_loss_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kNegativeLogLikelihoodLoss] = lower_loss;
  t[OpKind::kSoftmaxCrossEntropyLoss] = lower_loss;
}

void register_loss_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kLoss] = bind_loss; }

}  // namespace kiln::cuda
