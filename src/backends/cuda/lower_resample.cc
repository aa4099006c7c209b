// Pad and Resize: k::pad_nd (constant, reflect, edge, wrap; negative pads crop) and k::resize
// (nearest and linear over the last one to three dims, every coordinate transform but
// tf_crop_and_resize). Pads, scales and sizes must be constants: a model whose are computed at run
// time keeps those nodes on the CPU, which says so.
#include <functional>
#include <numeric>

#include "backends/cuda/lower.h"
#include "support/float_types.h"

namespace kiln::cuda {

namespace {



// The constant's value as the device holds an element of dt.
Expected<uint64_t> value_bits(const Tensor* t, k::DT dt) {
  if (t && t->numel() != 1) KILN_UNSUPPORTED("Pad constant_value of {} elements", t->numel());
  const double v = t ? t->as_double(0) : 0.0;
  switch (dt) {
    case k::DT::kF32: return uint64_t(float_bits(float(v)));
    case k::DT::kF16: return uint64_t(float_to_half_bits(float(v)));
    case k::DT::kBF16: return uint64_t(float_to_bf16_bits(float(v)));
    case k::DT::kI64: return uint64_t(int64_t(v));
    case k::DT::kI32: return uint64_t(uint32_t(int32_t(v)));
    case k::DT::kI8: return uint64_t(uint8_t(int8_t(v)));
    case k::DT::kU8: return uint64_t(uint8_t(v));
    case k::DT::kI16: return uint64_t(uint16_t(int16_t(v)));
    case k::DT::kU16: return uint64_t(uint16_t(v));
    case k::DT::kU32: return uint64_t(uint32_t(v));
    case k::DT::kU64: return uint64_t(v);
    case k::DT::kBool: return uint64_t(v != 0);
    default: KILN_UNSUPPORTED("Pad of {}", int(dt));
  }
}

Status lower_pad(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  const size_t r = x->dims.size();
  if (r < 1 || r > size_t(k::kMaxRank)) KILN_UNSUPPORTED("Pad of rank {}", r);
  const std::string mode = n.attr_string("mode", "constant");
  int m = mode == "constant" ? 0 : mode == "reflect" ? 1 : mode == "edge" ? 2 : mode == "wrap" ? 3 : -1;
  if (m < 0) KILN_UNSUPPORTED("Pad mode '{}'", mode);
  std::vector<int64_t> pads;
  const Tensor* value = nullptr;
  if (n.has_attr("pads")) {  // opset < 11: pads and value are attributes
    pads = n.attr_ints("pads");
  } else {
    const Tensor* p = n.has_input(1) ? L.constant(n.inputs[1]) : nullptr;
    if (!p) KILN_UNSUPPORTED("Pad pads computed at run time");
    pads = p->to_int_vector();
    if (n.has_input(2)) {
      value = L.constant(n.inputs[2]);
      if (!value) KILN_UNSUPPORTED("Pad constant_value computed at run time");
    }
  }
  std::vector<int64_t> axes;
  if (n.has_input(3)) {
    const Tensor* a = L.constant(n.inputs[3]);
    if (!a) KILN_UNSUPPORTED("Pad axes computed at run time");
    axes = a->to_int_vector();
  } else {
    for (size_t i = 0; i < r; ++i) axes.push_back(int64_t(i));
  }
  if (pads.size() != 2 * axes.size()) KILN_UNSUPPORTED("Pad with {} pads for {} axes", pads.size(), axes.size());
  std::vector<int64_t> begin(r, 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axes[i] < 0 ? axes[i] + int64_t(r) : axes[i];
    if (a < 0 || a >= int64_t(r)) KILN_UNSUPPORTED("Pad axis {}", axes[i]);
    begin[size_t(a)] = pads[i];
    const int64_t d = x->dims[size_t(a)], lo = pads[i], hi = pads[i + axes.size()];
    // Reflect mirrors once (the reference's numpy semantics beyond that are not what models use).
    if (m == 1 && (lo >= d || hi >= d)) KILN_UNSUPPORTED("Pad reflect by {} and {} over a dim of {}", lo, hi, d);
    if (m != 0 && d == 0) KILN_UNSUPPORTED("Pad {} of an empty dim", mode);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out, exact_dims(n.outputs[0]));
  if (out.size() != r) KILN_UNSUPPORTED("Pad output of rank {}", out.size());
  KILN_ASSIGN_OR_RETURN(uint64_t bits, value_bits(value, x->dt));
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter w;
  w.put(int32_t(k::dt_size(x->dt)));
  put(w, x->ref);
  put(w, y.ref);
  put(w, x->dims);
  put(w, out);
  for (int64_t b : begin) w.i64(b);  // may be negative (a crop): not dims
  w.put(int32_t(m));
  w.i64(int64_t(bits));
  L.emit(&n, "kernel pad (" + mode + ")", {read_id(x)}, {y.ref.id}, StepOp::kPad, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_pad(Params& in, BindCtx&) {
  const int32_t eb = in.i32();
  const Ref xr = in.ref(), yr = in.ref();
  const std::vector<int64_t> xd = in.dims(), yd = in.dims();
  std::vector<int64_t> begin;
  for (size_t i = 0; i < xd.size() && i < size_t(k::kMaxRank); ++i) begin.push_back(in.i64());
  const int32_t mode = in.i32();
  const uint64_t bits = uint64_t(in.i64());
  KILN_RETURN_IF_ERROR(in.done());
  if (xd.empty() || xd.size() > size_t(k::kMaxRank) || yd.size() != xd.size() || begin.size() != xd.size() || mode < 0 ||
      mode > 3 || (eb != 1 && eb != 2 && eb != 4 && eb != 8)) {
    return KILN_ERROR(kInvalidModel, "{}: malformed pad parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::pad_nd(eb, c.ptr(xr), c.ptr(yr), int(xd.size()), xd.data(), yd.data(), begin.data(), mode,
                                 bits, c.stream), "pad_nd");
  });
}

// Resize; opset 10's takes (X, scales), later ones (X, roi, scales, sizes). An NHWC input (a
// convolution's output in half builds) is resized in place of layout, H and W with C innermost, so
// an upsampling between two convolutions costs no layout change.
Status lower_resize(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* xv, L.value(n.inputs[0]));
  if (xv->dt != k::DT::kF32 && xv->dt != k::DT::kF16 && xv->dt != k::DT::kBF16) {
    KILN_UNSUPPORTED("Resize of {}", dtype_name(xv->ir_dtype));
  }
  const size_t r = xv->dims.size();
  const std::string mode = n.attr_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear") KILN_UNSUPPORTED("Resize mode '{}'", mode);
  const bool linear = mode == "linear";
  static const char* kCtm[] = {"half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners", "half_pixel_symmetric",
                               "tf_half_pixel_for_nn"};
  const std::string ctm_name = n.attr_string("coordinate_transformation_mode", "half_pixel");
  int ctm = -1;
  for (int i = 0; i < 6; ++i) {
    if (ctm_name == kCtm[i]) ctm = i;
  }
  if (ctm < 0) KILN_UNSUPPORTED("Resize coordinate_transformation_mode '{}'", ctm_name);
  static const char* kNearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  const std::string nm = n.attr_string("nearest_mode", "round_prefer_floor");
  int nearest = -1;
  for (int i = 0; i < 4; ++i) {
    if (nm == kNearest[i]) nearest = i;
  }
  if (nearest < 0) KILN_UNSUPPORTED("Resize nearest_mode '{}'", nm);
  if (n.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch") KILN_UNSUPPORTED("keep_aspect_ratio_policy");
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out, exact_dims(n.outputs[0]));
  if (out.size() != r) KILN_UNSUPPORTED("Resize output of rank {}", out.size());
  // Per-axis scales: the scales input (a constant) when given, else output / input from the sizes.
  std::vector<double> scale(r, 1.0);
  const Value* sv = n.inputs.size() == 2 ? n.inputs[1] : (n.has_input(2) ? n.inputs[2] : nullptr);
  const Tensor* st = sv ? L.constant(sv) : nullptr;
  if (sv && !st) KILN_UNSUPPORTED("Resize scales computed at run time");
  std::vector<int64_t> axes;
  if (n.has_attr("axes")) axes = n.attr_ints("axes");
  else for (size_t i = 0; i < r; ++i) axes.push_back(int64_t(i));
  if (st && st->numel() > 0) {
    if (size_t(st->numel()) != axes.size()) KILN_UNSUPPORTED("Resize with {} scales", st->numel());
    for (size_t i = 0; i < axes.size(); ++i) scale[size_t(axes[i] < 0 ? axes[i] + int64_t(r) : axes[i])] = st->as_double(int64_t(i));
  } else {
    for (size_t i = 0; i < r; ++i) scale[i] = xv->dims[i] == 0 ? 1.0 : double(out[i]) / double(xv->dims[i]);
  }
  auto resized = [&](size_t i) { return scale[i] != 1.0 || out[i] != xv->dims[i]; };
  // NHWC when only H and W change; else row-major with the resized dims the last one to three.
  const bool nhwc = xv->layout == Layout::kNHWC && r == 4 && !resized(0) && !resized(1);
  const DevValue* x = xv;
  if (!nhwc) {
    KILN_ASSIGN_OR_RETURN(x, L.rowmajor(n.inputs[0]));
  }
  size_t first = nhwc ? 2 : r;
  for (size_t i = 0; i < r && !nhwc; ++i) {
    if (resized(i)) { first = i; break; }
  }
  if (first == r) first = r - 1;  // nothing resized: a copy over the last dim
  if (r - first > 3) KILN_UNSUPPORTED("Resize of {} dims", r - first);
  for (size_t i = first; i < r; ++i) {
    if (x->dims[i] < 1 || x->dims[i] > 0x7fffffff || !(scale[i] > 0)) {
      KILN_UNSUPPORTED("Resize of a dim of {} with a scale of {}", x->dims[i], scale[i]);
    }
    if (linear && n.attr_int("antialias", 0) && scale[i] < 1) KILN_UNSUPPORTED("antialiased linear downsampling");
  }
  const int64_t outer = nhwc ? x->dims[0] : std::accumulate(x->dims.begin(), x->dims.begin() + long(first), int64_t{1},
                                                            std::multiplies<int64_t>());
  const int64_t inner = nhwc ? x->dims[1] : 1;
  const std::vector<int64_t> in_sp(x->dims.begin() + long(first), x->dims.end()),
      out_sp(out.begin() + long(first), out.end());
  const int scratch = L.scratch(k::resize_scratch_bytes(int(out_sp.size()), out_sp.data()));
  const DevValue& y = L.define(n.outputs[0], nhwc ? Layout::kNHWC : Layout::kRowMajor);
  ByteWriter w;
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, y.ref);
  put(w, Ref{false, scratch});
  w.i64(outer);
  w.i64(inner);
  put(w, in_sp);
  put(w, out_sp);
  for (size_t i = first; i < r; ++i) w.put(scale[i]);
  w.u8(linear);
  w.put(int32_t(ctm));
  w.put(int32_t(nearest));
  L.emit(&n, fmt::format("kernel resize ({}, {}{})", mode, ctm_name, nhwc ? ", NHWC" : ""), {read_id(x), scratch},
         {y.ref.id, scratch}, StepOp::kResize, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_resize(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref(), sr = in.ref();
  const int64_t outer = in.i64(), inner = in.i64();
  const std::vector<int64_t> xd = in.dims(), yd = in.dims();
  if (xd.empty() || xd.size() > 3 || yd.size() != xd.size() || sr.weight || inner < 1) {
    return KILN_ERROR(kInvalidModel, "{}: malformed resize parameters", in.step().label);
  }
  std::vector<double> scales;
  for (size_t i = 0; i < xd.size(); ++i) scales.push_back(in.f64());
  const bool linear = in.flag();
  const int32_t ctm = in.i32(), nearest = in.i32();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::resize(dt, c.ptr(xr), c.ptr(yr), outer, int(xd.size()), xd.data(), yd.data(), inner,
                                 scales.data(), linear, ctm, nearest, c.ptr(sr), c.stream), "resize");
  });
}

}  // namespace

void register_resample_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kPad] = lower_pad;
  t[OpKind::kResize] = lower_resize;
}

void register_resample_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kPad] = bind_pad;
  t[StepOp::kResize] = bind_resize;
}

}  // namespace kiln::cuda
