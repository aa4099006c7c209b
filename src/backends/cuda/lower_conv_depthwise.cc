// Depthwise 2-D convolutions (MobileNet's and EfficientNet's 3x3 and 5x5 per-channel filters) on
// kiln's own NHWC kernel (kernels/conv.cu), in half-precision builds: the bias, a following Relu,
// constant Clip (ReLU6) or SiLU applied in the same pass, and a cheap activation in front of it
// (the expansion convolution's Clip, HardSwish or LeakyRelu) applied as the input is read. It reads the leading pads itself, so
// asymmetric padding needs no padded copy.
#include <cmath>
#include <optional>

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

// What activation node n applies, as the depthwise kernel's input transform (x: its input).
std::optional<InputAct> input_act_of(const Lowering& L, const Node& n) {
  if (n.inputs.empty() || !n.inputs[0] || n.outputs.size() != 1 || !(n.inputs[0]->type == n.outputs[0]->type)) {
    return std::nullopt;
  }
  InputAct in{n.inputs[0], k::DwInput::kNone, 0, 0};
  switch (n.op) {
    case OpKind::kClip:
      in.act = k::DwInput::kClip;
      in.a = -INFINITY;
      in.b = INFINITY;
      for (size_t i = 1; i < 3; ++i) {
        if (!n.has_input(i)) continue;
        const Tensor* c = L.constant(n.inputs[i]);
        if (!c || c->numel() != 1) return std::nullopt;
        (i == 1 ? in.a : in.b) = float(c->as_double(0));
      }
      return in;
    case OpKind::kHardSwish: in.act = k::DwInput::kHardSwish; return in;
    case OpKind::kLeakyRelu:
      in.act = k::DwInput::kLeakyRelu;
      in.a = n.attr_float("alpha", 0.01f);
      return in;
    default: return std::nullopt;
  }
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
// Cheap activations only (kernels.h, DwInput): EfficientNet's SiLU stays a pass. Relu is left to
// the producer's epilogue (a GEMM or cuDNN convolution applies it for free). The activation's input
// may have other readers; its output must have the convolution alone.
void find_conv_input_acts(Lowering& L) {
  for (const auto& up : L.graph().nodes) {
    const Node& a = *up;
    if (L.is_fused(&a)) continue;
    std::optional<InputAct> in = input_act_of(L, a);
    if (!in) continue;
    const Node* conv = L.only_consumer(a.outputs[0]);
    if (!conv || conv->inputs[0] != a.outputs[0] || !depthwise_candidate(L, *conv) || L.input_acts.count(conv)) continue;
    L.input_acts[conv] = *in;
    L.mark_fused(&a, conv);
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

// n * ... in int64, or -1 past it (a malformed engine file's sizes).
int64_t product(std::initializer_list<int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(p, d, &p)) return -1;
  }
  return p;
}

Expected<StepFn> bind_depthwise(Params& in, BindCtx& ctx) {
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
  // Sizes the kernel's int pixel arithmetic takes, and arena buffers that hold what it reads and writes.
  bool ok = sh.in_act >= 0 && sh.in_act <= int(k::DwInput::kLast) && act >= 0 && act <= 3 && !yr.weight;
  for (int v : {sh.n, sh.h, sh.w, sh.c, sh.r, sh.s, sh.p, sh.q, sh.stride_h, sh.stride_w, sh.dil_h, sh.dil_w}) ok = ok && v >= 1;
  ok = ok && sh.pad_h >= 0 && sh.pad_w >= 0 &&
       int64_t(sh.p) * sh.stride_h + int64_t(sh.r) * sh.dil_h + sh.pad_h < INT32_MAX &&
       int64_t(sh.q) * sh.stride_w + int64_t(sh.s) * sh.dil_w + sh.pad_w < INT32_MAX;
  const int64_t e = k::dt_size(dt);
  auto holds = [&](Ref r, int64_t bytes) {
    const int64_t h = held_bytes(ctx.plan, r);
    ok = ok && bytes >= 0 && (h < 0 || h >= bytes);
  };
  if (ok) {
    holds(xr, product({sh.n, sh.h, sh.w, sh.c, e}));
    holds(yr, product({sh.n, sh.p, sh.q, sh.c, e}));
    holds(wr, product({sh.r, sh.s, sh.c, e}));
    if (br.id >= 0) holds(br, product({sh.c, e}));
  }
  if (!ok) return KILN_ERROR(kInvalidModel, "{}: malformed depthwise convolution parameters", in.step().label);
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::depthwise_conv2d_nhwc(dt, c.ptr(xr), c.ptr(wr), br.id >= 0 ? c.ptr(br) : nullptr, c.ptr(yr), sh,
                                                act, lo, hi, c.stream), "depthwise_conv2d_nhwc");
  });
}

}  // namespace

void register_depthwise_binder(std::map<StepOp, BindFn>& t) { t[StepOp::kDepthwiseConv] = bind_depthwise; }

}  // namespace kiln::cuda
