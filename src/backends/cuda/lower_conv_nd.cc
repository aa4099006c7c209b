// Conv over 3 spatial dims (video and volumetric models: 3-D UNets, I3D) and over 1 with a weight
// computed at run time (1-D convolutions with a constant weight become 2-D ones in conv-as-planar):
// cuDNN's N-d descriptors on row-major NC[D]HW data, a 1-D convolution as a 2-D one of height 1.
// The weight and bias may be constants or values; the algorithm is cuDNN's heuristic first choice
// within the workspace, the bias added by cudnnAddTensor. Pads must be symmetric per dim (cuDNN's).
#include <algorithm>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

Status destroy_tensor_nd(cudnnTensorDescriptor_t d) { return cuda_status(cudnnDestroyTensorDescriptor(d), "destroy"); }
Status destroy_filter_nd(cudnnFilterDescriptor_t d) { return cuda_status(cudnnDestroyFilterDescriptor(d), "destroy"); }
Status destroy_conv_nd(cudnnConvolutionDescriptor_t d) { return cuda_status(cudnnDestroyConvolutionDescriptor(d), "destroy"); }

cudnnDataType_t nd_type(k::DT dt) {
  return dt == k::DT::kF16 ? CUDNN_DATA_HALF : dt == k::DT::kBF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
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

Expected<NdDescs> nd_descs(std::vector<std::shared_ptr<void>>& keep, k::DT dt, Precision prec, const NdConv& g, bool bias) {
  NdDescs d;
  KILN_ASSIGN_OR_RETURN(d.x, tensor_nd(keep, g.x, dt));
  KILN_ASSIGN_OR_RETURN(d.y, tensor_nd(keep, g.y, dt));
  if (bias) {
    std::vector<int64_t> bd(g.y.size(), 1);
    bd[1] = g.y[1];
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
                                                CUDNN_DATA_FLOAT));
  KILN_CUDA_TRY(cudnnSetConvolutionGroupCount(d.c, int(g.group)));
  const cudnnMathType_t math = dt != k::DT::kF32 ? CUDNN_TENSOR_OP_MATH
                               : prec == Precision::kTf32 ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                                                          : CUDNN_FMA_MATH;
  KILN_CUDA_TRY(cudnnSetConvolutionMathType(d.c, math));
  return d;
}

}  // namespace

Status lower_conv_nd(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* w, L.rowmajor(n.inputs[1]));
  const size_t r = x->dims.size();
  if ((r != 3 && r != 5) || w->dims.size() != r) KILN_UNSUPPORTED("Conv of rank {} with a weight of rank {}", r, w->dims.size());
  if (x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16) KILN_UNSUPPORTED("Conv on {}", dtype_name(x->ir_dtype));
  if (w->dt != x->dt) KILN_UNSUPPORTED("Conv with a weight of another dtype");
  const size_t sp = r - 2;
  std::vector<int64_t> st = n.attr_ints("strides", std::vector<int64_t>(sp, 1));
  std::vector<int64_t> dil = n.attr_ints("dilations", std::vector<int64_t>(sp, 1));
  const std::string ap = n.attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> p = ap == "NOTSET" ? n.attr_ints("pads", std::vector<int64_t>(2 * sp, 0)) : std::vector<int64_t>(2 * sp, 0);
  if (st.size() != sp || dil.size() != sp || p.size() != 2 * sp) KILN_UNSUPPORTED("Conv attributes for {} spatial dims", sp);
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {  // the output is ceil(in / stride)
    for (size_t i = 0; i < sp; ++i) {
      const int64_t in = x->dims[2 + i], kk = w->dims[2 + i], out = (in + st[i] - 1) / st[i];
      const int64_t total = std::max<int64_t>(0, (out - 1) * st[i] + (kk - 1) * dil[i] + 1 - in);
      p[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      p[i + sp] = total - p[i];
    }
  } else if (ap != "NOTSET" && ap != "VALID") {
    KILN_UNSUPPORTED("Conv with auto_pad {}", ap);
  }
  for (size_t i = 0; i < sp; ++i) {
    if (p[i] != p[i + sp]) KILN_UNSUPPORTED("Conv of {} spatial dims with asymmetric pads", sp);
  }
  const DevValue* b = nullptr;
  if (n.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(b, L.rowmajor(n.inputs[2]));
    if (b->dt != x->dt || b->numel() != w->dims[0]) KILN_UNSUPPORTED("Conv bias {}", dims_to_string(b->dims));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  NdConv g;
  g.x = x->dims;
  g.w = w->dims;
  g.y = yd;
  g.group = n.attr_int("group", 1);
  for (size_t i = 0; i < sp; ++i) {
    g.pads.push_back(int(p[i]));
    g.strides.push_back(int(st[i]));
    g.dil.push_back(int(dil[i]));
  }
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
      KILN_UNSUPPORTED("Conv of {} with a weight {}", dims_to_string(x->dims), dims_to_string(w->dims));
    }
  }
  if (g.group < 1 || g.x[1] != g.w[1] * g.group || g.w[0] % g.group != 0 || g.y[1] != g.w[0]) {
    KILN_UNSUPPORTED("Conv of {} channels to {} in {} groups", g.x[1], g.w[0], g.group);
  }
  // A cuDNN refusal here is a node the GPU declines (the CPU runs it), not a failed build.
  auto descs = nd_descs(L.keep_alive, x->dt, L.options().precision, g, b != nullptr);
  if (!descs) KILN_UNSUPPORTED("cuDNN declines this convolution: {}", descs.status().message());
  const NdDescs d = *descs;
  std::vector<int> want(g.y.size());
  if (cudnnGetConvolutionNdForwardOutputDim(d.c, d.x, d.w, int(want.size()), want.data()) != CUDNN_STATUS_SUCCESS ||
      !std::equal(want.begin(), want.end(), g.y.begin(), [](int a, int64_t e) { return int64_t(a) == e; })) {
    KILN_UNSUPPORTED("Conv output {} is not cuDNN's", dims_to_string(yd));
  }
  constexpr int kMax = 8;
  cudnnConvolutionFwdAlgoPerf_t perf[kMax];
  int got = 0;
  if (cudnnGetConvolutionForwardAlgorithm_v7(L.dnn, d.x, d.w, d.c, d.y, kMax, &got, perf) != CUDNN_STATUS_SUCCESS) got = 0;
  int algo = -1;
  for (int i = 0; i < got && algo < 0; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= L.options().workspace_bytes) algo = int(perf[i].algo);
  }
  if (algo < 0) KILN_UNSUPPORTED("cuDNN has no forward algorithm for this Conv within the workspace");
  const DevValue& y = L.define(n.outputs[0]);
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
  L.emit(&n, fmt::format("cudnn conv {}-D algo {}{}", sp, algo, b ? " +bias (cudnnAddTensor)" : ""),
         {read_id(x), read_id(w), read_id(b)}, {y.ref.id}, StepOp::kCudnnConvNd, std::move(rec));
  return Status::ok();
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
  const auto algo = cudnnConvolutionFwdAlgo_t(in.i32());
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
  KILN_ASSIGN_OR_RETURN(NdDescs d, nd_descs(bc.keep_alive, dt, bc.opt.precision, g, br.id >= 0));
  size_t ws = 0;
  if (cudnnGetConvolutionForwardWorkspaceSize(bc.dnn, d.x, d.w, d.c, d.y, algo, &ws) != CUDNN_STATUS_SUCCESS ||
      ws > bc.opt.workspace_bytes) {
    return KILN_ERROR(kInvalidModel, "step '{}': cuDNN refuses the engine's algorithm {} for this convolution",
                      in.step().label, int(algo));
  }
  return StepFn([=](const RunCtx& c) -> Status {
    const float one = 1.0f, zero = 0.0f;
    KILN_CUDA_TRY(cudnnConvolutionForward(c.dnn, &one, d.x, c.ptr(xr), d.w, c.ptr(wr), d.c, algo, c.workspace,
                                          c.workspace_bytes, &zero, d.y, c.ptr(yr)));
    if (br.id >= 0) KILN_CUDA_TRY(cudnnAddTensor(c.dnn, &one, d.b, c.ptr(br), &one, d.y, c.ptr(yr)));
    return Status::ok();
  });
}

}  // namespace

void register_conv_nd_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kCudnnConvNd] = bind_conv_nd; }

}  // namespace kiln::cuda
