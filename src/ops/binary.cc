// Op family: binary. Broadcasting arithmetic, comparisons, logic and bit ops, the variadic
// Sum/Mean/Max/Min folds, and Where; see elementwise_util.h for the machinery.
#include <cmath>

#include "ops/elementwise_util.h"

namespace kiln {

namespace {

constexpr TypeClass kNumeric = TypeClass::kNumeric;

// ---- arithmetic ------------------------------------------------------------------------------

struct Add {
  static constexpr TypeClass kTypes = kNumeric;
  template <typename T> T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) return wrap_add(a, b);
    else return a + b;
  }
};

struct Sub {
  static constexpr TypeClass kTypes = kNumeric;
  template <typename T> T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) return wrap_sub(a, b);
    else return a - b;
  }
};

struct Mul {
  static constexpr TypeClass kTypes = kNumeric;
  template <typename T> T operator()(T a, T b) const {
    if constexpr (is_int_v<T>) return wrap_mul(a, b);
    else return a * b;
  }
};

// Integer division truncates toward zero, like C (and ONNX Runtime); MIN / -1 wraps.
struct Div {
  static constexpr TypeClass kTypes = kNumeric;
  static constexpr bool kIntDivisor = true;
  template <typename T> T operator()(T a, T b) const {
    if constexpr (is_int_v<T> && std::is_signed_v<T>) {
      if (b == T(-1)) return wrap_neg(a);
    }
    return T(a / b);
  }
};

// fmod=1: remainder with the sign of A (C fmod / %). fmod=0: remainder with the sign of B
// (Python / numpy.mod), also for floats, where a zero result takes B's sign.
struct Mod {
  static constexpr TypeClass kTypes = kNumeric;
  static constexpr bool kIntDivisor = true;
  bool fmod;
  explicit Mod(const Node& n) : fmod(n.attr_int("fmod", 0) != 0) {}
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_unsigned_v<T>) {
      return T(a % b);
    } else {
      T r;
      if constexpr (is_int_v<T>) r = b == T(-1) ? T(0) : T(a % b);  // MIN % -1 overflows in C
      else r = std::fmod(a, b);
      if (fmod) return r;
      if (r != T(0) && ((r < T(0)) != (b < T(0)))) return T(r + b);
      if constexpr (!is_int_v<T>) {
        if (r == T(0)) return std::copysign(T(0), b);
      }
      return r;
    }
  }
};

// numpy.power on integers: exact with wrap-around; negative exponents give 0 (except base +-1).
template <typename T, typename U>
T int_pow(T base, U exp) {
  if constexpr (std::is_signed_v<U>) {
    if (exp < 0) return base == T(1) ? T(1) : base == T(-1) ? (exp % 2 ? T(-1) : T(1)) : T(0);
  }
  T result = 1;
  for (uint64_t e = uint64_t(exp); e != 0; e >>= 1) {
    if (e & 1) result = wrap_mul(result, base);
    base = wrap_mul(base, base);
  }
  return result;
}

// Pow: base and exponent may have different dtypes; the output has the base's dtype.
struct PowFn {
  template <typename T, typename U>
  T operator()(T base, U exp) const {
    if constexpr (is_int_v<T> && is_int_v<U>) return int_pow(base, exp);
    else if constexpr (is_int_v<T>) return saturate_cast<T>(std::pow(double(base), double(exp)));
    else return T(std::pow(double(base), double(exp)));
  }
};

Status infer_pow(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(c.tensor_dtype(1).status());
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, kNumeric));
  KILN_RETURN_IF_ERROR(check_input_class(c, 1, kNumeric));
  KILN_ASSIGN_OR_RETURN(std::optional<Shape> s, broadcast_input_shapes(c));
  c.set_output_tensor(0, dt, std::move(s));
  return Status::ok();
}

// The exponent is widened first, to int64 (integers: numpy's exact integer power) or to double
// (floats, which PowFn reads as double anyway): two exponent types to instantiate, not every one.
Status pow_cpu(KernelCtx& c) {
  const Tensor& a = c.tensor(0);
  const Tensor& b = c.tensor(1);
  if (!dtype_in_class(kNumeric, a.dtype()) || !dtype_in_class(kNumeric, b.dtype())) {
    return c.unsupported("Pow of {} by {} is not supported", dtype_name(a.dtype()), dtype_name(b.dtype()));
  }
  const bool int_exp = dtype_is_int(b.dtype());
  KILN_ASSIGN_OR_RETURN(Tensor e, Tensor::create(int_exp ? DType::kInt64 : DType::kFloat64, b.dims()));
  for (int64_t i = 0; i < b.numel(); ++i) {
    if (int_exp) e.data<int64_t>()[i] = b.as_int(i);
    else e.data<double>()[i] = b.as_double(i);
  }
  return visit_dtype(a.dtype(), [&]<typename T>() -> Status {
    if constexpr (in_class<kNumeric, T>()) {
      return int_exp ? map_output<T, T, int64_t>(c, 0, PowFn{}, a, e) : map_output<T, T, double>(c, 0, PowFn{}, a, e);
    } else {
      return c.unsupported("Pow of {} is not supported", dtype_name(a.dtype()));
    }
  });
}

// Add/Sub/Mul/Div on integer shape values (Shape(x)[0] * 2, ...) also compute the result's
// symbolic element values, so a Reshape fed by them still infers a shape.
std::optional<Dim> arith_dim(OpKind op, const Dim& a, const Dim& b) {
  if (op == OpKind::kAdd) return a + b;
  if (op == OpKind::kSub) return a - b;
  if (op == OpKind::kMul) return a * b;
  // Div
  if (!b.is_static() || b.value() == 0) return std::nullopt;
  if (a.is_static()) return Dim(b.value() == -1 ? wrap_neg(a.value()) : a.value() / b.value());
  if (b.value() > 0) return floor_div(a, b);  // dims are non-negative, so floor == trunc
  return std::nullopt;
}

template <typename Op, OpKind kOp>
Status infer_arith(InferCtx& c) {
  KILN_RETURN_IF_ERROR(infer_binary<Op>(c));
  if (!dtype_is_int(c.output_type(0).dtype)) return Status::ok();
  std::optional<std::vector<Dim>> a = c.input_as_dims(0), b = c.input_as_dims(1);
  if (!a || !b) return Status::ok();
  const size_t n = std::max(a->size(), b->size());
  if ((a->size() != n && a->size() != 1) || (b->size() != n && b->size() != 1)) return Status::ok();
  std::vector<Dim> out;
  for (size_t i = 0; i < n; ++i) {
    std::optional<Dim> d = arith_dim(kOp, (*a)[a->size() == 1 ? 0 : i], (*b)[b->size() == 1 ? 0 : i]);
    if (!d) return Status::ok();
    out.push_back(*d);
  }
  c.set_output_dims_value(0, std::move(out));
  return Status::ok();
}

template <typename Op, OpKind kOp>
void def_arith(OpRegistry& r) {
  r.def(kOp, binary_op<Op>({}, infer_arith<Op, kOp>));
}

// ---- comparisons and bit ops ----------------------------------------------------------------

template <template <typename> class Cmp, TypeClass kClass = kNumeric>
struct Compare {
  static constexpr TypeClass kTypes = kClass;
  static constexpr bool kBoolOutput = true;
  template <typename T> bool operator()(const T& a, const T& b) const { return Cmp<T>{}(a, b); }
};

// For a signed T, right shifts are arithmetic; out-of-range amounts (negative or >= the bit
// width) give what sign extension alone gives: -1 for a negative X shifted right, else 0.
struct BitShift {
  static constexpr TypeClass kTypes = TypeClass::kInt;
  bool right;
  explicit BitShift(const Node& n) : right(n.attr_string("direction", "") == "RIGHT") {}
  template <typename T> T operator()(T x, T y) const {
    constexpr int kBits = int(sizeof(T) * 8);
    bool out_of_range = uint64_t(y) >= uint64_t(kBits);  // a negative y is huge as unsigned
    if (right) {
      if constexpr (std::is_signed_v<T>) {
        if (out_of_range) return x < T(0) ? T(-1) : T(0);
      }
      if (out_of_range) return T(0);
      return T(x >> y);
    }
    if (out_of_range) return T(0);
    return T(wide_unsigned_t<T>(x) << y);
  }
};

Status infer_bitshift(InferCtx& c) {
  std::string dir = c.node().attr_string("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") return c.error("direction must be LEFT or RIGHT, got '{}'", dir);
  return infer_binary<BitShift>(c);
}

// ---- variadic folds ---------------------------------------------------------------------------

struct MaxFn {
  static constexpr TypeClass kTypes = kNumeric;
  template <typename T> T operator()(T a, T b) const {
    if (is_nan(a) || is_nan(b)) return is_nan(a) ? a : b;  // NaN propagates, as numpy.maximum
    return a < b ? b : a;
  }
};

struct MinFn {
  static constexpr TypeClass kTypes = kNumeric;
  template <typename T> T operator()(T a, T b) const {
    if (is_nan(a) || is_nan(b)) return is_nan(a) ? a : b;
    return b < a ? b : a;
  }
};

struct SumFn : Add {
  static constexpr TypeClass kTypes = TypeClass::kFloat;
};

// Folds inputs left to right with Op, broadcasting at each step; Mean divides the sum after.
template <typename Op, bool kMean = false>
Status fold_cpu(KernelCtx& c) {
  const DType dt = c.tensor(0).dtype();
  for (size_t i = 1; i < c.num_inputs(); ++i) {
    if (c.tensor(i).dtype() != dt) {
      return c.error("inputs 0 and {} must have the same element type, got {} and {}", i, dtype_name(dt),
                     dtype_name(c.tensor(i).dtype()));
    }
  }
  return visit_dtype(dt, [&]<typename T>() -> Status {
    if constexpr (in_class<Op::kTypes, T>()) {
      Tensor acc = c.tensor(0).clone();
      for (size_t i = 1; i < c.num_inputs(); ++i) {
        const Tensor& x = c.tensor(i);
        KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, broadcast_dims(c, {acc.dims(), x.dims()}));
        Expected<Tensor> next = Tensor::create(dt, std::move(dims));
        if (!next) return next.status().with_context(c.node().describe());
        map_into<T, T, T>(*next, Op{}, acc, x);
        acc = std::move(*next);
      }
      if constexpr (kMean) {
        const auto n = compute_t<T>(c.num_inputs());
        map_into<T, T>(acc, [n](auto s) { return s / n; }, acc);  // in place: same index in and out
      }
      c.set_output(0, Data(std::move(acc)));
      return Status::ok();
    } else {
      return unsupported_dtype(c, dt);
    }
  });
}

template <typename Op, bool kMean = false>
OpDef variadic_op() {
  return {.inputs = {1, kVariadic}, .outputs = {1, 1}, .infer = infer_binary<Op>, .cpu = fold_cpu<Op, kMean>};
}

// ---- Where --------------------------------------------------------------------------------------

Status infer_where(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kBool));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 1, 3));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(1));
  KILN_ASSIGN_OR_RETURN(std::optional<Shape> s, broadcast_input_shapes(c));
  c.set_output_tensor(0, dt, std::move(s));
  return Status::ok();
}

Status where_cpu(KernelCtx& c) {
  const Tensor& cond = c.tensor(0);
  const Tensor& x = c.tensor(1);
  const Tensor& y = c.tensor(2);
  if (cond.dtype() != DType::kBool || x.dtype() != y.dtype()) {
    return c.error("expected a bool condition and X, Y of one type, got {}, {}, {}", dtype_name(cond.dtype()),
                   dtype_name(x.dtype()), dtype_name(y.dtype()));
  }
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    auto pick = [](bool k, const auto& a, const auto& b) { return k ? a : b; };
    return map_output<T, bool, T, T>(c, 0, pick, cond, x, y);
  });
}

}  // namespace

void register_binary_ops(OpRegistry& r) {
  def_arith<Add, OpKind::kAdd>(r);
  def_arith<Sub, OpKind::kSub>(r);
  def_arith<Mul, OpKind::kMul>(r);
  def_arith<Div, OpKind::kDiv>(r);
  r.def(OpKind::kMod, binary_op<Mod>({{"fmod", Attribute::Kind::kInt}}));
  r.def(OpKind::kPow, {.inputs = {2, 2}, .outputs = {1, 1}, .infer = infer_pow, .cpu = pow_cpu});

  r.def(OpKind::kEqual, binary_op<Compare<std::equal_to, TypeClass::kComparable>>());
  r.def(OpKind::kLess, binary_op<Compare<std::less>>());
  r.def(OpKind::kLessOrEqual, binary_op<Compare<std::less_equal>>());
  r.def(OpKind::kGreater, binary_op<Compare<std::greater>>());
  r.def(OpKind::kGreaterOrEqual, binary_op<Compare<std::greater_equal>>());

  r.def(OpKind::kAnd, binary_fn<TypeClass::kBool>([](bool a, bool b) { return a && b; }));
  r.def(OpKind::kOr, binary_fn<TypeClass::kBool>([](bool a, bool b) { return a || b; }));
  r.def(OpKind::kXor, binary_fn<TypeClass::kBool>([](bool a, bool b) { return a != b; }));
  r.def(OpKind::kBitwiseAnd, binary_fn<TypeClass::kInt>([](auto a, auto b) { return decltype(a)(a & b); }));
  r.def(OpKind::kBitwiseOr, binary_fn<TypeClass::kInt>([](auto a, auto b) { return decltype(a)(a | b); }));
  r.def(OpKind::kBitwiseXor, binary_fn<TypeClass::kInt>([](auto a, auto b) { return decltype(a)(a ^ b); }));
  r.def(OpKind::kBitShift,
        binary_op<BitShift>({{"direction", Attribute::Kind::kString, /*required=*/true}}, infer_bitshift));

  r.def(OpKind::kSum, variadic_op<SumFn>());
  r.def(OpKind::kMean, variadic_op<SumFn, /*kMean=*/true>());
  r.def(OpKind::kMax, variadic_op<MaxFn>());
  r.def(OpKind::kMin, variadic_op<MinFn>());
  r.def(OpKind::kWhere, {.inputs = {3, 3}, .outputs = {1, 1}, .infer = infer_where, .cpu = where_cpu});
}

}  // namespace kiln
