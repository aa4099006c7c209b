// Conv with a weight or bias computed at run time (a hypernetwork's filters, dynamic convolutions,
// the ONNX tests that feed the weight as an input): cuDNN's forward convolution reads the filter
// and bias from the arena instead of uploaded constants. The constant-weight lowering's extras
// (algorithm timing, fused activations, GEMM and depthwise paths, asymmetric padding) are not
// taken: the algorithm is cuDNN's heuristic first choice that fits the workspace, the bias is
// added by cudnnAddTensor (the kCudnnConv record's separate-bias form).
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

Expected<cudnnConvolutionFwdAlgo_t> pick_fwd_algo(cudnnHandle_t h, const ConvDescs& d, size_t limit) {
  constexpr int kMax = 8;
  cudnnConvolutionFwdAlgoPerf_t perf[kMax];
  int got = 0;
  KILN_CUDA_TRY(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.c, d.y, kMax, &got, perf));
  for (int i = 0; i < got; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit) return perf[i].algo;
  }
  KILN_UNSUPPORTED("cuDNN has no forward algorithm for this Conv within {} bytes of workspace", limit);
}

}  // namespace

const DevValue* filter_krsc_copy(Lowering& L, const Node& n, const DevValue* w) {
  auto* f = new DevValue(*w);
  L.keep_alive.emplace_back(f, [](void* p) { delete static_cast<DevValue*>(p); });
  f->ref = Ref{false, L.scratch(f->bytes())};
  const std::vector<int64_t>& d = w->dims;  // [K, C, R, S]
  const std::vector<int64_t> ws = w->strides();
  // Walk [K, R, S, C] in the destination's order, reading w's strides.
  emit_copy_nd(L, &n, "kernel copy_nd (filter KCRS -> KRSC)", k::dt_size(w->dt), w->ref, 0,
               nd({d[0], d[2], d[3], d[1]}, {ws[0], ws[2], ws[3], ws[1]}), f->ref, 0,
               nd({d[0], d[2], d[3], d[1]}, contiguous_strides({d[0], d[2], d[3], d[1]})));
  return f;
}

Status lower_conv_fed(Lowering& L, const Node& n) {
  if (n.inputs[0]->type.has_rank() && (n.inputs[0]->type.shape->rank() == 3 || n.inputs[0]->type.shape->rank() == 5)) {
    return lower_conv_nd(L, n);
  }
  if (!n.inputs[1]->type.has_rank() || n.inputs[1]->type.shape->rank() != 4 || !n.inputs[0]->type.has_rank() ||
      n.inputs[0]->type.shape->rank() != 4) {
    KILN_UNSUPPORTED("Conv of that rank (1-, 2- and 3-D convolutions of known shape)");
  }
  const std::string ap = n.attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> p = ap == "NOTSET" ? n.attr_ints("pads", {0, 0, 0, 0}) : std::vector<int64_t>{0, 0, 0, 0};
  std::vector<int64_t> st = n.attr_ints("strides", {1, 1}), dil = n.attr_ints("dilations", {1, 1});
  if (p.size() != 4 || st.size() != 2 || dil.size() != 2) KILN_UNSUPPORTED("Conv attributes (2-D convolutions only)");
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {  // the output is ceil(in / stride)
    const Value* w = n.inputs[1];
    for (size_t i = 0; i < 2; ++i) {
      const int64_t in = n.inputs[0]->type.shape->dims[2 + i].value(), k = w->type.shape->dims[2 + i].value();
      const int64_t out = (in + st[i] - 1) / st[i];
      const int64_t total = std::max<int64_t>(0, (out - 1) * st[i] + (k - 1) * dil[i] + 1 - in);
      p[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      p[i + 2] = total - p[i];
    }
  } else if (ap != "NOTSET" && ap != "VALID") {
    KILN_UNSUPPORTED("Conv with a weight computed at run time and auto_pad {}", ap);
  }
  if (p[0] != p[2] || p[1] != p[3]) KILN_UNSUPPORTED("Conv with a weight computed at run time and asymmetric pads");
  const int64_t group = n.attr_int("group", 1);
  auto dt = L.device_dt(n.inputs[0]->type.dtype);
  if (!dt || (*dt != k::DT::kF32 && *dt != k::DT::kF16 && *dt != k::DT::kBF16)) {
    KILN_UNSUPPORTED("Conv on {}", n.inputs[0]->type.to_string());
  }
  const Layout lay = L.half() ? Layout::kNHWC : Layout::kRowMajor;
  KILN_ASSIGN_OR_RETURN(const DevValue* x, lay == Layout::kNHWC ? L.nhwc(n.inputs[0]) : L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* w, L.rowmajor(n.inputs[1]));
  if (x->dims.size() != 4 || w->dims.size() != 4) KILN_UNSUPPORTED("Conv of rank {} (2-D convolutions only)", x->dims.size());
  if (w->dt != *dt) KILN_UNSUPPORTED("Conv with a weight of another dtype");
  const DevValue* b = nullptr;
  if (n.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(b, L.rowmajor(n.inputs[2]));
    if (b->dt != *dt || b->numel() != w->dims[0]) KILN_UNSUPPORTED("Conv bias {}", dims_to_string(b->dims));
  }
  std::vector<int64_t> yd;
  for (const Dim& d : n.outputs[0]->type.shape->dims) yd.push_back(d.value());
  const std::array<int64_t, 4> wdims{w->dims[0], w->dims[1], w->dims[2], w->dims[3]};
  KILN_ASSIGN_OR_RETURN(ConvDescs d, make_conv_descs(L.keep_alive, L.options().precision, L.options().workspace_bytes, *dt,
                                                     lay, x->dims, wdims, {int(p[0]), int(p[1])}, {int(st[0]), int(st[1])},
                                                     {int(dil[0]), int(dil[1])}, group, yd));
  KILN_ASSIGN_OR_RETURN(cudnnConvolutionFwdAlgo_t algo, pick_fwd_algo(L.dnn, d, L.options().workspace_bytes));
  if (lay == Layout::kNHWC) w = filter_krsc_copy(L, n, w);
  const DevValue& y = L.define(n.outputs[0], lay);
  ByteWriter r;  // the kCudnnConv record (lower_conv.cc), bias added separately, no activation
  r.put(int32_t(*dt));
  r.u8(lay == Layout::kNHWC);
  put(r, x->dims);
  for (int64_t v : wdims) r.i64(v);
  for (int64_t v : {p[0], p[1], st[0], st[1], dil[0], dil[1]}) r.put(int32_t(v));
  r.i64(group);
  put(r, yd);
  r.put(int32_t(algo));
  r.u8(b != nullptr);  // fuse: a bias
  r.u8(b != nullptr);  // separate_bias
  r.u8(0);             // relu
  put(r, x->ref);
  put(r, w->ref);
  put(r, b ? b->ref : Ref{});
  put(r, Ref{});
  put(r, y.ref);
  L.emit(&n, fmt::format("cudnn conv {} (weight computed at run time) algo {}{}", lay == Layout::kNHWC ? "NHWC" : "NCHW",
                         int(algo), b ? " +bias (cudnnAddTensor)" : ""),
         {read_id(x), read_id(w), read_id(b)}, {y.ref.id}, StepOp::kCudnnConv, std::move(r));
  return Status::ok();
}

}  // namespace kiln::cuda
