// Resize (opset 19): nearest / linear / cubic interpolation with every
// coordinate_transformation_mode, antialiasing, axes, keep_aspect_ratio_policy, and roi / scales /
// sizes inputs.
//
// Interpolation is separable, so the kernel plans each resized axis on its own: for every output
// position, a few input taps with weights (AxisTaps). Nearest then gathers elements of any dtype
// in one pass; linear and cubic resize one axis at a time in double, like the ONNX reference
// (onnx/reference/ops/op_resize.py), whose numbers the conformance tests hold.
#include <algorithm>
#include <cmath>

#include "ops/image_util.h"

namespace kiln {

namespace {

enum class ResizeMode { kNearest, kLinear, kCubic };
enum class CoordMode { kHalfPixel, kHalfPixelSymmetric, kPytorchHalfPixel, kAlignCorners, kAsymmetric, kTfCropAndResize,
                       kTfHalfPixelForNn };
enum class NearestMode { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };
enum class AspectPolicy { kStretch, kNotLarger, kNotSmaller };

constexpr NamedValue<ResizeMode> kModes[] = {
    {"nearest", ResizeMode::kNearest}, {"linear", ResizeMode::kLinear}, {"cubic", ResizeMode::kCubic}};
constexpr NamedValue<CoordMode> kCoordModes[] = {
    {"half_pixel", CoordMode::kHalfPixel},
    {"half_pixel_symmetric", CoordMode::kHalfPixelSymmetric},
    {"pytorch_half_pixel", CoordMode::kPytorchHalfPixel},
    {"align_corners", CoordMode::kAlignCorners},
    {"asymmetric", CoordMode::kAsymmetric},
    {"tf_crop_and_resize", CoordMode::kTfCropAndResize},
    // Resize-11/12 only (dropped in opset 13); kept so older models run unchanged
    {"tf_half_pixel_for_nn", CoordMode::kTfHalfPixelForNn}};
constexpr NamedValue<NearestMode> kNearestModes[] = {
    {"round_prefer_floor", NearestMode::kRoundPreferFloor},
    {"round_prefer_ceil", NearestMode::kRoundPreferCeil},
    {"floor", NearestMode::kFloor},
    {"ceil", NearestMode::kCeil}};
constexpr NamedValue<AspectPolicy> kAspectPolicies[] = {
    {"stretch", AspectPolicy::kStretch}, {"not_larger", AspectPolicy::kNotLarger}, {"not_smaller", AspectPolicy::kNotSmaller}};

struct ResizeAttrs {
  ResizeMode mode;
  CoordMode coord;
  NearestMode nearest;
  AspectPolicy aspect;
  double cubic_a;
  bool exclude_outside, antialias;
  double extrapolation;
  std::vector<int64_t> axes;  // the resized axes, normalized, in attribute order (all when absent)
};

template <typename Ctx>
Expected<ResizeAttrs> parse_resize_attrs(const Ctx& c, int64_t rank) {
  const Node& n = c.node();
  ResizeAttrs a;
  KILN_ASSIGN_OR_RETURN(a.mode, parse_enum_attr(c, "mode", "nearest", kModes));
  KILN_ASSIGN_OR_RETURN(a.coord, parse_enum_attr(c, "coordinate_transformation_mode", "half_pixel", kCoordModes));
  KILN_ASSIGN_OR_RETURN(a.nearest, parse_enum_attr(c, "nearest_mode", "round_prefer_floor", kNearestModes));
  KILN_ASSIGN_OR_RETURN(a.aspect, parse_enum_attr(c, "keep_aspect_ratio_policy", "stretch", kAspectPolicies));
  a.cubic_a = n.attr_float("cubic_coeff_a", -0.75f);
  a.exclude_outside = n.attr_int("exclude_outside", 0) != 0;
  a.antialias = n.attr_int("antialias", 0) != 0;
  a.extrapolation = n.attr_float("extrapolation_value", 0.0f);
  if (!n.has_attr("axes")) {
    for (int64_t i = 0; i < rank; ++i) a.axes.push_back(i);
    return a;
  }
  std::vector<bool> seen(size_t(rank), false);
  for (int64_t ax : n.attr_ints("axes")) {
    KILN_ASSIGN_OR_RETURN(int64_t k, normalize_axis(c, ax, rank));
    if (seen[size_t(k)]) return c.error("axes lists axis {} twice", ax);
    seen[size_t(k)] = true;
    a.axes.push_back(k);
  }
  return a;
}

// An input given as an empty tensor counts as absent (models pass empty scales next to sizes).
bool present(const KernelCtx& c, size_t i) { return c.has_input(i) && c.tensor(i).numel() > 0; }

// ---- inference ---------------------------------------------------------------------------------

// Output dims from constant scales: floor(in * scale) for static dims; in*k for integer scales.
std::vector<Dim> dims_from_scales(const Shape& in, const ResizeAttrs& a, const Tensor& scales) {
  std::vector<Dim> out = in.dims;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const Dim& d = in[size_t(a.axes[i])];
    double s = scales.as_double(int64_t(i));
    if (d.is_static()) out[size_t(a.axes[i])] = Dim(int64_t(std::floor(s * double(d.value()))));
    else if (s >= 1 && s == std::floor(s)) out[size_t(a.axes[i])] = d * Dim(int64_t(s));
    else out[size_t(a.axes[i])] = Dim();
  }
  return out;
}

Status infer_resize(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& x = c.input_type(0);
  KILN_ASSIGN_OR_RETURN(ResizeAttrs a, parse_resize_attrs(c, x.has_rank() ? int64_t(x.shape->rank()) : 0));
  if (a.mode != ResizeMode::kNearest && !dtype_in_class(TypeClass::kNumeric, dt)) {
    return c.error("mode '{}' needs a numeric X, got {}", c.node().attr_string("mode", ""), dtype_name(dt));
  }
  if (!x.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const Shape& in = *x.shape;
  Shape out = in;  // resized axes become unknown unless scales or sizes say more
  for (int64_t ax : a.axes) out[size_t(ax)] = Dim();
  const Tensor* scales = c.input_constant(2);
  bool has_sizes = c.has_input(3) && !(c.input_constant(3) && c.input_constant(3)->numel() == 0);
  if (has_sizes) {
    std::optional<std::vector<Dim>> sizes = c.input_as_dims(3);
    if (sizes && sizes->size() != a.axes.size()) {
      return c.error("sizes has {} values, expected one per resized axis ({})", sizes->size(), a.axes.size());
    }
    if (sizes && a.aspect == AspectPolicy::kStretch) {
      for (size_t i = 0; i < a.axes.size(); ++i) out[size_t(a.axes[i])] = (*sizes)[i];
    }
  } else if (scales && scales->numel() > 0) {
    if (scales->numel() != int64_t(a.axes.size())) {
      return c.error("scales has {} values, expected one per resized axis ({})", scales->numel(), a.axes.size());
    }
    out = Shape(dims_from_scales(in, a, *scales));
  } else if (scales || !c.has_input(2)) {
    return c.error("one of scales and sizes must be given");
  }
  c.set_output_tensor(0, dt, out);
  return Status::ok();
}

// ---- planning ----------------------------------------------------------------------------------

// How one axis is resized: sizes, the scale used by the coordinate transform, and the roi.
struct AxisResize {
  int64_t in = 1, out = 1;
  double scale = 1;
  double roi_start = 0, roi_end = 1;
  bool identity() const { return in == out && scale == 1 && roi_start == 0 && roi_end == 1; }
};

Status read_scales_or_sizes(const KernelCtx& c, const ResizeAttrs& a, std::vector<AxisResize>& plan) {
  const size_t na = a.axes.size();
  if (present(c, 3)) {
    const Tensor& sizes = c.tensor(3);
    if (size_t(sizes.numel()) != na) return c.error("sizes has {} values, expected {}", sizes.numel(), na);
    for (size_t i = 0; i < na; ++i) {
      AxisResize& p = plan[size_t(a.axes[i])];
      p.out = sizes.as_int(int64_t(i));
      if (p.out < 0) return c.error("sizes[{}] is negative ({})", i, p.out);
      p.scale = p.in == 0 ? 1.0 : double(p.out) / double(p.in);
    }
    if (a.aspect == AspectPolicy::kStretch) return Status::ok();
    // One scale for every resized axis: the smallest (not_larger) or largest (not_smaller).
    double s = plan[size_t(a.axes[0])].scale;
    for (int64_t ax : a.axes) {
      s = a.aspect == AspectPolicy::kNotLarger ? std::min(s, plan[size_t(ax)].scale) : std::max(s, plan[size_t(ax)].scale);
    }
    for (int64_t ax : a.axes) {
      AxisResize& p = plan[size_t(ax)];
      p.scale = s;
      p.out = int64_t(s * double(p.in) + 0.5);  // round half up
    }
    return Status::ok();
  }
  if (!present(c, 2)) return c.error("one of scales and sizes must be given");
  const Tensor& scales = c.tensor(2);
  if (size_t(scales.numel()) != na) return c.error("scales has {} values, expected {}", scales.numel(), na);
  for (size_t i = 0; i < na; ++i) {
    AxisResize& p = plan[size_t(a.axes[i])];
    p.scale = scales.as_double(int64_t(i));
    if (!(p.scale > 0) || !std::isfinite(p.scale)) return c.error("scales[{}] must be positive, got {}", i, p.scale);
    double out = std::floor(p.scale * double(p.in));
    if (out > 1e15) return c.error("scales[{}] = {} makes an output dimension too large", i, p.scale);
    p.out = int64_t(out);
  }
  return Status::ok();
}

Expected<std::vector<AxisResize>> plan_resize(const KernelCtx& c, const ResizeAttrs& a, const std::vector<int64_t>& in) {
  std::vector<AxisResize> plan(in.size());
  for (size_t i = 0; i < in.size(); ++i) plan[i].in = plan[i].out = in[i];
  KILN_RETURN_IF_ERROR(read_scales_or_sizes(c, a, plan));
  // roi only matters for tf_crop_and_resize (the spec ignores it otherwise).
  if (a.coord == CoordMode::kTfCropAndResize && present(c, 1)) {
    const Tensor& roi = c.tensor(1);
    const size_t na = a.axes.size();
    if (size_t(roi.numel()) != 2 * na) return c.error("roi has {} values, expected {}", roi.numel(), 2 * na);
    for (size_t i = 0; i < na; ++i) {
      plan[size_t(a.axes[i])].roi_start = roi.as_double(int64_t(i));
      plan[size_t(a.axes[i])].roi_end = roi.as_double(int64_t(na + i));
    }
  }
  return plan;
}

// ---- per-axis taps -----------------------------------------------------------------------------

// The source coordinate of output index y along one axis. Like the reference, the "resized
// length" in align_corners / pytorch_half_pixel is scale * in, which is fractional when scales
// (not sizes) were given.
double source_coord(const AxisResize& p, CoordMode m, int64_t y) {
  const double in = double(p.in), out = p.scale * in, s = p.scale, yd = double(y);
  switch (m) {
    case CoordMode::kHalfPixel: return (yd + 0.5) / s - 0.5;
    case CoordMode::kHalfPixelSymmetric: {
      double offset = in / 2 * (1 - double(p.out) / out);
      return offset + (yd + 0.5) / s - 0.5;
    }
    case CoordMode::kPytorchHalfPixel: return out == 1 ? -0.5 : (yd + 0.5) / s - 0.5;
    case CoordMode::kAlignCorners: return out == 1 ? 0 : yd * (in - 1) / (out - 1);
    case CoordMode::kAsymmetric: return yd / s;
    case CoordMode::kTfHalfPixelForNn: return (yd + 0.5) / s;
    case CoordMode::kTfCropAndResize: {
      double span = (p.roi_end - p.roi_start) * (in - 1);
      return p.roi_start * (in - 1) + (out == 1 ? span / 2 : yd * span / (out - 1));
    }
  }
  return 0;
}

int64_t nearest_index(double x, NearestMode m) {
  double f = std::floor(x);
  if (x == f) return int64_t(f);
  switch (m) {
    case NearestMode::kRoundPreferFloor: return int64_t(x - f <= 0.5 ? f : f + 1);
    case NearestMode::kRoundPreferCeil: return int64_t(x - f < 0.5 ? f : f + 1);
    case NearestMode::kFloor: return int64_t(f);
    case NearestMode::kCeil: return int64_t(f + 1);
  }
  return int64_t(f);
}

// Interpolation kernels as functions of the distance between a tap and the source coordinate.
double linear_weight(double d) { return std::max(0.0, 1 - std::abs(d)); }
double cubic_weight(double d, double A) {
  d = std::abs(d);
  if (d <= 1) return ((A + 2) * d - (A + 3)) * d * d + 1;
  if (d < 2) return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A;
  return 0;
}

// For each output position along one axis: n input taps (indices clamped into range, which is the
// reference's edge padding) and their weights, or a flag to write extrapolation_value instead.
struct AxisTaps {
  int64_t n = 1;
  std::vector<int64_t> index;     // [out * n]
  std::vector<double> weight;     // [out * n]
  std::vector<uint8_t> extrapolate;  // [out]
};

AxisTaps plan_taps(const AxisResize& p, const ResizeAttrs& a) {
  AxisTaps t;
  const bool nearest = a.mode == ResizeMode::kNearest;
  // Linear has support 1, cubic 2. Antialiasing stretches the kernel by 1/scale when
  // downsampling, so more taps fall inside it.
  const double support = a.mode == ResizeMode::kCubic ? 2 : 1;
  const double ks = a.antialias && !nearest ? std::min(p.scale, 1.0) : 1.0;
  const int64_t start = int64_t(std::floor(-support / ks)) + 1;
  t.n = nearest ? 1 : 2 - 2 * start;
  t.index.resize(size_t(p.out * t.n));
  t.weight.resize(size_t(p.out * t.n));
  t.extrapolate.resize(size_t(p.out));
  const double in = double(p.in);
  for (int64_t y = 0; y < p.out; ++y) {
    double x = source_coord(p, a.coord, y);
    t.extrapolate[size_t(y)] = a.coord == CoordMode::kTfCropAndResize && (x < 0 || x > in - 1);
    // Far outside, every tap is clamped to an edge anyway; bounding x keeps the casts defined.
    x = std::clamp(x, -in - double(t.n) - 2, 2 * in + double(t.n) + 2);
    int64_t* idx = &t.index[size_t(y * t.n)];
    double* w = &t.weight[size_t(y * t.n)];
    if (nearest) {
      idx[0] = std::clamp<int64_t>(nearest_index(x, a.nearest), 0, p.in - 1);
      w[0] = 1;
      continue;
    }
    const int64_t x0 = int64_t(std::floor(x));
    double sum = 0;
    for (int64_t k = 0; k < t.n; ++k) {
      idx[k] = x0 + start + k;
      double d = (double(idx[k]) - x) * ks;
      w[k] = a.mode == ResizeMode::kCubic ? cubic_weight(d, a.cubic_a) : linear_weight(d);
      if (a.exclude_outside && (idx[k] < 0 || idx[k] >= p.in)) w[k] = 0;
      sum += w[k];
    }
    // Antialiased kernels and exclude_outside renormalize the weights to sum to 1.
    if ((a.antialias || a.exclude_outside) && sum != 0) {
      for (int64_t k = 0; k < t.n; ++k) w[k] /= sum;
    }
    for (int64_t k = 0; k < t.n; ++k) idx[k] = std::clamp<int64_t>(idx[k], 0, p.in - 1);
  }
  return t;
}

// ---- kernels -----------------------------------------------------------------------------------

// Nearest: every output element copies one input element (or extrapolation_value), any dtype.
template <typename T>
void resize_nearest(const Tensor& x, Tensor& y, const std::vector<AxisTaps>& taps, T extrapolation) {
  const T* src = x.data<T>();
  T* dst = y.data<T>();
  const std::vector<int64_t>& od = y.dims();
  const size_t r = od.size();
  if (r == 0) {
    dst[0] = src[0];
    return;
  }
  const std::vector<int64_t> st = strides_of(x.dims());
  const int64_t last = od[r - 1], rows = y.numel() / std::max<int64_t>(last, 1);
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(last, 1)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      int64_t base = 0, rem = row;
      bool outside = false;
      for (size_t k = r - 1; k-- > 0;) {
        int64_t i = rem % od[k];
        rem /= od[k];
        base += taps[k].index[size_t(i)] * st[k];
        outside = outside || taps[k].extrapolate[size_t(i)];
      }
      const AxisTaps& tl = taps[r - 1];
      for (int64_t j = 0; j < last; ++j) {
        bool ext = outside || tl.extrapolate[size_t(j)];
        dst[row * last + j] = ext ? extrapolation : src[base + tl.index[size_t(j)] * st[r - 1]];
      }
    }
  });
}

// One separable pass: resizes axis `axis` of `src` (dims `dims`), returning the new buffer.
std::vector<double> resize_axis(const std::vector<double>& src, const std::vector<int64_t>& dims, size_t axis,
                                const AxisTaps& t, int64_t out, double extrapolation) {
  int64_t outer = 1, inner = 1;
  for (size_t k = 0; k < axis; ++k) outer *= dims[k];
  for (size_t k = axis + 1; k < dims.size(); ++k) inner *= dims[k];
  const int64_t in = dims[axis];
  std::vector<double> dst(size_t(outer * out * inner), 0.0);
  parallel_for(outer * out, std::max<int64_t>(1, 4096 / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t o = row / out, y = row % out;
      double* d = &dst[size_t(row * inner)];
      if (t.extrapolate[size_t(y)]) {
        std::fill(d, d + inner, extrapolation);
        continue;
      }
      for (int64_t k = 0; k < t.n; ++k) {
        const double w = t.weight[size_t(y * t.n + k)];
        if (w == 0) continue;
        const double* s = &src[size_t((o * in + t.index[size_t(y * t.n + k)]) * inner)];
        for (int64_t i = 0; i < inner; ++i) d[i] += w * s[i];
      }
    }
  });
  return dst;
}

template <typename T>
void resize_interpolate(const Tensor& x, Tensor& y, const std::vector<AxisResize>& plan,
                        const std::vector<AxisTaps>& taps, const ResizeAttrs& a) {
  const T* src = x.data<T>();
  std::vector<double> buf(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) buf[size_t(i)] = double(compute_t<T>(src[i]));
  std::vector<int64_t> dims = x.dims();
  for (int64_t ax : a.axes) {
    const AxisResize& p = plan[size_t(ax)];
    if (p.identity()) continue;
    buf = resize_axis(buf, dims, size_t(ax), taps[size_t(ax)], p.out, a.extrapolation);
    dims[size_t(ax)] = p.out;
  }
  T* dst = y.data<T>();
  for (int64_t i = 0; i < y.numel(); ++i) dst[i] = from_double<T>(buf[size_t(i)]);
}

Status resize_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(ResizeAttrs a, parse_resize_attrs(c, int64_t(x.rank())));
  KILN_ASSIGN_OR_RETURN(std::vector<AxisResize> plan, plan_resize(c, a, x.dims()));
  std::vector<int64_t> out_dims;
  for (const AxisResize& p : plan) {
    if (p.in == 0 && p.out > 0) return c.error("cannot resize an empty axis to {}", p.out);
    out_dims.push_back(p.out);
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), out_dims));
  if (y->numel() == 0) return Status::ok();
  std::vector<AxisTaps> taps;
  for (const AxisResize& p : plan) taps.push_back(plan_taps(p, a));
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if (a.mode == ResizeMode::kNearest) {
      resize_nearest<T>(x, *y, taps, from_double<T>(a.extrapolation));
      return Status::ok();
    }
    if constexpr (is_numeric_v<T>) {
      resize_interpolate<T>(x, *y, plan, taps, a);
      return Status::ok();
    } else {
      return c.unsupported("linear/cubic Resize of {}", dtype_name(x.dtype()));
    }
  });
}

}  // namespace

void register_image_resize_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kResize, {.inputs = {1, 4},
                          .attrs = {{"antialias", K::kInt},
                                    {"axes", K::kInts},
                                    {"coordinate_transformation_mode", K::kString},
                                    {"cubic_coeff_a", K::kFloat},
                                    {"exclude_outside", K::kInt},
                                    {"extrapolation_value", K::kFloat},
                                    {"keep_aspect_ratio_policy", K::kString},
                                    {"mode", K::kString},
                                    {"nearest_mode", K::kString}},
                          .infer = infer_resize,
                          .cpu = resize_cpu});
}

}  // namespace kiln
