// Op family: create. Constant, ConstantOfShape, Range, EyeLike here; Cast/CastLike in
// create_cast.cc, the random generators in create_random.cc.
#include <algorithm>
#include <cmath>

#include "ops/create_cast.h"
#include "ops/op_util.h"

namespace kiln {
namespace {

// Small 1-D int tensors are also recorded as symbolic values, so Reshape(x, Constant) and
// Concat(Shape(x)[0], Constant) infer static/symbolic shapes.
constexpr int64_t kMaxDimsValue = 64;

void set_dims_value_from(InferCtx& c, size_t out, const Tensor& t) {
  if (!dtype_is_int(t.dtype()) || t.rank() > 1 || t.numel() > kMaxDimsValue) return;
  std::vector<Dim> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.emplace_back(t.as_int(i));
  c.set_output_dims_value(out, std::move(v));
}

// ---- Constant ----------------------------------------------------------------------------------

// The one value attribute of a Constant node, as a tensor.
template <typename Ctx>
Expected<Tensor> constant_value(const Ctx& c) {
  const Node& n = c.node();
  if (n.attrs.size() != 1) return c.error("needs exactly one value attribute, got {}", n.attrs.size());
  const auto& [name, a] = *n.attrs.begin();
  if (name == "value") return a.t;
  if (name == "value_float") return Tensor::scalar<float>(a.f);
  if (name == "value_int") return Tensor::scalar<int64_t>(a.i);
  if (name == "value_string") return Tensor::scalar<std::string>(a.s);
  if (name == "value_floats") return Tensor::from_vector<float>(a.floats, {int64_t(a.floats.size())});
  if (name == "value_ints") return Tensor::from_vector<int64_t>(a.ints, {int64_t(a.ints.size())});
  if (name == "value_strings") return Tensor::from_vector<std::string>(a.strings, {int64_t(a.strings.size())});
  if (name == "sparse_value") return c.unsupported("sparse_value constants are not supported");
  return c.error("unknown value attribute '{}'", name);
}

Status constant_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(Tensor t, constant_value(c));
  c.set_output_tensor(0, t.dtype(), Shape::of(t.dims()));
  set_dims_value_from(c, 0, t);
  return Status::ok();
}

Status constant_cpu(KernelCtx& c) {
  // Shares the attribute's buffer: kernels never write into their inputs.
  KILN_ASSIGN_OR_RETURN(Tensor t, constant_value(c));
  c.set_output(0, Data(std::move(t)));
  return Status::ok();
}

// ---- ConstantOfShape ---------------------------------------------------------------------------

template <typename Ctx>
Expected<Tensor> fill_value(const Ctx& c) {
  const Tensor* v = c.node().attr_tensor("value");
  if (!v) return Tensor::scalar<float>(0.0f);
  if (v->numel() != 1) return c.error("value must have exactly one element, got {}", v->summary());
  return *v;
}

Status constant_of_shape_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(Tensor v, fill_value(c));
  KILN_ASSIGN_OR_RETURN(DType st, c.tensor_dtype(0));
  if (st != DType::kInt64) return c.error("input must be int64, got {}", dtype_name(st));
  if (std::optional<std::vector<Dim>> dims = c.input_as_dims(0)) {
    for (const Dim& d : *dims) {
      if (d.is_static() && d.value() < 0) return c.error("shape {} has a negative dimension", Shape(*dims).to_string());
    }
    c.set_output_tensor(0, v.dtype(), Shape(*dims));
    // ConstantOfShape([k]) of an int value is a small constant vector: keep its values.
    if (dims->size() == 1 && (*dims)[0].is_static() && (*dims)[0].value() <= kMaxDimsValue && dtype_is_int(v.dtype())) {
      c.set_output_dims_value(0, std::vector<Dim>(size_t((*dims)[0].value()), Dim(v.as_int(0))));
    }
    return Status::ok();
  }
  const Type& s = c.input_type(0);
  if (s.has_rank() && s.shape->rank() == 1 && (*s.shape)[0].is_static()) {
    c.set_output_tensor(0, v.dtype(), Shape(std::vector<Dim>(size_t((*s.shape)[0].value()))));
  } else {
    c.set_output_tensor(0, v.dtype(), std::nullopt);
  }
  return Status::ok();
}

Status constant_of_shape_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(Tensor v, fill_value(c));
  const Tensor& s = c.tensor(0);
  if (s.rank() > 1) return c.error("shape must be 1-D, got {}", s.summary());
  std::vector<int64_t> dims = s.to_int_vector();
  for (int64_t d : dims) {
    if (d < 0) return c.error("shape {} has a negative dimension", dims_to_string(dims));
  }
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, v.dtype(), dims));
  visit_dtype(v.dtype(), [&]<typename T>() {
    std::fill(out->data<T>(), out->data<T>() + out->numel(), v.data<T>()[0]);
  });
  return Status::ok();
}

// ---- Range -------------------------------------------------------------------------------------

Status range_infer(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, 3));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  for (size_t i = 0; i < 3; ++i) {
    const Type& t = c.input_type(i);
    if (t.has_rank() && t.shape->rank() > 1) return c.error("input {} must be a scalar, got {}", i, t.to_string());
  }
  // The length is known when the three scalars are: statically, or symbolically for the
  // common Range(0, n, 1) / Range(start, limit, 1) forms with integer inputs.
  Dim len;
  if (dtype_is_int(dt)) {
    auto s = c.input_as_dims(0), l = c.input_as_dims(1), d = c.input_as_dims(2);
    if (s && l && d && s->size() == 1 && l->size() == 1 && d->size() == 1 && (*d)[0].is_static()) {
      int64_t delta = (*d)[0].value();
      if (delta == 0) return c.error("delta must not be zero");
      Dim span = (*l)[0] - (*s)[0];
      if (span.is_static()) {
        len = Dim(std::max<int64_t>(0, delta > 0 ? (span.value() + delta - 1) / delta : (span.value() + delta + 1) / delta));
      } else if (delta > 0) {
        len = ceil_div(span, Dim(delta));
      }
    }
  } else if (const Tensor *s = c.input_constant(0), *l = c.input_constant(1), *d = c.input_constant(2); s && l && d) {
    double delta = d->as_double(0);
    if (delta == 0) return c.error("delta must not be zero");
    len = Dim(int64_t(std::max(0.0, std::ceil((l->as_double(0) - s->as_double(0)) / delta))));
  }
  c.set_output_tensor(0, dt, Shape{len});
  return Status::ok();
}

Status range_cpu(KernelCtx& c) {
  const Tensor& ts = c.tensor(0);
  const Tensor& tl = c.tensor(1);
  const Tensor& td = c.tensor(2);
  for (const Tensor* t : {&ts, &tl, &td}) {
    if (t->numel() != 1) return c.error("start, limit and delta must be scalars, got {}", t->summary());
    if (t->dtype() != ts.dtype()) return c.error("start, limit and delta must share a type, got {} and {}", ts.summary(), t->summary());
  }
  DType dt = ts.dtype();
  if (dtype_is_int(dt)) {
    // Integer ranges are computed exactly, without going through double.
    int64_t start = ts.as_int(0), limit = tl.as_int(0), delta = td.as_int(0);
    if (delta == 0) return c.error("delta must not be zero");
    int64_t span = limit - start;
    int64_t n = delta > 0 ? (span + delta - 1) / delta : (span + delta + 1) / delta;
    KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, dt, {std::max<int64_t>(n, 0)}));
    visit_dtype(dt, [&]<typename T>() {
      if constexpr (std::is_integral_v<T>) {
        for (int64_t i = 0; i < out->numel(); ++i) out->data<T>()[i] = static_cast<T>(start + i * delta);
      }
    });
    return Status::ok();
  }
  if (!dtype_is_float(dt) || dtype_is_f8(dt)) return c.unsupported("Range of {} is not supported", dtype_name(dt));
  // Floats: count and values in double (float16/bfloat16 follow stash_type=float, at least as precise).
  double start = ts.as_double(0), limit = tl.as_double(0), delta = td.as_double(0);
  if (delta == 0 || !std::isfinite(delta) || !std::isfinite(start) || !std::isfinite(limit)) {
    return c.error("start {}, limit {}, delta {} must be finite with delta non-zero", start, limit, delta);
  }
  double n = std::max(0.0, std::ceil((limit - start) / delta));
  if (n > double(max_tensor_bytes())) return c.error("range of {} elements is too large", n);
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, dt, {int64_t(n)}));
  for (int64_t i = 0; i < out->numel(); ++i) set_element(*out, i, start + double(i) * delta);
  return Status::ok();
}

// ---- EyeLike -----------------------------------------------------------------------------------

template <typename Ctx>
Expected<DType> eye_like_dtype(const Ctx& c, DType input) {
  if (!c.node().has_attr("dtype")) return input;
  int64_t code = c.node().attr_int("dtype", 0);
  std::optional<DType> dt = dtype_from_onnx(int32_t(code));
  if (!dt || *dt == DType::kString) return c.error("dtype {} is not a valid EyeLike output type", code);
  return *dt;
}

Status eye_like_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType in, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType dt, eye_like_dtype(c, in));
  const Type& x = c.input_type(0);
  if (x.has_rank() && x.shape->rank() != 2) return c.error("input must be 2-D, got {}", x.to_string());
  c.set_output_tensor(0, dt, x.shape);
  return Status::ok();
}

Status eye_like_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() != 2) return c.error("input must be 2-D, got {}", x.summary());
  KILN_ASSIGN_OR_RETURN(DType dt, eye_like_dtype(c, x.dtype()));
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, dt, x.dims()));
  int64_t k = c.node().attr_int("k", 0), rows = x.dim(0), cols = x.dim(1);
  for (int64_t i = std::max<int64_t>(0, -k); i < rows && i + k < cols; ++i) set_element(*out, i * cols + i + k, 1.0);
  return Status::ok();
}

}  // namespace

void register_create_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kConstant, {.inputs = {0, 0},
                            .attrs = {{"value", K::kTensor}, {"value_float", K::kFloat}, {"value_floats", K::kFloats},
                                      {"value_int", K::kInt}, {"value_ints", K::kInts}, {"value_string", K::kString},
                                      {"value_strings", K::kStrings}},
                            .infer = constant_infer, .cpu = constant_cpu});
  r.def(OpKind::kConstantOfShape, {.inputs = {1, 1}, .attrs = {{"value", K::kTensor}},
                                   .infer = constant_of_shape_infer, .cpu = constant_of_shape_cpu});
  r.def(OpKind::kRange, {.inputs = {3, 3}, .attrs = {{"stash_type", K::kInt}}, .infer = range_infer, .cpu = range_cpu});
  r.def(OpKind::kEyeLike, {.inputs = {1, 1}, .attrs = {{"dtype", K::kInt}, {"k", K::kInt}},
                           .infer = eye_like_infer, .cpu = eye_like_cpu});
  register_create_cast_ops(r);
  register_create_random_ops(r);
}

}  // namespace kiln
