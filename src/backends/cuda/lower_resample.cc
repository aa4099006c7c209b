// Pad and Resize: k::pad_nd (constant, reflect, edge, wrap; negative pads crop) and k::resize
// (nearest, linear and cubic over the last one to three dims, every coordinate transform,
// antialiasing, exclude_outside). Pads, roi, scales and sizes must be constants: a model whose are
// computed at run time keeps those nodes on the CPU, which says so.
#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "backends/cuda/lower.h"
#include "ops/resize_taps.h"
#include "support/float_types.h"

namespace kiln::cuda {

namespace {



// v as the device holds an element of dt.
Expected<uint64_t> value_bits(double v, k::DT dt) {
  switch (dt) {
    case k::DT::kF32: return uint64_t(float_bits(float(v)));
    case k::DT::kF64: {
      uint64_t b = 0;
      std::memcpy(&b, &v, sizeof(b));
      return b;
    }
    case k::DT::kF16: return uint64_t(float_to_half_bits(float(v)));
    case k::DT::kBF16: return uint64_t(float_to_bf16_bits(float(v)));
    case k::DT::kI64: return uint64_t(int64_t(v));
    case k::DT::kI32: return uint64_t(uint32_t(int32_t(int64_t(v))));
    case k::DT::kI8: return uint64_t(uint8_t(int8_t(int64_t(v))));
    case k::DT::kU8: return uint64_t(uint8_t(int64_t(v)));
    case k::DT::kI16: return uint64_t(uint16_t(int16_t(int64_t(v))));
    case k::DT::kU16: return uint64_t(uint16_t(int64_t(v)));
    case k::DT::kU32: return uint64_t(uint32_t(int64_t(v)));
    case k::DT::kU64: return v < 0 ? uint64_t(int64_t(v)) : uint64_t(v);
    case k::DT::kBool: return uint64_t(v != 0);
    default: KILN_UNSUPPORTED("a constant of device dtype {}", int(dt));
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
  if (value && value->numel() != 1) KILN_UNSUPPORTED("Pad constant_value of {} elements", value->numel());
  KILN_ASSIGN_OR_RETURN(uint64_t bits, value_bits(value ? value->as_double(0) : 0.0, x->dt));
  const DevValue& y = L.define(n.outputs[0]);
  emit_pad(L, n, "kernel pad (" + mode + ")", k::dt_size(x->dt), x->ref, y.ref, x->dims, out, begin, m, bits);
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

// Resize; opset 10's takes (X, scales), later ones (X, roi, scales, sizes), which must be constants.
// The taps of every resized axis are planned on the host as the CPU kernel plans them
// (ops/resize_taps.h) and uploaded as one table; the kernel sums over their product. An NHWC
// input (a convolution's output in half builds) is resized in place of layout, H and W with C
// innermost, so an upsampling between two convolutions costs no layout change.
struct ResizeLowerCtx {
  const Node& n;
  const Node& node() const { return n; }
  template <typename... Args>
  Status error(fmt::format_string<Args...> f, Args&&... args) const {
    return Status(ErrorCode::kUnsupported, fmt::format(f, std::forward<Args>(args)...));
  }
};

Status lower_resize(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* xv, L.value(n.inputs[0]));
  const size_t r = xv->dims.size();
  const ResizeLowerCtx rc{n};
  KILN_ASSIGN_OR_RETURN(ResizeAttrs a, parse_resize_attrs(rc, int64_t(r)));
  const bool interpolate = a.mode != ResizeMode::kNearest;
  if (interpolate && xv->dt != k::DT::kF32 && xv->dt != k::DT::kF16 && xv->dt != k::DT::kBF16) {
    KILN_UNSUPPORTED("{} Resize of {}", n.attr_string("mode", ""), dtype_name(xv->ir_dtype));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out, exact_dims(n.outputs[0]));
  if (out.size() != r) KILN_UNSUPPORTED("Resize output of rank {}", out.size());
  // An input given as an empty tensor counts as absent (models pass empty scales next to sizes).
  // Sizes computed at run time (a shape-derived target) are the output's static dims when the
  // policy stretches; roi is read only by tf_crop_and_resize.
  const bool opset10 = n.inputs.size() == 2;
  Tensor out_sizes;
  auto input = [&](size_t i) -> Expected<const Tensor*> {
    if (!n.has_input(i) || (opset10 && i != 1)) return static_cast<const Tensor*>(nullptr);
    if (i == 1 && !opset10 && a.coord != CoordMode::kTfCropAndResize) return static_cast<const Tensor*>(nullptr);
    const Tensor* t = L.constant(n.inputs[i]);
    if (!t && i == 3 && a.aspect == AspectPolicy::kStretch) {
      std::vector<int64_t> v;
      for (int64_t ax : a.axes) v.push_back(out[size_t(ax)]);
      out_sizes = Tensor::from_vector(v, {int64_t(v.size())});
      return &out_sizes;
    }
    if (!t) KILN_UNSUPPORTED("Resize input {} computed at run time", i);
    return t->numel() > 0 ? t : nullptr;
  };
  KILN_ASSIGN_OR_RETURN(const Tensor* roi, input(1));
  KILN_ASSIGN_OR_RETURN(const Tensor* scales, input(opset10 ? 1 : 2));
  KILN_ASSIGN_OR_RETURN(const Tensor* sizes, input(3));
  KILN_ASSIGN_OR_RETURN(std::vector<AxisResize> plan, plan_resize(rc, a, xv->dims, opset10 ? nullptr : roi, scales, sizes));
  for (size_t i = 0; i < r; ++i) {
    if (plan[i].out != out[i]) KILN_UNSUPPORTED("Resize output dim {} is {}, the plan makes {}", i, out[i], plan[i].out);
  }
  // NHWC when only H and W change; else row-major with the resized dims the last one to three.
  const bool nhwc = xv->layout == Layout::kNHWC && r == 4 && plan[0].identity() && plan[1].identity();
  const DevValue* x = xv;
  if (!nhwc) {
    KILN_ASSIGN_OR_RETURN(x, L.rowmajor(n.inputs[0]));
  }
  size_t first = nhwc ? 2 : r;
  for (size_t i = 0; i < r && !nhwc; ++i) {
    if (!plan[i].identity()) { first = i; break; }
  }
  if (first == r) first = r - 1;  // nothing resized: a copy over the last dim
  if (r - first > 3) KILN_UNSUPPORTED("Resize of {} dims", r - first);
  // The taps of the resized span, axis after axis; an extrapolated coordinate is index -1.
  // An axis the resize leaves alone (inside the span: scales [1, 1, 2, 1]) copies, as the CPU
  // skips it: its output o reads o with weight 1, padded with zero-weight taps to the others' count.
  std::vector<AxisTaps> axis_taps(r);
  int64_t common = 1;
  for (size_t i = first; i < r; ++i) {
    if (x->dims[i] < 1 || x->dims[i] > 0x7fffffff) KILN_UNSUPPORTED("Resize of a dim of {}", x->dims[i]);
    if (plan[i].identity()) continue;
    axis_taps[i] = plan_taps(plan[i], a);
    if (axis_taps[i].n > 64) {
      KILN_UNSUPPORTED("Resize with {} taps per output (antialiased by {})", axis_taps[i].n, plan[i].scale);
    }
    common = std::max(common, axis_taps[i].n);
  }
  std::vector<k::ResizeTap> table;
  std::vector<int32_t> per_axis;
  for (size_t i = first; i < r; ++i) {
    if (plan[i].identity()) {
      per_axis.push_back(int32_t(common));
      for (int64_t o = 0; o < plan[i].out; ++o) {
        for (int64_t j = 0; j < common; ++j) table.push_back({int32_t(o), j == 0 ? 1.0f : 0.0f});
      }
      continue;
    }
    const AxisTaps& t = axis_taps[i];
    per_axis.push_back(int32_t(t.n));
    for (int64_t o = 0; o < plan[i].out; ++o) {
      for (int64_t j = 0; j < t.n; ++j) {
        const size_t e = size_t(o * t.n + j);
        const bool ext = j == 0 && t.extrapolate[size_t(o)];
        table.push_back({ext ? -1 : int32_t(t.index[e]), float(t.weight[e])});
      }
    }
  }
  if (table.empty()) table.push_back({0, 0.f});  // an empty output still gets a valid table pointer
  KILN_ASSIGN_OR_RETURN(Ref taps, L.upload_raw(table.data(), table.size() * sizeof(k::ResizeTap)));
  KILN_ASSIGN_OR_RETURN(uint64_t ext_bits, value_bits(a.extrapolation, x->dt));
  const int64_t outer = nhwc ? x->dims[0] : std::accumulate(x->dims.begin(), x->dims.begin() + long(first), int64_t{1},
                                                            std::multiplies<int64_t>());
  const int64_t inner = nhwc ? x->dims[1] : 1;
  const std::vector<int64_t> in_sp(x->dims.begin() + long(first), x->dims.end()),
      out_sp(out.begin() + long(first), out.end());
  const DevValue& y = L.define(n.outputs[0], nhwc ? Layout::kNHWC : Layout::kRowMajor);
  ByteWriter w;
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, y.ref);
  put(w, taps);
  w.i64(outer);
  w.i64(inner);
  put(w, in_sp);
  put(w, out_sp);
  for (int32_t t : per_axis) w.put(t);
  w.u8(interpolate);
  w.put(a.extrapolation);
  w.i64(int64_t(ext_bits));
  L.emit(&n, fmt::format("kernel resize ({}, {}{})", n.attr_string("mode", "nearest"),
                         n.attr_string("coordinate_transformation_mode", "half_pixel"), nhwc ? ", NHWC" : ""),
         {read_id(x)}, {y.ref.id}, StepOp::kResize, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_resize(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref(), tr = in.ref();
  const int64_t outer = in.i64(), inner = in.i64();
  const std::vector<int64_t> xd = in.dims(), yd = in.dims();
  if (xd.empty() || xd.size() > 3 || yd.size() != xd.size() || !tr.weight || inner < 1) {
    return KILN_ERROR(kInvalidModel, "{}: malformed resize parameters", in.step().label);
  }
  std::vector<int> per_axis;
  for (size_t i = 0; i < xd.size(); ++i) per_axis.push_back(in.i32());
  const bool interpolate = in.flag();
  const double ext = in.f64();
  const uint64_t ext_bits = uint64_t(in.i64());
  KILN_RETURN_IF_ERROR(in.done());
  for (int t : per_axis) {
    if (t < 1 || t > 64 || (!interpolate && t != 1)) {
      return KILN_ERROR(kInvalidModel, "{}: malformed resize tap counts", in.step().label);
    }
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::resize(dt, c.ptr(xr), c.ptr(yr), outer, int(xd.size()), xd.data(), yd.data(), inner,
                                 per_axis.data(), static_cast<const k::ResizeTap*>(c.ptr(tr)), interpolate, ext,
                                 ext_bits, c.stream),
                       "resize");
  });
}

// GridSample (opset 16's bilinear/bicubic spellings too) over 1..3 spatial dims, X and grid row-major.
Status lower_grid_sample(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* g, L.rowmajor(n.inputs[1]));
  auto f32ish = [](k::DT dt) { return dt == k::DT::kF32 || dt == k::DT::kF16 || dt == k::DT::kBF16; };
  if (!f32ish(x->dt) || !f32ish(g->dt)) {
    KILN_UNSUPPORTED("GridSample of {} at a {} grid", dtype_name(x->ir_dtype), dtype_name(g->ir_dtype));
  }
  const size_t rank = x->dims.size();
  const int r = int(rank) - 2;
  if (r < 1 || r > 3 || g->dims.size() != rank || g->dims[rank - 1] != r || g->dims[0] != x->dims[0]) {
    KILN_UNSUPPORTED("GridSample of X {} at grid {}", dims_to_string(x->dims), dims_to_string(g->dims));
  }
  const std::string mode = n.attr_string("mode", "linear"), pad = n.attr_string("padding_mode", "zeros");
  const int m = mode == "nearest" ? 0 : (mode == "linear" || mode == "bilinear") ? 1
                                          : (mode == "cubic" || mode == "bicubic") ? 2 : -1;
  const int p = pad == "zeros" ? 0 : pad == "border" ? 1 : pad == "reflection" ? 2 : -1;
  if (m < 0 || p < 0) KILN_UNSUPPORTED("GridSample mode '{}', padding_mode '{}'", mode, pad);
  for (int i = 0; i < r; ++i) {
    if (x->dims[size_t(i + 2)] < 1) KILN_UNSUPPORTED("GridSample from an empty spatial dim");
  }
  int64_t points = 1;
  for (int i = 1; i <= r; ++i) points *= g->dims[size_t(i)];
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter w;
  w.put(int32_t(x->dt));
  w.put(int32_t(g->dt));
  put(w, x->ref);
  put(w, g->ref);
  put(w, y.ref);
  put(w, x->dims);
  w.i64(points);
  w.put(int32_t(m));
  w.put(int32_t(p));
  w.u8(n.attr_int("align_corners", 0) != 0);
  L.emit(&n, fmt::format("kernel grid_sample ({}, {})", mode, pad), {read_id(x), read_id(g)}, {y.ref.id},
         StepOp::kGridSample, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_grid_sample(Params& in, BindCtx&) {
  const k::DT dt = in.dt(), gdt = in.dt();
  const Ref xr = in.ref(), gr = in.ref(), yr = in.ref();
  const std::vector<int64_t> xd = in.dims();
  const int64_t points = in.i64();
  const int32_t mode = in.i32(), pad = in.i32();
  const bool align = in.flag();
  KILN_RETURN_IF_ERROR(in.done());
  if (xd.size() < 3 || xd.size() > 5 || points < 0) {
    return KILN_ERROR(kInvalidModel, "{}: malformed grid_sample parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::grid_sample(dt, gdt, c.ptr(xr), c.ptr(gr), c.ptr(yr), xd[0], xd[1], int(xd.size()) - 2,
                                      xd.data() + 2, points, mode, pad, align, c.stream),
                       "grid_sample");
  });
}

}  // namespace

void emit_pad(Lowering& L, const Node& n, std::string label, int elem_bytes, Ref x, Ref y,
              const std::vector<int64_t>& in, const std::vector<int64_t>& out, const std::vector<int64_t>& begin,
              int mode, uint64_t value_bits) {
  ByteWriter w;
  w.put(int32_t(elem_bytes));
  put(w, x);
  put(w, y);
  put(w, in);
  put(w, out);
  for (int64_t b : begin) w.i64(b);  // may be negative (a crop): not dims
  w.put(int32_t(mode));
  w.i64(int64_t(value_bits));
  L.emit(&n, std::move(label), {x.weight ? -1 : x.id}, {y.id}, StepOp::kPad, std::move(w));
}

void register_resample_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kPad] = lower_pad;
  t[OpKind::kResize] = lower_resize;
  t[OpKind::kGridSample] = lower_grid_sample;
}

void register_resample_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kPad] = bind_pad;
  t[StepOp::kResize] = bind_resize;
  t[StepOp::kGridSample] = bind_grid_sample;
}

}  // namespace kiln::cuda
