// Depthwise 2-D convolutions (MobileNet's and EfficientNet's 3x3 and 5x5 per-channel filters) on
// kiln's own NHWC kernel (kernels/conv.cu), in half-precision builds: the bias, a following Relu,
// constant Clip (ReLU6) or SiLU applied in the same pass, and a cheap activation in front of it
// (the expansion convolution's Clip or HardSwish) applied as the input is read. It reads the leading pads itself, so
// asymmetric padding needs no padded copy.
#include <algorithm>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

const char* dw_input_name(k::DwInput a) {
  switch (a) {
    case k::DwInput::kClip: return " (input clip)";
    case k::DwInput::kHardSwish: return " (input hardswish)";
    case k::DwInput::kLeakyRelu: return " (input leakyrelu)";
    default: return "";
  }
}

// The activation found in front of depthwise convolution conv, read from v: recorded and claimed.
void claim_input_act(Lowering& L, const Value* v) {
  std::optional<ActMatch> m = match_act(L, v);
  if (!m || std::any_of(m->nodes.begin(), m->nodes.end(), [&L](const Node* f) { return L.is_fused(f); })) return;
  const Node* conv = L.only_consumer(m->out);
  if (!conv || conv->inputs[0] != m->out || !depthwise_candidate(L, *conv) || L.input_acts.count(conv)) return;
  if (!(v->type == m->out->type)) return;
  InputAct in{v, k::DwInput::kNone, m->p.a, m->p.b};
  switch (m->op) {
    case k::Unary::kClip:
      if (m->p.a <= 0 && 0 <= m->p.b) in.act = k::DwInput::kClip;
      break;
    case k::Unary::kHardSwish: in.act = k::DwInput::kHardSwish; break;
    case k::Unary::kLeakyRelu: in.act = k::DwInput::kLeakyRelu; break;
    default: break;
  }
  if (in.act == k::DwInput::kNone) return;
  L.input_acts[conv] = in;
  for (const Node* f : m->nodes) L.mark_fused(f, conv);
}

}  // namespace

bool depthwise_candidate(Lowering& L, const Node& n) {
  if (n.op != OpKind::kConv || !L.half()) return false;
  const Tensor* w = L.constant(n.inputs[1]);
  auto p4 = pads4(n);
  const auto& xs = n.inputs[0]->type.shape;
  auto dt = L.device_dt(n.inputs[0]->type.dtype);
  int64_t group = n.attr_int("group", 1);
  return w && w->rank() == 4 && (!n.has_input(2) || L.constant(n.inputs[2])) && p4 && (*p4)[2] >= (*p4)[0] &&
         (*p4)[3] >= (*p4)[1] && dt && (*dt == k::DT::kF16 || *dt == k::DT::kBF16) && xs && xs->rank() == 4 &&
         xs->dims[1].is_static() && group > 1 && group == xs->dims[1].value() && w->dim(0) == group && w->dim(1) == 1;
}

// The activation after each expansion convolution of an inverted-residual block (MobileNetV2's
// Clip, MobileNetV3's HardSwish) feeds a depthwise convolution: the depthwise kernel applies it to
// its input as it reads it, and the pass over the widest activations of the network disappears.
// Only cheap activations that are 0 at 0 (kernels.h, DwInput): EfficientNet's SiLU stays a pass.
// Relu is left to the producer's epilogue (a GEMM or cuDNN convolution applies it for free).
void find_conv_input_acts(Lowering& L) {
  for (const Value* v : L.graph().inputs) claim_input_act(L, v);
  for (const auto& up : L.graph().nodes) {
    for (const Value* v : up->outputs) {
      if (v) claim_input_act(L, v);
    }
  }
}

Status lower_depthwise(Lowering& L, const Node& n, const DevValue& input, const InputAct* in_act) {
  const DevValue* x0 = &input;
  const Tensor* w = L.constant(n.inputs[1]);
  const Tensor* bias_t = n.has_input(2) ? L.constant(n.inputs[2]) : nullptr;
  const auto p4 = pads4(n);  // (depthwise_candidate: both present)
  const std::vector<int64_t> st = n.attr_ints("strides", {1, 1}), dil = n.attr_ints("dilations", {1, 1});
  const auto dt = L.device_dt(n.inputs[0]->type.dtype);
  const Layout lay = Layout::kNHWC;
  const Value* dout = n.outputs[0];
  int act = 0;
  float lo = 0, hi = 0;
  const Node* fused_act = L.only_consumer(dout);
  if (fused_act && L.is_fused(fused_act)) fused_act = nullptr;  // taken by a pattern (the next conv's input)
  if (fused_act && fused_act->op == OpKind::kRelu) {
    act = 1;
  } else if (fused_act && fused_act->op == OpKind::kClip) {
    const Tensor* a = fused_act->has_input(1) ? L.constant(fused_act->inputs[1]) : nullptr;
    const Tensor* b = fused_act->has_input(2) ? L.constant(fused_act->inputs[2]) : nullptr;
    if (a && b && a->numel() == 1 && b->numel() == 1) {
      act = 2;
      lo = float(a->as_double(0));
      hi = float(b->as_double(0));
    }
  }
  if (act == 0) fused_act = nullptr;
  if (fused_act) dout = fused_act->outputs[0];
  // A SiLU (EfficientNet's and MobileViT's depthwise convolutions have one) in the same pass.
  std::vector<const Node*> silu;
  if (act == 0) silu = silu_after(L, dout);
  if (!silu.empty()) {
    act = 3;
    dout = silu.back()->outputs[0];
  }
  // Filter [C,1,R,S] -> [R,S,C] so that a warp's filter reads are consecutive channels.
  const int64_t C = w->dim(0), R = w->dim(2), S = w->dim(3);
  KILN_ASSIGN_OR_RETURN(Ref wr, L.upload_derived(*w, "rsc", *dt, [w, C, R, S]() -> Expected<Tensor> {
    KILN_ASSIGN_OR_RETURN(Tensor wf, convert_tensor(*w, DType::kFloat32));
    KILN_ASSIGN_OR_RETURN(Tensor wt, Tensor::create(DType::kFloat32, {R, S, C}));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R * S; ++r) wt.data<float>()[r * C + c] = wf.data<float>()[c * R * S + r];
    return wt;
  }));
  Ref br;
  if (bias_t) {
    KILN_ASSIGN_OR_RETURN(br, L.upload_constant(*bias_t, *dt));
  }
  k::DepthwiseShape sh{};
  sh.n = int(x0->dims[0]);
  sh.c = int(C);
  sh.h = int(x0->dims[2]);
  sh.w = int(x0->dims[3]);
  sh.r = int(R);
  sh.s = int(S);
  sh.p = int(n.outputs[0]->type.shape->dims[2].value());
  sh.q = int(n.outputs[0]->type.shape->dims[3].value());
  sh.stride_h = int(st[0]);
  sh.stride_w = int(st[1]);
  sh.pad_h = int((*p4)[0]);
  sh.pad_w = int((*p4)[1]);
  sh.dil_h = int(dil[0]);
  sh.dil_w = int(dil[1]);
  if (in_act) {
    sh.in_act = int(in_act->act);
    sh.in_a = in_act->a;
    sh.in_b = in_act->b;
  }
  const DevValue& y = L.define(dout, lay);
  ByteWriter wr_;
  wr_.put(int32_t(*dt));
  put(wr_, x0->ref);
  put(wr_, wr);
  put(wr_, bias_t ? br : Ref{});
  put(wr_, y.ref);
  for (int v : {sh.n, sh.h, sh.w, sh.c, sh.r, sh.s, sh.p, sh.q, sh.stride_h, sh.stride_w, sh.pad_h, sh.pad_w, sh.dil_h,
                sh.dil_w, sh.in_act}) {
    wr_.put(int32_t(v));
  }
  for (float v : {sh.in_a, sh.in_b}) wr_.put(v);
  wr_.put(int32_t(act));
  wr_.put(lo);
  wr_.put(hi);
  L.emit(&n, fmt::format("kernel depthwise_conv2d_nhwc{}{}{}", in_act ? dw_input_name(in_act->act) : "", bias_t ? " +bias" : "",
                         act == 1 ? " +relu" : act == 2 ? " +clip" : act == 3 ? " +silu" : ""),
         {read_id(x0)}, {y.ref.id}, StepOp::kDepthwiseConv, std::move(wr_));
  if (fused_act) L.mark_fused(fused_act, &n);
  for (const Node* f : silu) L.mark_fused(f, &n);
  return Status::ok();
}

namespace {

Expected<StepFn> bind_depthwise(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), wr = in.ref(), br = in.opt_ref(), yr = in.ref();
  k::DepthwiseShape sh{};
  for (int* v : {&sh.n, &sh.h, &sh.w, &sh.c, &sh.r, &sh.s, &sh.p, &sh.q, &sh.stride_h, &sh.stride_w, &sh.pad_h, &sh.pad_w,
                 &sh.dil_h, &sh.dil_w, &sh.in_act}) {
    *v = in.i32();
  }
  sh.in_a = in.f32();
  sh.in_b = in.f32();
  const int act = in.i32();
  const float lo = in.f32(), hi = in.f32();
  KILN_RETURN_IF_ERROR(in.done());
  if (sh.in_act < 0 || sh.in_act > int(k::DwInput::kLast) || act < 0 || act > 3) {
    return KILN_ERROR(kInvalidModel, "{}: malformed depthwise convolution parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::depthwise_conv2d_nhwc(dt, c.ptr(xr), c.ptr(wr), br.id >= 0 ? c.ptr(br) : nullptr, c.ptr(yr), sh,
                                                act, lo, hi, c.stream), "depthwise_conv2d_nhwc");
  });
}

}  // namespace

void register_depthwise_binder(std::map<StepOp, BindFn>& t) { t[StepOp::kDepthwiseConv] = bind_depthwise; }

}  // namespace kiln::cuda
