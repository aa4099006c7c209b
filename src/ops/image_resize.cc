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

#include "ops/resize_taps.h"

namespace kiln {

namespace {

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

Expected<std::vector<AxisResize>> plan_resize(const KernelCtx& c, const ResizeAttrs& a, const std::vector<int64_t>& in) {
  auto opt = [&](size_t i) { return present(c, i) ? &c.tensor(i) : nullptr; };
  return plan_resize(c, a, in, opt(1), opt(2), opt(3));
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
