// Shared machinery for the elementwise op families (unary, binary, activation): dtype classes,
// one generic broadcasting map over any number of inputs, and OpDef builders, so each op is a
// functor plus one registration line:
//
//   struct Exp {
//     static constexpr TypeClass kTypes = TypeClass::kFloat;     // dtypes the op accepts
//     template <typename T> T operator()(T x) const { return std::exp(x); }
//   };
//   r.def(OpKind::kExp, unary_op<Exp>());
//
// A functor sees values in compute_t<T> (float for half/bf16/f8) and returns the output value in
// compute type. Optional members:
//   static constexpr bool kBoolOutput = true;   // output is bool (comparisons, IsNaN)
//   explicit Op(const Node& n);                 // reads attributes once per kernel call
//   static constexpr bool kIntDivisor = true;   // binary: integer B must have no zeros (Div, Mod)
#pragma once

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ops/op_util.h"

namespace kiln {

// ---- dtype classes ---------------------------------------------------------------------------

enum class TypeClass {
  kFloat,          // f16 f32 f64 bf16
  kFloatOrF8,      // kFloat and the float8 types
  kSignedNumeric,  // kFloat and i8..i64
  kNumeric,        // kFloat and every integer type
  kInt,            // i8..i64, u8..u64
  kBool,
  kComparable,     // kNumeric, bool, string (Equal)
  kAny,            // every dtype (Where)
};

template <typename T>
inline constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;
template <typename T>
inline constexpr bool is_std_float_v = is_float_v<T> && !is_reduced_float_v<T>;
template <typename T>
inline constexpr bool is_onnx_float_v =
    std::is_floating_point_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <TypeClass C, typename T>
constexpr bool in_class() {
  switch (C) {
    case TypeClass::kFloat: return is_onnx_float_v<T>;
    case TypeClass::kFloatOrF8: return is_float_v<T>;
    case TypeClass::kSignedNumeric: return is_onnx_float_v<T> || (is_int_v<T> && std::is_signed_v<T>);
    case TypeClass::kNumeric: return is_onnx_float_v<T> || is_int_v<T>;
    case TypeClass::kInt: return is_int_v<T>;
    case TypeClass::kBool: return std::is_same_v<T, bool>;
    case TypeClass::kComparable:
      return is_onnx_float_v<T> || std::is_integral_v<T> || std::is_same_v<T, std::string>;
    case TypeClass::kAny: return true;
  }
  return false;
}

bool dtype_in_class(TypeClass c, DType dt);
std::string_view type_class_name(TypeClass c);  // "float (f16, f32, f64, bf16)", for messages

// Requires input i (when present) to be a tensor whose dtype is in class `tc`.
Status check_input_class(const InferCtx& c, size_t i, TypeClass tc);

// ---- integer arithmetic that wraps instead of overflowing (signed overflow is UB in C++) ------

// An unsigned type at least as wide as T and as unsigned int, so uint16*uint16 cannot overflow int.
template <typename T>
using wide_unsigned_t = std::make_unsigned_t<decltype(T() + 0u)>;

template <typename T> T wrap_add(T a, T b) { return T(wide_unsigned_t<T>(a) + wide_unsigned_t<T>(b)); }
template <typename T> T wrap_sub(T a, T b) { return T(wide_unsigned_t<T>(a) - wide_unsigned_t<T>(b)); }
template <typename T> T wrap_mul(T a, T b) { return T(wide_unsigned_t<T>(a) * wide_unsigned_t<T>(b)); }
template <typename T> T wrap_neg(T a) { return T(wide_unsigned_t<T>(0) - wide_unsigned_t<T>(a)); }

// double -> integer T without UB: NaN becomes 0, out-of-range values saturate.
template <typename T>
T saturate_cast(double v) {
  if constexpr (is_int_v<T>) {
    if (std::isnan(v)) return 0;
    if (v <= double(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (v >= double(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return T(v);
  } else {
    return static_cast<T>(v);
  }
}

// ---- the generic broadcasting map ------------------------------------------------------------

namespace elementwise_detail {

template <typename T>
compute_t<T> load(const T& v) { return compute_t<T>(v); }

template <typename Out, typename F, typename... In, size_t... I>
void map_same_shape(Out* y, int64_t n, const F& f, std::index_sequence<I...>, const std::tuple<const In*...>& p) {
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = static_cast<Out>(f(load(std::get<I>(p)[i])...));
  });
}

// General broadcasting: rows of the innermost output dim run in parallel; each row finds its
// input offsets from its multi-index, then steps every input by its innermost stride.
template <typename Out, typename F, typename... In, size_t... I>
void map_broadcast(Out* y, const std::vector<int64_t>& od, const F& f, std::index_sequence<I...>,
                   const std::tuple<const In*...>& p, const std::array<std::vector<int64_t>, sizeof...(In)>& st) {
  const size_t r = od.size();
  const int64_t inner = od[r - 1];
  int64_t rows = 1;
  for (size_t k = 0; k + 1 < r; ++k) rows *= od[k];
  parallel_for(rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      std::array<int64_t, sizeof...(In)> off{};
      for (int64_t k = int64_t(r) - 2, rem = row; k >= 0; --k) {
        int64_t idx = rem % od[k];
        rem /= od[k];
        for (size_t j = 0; j < sizeof...(In); ++j) off[j] += idx * st[j][k];
      }
      Out* yr = y + row * inner;
      for (int64_t i = 0; i < inner; ++i) {
        yr[i] = static_cast<Out>(f(load(std::get<I>(p)[off[I] + i * st[I][r - 1]])...));
      }
    }
  });
}

}  // namespace elementwise_detail

// out[idx] = f(ins[idx]...) with numpy broadcasting of every input to out's dims (already
// allocated with the broadcast shape and dtype Out). Inputs have the C++ types In.
template <typename Out, typename... In, typename F>
void map_into(Tensor& out, const F& f, const std::conditional_t<true, Tensor, In>&... ins) {
  Out* y = out.data<Out>();
  std::tuple<const In*...> p{ins.template data<In>()...};
  const auto& od = out.dims();
  if (((ins.dims() == od) && ...)) {
    elementwise_detail::map_same_shape<Out>(y, out.numel(), f, std::index_sequence_for<In...>{}, p);
    return;
  }
  if (out.numel() == 0) return;
  std::array<std::vector<int64_t>, sizeof...(In)> st{broadcast_strides(ins.dims(), od)...};
  elementwise_detail::map_broadcast<Out>(y, od, f, std::index_sequence_for<In...>{}, p, st);
}

// Allocates output `oi` with the broadcast dims of `ins` and fills it with f.
template <typename Out, typename... In, typename F>
Status map_output(KernelCtx& c, size_t oi, const F& f, const std::conditional_t<true, Tensor, In>&... ins) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, broadcast_dims(c, {ins.dims()...}));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(oi, dtype_of<Out>(), std::move(dims)));
  map_into<Out, In...>(*y, f, ins...);
  return Status::ok();
}

// ---- functor traits ----------------------------------------------------------------------------

template <typename Op>
Op make_op(const Node& n) {
  if constexpr (std::is_constructible_v<Op, const Node&>) return Op(n);
  else return Op{};
}

template <typename Op>
constexpr bool bool_output() {
  if constexpr (requires { Op::kBoolOutput; }) return Op::kBoolOutput;
  else return false;
}
template <typename Op, typename T>
using op_out_t = std::conditional_t<bool_output<Op>(), bool, T>;

template <typename Op>
constexpr bool checks_int_divisor() {
  if constexpr (requires { Op::kIntDivisor; }) return Op::kIntDivisor;
  else return false;
}

Status unsupported_dtype(const KernelCtx& c, DType dt);
// Errors when an integer divisor tensor holds a zero (integer division by zero is undefined).
Status check_no_zero_divisor(const KernelCtx& c, const Tensor& b);

// ---- unary and binary ops ----------------------------------------------------------------------

template <typename Op>
Status infer_unary(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, Op::kTypes));
  c.set_output_tensor(0, bool_output<Op>() ? DType::kBool : dt, c.input_type(0).shape);
  return Status::ok();
}

template <typename Op>
Status unary_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Op op = make_op<Op>(c.node());
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (in_class<Op::kTypes, T>()) {
      return map_output<op_out_t<Op, T>, T>(c, 0, op, x);
    } else {
      return unsupported_dtype(c, x.dtype());
    }
  });
}

template <typename Op>
OpDef unary_op(std::vector<AttrSpec> attrs = {}) {
  return {.inputs = {1, 1}, .outputs = {1, 1}, .attrs = std::move(attrs), .infer = infer_unary<Op>,
          .cpu = unary_cpu<Op>};
}

// An op from a captureless lambda, for ops without attributes:
//   r.def(OpKind::kExp, unary_fn<TypeClass::kFloat>([](auto x) { return std::exp(x); }));
template <TypeClass C, typename Fn, bool kBool = false>
struct FnOp {
  static constexpr TypeClass kTypes = C;
  static constexpr bool kBoolOutput = kBool;
  template <typename... T>
  auto operator()(T... x) const { return Fn{}(x...); }
};
template <TypeClass C, bool kBool = false, typename Fn>
OpDef unary_fn(Fn) { return unary_op<FnOp<C, Fn, kBool>>(); }

// Output shape of a broadcast over all present inputs (nullopt when some rank is unknown).
Expected<std::optional<Shape>> broadcast_input_shapes(const InferCtx& c);

template <typename Op>
Status infer_binary(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, c.num_inputs()));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  for (size_t i = 0; i < c.num_inputs(); ++i) KILN_RETURN_IF_ERROR(check_input_class(c, i, Op::kTypes));
  KILN_ASSIGN_OR_RETURN(std::optional<Shape> s, broadcast_input_shapes(c));
  c.set_output_tensor(0, bool_output<Op>() ? DType::kBool : dt, std::move(s));
  return Status::ok();
}

template <typename Op>
Status binary_cpu(KernelCtx& c) {
  const Tensor& a = c.tensor(0);
  const Tensor& b = c.tensor(1);
  if (a.dtype() != b.dtype()) {
    return c.error("inputs must have the same element type, got {} and {}", dtype_name(a.dtype()),
                   dtype_name(b.dtype()));
  }
  const Op op = make_op<Op>(c.node());
  return visit_dtype(a.dtype(), [&]<typename T>() -> Status {
    if constexpr (in_class<Op::kTypes, T>()) {
      if constexpr (checks_int_divisor<Op>() && is_int_v<T>) KILN_RETURN_IF_ERROR(check_no_zero_divisor(c, b));
      return map_output<op_out_t<Op, T>, T, T>(c, 0, op, a, b);
    } else {
      return unsupported_dtype(c, a.dtype());
    }
  });
}

template <typename Op>
OpDef binary_op(std::vector<AttrSpec> attrs = {}, InferFn infer = infer_binary<Op>) {
  return {.inputs = {2, 2}, .outputs = {1, 1}, .attrs = std::move(attrs), .infer = infer, .cpu = binary_cpu<Op>};
}
template <TypeClass C, bool kBool = false, typename Fn>
OpDef binary_fn(Fn) { return binary_op<FnOp<C, Fn, kBool>>(); }

// ---- NaN-aware helpers shared by functors --------------------------------------------------------

template <typename T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

}  // namespace kiln
