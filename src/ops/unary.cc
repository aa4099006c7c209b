// Op family: unary. Elementwise maps of one tensor; see elementwise_util.h for the machinery.
#include <cmath>

#include "ops/elementwise_util.h"

namespace kiln {

namespace {

constexpr TypeClass kFloat = TypeClass::kFloat;

struct Abs {
  static constexpr TypeClass kTypes = TypeClass::kNumeric;
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return x;
    else if constexpr (is_int_v<T>) return x < 0 ? wrap_neg(x) : x;  // INT_MIN stays INT_MIN
    else return std::abs(x);
  }
};

struct Neg {
  static constexpr TypeClass kTypes = TypeClass::kSignedNumeric;
  template <typename T>
  T operator()(T x) const {
    if constexpr (is_int_v<T>) return wrap_neg(x);
    else return -x;
  }
};

// numpy.sign: -1, 0 or 1; NaN stays NaN.
struct Sign {
  static constexpr TypeClass kTypes = TypeClass::kNumeric;
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return T(x != 0);
    else if (is_nan(x)) return x;
    else return T(int(x > T(0)) - int(x < T(0)));
  }
};

struct IsInf {
  static constexpr TypeClass kTypes = TypeClass::kFloatOrF8;
  static constexpr bool kBoolOutput = true;
  bool negative, positive;
  explicit IsInf(const Node& n)
      : negative(n.attr_int("detect_negative", 1) != 0), positive(n.attr_int("detect_positive", 1) != 0) {}
  template <typename T>
  bool operator()(T x) const {
    return std::isinf(x) && (x < 0 ? negative : positive);
  }
};

}  // namespace

void register_unary_ops(OpRegistry& r) {
  r.def(OpKind::kAbs, unary_op<Abs>());
  r.def(OpKind::kNeg, unary_op<Neg>());
  r.def(OpKind::kSign, unary_op<Sign>());
  r.def(OpKind::kExp, unary_fn<kFloat>([](auto x) { return std::exp(x); }));
  r.def(OpKind::kLog, unary_fn<kFloat>([](auto x) { return std::log(x); }));
  r.def(OpKind::kSqrt, unary_fn<kFloat>([](auto x) { return std::sqrt(x); }));
  r.def(OpKind::kReciprocal, unary_fn<kFloat>([](auto x) { return decltype(x)(1) / x; }));
  r.def(OpKind::kFloor, unary_fn<kFloat>([](auto x) { return std::floor(x); }));
  r.def(OpKind::kCeil, unary_fn<kFloat>([](auto x) { return std::ceil(x); }));
  // nearbyint in the default rounding mode rounds half to even, as ONNX Round requires.
  r.def(OpKind::kRound, unary_fn<kFloat>([](auto x) { return std::nearbyint(x); }));
  r.def(OpKind::kSin, unary_fn<kFloat>([](auto x) { return std::sin(x); }));
  r.def(OpKind::kCos, unary_fn<kFloat>([](auto x) { return std::cos(x); }));
  r.def(OpKind::kTan, unary_fn<kFloat>([](auto x) { return std::tan(x); }));
  r.def(OpKind::kAsin, unary_fn<kFloat>([](auto x) { return std::asin(x); }));
  r.def(OpKind::kAcos, unary_fn<kFloat>([](auto x) { return std::acos(x); }));
  r.def(OpKind::kAtan, unary_fn<kFloat>([](auto x) { return std::atan(x); }));
  r.def(OpKind::kSinh, unary_fn<kFloat>([](auto x) { return std::sinh(x); }));
  r.def(OpKind::kCosh, unary_fn<kFloat>([](auto x) { return std::cosh(x); }));
  r.def(OpKind::kAsinh, unary_fn<kFloat>([](auto x) { return std::asinh(x); }));
  r.def(OpKind::kAcosh, unary_fn<kFloat>([](auto x) { return std::acosh(x); }));
  r.def(OpKind::kAtanh, unary_fn<kFloat>([](auto x) { return std::atanh(x); }));
  r.def(OpKind::kErf, unary_fn<kFloat>([](auto x) { return std::erf(x); }));
  r.def(OpKind::kNot, unary_fn<TypeClass::kBool>([](bool x) { return !x; }));
  r.def(OpKind::kBitwiseNot, unary_fn<TypeClass::kInt>([](auto x) { return decltype(x)(~x); }));
  r.def(OpKind::kIsNaN, unary_fn<TypeClass::kFloatOrF8, true>([](auto x) { return std::isnan(x); }));
  r.def(OpKind::kIsInf, unary_op<IsInf>({{"detect_negative", Attribute::Kind::kInt},
                                         {"detect_positive", Attribute::Kind::kInt}}));
}

}  // namespace kiln
