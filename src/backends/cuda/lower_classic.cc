// Ops of older model families: LRN (AlexNet, GoogLeNet: cuDNN's cross-channel LRN), and those with
// no library kernel: ReverseSequence (bidirectional sequence models), Det (k::det, small matrices)
// MaxUnpool (SegNet-style decoders: a zero fill and a scatter of the pooled values at their flat
// indices) and RoiAlign (two-stage detectors' box heads: k::roi_align, whose per-bin math is the CPU
// kernel's, ops/roi_align_math.h; a batch index out of range is the run's error).
#include <algorithm>

#include "backends/cuda/kernels/roi.h"
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

Status lower_reverse_sequence(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* lens, L.rowmajor(n.inputs[1]));
  const int64_t batch_axis = n.attr_int("batch_axis", 1), time_axis = n.attr_int("time_axis", 0);
  if (x->dims.size() < 2 || batch_axis + time_axis != 1 || (batch_axis != 0 && batch_axis != 1)) {
    KILN_UNSUPPORTED("ReverseSequence with batch_axis {} and time_axis {} of rank {}", batch_axis, time_axis,
                     x->dims.size());
  }
  if (lens->dt != k::DT::kI64 && lens->dt != k::DT::kI32) {
    KILN_UNSUPPORTED("ReverseSequence lengths of {}", dtype_name(lens->ir_dtype));
  }
  if (lens->numel() != x->dims[size_t(batch_axis)]) {
    KILN_UNSUPPORTED("ReverseSequence with {} lengths for a batch of {}", lens->numel(), x->dims[size_t(batch_axis)]);
  }
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter w;
  w.put(int32_t(k::dt_size(x->dt)));
  w.put(int32_t(lens->dt));
  put(w, x->ref);
  put(w, lens->ref);
  put(w, y.ref);
  w.i64(x->dims[0]);
  w.i64(x->dims[1]);
  w.i64(prod_of(x->dims, 2, x->dims.size()));
  w.u8(batch_axis == 0);
  L.emit(&n, "kernel reverse_sequence", {read_id(x), read_id(lens)}, {y.ref.id}, StepOp::kReverseSequence, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_reverse_sequence(Params& in, BindCtx&) {
  const int32_t eb = in.i32();
  const k::DT ldt = in.dt();
  const Ref xr = in.ref(), lr = in.ref(), yr = in.ref();
  const int64_t d0 = in.i64(), d1 = in.i64(), inner = in.i64();
  const bool batch_first = in.flag();
  KILN_RETURN_IF_ERROR(in.done());
  if ((eb != 1 && eb != 2 && eb != 4 && eb != 8) || d0 < 0 || d1 < 0 || inner < 0) {
    return KILN_ERROR(kInvalidModel, "{}: malformed reverse_sequence parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::reverse_sequence(eb, c.ptr(xr), c.ptr(lr), ldt, c.ptr(yr), d0, d1, inner, batch_first, c.stream),
                       "reverse_sequence");
  });
}

Status lower_det(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  const size_t r = x->dims.size();
  if (r < 2 || x->dims[r - 1] != x->dims[r - 2]) KILN_UNSUPPORTED("Det of {}", dims_to_string(x->dims));
  if (x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16 && x->dt != k::DT::kF64) {
    KILN_UNSUPPORTED("Det of {}", dtype_name(x->ir_dtype));
  }
  const int64_t m = x->dims[r - 1], batch = prod_of(x->dims, 0, r - 2);
  const int work = L.scratch(size_t(std::max<int64_t>(batch * m * m, 1)) * sizeof(double));
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter w;
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, y.ref);
  put(w, Ref{false, work});
  w.i64(batch);
  w.i64(m);
  L.emit(&n, "kernel det", {read_id(x), work}, {y.ref.id, work}, StepOp::kDet, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_det(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref(), wr = in.ref();
  const int64_t batch = in.i64(), m = in.i64();
  KILN_RETURN_IF_ERROR(in.done());
  if (batch < 0 || m < 0 || wr.weight) return KILN_ERROR(kInvalidModel, "{}: malformed det parameters", in.step().label);
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::det(dt, c.ptr(xr), c.ptr(yr), static_cast<double*>(c.ptr(wr)), batch, m, c.stream), "det");
  });
}

// MaxUnpool: y = 0, then y.flat[I.flat] = X.flat (MaxPool's Indices count over the whole tensor).
// An output_shape larger than the unpooled shape pads its trailing ends: the unpooled tensor is
// built in a scratch buffer and copied in.
Status lower_max_unpool(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* idx, L.rowmajor(n.inputs[1]));
  if (idx->dt != k::DT::kI64 || idx->dims != x->dims) KILN_UNSUPPORTED("MaxUnpool indices {}", dims_to_string(idx->dims));
  const std::vector<int64_t> kernel = n.attr_ints("kernel_shape");
  const size_t sp = kernel.size();
  if (x->dims.size() != sp + 2 || sp > 3) KILN_UNSUPPORTED("MaxUnpool of {}", dims_to_string(x->dims));
  std::vector<int64_t> strides = n.attr_ints("strides"), pads = n.attr_ints("pads");
  strides.resize(sp, 1);
  pads.resize(2 * sp, 0);
  std::vector<int64_t> dims = {x->dims[0], x->dims[1]};
  for (size_t i = 0; i < sp; ++i) dims.push_back((x->dims[i + 2] - 1) * strides[i] + kernel[i] - pads[i] - pads[i + sp]);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out, exact_dims(n.outputs[0]));
  if (out.size() != dims.size()) KILN_UNSUPPORTED("MaxUnpool output of rank {}", out.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    if (out[i] < dims[i]) KILN_UNSUPPORTED("MaxUnpool output {} smaller than {}", dims_to_string(out), dims_to_string(dims));
  }
  const DevValue& y = L.define(n.outputs[0]);
  const bool padded = out != dims;
  const int64_t unpooled = prod_of(dims, 0, dims.size());
  const Ref dst = padded ? Ref{false, L.scratch(size_t(unpooled) * size_t(k::dt_size(x->dt)))} : y.ref;
  emit_fill(L, n, "kernel fill (MaxUnpool zeros)", x->dt, dst, unpooled, 0.0);
  emit_scatter(L, n, "kernel scatter_elements (MaxUnpool)", x->dt, dst, unpooled, idx, x->ref, x->numel(), dst, true,
               unpooled, k::IndexTuple{}, x->numel(), 1, 0, /*wrap_negative=*/false);
  if (padded) {  // the unpooled tensor at the origin, zeros after it
    emit_pad(L, n, "kernel pad (MaxUnpool output_shape)", k::dt_size(x->dt), dst, y.ref, dims, out,
             std::vector<int64_t>(dims.size(), 0), 0, 0);
  }
  return Status::ok();
}

// LRN across channels: cuDNN's window is ONNX's (floor((size-1)/2) before, the rest after) and its
// formula x / (bias + alpha / size * sum of squares)^beta. x [N, C, spatial...] is viewed as
// [N, C, prod(spatial), 1], which the channel window does not see.
Status lower_lrn(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (x->dt != k::DT::kF32 && x->dt != k::DT::kF16) {
    KILN_UNSUPPORTED("LRN in {} (cuDNN's LRN takes f32 and f16)", x->dt == k::DT::kBF16 ? std::string_view("bf16") : dtype_name(x->ir_dtype));
  }
  if (x->dims.size() < 3) KILN_UNSUPPORTED("LRN of rank {}", x->dims.size());
  const int64_t size = n.attr_int("size", 0);
  const double alpha = n.attr_float("alpha", 1e-4f), beta = n.attr_float("beta", 0.75f), bias = n.attr_float("bias", 1.0f);
  if (size < CUDNN_LRN_MIN_N || size > CUDNN_LRN_MAX_N || bias < CUDNN_LRN_MIN_K || beta < CUDNN_LRN_MIN_BETA) {
    KILN_UNSUPPORTED("LRN size {}, bias {}, beta {} (cuDNN: size 1..16, bias >= 1e-5, beta >= 0.01)", size, bias, beta);
  }
  const std::vector<int64_t> d4 = {x->dims[0], x->dims[1], prod_of(x->dims, 2, x->dims.size()), 1};
  for (int64_t v : d4) {
    if (v > 0x7fffffff) KILN_UNSUPPORTED("LRN of {}", dims_to_string(x->dims));
  }
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter w;
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, y.ref);
  put(w, d4);
  w.put(int32_t(size));
  for (double v : {alpha, beta, bias}) w.put(v);
  L.emit(&n, fmt::format("cudnn lrn (size {})", size), {read_id(x)}, {y.ref.id}, StepOp::kCudnnLrn, std::move(w));
  return Status::ok();
}

Status lower_roi_align(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* rois, L.rowmajor(n.inputs[1]));
  KILN_ASSIGN_OR_RETURN(const DevValue* idx, L.rowmajor(n.inputs[2]));
  const std::string mode = n.attr_string("mode", "avg"), ctm = n.attr_string("coordinate_transformation_mode", "half_pixel");
  if ((mode != "avg" && mode != "max") || (ctm != "half_pixel" && ctm != "output_half_pixel")) {
    KILN_UNSUPPORTED("RoiAlign mode {} with coordinate_transformation_mode {}", mode, ctm);
  }
  if (x->dims.size() != 4 || rois->dims.size() != 2 || rois->dims[1] != 4 || idx->dims.size() != 1 ||
      idx->dims[0] != rois->dims[0] || idx->dt != k::DT::kI64) {
    KILN_UNSUPPORTED("RoiAlign of {} with rois {} and batch indices {}", dims_to_string(x->dims), dims_to_string(rois->dims),
                     n.inputs[2]->type.to_string());
  }
  if ((x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16 && x->dt != k::DT::kF64) || rois->dt != x->dt) {
    KILN_UNSUPPORTED("RoiAlign on {} with rois of {}", dtype_name(x->ir_dtype), dtype_name(rois->ir_dtype));
  }
  const int64_t oh = n.attr_int("output_height", 1), ow = n.attr_int("output_width", 1), ratio = n.attr_int("sampling_ratio", 0);
  if (oh < 1 || ow < 1 || ratio < 0) KILN_UNSUPPORTED("RoiAlign output {}x{} with sampling_ratio {}", oh, ow, ratio);
  if (x->numel() == 0) KILN_UNSUPPORTED("RoiAlign over an empty feature map");
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter w;
  w.put(int32_t(x->dt));
  for (int64_t v : {x->dims[0], x->dims[1], x->dims[2], x->dims[3], rois->dims[0], oh, ow, ratio}) w.i64(v);
  w.put(double(n.attr_float("spatial_scale", 1.0f)));
  w.u8(ctm == "half_pixel");
  w.u8(mode == "max");
  put(w, x->ref);
  put(w, rois->ref);
  put(w, idx->ref);
  put(w, y.ref);
  const int slot = L.new_bad_index_slot();
  L.emit(&n, "kernel roi_align", {read_id(x), read_id(rois), read_id(idx)}, {y.ref.id}, StepOp::kRoiAlign, std::move(w));
  L.steps.back().bad_index_slot = slot;
  return Status::ok();
}

Expected<StepFn> bind_roi_align(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const int64_t batch = in.i64(), channels = in.i64();
  roi::Align a;
  a.height = in.i64();
  a.width = in.i64();
  const int64_t num_rois = in.i64();
  a.out_h = in.i64();
  a.out_w = in.i64();
  a.sampling_ratio = in.i64();
  a.spatial_scale = in.f64();
  a.half_pixel = in.flag();
  a.is_max = in.flag();
  const Ref xr = in.ref(), rr = in.ref(), ir = in.ref(), yr = in.ref();
  const int slot = in.step().bad_index_slot;
  KILN_RETURN_IF_ERROR(in.done());
  if (batch < 1 || channels < 1 || a.height < 1 || a.width < 1 || num_rois < 0 || a.out_h < 1 || a.out_w < 1 ||
      a.sampling_ratio < 0 || slot < 0) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed roi_align parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::roi_align(dt, c.ptr(xr), c.ptr(rr), static_cast<const int64_t*>(c.ptr(ir)), batch, channels, num_rois,
                                    a, c.ptr(yr), c.bad_index + slot, c.stream),
                       "roi_align");
  });
}

Status destroy_lrn(cudnnLRNDescriptor_t d) { return cuda_status(cudnnDestroyLRNDescriptor(d), "destroy"); }

Expected<StepFn> bind_lrn(Params& in, BindCtx& bc) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  const std::vector<int64_t> d4 = in.dims();
  const int32_t size = in.i32();
  const double alpha = in.f64(), beta = in.f64(), bias = in.f64();
  KILN_RETURN_IF_ERROR(in.done());
  if (d4.size() != 4 || size < CUDNN_LRN_MIN_N || size > CUDNN_LRN_MAX_N ||
      std::any_of(d4.begin(), d4.end(), [](int64_t v) { return v > 0x7fffffff; })) {
    return KILN_ERROR(kInvalidModel, "{}: malformed lrn parameters", in.step().label);
  }
  KILN_ASSIGN_OR_RETURN(auto td, make_tensor_desc(bc.keep_alive, d4, dt, Layout::kRowMajor));
  cudnnLRNDescriptor_t ld = nullptr;
  KILN_CUDA_TRY(cudnnCreateLRNDescriptor(&ld));
  hold(bc.keep_alive, ld, destroy_lrn);
  KILN_CUDA_TRY(cudnnSetLRNDescriptor(ld, unsigned(size), alpha, beta, bias));
  return StepFn([=](const RunCtx& c) -> Status {
    const float one = 1.0f, zero = 0.0f;
    KILN_CUDA_TRY(cudnnLRNCrossChannelForward(c.dnn, ld, CUDNN_LRN_CROSS_CHANNEL_DIM1, &one, td, c.ptr(xr), &zero, td,
                                              c.ptr(yr)));
    return Status::ok();
  });
}

}  // namespace

void register_classic_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kRoiAlign] = lower_roi_align;
  t[OpKind::kLRN] = lower_lrn;
  t[OpKind::kReverseSequence] = lower_reverse_sequence;
  t[OpKind::kDet] = lower_det;
  t[OpKind::kMaxUnpool] = lower_max_unpool;
}

void register_classic_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kRoiAlign] = bind_roi_align;
  t[StepOp::kReverseSequence] = bind_reverse_sequence;
  t[StepOp::kDet] = bind_det;
  t[StepOp::kCudnnLrn] = bind_lrn;
}

}  // namespace kiln::cuda
