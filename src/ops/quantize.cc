// Op family: quantize. QuantizeLinear, DequantizeLinear (per-tensor, per-axis and blocked scales)
// and DynamicQuantizeLinear. Arithmetic follows the ONNX reference implementation: the division
// x / scale is rounded to its precision type before round-half-to-even and saturation.
#include <algorithm>
#include <cmath>

#include "ops/create_cast.h"
#include "ops/op_util.h"
#include "ops/quantize_util.h"

namespace kiln {
namespace {

// Which scale (and zero point) element applies to each element of x.
struct ScaleMap {
  enum class Kind { kTensor, kAxis, kBlocked } kind = Kind::kTensor;
  int64_t inner = 1;       // product of x's dims after the axis
  int64_t axis_len = 1;    // x's dim at the axis
  int64_t scale_len = 1;   // the scale's dim at the axis (blocked)
  int64_t block = 1;

  int64_t index(int64_t i) const {
    if (kind == Kind::kTensor) return 0;
    int64_t a = (i / inner) % axis_len;
    if (kind == Kind::kAxis) return a;
    int64_t outer = i / (inner * axis_len);
    return (outer * scale_len + a / block) * inner + i % inner;
  }
};

Expected<ScaleMap> make_scale_map(const KernelCtx& c, const std::vector<int64_t>& x, const Tensor& scale) {
  ScaleMap m;
  const std::vector<int64_t>& s = scale.dims();
  if (scale.numel() == 1 && s.size() <= 1) return m;  // per-tensor
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", 1), int64_t(x.size())));
  int64_t block = c.node().attr_int("block_size", 0);
  m.axis_len = x[size_t(axis)];
  for (size_t i = size_t(axis) + 1; i < x.size(); ++i) m.inner *= x[i];
  if (block <= 0) {
    if (s.size() != 1 || s[0] != m.axis_len) {
      return c.error("per-axis scale must be 1-D of length {} (axis {} of {}), got {}", m.axis_len, axis,
                     dims_to_string(x), scale.summary());
    }
    m.kind = ScaleMap::Kind::kAxis;
    return m;
  }
  // Blocked: the scale matches x except along the axis, where it holds ceil(D / block) blocks.
  bool ok = s.size() == x.size();
  for (size_t i = 0; ok && i < x.size(); ++i) {
    ok = int64_t(i) == axis ? s[i] == (x[i] + block - 1) / block : s[i] == x[i];
  }
  if (!ok) {
    return c.error("blocked scale {} does not fit input {} with block_size {} on axis {}", scale.summary(),
                   dims_to_string(x), block, axis);
  }
  m.kind = ScaleMap::Kind::kBlocked;
  m.scale_len = s[size_t(axis)];
  m.block = block;
  return m;
}

Status check_zero_point_shape(const KernelCtx& c, const Tensor& scale, size_t zp_input) {
  if (!c.has_input(zp_input)) return Status::ok();
  const Tensor& zp = c.tensor(zp_input);
  if (zp.numel() != scale.numel() || (zp.numel() != 1 && zp.dims() != scale.dims())) {
    return c.error("zero point {} must have the scale's shape {}", zp.summary(), scale.summary());
  }
  return Status::ok();
}

// Rounds v to the nearest value of dtype p (the precision the reference computes in).
double round_to(double v, DType p) {
  return visit_dtype(p, [&]<typename T>() -> double {
    if constexpr (is_float_v<T>) return double(compute_t<T>(cast_value<T>(v)));
    else return v;
  });
}

bool is_quantized_type(DType t) {
  return t == DType::kUInt8 || t == DType::kInt8 || t == DType::kUInt16 || t == DType::kInt16 || dtype_is_f8(t) ||
         t == DType::kFloat4E2M1 || t == DType::kInt4 || t == DType::kUInt4 || t == DType::kInt2 || t == DType::kUInt2;
}

// ---- QuantizeLinear ----------------------------------------------------------------------------

// The output type: the zero point's, else output_dtype, else uint8.
template <typename Ctx>
Expected<DType> quantize_output_dtype(const Ctx& c, std::optional<DType> zp) {
  int64_t code = c.node().attr_int("output_dtype", 0);
  std::optional<DType> out;
  if (code != 0) {
    out = dtype_from_onnx(int32_t(code));
    if (!out) return c.unsupported("output_dtype {} is not supported", code);
  }
  if (zp && out && *zp != *out) {
    return c.error("output_dtype {} differs from the zero point's type {}", dtype_name(*out), dtype_name(*zp));
  }
  DType dt = zp ? *zp : out.value_or(DType::kUInt8);
  if (!is_quantized_type(dt)) return c.unsupported("quantizing to {} is not supported", dtype_name(dt));
  return dt;
}

// The type x / scale is computed in: the precision attribute, else numpy's promotion of the two.
template <typename Ctx>
Expected<DType> division_dtype(const Ctx& c, DType x, DType scale) {
  if (int64_t code = c.node().attr_int("precision", 0); code != 0) {
    std::optional<DType> p = dtype_from_onnx(int32_t(code));
    if (!p || !dtype_is_float(*p)) return c.error("precision {} is not a float type", code);
    return *p;
  }
  if (x == DType::kInt32 || scale == DType::kInt32) return DType::kFloat64;
  return x == scale ? x : DType::kFloat32;
}

// A scale must be a positive, finite number: zero or negative scales divide by zero or flip signs
// (QuantizeLinear) and mean nothing (DequantizeLinear). Checked at import for constant scales and
// by the kernels for computed ones.
template <typename Ctx>
Status check_scales(const Ctx& c, const Tensor& scale) {
  if (!dtype_is_float(scale.dtype())) return Status::ok();
  for (int64_t i = 0; i < scale.numel(); ++i) {
    double v = scale.as_double(i);
    if (!(v > 0) || !std::isfinite(v)) {
      return c.error("scale {}{} is {}: scales must be positive and finite", c.node().inputs[1]->name,
                     scale.numel() > 1 ? fmt::format("[{}]", i) : "", v);
    }
  }
  return Status::ok();
}

Status quantize_infer(InferCtx& c) {
  KILN_RETURN_IF_ERROR(c.tensor_dtype(0).status());
  KILN_RETURN_IF_ERROR(c.tensor_dtype(1).status());
  if (const Tensor* scale = c.input_constant(1)) KILN_RETURN_IF_ERROR(check_scales(c, *scale));
  std::optional<DType> zp;
  if (c.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(zp, c.tensor_dtype(2));
  }
  KILN_ASSIGN_OR_RETURN(DType dt, quantize_output_dtype(c, zp));
  c.set_output_tensor(0, dt, c.input_type(0).shape);
  return Status::ok();
}

template <typename Q>
Q quantize_one(double q, double zp, bool saturate) {
  if constexpr (is_f8_v<Q> || std::is_same_v<Q, float4e2m1>) {
    return cast_value<Q>(q + zp, saturate);
  } else if constexpr (is_small_int_v<Q>) {
    if (std::isnan(q)) return Q(0);
    return Q(int64_t(std::clamp(std::nearbyint(q) + zp, double(Q::kMin), double(Q::kMax))));
  } else {
    double lo = double(std::numeric_limits<Q>::min()), hi = double(std::numeric_limits<Q>::max());
    if (std::isnan(q)) return Q(0);  // ONNX leaves it undefined
    return static_cast<Q>(std::clamp(std::nearbyint(q) + zp, lo, hi));
  }
}

Status quantize_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& scale = c.tensor(1);
  std::optional<DType> zp_type;
  if (c.has_input(2)) zp_type = c.tensor(2).dtype();
  KILN_ASSIGN_OR_RETURN(DType dt, quantize_output_dtype(c, zp_type));
  KILN_ASSIGN_OR_RETURN(DType prec, division_dtype(c, x.dtype(), scale.dtype()));
  KILN_RETURN_IF_ERROR(check_scales(c, scale));
  KILN_ASSIGN_OR_RETURN(ScaleMap map, make_scale_map(c, x.dims(), scale));
  KILN_RETURN_IF_ERROR(check_zero_point_shape(c, scale, 2));
  bool saturate = c.node().attr_int("saturate", 1) != 0;
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, dt, x.dims()));
  visit_dtype(dt, [&]<typename Q>() {
    if constexpr (is_f8_v<Q> || is_small_int_v<Q> || std::is_same_v<Q, float4e2m1> ||
                  (std::is_integral_v<Q> && !std::is_same_v<Q, bool>)) {
      Q* y = out->data<Q>();
      for (int64_t i = 0; i < x.numel(); ++i) {
        int64_t k = map.index(i);
        double q = round_to(round_to(x.as_double(i), prec) / round_to(scale.as_double(k), prec), prec);
        double zp = c.has_input(2) ? c.tensor(2).as_double(k) : 0.0;
        y[i] = quantize_one<Q>(q, zp, saturate);
      }
    }
  });
  return Status::ok();
}

// ---- DequantizeLinear --------------------------------------------------------------------------

template <typename Ctx>
Expected<DType> dequantize_output_dtype(const Ctx& c, DType scale) {
  int64_t code = c.node().attr_int("output_dtype", 0);
  DType dt = scale;
  if (code != 0) {
    std::optional<DType> d = dtype_from_onnx(int32_t(code));
    if (!d) return c.unsupported("output_dtype {} is not supported", code);
    dt = *d;
  }
  if (!dtype_is_float(dt) || dtype_is_f8(dt)) return c.error("output type must be float, float16 or bfloat16, got {}", dtype_name(dt));
  return dt;
}

Status dequantize_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType xt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType st, c.tensor_dtype(1));
  if (const Tensor* scale = c.input_constant(1)) KILN_RETURN_IF_ERROR(check_scales(c, *scale));
  if (c.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(DType zt, c.tensor_dtype(2));
    if (zt != xt) return c.error("zero point type {} differs from input type {}", dtype_name(zt), dtype_name(xt));
  }
  KILN_ASSIGN_OR_RETURN(DType dt, dequantize_output_dtype(c, st));
  c.set_output_tensor(0, dt, c.input_type(0).shape);
  return Status::ok();
}

Status dequantize_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& scale = c.tensor(1);
  KILN_ASSIGN_OR_RETURN(DType dt, dequantize_output_dtype(c, scale.dtype()));
  KILN_RETURN_IF_ERROR(check_scales(c, scale));
  KILN_ASSIGN_OR_RETURN(ScaleMap map, make_scale_map(c, x.dims(), scale));
  KILN_RETURN_IF_ERROR(check_zero_point_shape(c, scale, 2));
  // float8/float4 inputs carry no offset: their zero point must be 0 and is ignored.
  bool use_zp = c.has_input(2) && !dtype_is_f8(x.dtype()) && x.dtype() != DType::kFloat4E2M1;
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, dt, x.dims()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t k = map.index(i);
    // As the reference: x in float32, minus the zero point, times the scale.
    double dx = double(float(x.as_double(i))) - (use_zp ? c.tensor(2).as_double(k) : 0.0);
    set_element(*out, i, dx * scale.as_double(k));
  }
  return Status::ok();
}

// ---- DynamicQuantizeLinear ---------------------------------------------------------------------

Status dynamic_quantize_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType xt, c.tensor_dtype(0));
  if (xt != DType::kFloat32) return c.error("input must be float32, got {}", dtype_name(xt));
  c.set_output_tensor(0, DType::kUInt8, c.input_type(0).shape);
  c.set_output_tensor(1, DType::kFloat32, Shape{});
  c.set_output_tensor(2, DType::kUInt8, Shape{});
  return Status::ok();
}

Status dynamic_quantize_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.dtype() != DType::kFloat32) return c.error("input must be float32, got {}", x.summary());
  const float* p = x.data<float>();
  // The range always includes 0 so that 0 is exactly representable (spec). float32 throughout,
  // as in the reference.
  float mx = 0, mn = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    mx = std::max(mx, p[i]);
    mn = std::min(mn, p[i]);
  }
  float scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
  float zp = std::nearbyint(std::clamp(0.0f - mn / scale, 0.0f, 255.0f));
  KILN_ASSIGN_OR_RETURN(Tensor* y, c.alloc_output(0, DType::kUInt8, x.dims()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    y->data<uint8_t>()[i] = uint8_t(std::clamp(std::nearbyint(p[i] / scale) + zp, 0.0f, 255.0f));
  }
  if (c.has_output(1)) c.set_output(1, Data(Tensor::scalar<float>(scale)));
  if (c.has_output(2)) c.set_output(2, Data(Tensor::scalar<uint8_t>(uint8_t(zp))));
  return Status::ok();
}

}  // namespace

void register_quantize_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kQuantizeLinear, {.inputs = {2, 3},
                                  .attrs = {{"axis", K::kInt}, {"block_size", K::kInt}, {"output_dtype", K::kInt},
                                            {"precision", K::kInt}, {"saturate", K::kInt}},
                                  .infer = quantize_infer, .cpu = quantize_cpu});
  r.def(OpKind::kDequantizeLinear, {.inputs = {2, 3},
                                    .attrs = {{"axis", K::kInt}, {"block_size", K::kInt}, {"output_dtype", K::kInt}},
                                    .infer = dequantize_infer, .cpu = dequantize_cpu});
  r.def(OpKind::kDynamicQuantizeLinear, {.inputs = {1, 1}, .outputs = {1, 3},
                                         .infer = dynamic_quantize_infer, .cpu = dynamic_quantize_cpu});
}

}  // namespace kiln

namespace kiln {

bool is_scalar_int8_qdq(const Node& n, const std::function<const Tensor*(const Value*)>& constant, std::string* why) {
  auto no = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  const bool q = n.op == OpKind::kQuantizeLinear;
  if (!q && n.op != OpKind::kDequantizeLinear) return no("not a QuantizeLinear or DequantizeLinear");
  if (n.inputs.size() < 2 || !n.inputs[0] || !n.inputs[1] || n.outputs.size() != 1 || !n.outputs[0]) {
    return no("missing inputs or outputs");
  }
  if (n.attr_int("block_size", 0) != 0) return no("blocked scales");
  if (q && n.attr_int("precision", 0) != 0) return no("a precision attribute");
  const Tensor* scale = constant(n.inputs[1]);
  // A float32 scale: x / scale is then a float32 division whatever x's float type (a 16-bit scale
  // with 16-bit x would round the quotient to 16 bits first).
  if (!scale || scale->numel() != 1 || scale->dtype() != DType::kFloat32) {
    return no("the scale is not one constant float32 (per-axis, computed or 16-bit scales)");
  }
  if (n.inputs.size() > 2 && n.inputs[2]) {
    const Tensor* zp = constant(n.inputs[2]);
    if (!zp || zp->numel() != 1) return no("the zero point is not one constant");
  }
  const DType f = (q ? n.inputs[0] : n.outputs[0])->type.dtype;
  const DType i = (q ? n.outputs[0] : n.inputs[0])->type.dtype;
  if (i != DType::kInt8 && i != DType::kUInt8) return no(fmt::format("quantized type {}", dtype_name(i)));
  if (f != DType::kFloat32 && f != DType::kFloat16 && f != DType::kBFloat16) {
    return no(fmt::format("float type {}", dtype_name(f)));
  }
  return true;
}

}  // namespace kiln
