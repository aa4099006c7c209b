#include "ops/elementwise_util.h"

namespace kiln {

bool dtype_in_class(TypeClass tc, DType dt) {
  return visit_dtype(dt, [&]<typename T>() {
    switch (tc) {
      case TypeClass::kFloat: return in_class<TypeClass::kFloat, T>();
      case TypeClass::kFloatOrF8: return in_class<TypeClass::kFloatOrF8, T>();
      case TypeClass::kSignedNumeric: return in_class<TypeClass::kSignedNumeric, T>();
      case TypeClass::kNumeric: return in_class<TypeClass::kNumeric, T>();
      case TypeClass::kInt: return in_class<TypeClass::kInt, T>();
      case TypeClass::kBool: return in_class<TypeClass::kBool, T>();
      case TypeClass::kComparable: return in_class<TypeClass::kComparable, T>();
      case TypeClass::kAny: return in_class<TypeClass::kAny, T>();
    }
    return false;
  });
}

std::string_view type_class_name(TypeClass tc) {
  switch (tc) {
    case TypeClass::kFloat: return "float (f16, f32, f64, bf16)";
    case TypeClass::kFloatOrF8: return "float (f16, f32, f64, bf16, f8*)";
    case TypeClass::kSignedNumeric: return "signed numeric (float or i8..i64)";
    case TypeClass::kNumeric: return "numeric (float or integer)";
    case TypeClass::kInt: return "integer";
    case TypeClass::kBool: return "bool";
    case TypeClass::kComparable: return "numeric, bool or string";
    case TypeClass::kAny: return "any";
  }
  return "?";
}

Status check_input_class(const InferCtx& c, size_t i, TypeClass tc) {
  if (!c.has_input(i)) return Status::ok();
  const Type& t = c.input_type(i);
  if (!t.is_tensor()) return c.error("input {} must be a tensor, got {}", i, t.to_string());
  if (!dtype_in_class(tc, t.dtype)) {
    return c.error("input {} must be a {} tensor, got {}", i, type_class_name(tc), dtype_name(t.dtype));
  }
  return Status::ok();
}

Status unsupported_dtype(const KernelCtx& c, DType dt) {
  return c.unsupported("element type {} is not supported", dtype_name(dt));
}

Status check_no_zero_divisor(const KernelCtx& c, const Tensor& b) {
  for (int64_t i = 0; i < b.numel(); ++i) {
    if (b.as_int(i) == 0) return c.error("integer division by zero (divisor element {})", i);
  }
  return Status::ok();
}

Expected<std::optional<Shape>> broadcast_input_shapes(const InferCtx& c) {
  std::vector<Shape> shapes;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_input(i)) continue;
    const Type& t = c.input_type(i);
    if (!t.has_rank()) return std::optional<Shape>();
    shapes.push_back(*t.shape);
  }
  KILN_ASSIGN_OR_RETURN(Shape s, broadcast_shapes(c, shapes));
  return std::optional<Shape>(std::move(s));
}

}  // namespace kiln
