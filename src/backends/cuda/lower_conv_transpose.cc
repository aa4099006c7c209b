// ConvTranspose (2-D, and 1-D through the conv-as-planar pass; 1-D and 3-D ones left over go to
// lower_conv_nd.cc) as cuDNN's backward-data
// convolution: the transposed convolution of x with w is the gradient, with respect to its input,
// of the forward convolution y = conv(dx, w) whose output dy is x. ONNX's weight [C_in, C_out/group,
// kH, kW] is that forward convolution's filter [K, C, R, S] as it is. The bias is added by
// cudnnAddTensor. NHWC in half builds, like Conv, so decoders keep one layout.
//
// Output size: stride * (in - 1) + output_padding + (k - 1) * dilation + 1 - pad_begin - pad_end.
// cuDNN pads the forward convolution symmetrically by pad_begin, which reproduces ONNX's positions
// whenever 0 <= output_padding + pad_begin - pad_end < stride (what exporters write: symmetric
// pads, output_padding below the stride); other pads stay on the CPU. A weight or bias computed at run time is read
// from the arena (the filter copied to KRSC in NHWC builds).
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {


// The algorithm cuDNN's heuristics rank first among the deterministic ones whose workspace fits.
Expected<cudnnConvolutionBwdDataAlgo_t> pick_bwd_algo(cudnnHandle_t h, const ConvDescs& d, size_t limit) {
  constexpr int kMax = 8;
  cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
  int got = 0;
  KILN_CUDA_TRY(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.c, d.x, kMax, &got, perf));
  for (int i = 0; i < got; ++i) {
    // Deterministic only (backward-data algorithm 0 sums with atomics): an engine rebuilt from its
    // file must give the same bits.
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC && perf[i].memory <= limit) {
      return perf[i].algo;
    }
  }
  KILN_UNSUPPORTED("cuDNN has no backward-data algorithm for this ConvTranspose within {} bytes of workspace", limit);
}

Status lower_conv_transpose(Lowering& L, const Node& n) {
  const Tensor* w = L.constant(n.inputs[1]);
  const Tensor* bias_t = n.has_input(2) ? L.constant(n.inputs[2]) : nullptr;
  const DevValue* wv = nullptr;  // a weight computed at run time
  const DevValue* bv = nullptr;  // a bias computed at run time
  if (!w) {
    KILN_ASSIGN_OR_RETURN(wv, L.rowmajor(n.inputs[1]));
  }
  if (n.has_input(2) && !bias_t) {
    KILN_ASSIGN_OR_RETURN(bv, L.rowmajor(n.inputs[2]));
  }
  const std::vector<int64_t> wshape = w ? w->dims() : wv->dims;
  if (wshape.size() == 3 || wshape.size() == 5) return lower_conv_transpose_nd(L, n);  // 1-D, 3-D: lower_conv_nd.cc
  if (wshape.size() != 4) KILN_UNSUPPORTED("ConvTranspose with a weight of rank {}", wshape.size());
  const std::string ap = n.attr_string("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID" && ap != "SAME_UPPER" && ap != "SAME_LOWER") {
    KILN_UNSUPPORTED("ConvTranspose with auto_pad {}", ap);
  }
  std::vector<int64_t> p = ap == "VALID" ? std::vector<int64_t>{0, 0, 0, 0} : n.attr_ints("pads", {0, 0, 0, 0});
  std::vector<int64_t> st = n.attr_ints("strides", {1, 1}), dil = n.attr_ints("dilations", {1, 1}),
                       op = n.attr_ints("output_padding", {0, 0});
  if (p.size() != 4 || st.size() != 2 || dil.size() != 2 || op.size() != 2) KILN_UNSUPPORTED("ConvTranspose attributes");
  // An output_shape (or SAME's input * stride) decides the pads, as the CPU reference derives them:
  // total = the unpadded size - the wanted one, the odd one at the end for SAME_UPPER, else first.
  std::vector<int64_t> want = n.attr_ints("output_shape");
  if (want.size() == 4) want = {want[2], want[3]};
  const bool same = ap == "SAME_UPPER" || ap == "SAME_LOWER";
  if (want.empty() && same) {
    for (int i = 0; i < 2; ++i) want.push_back(n.inputs[0]->type.shape->dims[size_t(2 + i)].value() * st[size_t(i)]);
  }
  if (!want.empty()) {
    if (want.size() != 2) KILN_UNSUPPORTED("ConvTranspose output_shape of {} values", want.size());
    for (size_t i = 0; i < 2; ++i) {
      const int64_t in = n.inputs[0]->type.shape->dims[2 + i].value();
      const int64_t total = st[i] * (in - 1) + op[i] + (wshape[2 + i] - 1) * dil[i] + 1 - want[i];
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      p[i] = ap == "SAME_UPPER" ? half : total - half;
      p[i + 2] = total - p[i];
    }
  }
  if (p[0] < 0 || p[1] < 0) KILN_UNSUPPORTED("ConvTranspose with negative leading pads {}", dims_to_string(p));
  if (op[0] >= st[0] || op[1] >= st[1]) {
    KILN_UNSUPPORTED("ConvTranspose output_padding {} not below the strides {}", dims_to_string(op), dims_to_string(st));
  }
  // Pads cuDNN cannot place (see the top) take the whole unpadded output into a buffer, cropped after.
  bool crop = false;
  for (int i = 0; i < 2; ++i) {
    const int64_t extra = op[size_t(i)] + p[size_t(i)] - p[size_t(i) + 2];
    crop = crop || extra < 0 || extra >= st[size_t(i)];
  }
  if (crop && (p[2] < 0 || p[3] < 0)) {
    KILN_UNSUPPORTED("ConvTranspose pads {} with output_padding {}", dims_to_string(p), dims_to_string(op));
  }
  const int64_t group = n.attr_int("group", 1);
  auto dt = L.device_dt(n.inputs[0]->type.dtype);
  if (!dt || (*dt != k::DT::kF32 && *dt != k::DT::kF16 && *dt != k::DT::kBF16)) {
    KILN_UNSUPPORTED("ConvTranspose on {}", n.inputs[0]->type.to_string());
  }
  const Layout lay = L.half() ? Layout::kNHWC : Layout::kRowMajor;
  KILN_ASSIGN_OR_RETURN(const DevValue* x, lay == Layout::kNHWC ? L.nhwc(n.inputs[0]) : L.rowmajor(n.inputs[0]));
  if (x->dims.size() != 4 || x->dims[1] != wshape[0]) KILN_UNSUPPORTED("ConvTranspose input {}", dims_to_string(x->dims));
  if ((wv && wv->dt != *dt) || (bv && (bv->dt != *dt || bv->numel() != wshape[1] * group))) {
    KILN_UNSUPPORTED("ConvTranspose weight or bias of another dtype or size");
  }
  std::vector<int64_t> yd;
  for (const Dim& d : n.outputs[0]->type.shape->dims) yd.push_back(d.value());
  const std::array<int64_t, 4> wdims{wshape[0], wshape[1], wshape[2], wshape[3]};
  const std::vector<int64_t> out_dims = yd;
  const std::array<int64_t, 2> lead{p[0], p[1]};
  if (crop) {  // unpadded: stride * (in - 1) + output_padding + (k - 1) * dilation + 1
    for (size_t i = 0; i < 2; ++i) yd[2 + i] = st[i] * (x->dims[2 + i] - 1) + op[i] + (wshape[2 + i] - 1) * dil[i] + 1;
    p = {0, 0, 0, 0};
  }
  // The forward convolution dx (our output) -> dy (our input).
  KILN_ASSIGN_OR_RETURN(ConvDescs d, make_conv_descs(L.keep_alive, L.options().precision, L.options().workspace_bytes, *dt,
                                                     lay, yd, wdims, {int(p[0]), int(p[1])}, {int(st[0]), int(st[1])},
                                                     {int(dil[0]), int(dil[1])}, group, x->dims));
  KILN_ASSIGN_OR_RETURN(cudnnConvolutionBwdDataAlgo_t algo, pick_bwd_algo(L.dnn, d, L.options().workspace_bytes));
  Ref wr, br;
  if (w) {
    if (lay == Layout::kNHWC) {
      KILN_ASSIGN_OR_RETURN(wr, L.upload_derived(*w, "krsc", *dt, [w]() { return filter_krsc(*w); }));
    } else {
      KILN_ASSIGN_OR_RETURN(wr, L.upload_constant(*w, *dt));
    }
  } else {
    wr = (lay == Layout::kNHWC ? filter_krsc_copy(L, n, wv) : wv)->ref;
  }
  if (bias_t) {
    KILN_ASSIGN_OR_RETURN(br, L.upload_constant(*bias_t, *dt));
  } else if (bv) {
    br = bv->ref;
  }
  const DevValue& y = L.define(n.outputs[0], lay);
  DevValue full = y;  // the cropped path's whole output
  if (crop) {
    full.dims = yd;
    full.ref = Ref{false, L.scratch(full.bytes())};
  }
  ByteWriter w8;
  w8.put(int32_t(*dt));
  w8.u8(lay == Layout::kNHWC);
  put(w8, x->dims);
  for (int64_t v : wdims) w8.i64(v);
  for (int64_t v : {p[0], p[1], st[0], st[1], dil[0], dil[1]}) w8.put(int32_t(v));
  w8.i64(group);
  put(w8, yd);
  w8.put(int32_t(algo));
  put(w8, x->ref);
  put(w8, wr);
  put(w8, br);
  put(w8, full.ref);
  L.emit(&n, fmt::format("cudnn conv-transpose {} {} algo {}{}", lay == Layout::kNHWC ? "NHWC" : "NCHW",
                         *dt == k::DT::kF32 ? "fp32" : *dt == k::DT::kF16 ? "fp16" : "bf16", int(algo),
                         bias_t || bv ? " +bias (cudnnAddTensor)" : ""),
         {read_id(x), wv ? int(wr.id) : -1, bv ? int(br.id) : -1}, {full.ref.id}, StepOp::kCudnnConvTranspose,
         std::move(w8));
  if (crop) {
    const std::vector<int64_t> fs = full.strides();
    emit_copy_nd(L, &n, "kernel copy_nd (ConvTranspose output cropped to its pads)", k::dt_size(*dt), full.ref,
                 lead[0] * fs[2] + lead[1] * fs[3], nd(out_dims, fs), y.ref, 0, nd(out_dims, y.strides()));
  }
  return Status::ok();
}

Expected<StepFn> bind_conv_transpose(Params& in, BindCtx& bc) {
  const k::DT dt = in.dt();
  const Layout lay = in.flag() ? Layout::kNHWC : Layout::kRowMajor;
  const std::vector<int64_t> xdims = in.dims();
  std::array<int64_t, 4> wdims{};
  for (int64_t& v : wdims) v = in.i64();
  std::array<int, 6> ci{};
  for (int& v : ci) v = in.i32();
  const int64_t group = in.i64();
  const std::vector<int64_t> ydims = in.dims();
  const auto algo = cudnnConvolutionBwdDataAlgo_t(in.i32());
  const Ref xr = in.ref(), wr = in.ref(), br = in.opt_ref(), yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  auto fits = [](int64_t v) { return v >= 1 && v <= INT32_MAX; };
  bool ok = xdims.size() == 4 && ydims.size() == 4 && group >= 1 && group <= INT32_MAX;
  for (size_t i = 0; ok && i < 4; ++i) ok = fits(xdims[i]) && fits(ydims[i]) && fits(wdims[i]);
  if (!ok) return KILN_ERROR(kInvalidModel, "step '{}': malformed conv-transpose parameters", in.step().label);
  KILN_ASSIGN_OR_RETURN(ConvDescs d, make_conv_descs(bc.keep_alive, bc.opt.precision, bc.opt.workspace_bytes, dt, lay, ydims,
                                                     wdims, {ci[0], ci[1]}, {ci[2], ci[3]}, {ci[4], ci[5]}, group, xdims));
  size_t ws = 0;
  if (cudnnGetConvolutionBackwardDataWorkspaceSize(bc.dnn, d.w, d.y, d.c, d.x, algo, &ws) != CUDNN_STATUS_SUCCESS ||
      ws > bc.opt.workspace_bytes) {
    return KILN_ERROR(kInvalidModel, "step '{}': cuDNN refuses the engine's algorithm {} for this ConvTranspose",
                      in.step().label, int(algo));
  }
  cudnnTensorDescriptor_t bd = nullptr;
  if (br.id >= 0) {
    KILN_ASSIGN_OR_RETURN(bd, make_tensor_desc(bc.keep_alive, {1, wdims[1] * group, 1, 1}, dt, lay));
  }
  // d.x describes the forward convolution's input: our output; d.y its output: our input.
  const auto dxd = d.x, dyd = d.y;
  const auto wd = d.w;
  const auto cd = d.c;
  return StepFn([=](const RunCtx& c) -> Status {
    float one = 1.0f, zero = 0.0f;
    KILN_CUDA_TRY(cudnnConvolutionBackwardData(c.dnn, &one, wd, c.ptr(wr), dyd, c.ptr(xr), cd, algo, c.workspace,
                                               c.workspace_bytes, &zero, dxd, c.ptr(yr)));
    if (bd) KILN_CUDA_TRY(cudnnAddTensor(c.dnn, &one, bd, c.ptr(br), &one, dxd, c.ptr(yr)));
    return Status::ok();
  });
}

}  // namespace

void register_conv_transpose_lowerings(std::map<OpKind, LowerFn>& t) { t[OpKind::kConvTranspose] = lower_conv_transpose; }

void register_conv_transpose_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kCudnnConvTranspose] = bind_conv_transpose; }

}  // namespace kiln::cuda
