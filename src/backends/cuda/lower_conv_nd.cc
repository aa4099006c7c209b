// Conv over 3 spatial dims (video and volumetric models: 3-D UNets, I3D) and over 1 with a weight
// computed at run time (1-D convolutions with a constant weight become 2-D ones in conv-as-planar),
// and ConvTranspose over 1 or 3 spatial dims (cuDNN's backward-data convolution, as the 2-D one in
// lower_conv_transpose.cc): cuDNN's N-d descriptors on row-major NC[D]HW data, 1-D as 2-D of height
// 1. The weight and bias may be constants or values; the algorithm is cuDNN's heuristic first
// choice within the workspace, the bias added by cudnnAddTensor. Pads must be symmetric per dim
// (cuDNN's); a ConvTranspose's output_padding may add up to stride - 1 past them.
#include <algorithm>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

Status destroy_tensor_nd(cudnnTensorDescriptor_t d) { return cuda_status(cudnnDestroyTensorDescriptor(d), "destroy"); }
Status destroy_filter_nd(cudnnFilterDescriptor_t d) { return cuda_status(cudnnDestroyFilterDescriptor(d), "destroy"); }
Status destroy_conv_nd(cudnnConvolutionDescriptor_t d) { return cuda_status(cudnnDestroyConvolutionDescriptor(d), "destroy"); }

cudnnDataType_t nd_type(k::DT dt) {
  return dt == k::DT::kF16    ? CUDNN_DATA_HALF
         : dt == k::DT::kBF16 ? CUDNN_DATA_BFLOAT16
         : dt == k::DT::kF64  ? CUDNN_DATA_DOUBLE
                              : CUDNN_DATA_FLOAT;
}

// One N-d convolution's geometry, as the step record carries it (cuDNN's view: 4 or 5 dims).
struct NdConv {
  std::vector<int64_t> x, w, y;          // [N, C, spatial...], [K, C/group, kernel...], [N, K, spatial...]
  std::vector<int> pads, strides, dil;   // per spatial dim
  int64_t group = 1;
};

struct NdDescs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, b = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t c = nullptr;
};

Expected<cudnnTensorDescriptor_t> tensor_nd(std::vector<std::shared_ptr<void>>& keep, const std::vector<int64_t>& d,
                                            k::DT dt) {
  cudnnTensorDescriptor_t t = nullptr;
  KILN_CUDA_TRY(cudnnCreateTensorDescriptor(&t));
  hold(keep, t, destroy_tensor_nd);
  std::vector<int> di(d.begin(), d.end());
  KILN_CUDA_TRY(cudnnSetTensorNdDescriptorEx(t, CUDNN_TENSOR_NCHW, nd_type(dt), int(di.size()), di.data()));
  return t;
}

// cuDNN's forward view of the convolution: x -> y. A transposed convolution is its backward data,
// dy (the node's input) -> dx (its output), and its bias is over x's channels.
Expected<NdDescs> nd_descs(std::vector<std::shared_ptr<void>>& keep, k::DT dt, Precision prec, const NdConv& g, bool bias,
                           bool transpose) {
  NdDescs d;
  KILN_ASSIGN_OR_RETURN(d.x, tensor_nd(keep, g.x, dt));
  KILN_ASSIGN_OR_RETURN(d.y, tensor_nd(keep, g.y, dt));
  if (bias) {
    const std::vector<int64_t>& out = transpose ? g.x : g.y;
    std::vector<int64_t> bd(out.size(), 1);
    bd[1] = out[1];
    KILN_ASSIGN_OR_RETURN(d.b, tensor_nd(keep, bd, dt));
  }
  KILN_CUDA_TRY(cudnnCreateFilterDescriptor(&d.w));
  hold(keep, d.w, destroy_filter_nd);
  std::vector<int> wi(g.w.begin(), g.w.end());
  KILN_CUDA_TRY(cudnnSetFilterNdDescriptor(d.w, nd_type(dt), CUDNN_TENSOR_NCHW, int(wi.size()), wi.data()));
  KILN_CUDA_TRY(cudnnCreateConvolutionDescriptor(&d.c));
  hold(keep, d.c, destroy_conv_nd);
  std::vector<int> p = g.pads, s = g.strides, dl = g.dil;
  KILN_CUDA_TRY(cudnnSetConvolutionNdDescriptor(d.c, int(p.size()), p.data(), s.data(), dl.data(), CUDNN_CROSS_CORRELATION,
                                                dt == k::DT::kF64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT));
  KILN_CUDA_TRY(cudnnSetConvolutionGroupCount(d.c, int(g.group)));
  const cudnnMathType_t math = dt == k::DT::kF64 ? CUDNN_FMA_MATH
                               : dt != k::DT::kF32 ? CUDNN_TENSOR_OP_MATH
                               : prec == Precision::kTf32 ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                                                          : CUDNN_FMA_MATH;
  KILN_CUDA_TRY(cudnnSetConvolutionMathType(d.c, math));
  return d;
}

// cuDNN's heuristic first choice that is deterministic and whose workspace fits, forward or
// backward-data.
template <class Perf>
Expected<int> pick_algo(Lowering& L, const NdDescs& d, bool transpose, bool exact) {
  constexpr int kMax = 8;
  Perf perf[kMax];
  int got = 0;
  cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
  if constexpr (std::is_same_v<Perf, cudnnConvolutionBwdDataAlgoPerf_t>) {
    st = cudnnGetConvolutionBackwardDataAlgorithm_v7(L.dnn, d.w, d.y, d.c, d.x, kMax, &got, perf);
  } else {
    st = cudnnGetConvolutionForwardAlgorithm_v7(L.dnn, d.x, d.w, d.c, d.y, kMax, &got, perf);
  }
  for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < got; ++i) {
    // Deterministic only: an engine rebuilt from its file must give the same bits. An f64
    // convolution is the integer ops' exact product: direct sums only (no FFT or Winograd).
    bool direct = true;
    if constexpr (std::is_same_v<Perf, cudnnConvolutionFwdAlgoPerf_t>) {
      direct = perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
               perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM || perf[i].algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM;
    }
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].determinism == CUDNN_DETERMINISTIC &&
        perf[i].memory <= L.options().workspace_bytes && (!exact || direct)) {
      return int(perf[i].algo);
    }
  }
  KILN_UNSUPPORTED("cuDNN has no {} algorithm for this convolution within the workspace", transpose ? "backward-data" : "forward");
}

// The step for convolution g (cuDNN's forward view; transpose: its backward data), reading x (the
// node's input), w and b (may be null) and writing `out`, else the node's output.
Status emit_conv_nd(Lowering& L, const Node& n, bool transpose, NdConv g, const DevValue* x, const DevValue* w,
                    const DevValue* b, const DevValue* out = nullptr) {
  const size_t sp = g.x.size() - 2;
  if (sp == 1) {  // cuDNN's N-d API wants 4 dims at least: a height of 1
    for (auto* v : {&g.x, &g.w, &g.y}) v->insert(v->begin() + 2, 1);
    g.pads.insert(g.pads.begin(), 0);
    g.strides.insert(g.strides.begin(), 1);
    g.dil.insert(g.dil.begin(), 1);
  }
  // cuDNN's descriptors take int dims and strides: every leading stride must fit.
  for (const auto* v : {&g.x, &g.w, &g.y}) {
    int64_t inner = 1;
    for (size_t i = v->size(); i-- > 1;) inner *= (*v)[i];
    if (inner > INT32_MAX || (*v)[0] > INT32_MAX ||
        std::any_of(v->begin(), v->end(), [](int64_t e) { return e < 1; })) {
      KILN_UNSUPPORTED("{} of {} with a weight {}", op_name(n.op), dims_to_string(x->dims), dims_to_string(w->dims));
    }
  }
  if (g.group < 1 || g.x[1] != g.w[1] * g.group || g.w[0] % g.group != 0 || g.y[1] != g.w[0]) {
    KILN_UNSUPPORTED("{} of {} channels to {} in {} groups", op_name(n.op), g.x[1], g.w[0], g.group);
  }
  // A cuDNN refusal here is a node the GPU declines (the CPU runs it), not a failed build.
  auto descs = nd_descs(L.keep_alive, x->dt, L.options().precision, g, b != nullptr, transpose);
  if (!descs) KILN_UNSUPPORTED("cuDNN declines this convolution: {}", descs.status().message());
  const NdDescs d = *descs;
  std::vector<int> want(g.y.size());
  if (cudnnGetConvolutionNdForwardOutputDim(d.c, d.x, d.w, int(want.size()), want.data()) != CUDNN_STATUS_SUCCESS ||
      !std::equal(want.begin(), want.end(), g.y.begin(), [](int a, int64_t e) { return int64_t(a) == e; })) {
    KILN_UNSUPPORTED("{}: {} -> {} is not cuDNN's geometry", op_name(n.op), dims_to_string(g.x), dims_to_string(g.y));
  }
  KILN_ASSIGN_OR_RETURN(const int algo, transpose ? pick_algo<cudnnConvolutionBwdDataAlgoPerf_t>(L, d, true, false)
                                                  : pick_algo<cudnnConvolutionFwdAlgoPerf_t>(L, d, false, x->dt == k::DT::kF64));
  const DevValue& y = out ? *out : L.define(n.outputs[0]);
  ByteWriter rec;
  rec.put(int32_t(x->dt));
  put(rec, g.x);
  put(rec, g.w);
  put(rec, g.y);
  for (const auto* v : {&g.pads, &g.strides, &g.dil}) {
    for (int e : *v) rec.put(int32_t(e));
  }
  rec.i64(g.group);
  rec.put(int32_t(algo));
  put(rec, x->ref);
  put(rec, w->ref);
  put(rec, b ? b->ref : Ref{});
  put(rec, y.ref);
  L.emit(&n, fmt::format("cudnn {} {}-D algo {}{}", transpose ? "backward-data conv" : "conv", sp, algo, b ? " +bias (cudnnAddTensor)" : ""),
         {read_id(x), read_id(w), read_id(b)}, {y.ref.id}, transpose ? StepOp::kCudnnConvTransposeNd : StepOp::kCudnnConvNd,
         std::move(rec));
  return Status::ok();
}

}  // namespace

namespace {

// Conv's geometry for x by w into n's output, in cuDNN's forward view: SAME pads resolved (the
// output is ceil(in / stride)); pads must be symmetric per dim.
Expected<NdConv> conv_geometry(const Node& n, const std::vector<int64_t>& xd, const std::vector<int64_t>& wd) {
  const size_t sp = xd.size() - 2;
  std::vector<int64_t> st = n.attr_ints("strides", std::vector<int64_t>(sp, 1));
  std::vector<int64_t> dil = n.attr_ints("dilations", std::vector<int64_t>(sp, 1));
  const std::string ap = n.attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> p = ap == "NOTSET" ? n.attr_ints("pads", std::vector<int64_t>(2 * sp, 0)) : std::vector<int64_t>(2 * sp, 0);
  if (st.size() != sp || dil.size() != sp || p.size() != 2 * sp) KILN_UNSUPPORTED("{} attributes for {} spatial dims", op_name(n.op), sp);
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    for (size_t i = 0; i < sp; ++i) {
      const int64_t in = xd[2 + i], kk = wd[2 + i], out = (in + st[i] - 1) / st[i];
      const int64_t total = std::max<int64_t>(0, (out - 1) * st[i] + (kk - 1) * dil[i] + 1 - in);
      p[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      p[i + sp] = total - p[i];
    }
  } else if (ap != "NOTSET" && ap != "VALID") {
    KILN_UNSUPPORTED("{} with auto_pad {}", op_name(n.op), ap);
  }
  for (size_t i = 0; i < sp; ++i) {
    if (p[i] != p[i + sp]) KILN_UNSUPPORTED("{} of {} spatial dims with asymmetric pads", op_name(n.op), sp);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  NdConv g;
  g.x = xd;
  g.w = wd;
  g.y = yd;
  g.group = n.attr_int("group", 1);
  for (size_t i = 0; i < sp; ++i) {
    g.pads.push_back(int(p[i]));
    g.strides.push_back(int(st[i]));
    g.dil.push_back(int(dil[i]));
  }
  return g;
}

// x and w of a Conv or ConvTranspose over 1 or 3 spatial dims: row-major, of one float type.
Expected<std::pair<const DevValue*, const DevValue*>> nd_operands(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* w, L.rowmajor(n.inputs[1]));
  const size_t r = x->dims.size();
  if ((r != 3 && r != 5) || w->dims.size() != r) {
    KILN_UNSUPPORTED("{} of rank {} with a weight of rank {}", op_name(n.op), r, w->dims.size());
  }
  if (x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16) {
    KILN_UNSUPPORTED("{} on {}", op_name(n.op), dtype_name(x->ir_dtype));
  }
  if (w->dt != x->dt) KILN_UNSUPPORTED("{} with a weight of another dtype", op_name(n.op));
  return std::make_pair(x, w);
}

}  // namespace

Status lower_conv_nd(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(auto xw, nd_operands(L, n));
  const auto [x, w] = xw;
  const DevValue* b = nullptr;
  if (n.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(b, L.rowmajor(n.inputs[2]));
    if (b->dt != x->dt || b->numel() != w->dims[0]) KILN_UNSUPPORTED("Conv bias {}", dims_to_string(b->dims));
  }
  KILN_ASSIGN_OR_RETURN(NdConv g, conv_geometry(n, x->dims, w->dims));
  return emit_conv_nd(L, n, false, std::move(g), x, w, b);
}

Status emit_conv_f64(Lowering& L, const Node& n, const DevValue* x, const DevValue* w, const DevValue& y) {
  const size_t r = x->dims.size();
  if (r < 3 || r > 5 || w->dims.size() != r) KILN_UNSUPPORTED("{} of rank {} with a weight of rank {}", op_name(n.op), r, w->dims.size());
  if (x->dt != k::DT::kF64 || w->dt != k::DT::kF64 || y.dt != k::DT::kF64) KILN_UNSUPPORTED("an f64 convolution of other types");
  KILN_ASSIGN_OR_RETURN(NdConv g, conv_geometry(n, x->dims, w->dims));
  if (g.y != y.dims) KILN_UNSUPPORTED("{} into {}", op_name(n.op), dims_to_string(y.dims));
  return emit_conv_nd(L, n, false, std::move(g), x, w, nullptr, &y);
}

// ConvTranspose of 1 or 3 spatial dims. The pads follow lower_conv_transpose.cc: output_shape or
// SAME decide them from the wanted size; cuDNN pads symmetrically by the leading pad, which places
// ONNX's outputs whenever 0 <= output_padding + pad_begin - pad_end < stride.
Status lower_conv_transpose_nd(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(auto xw, nd_operands(L, n));
  const auto [x, w] = xw;
  const size_t r = x->dims.size();
  const size_t sp = r - 2;
  const std::string ap = n.attr_string("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID" && ap != "SAME_UPPER" && ap != "SAME_LOWER") KILN_UNSUPPORTED("ConvTranspose with auto_pad {}", ap);
  std::vector<int64_t> p = ap == "VALID" ? std::vector<int64_t>(2 * sp, 0) : n.attr_ints("pads", std::vector<int64_t>(2 * sp, 0));
  const std::vector<int64_t> st = n.attr_ints("strides", std::vector<int64_t>(sp, 1)),
                             dil = n.attr_ints("dilations", std::vector<int64_t>(sp, 1)),
                             op = n.attr_ints("output_padding", std::vector<int64_t>(sp, 0));
  if (p.size() != 2 * sp || st.size() != sp || dil.size() != sp || op.size() != sp) KILN_UNSUPPORTED("ConvTranspose attributes");
  std::vector<int64_t> want = n.attr_ints("output_shape");
  if (want.size() == r) want.erase(want.begin(), want.begin() + 2);
  const bool same = ap == "SAME_UPPER" || ap == "SAME_LOWER";
  if (want.empty() && same) {
    for (size_t i = 0; i < sp; ++i) want.push_back(x->dims[2 + i] * st[i]);
  }
  if (!want.empty() && want.size() != sp) KILN_UNSUPPORTED("ConvTranspose output_shape of {} values", want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const int64_t total = st[i] * (x->dims[2 + i] - 1) + op[i] + (w->dims[2 + i] - 1) * dil[i] + 1 - want[i];
    const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
    p[i] = ap == "SAME_UPPER" ? half : total - half;
    p[i + sp] = total - p[i];
  }
  for (size_t i = 0; i < sp; ++i) {
    const int64_t extra = op[i] + p[i] - p[i + sp];
    if (p[i] < 0 || extra < 0 || extra >= st[i]) {
      KILN_UNSUPPORTED("ConvTranspose of {} spatial dims with pads {} and output_padding {}", sp, dims_to_string(p), dims_to_string(op));
    }
  }
  const int64_t group = n.attr_int("group", 1);
  const DevValue* b = nullptr;
  if (n.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(b, L.rowmajor(n.inputs[2]));
    if (b->dt != x->dt || b->numel() != w->dims[1] * group) KILN_UNSUPPORTED("ConvTranspose bias {}", dims_to_string(b->dims));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  NdConv g;  // the forward convolution yd -> x's dims
  g.x = yd;
  g.w = w->dims;
  g.y = x->dims;
  g.group = group;
  for (size_t i = 0; i < sp; ++i) {
    g.pads.push_back(int(p[i]));
    g.strides.push_back(int(st[i]));
    g.dil.push_back(int(dil[i]));
  }
  return emit_conv_nd(L, n, true, std::move(g), x, w, b);
}

namespace {

Expected<StepFn> bind_conv_nd(Params& in, BindCtx& bc) {
  const k::DT dt = in.dt();
  NdConv g;
  g.x = in.dims();
  g.w = in.dims();
  g.y = in.dims();
  const size_t sp = g.x.size() >= 2 ? g.x.size() - 2 : 0;
  for (auto* v : {&g.pads, &g.strides, &g.dil}) {
    for (size_t i = 0; i < sp && i < 3; ++i) v->push_back(in.i32());
  }
  g.group = in.i64();
  const int algo = in.i32();
  const bool transpose = in.step().kind == uint16_t(StepOp::kCudnnConvTransposeNd);
  const Ref xr = in.ref(), wr = in.ref(), br = in.opt_ref(), yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  auto in_range = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t e) { return e >= 1 && e <= INT32_MAX; });
  };
  if ((sp != 2 && sp != 3) || g.w.size() != g.x.size() || g.y.size() != g.x.size() || g.group < 1 || g.group > INT32_MAX ||
      !in_range(g.x) || !in_range(g.w) || !in_range(g.y) || g.pads.size() != sp ||
      std::any_of(g.pads.begin(), g.pads.end(), [](int e) { return e < 0; }) ||
      std::any_of(g.strides.begin(), g.strides.end(), [](int e) { return e < 1; }) ||
      std::any_of(g.dil.begin(), g.dil.end(), [](int e) { return e < 1; })) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed N-d convolution parameters", in.step().label);
  }
  KILN_ASSIGN_OR_RETURN(NdDescs d, nd_descs(bc.keep_alive, dt, bc.opt.precision, g, br.id >= 0, transpose));
  size_t ws = 0;
  const auto fwd = cudnnConvolutionFwdAlgo_t(algo);
  const auto bwd = cudnnConvolutionBwdDataAlgo_t(algo);
  const cudnnStatus_t st = transpose ? cudnnGetConvolutionBackwardDataWorkspaceSize(bc.dnn, d.w, d.y, d.c, d.x, bwd, &ws)
                                     : cudnnGetConvolutionForwardWorkspaceSize(bc.dnn, d.x, d.w, d.c, d.y, fwd, &ws);
  if (st != CUDNN_STATUS_SUCCESS || ws > bc.opt.workspace_bytes) {
    return KILN_ERROR(kInvalidModel, "step '{}': cuDNN refuses the engine's algorithm {} for this convolution",
                      in.step().label, algo);
  }
  return StepFn([=](const RunCtx& c) -> Status {
    // cuDNN scales f64 data by doubles, every other type by floats.
    const float one_f = 1.0f, zero_f = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const void* one = dt == k::DT::kF64 ? static_cast<const void*>(&one_d) : &one_f;
    const void* zero = dt == k::DT::kF64 ? static_cast<const void*>(&zero_d) : &zero_f;
    if (transpose) {  // dx (the output) from dy (the input)
      KILN_CUDA_TRY(cudnnConvolutionBackwardData(c.dnn, one, d.w, c.ptr(wr), d.y, c.ptr(xr), d.c, bwd, c.workspace,
                                                 c.workspace_bytes, zero, d.x, c.ptr(yr)));
      if (br.id >= 0) KILN_CUDA_TRY(cudnnAddTensor(c.dnn, one, d.b, c.ptr(br), one, d.x, c.ptr(yr)));
    } else {
      KILN_CUDA_TRY(cudnnConvolutionForward(c.dnn, one, d.x, c.ptr(xr), d.w, c.ptr(wr), d.c, fwd, c.workspace,
                                            c.workspace_bytes, zero, d.y, c.ptr(yr)));
      if (br.id >= 0) KILN_CUDA_TRY(cudnnAddTensor(c.dnn, one, d.b, c.ptr(br), one, d.y, c.ptr(yr)));
    }
    return Status::ok();
  });
}

}  // namespace

void register_conv_nd_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kCudnnConvNd] = bind_conv_nd;
  t[StepOp::kCudnnConvTransposeNd] = bind_conv_nd;
}

}  // namespace kiln::cuda
