// Op family: activation. Elementwise nonlinearities (most with float attributes), PRelu with a
// broadcast slope, and Clip with optional min/max inputs; see elementwise_util.h.
#include <cmath>

#include "ops/elementwise_util.h"

namespace kiln {

namespace {

constexpr TypeClass kFloat = TypeClass::kFloat;
constexpr auto kF = Attribute::Kind::kFloat;

template <typename T> T sigmoid(T x) {
  // Two forms so exp never overflows: exp(-|x|) is at most 1.
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  T e = std::exp(x);
  return e / (T(1) + e);
}

// log(1 + exp(x)) without overflow for large x.
template <typename T> T softplus(T x) {
  return std::max(x, T(0)) + std::log1p(std::exp(-std::abs(x)));
}

// Base for activations with one float attribute `alpha`, read once per kernel call.
// The default is given in thousandths: float template arguments need clang 18 (the fuzz build uses 14).
template <const char* kName, int kDefaultMilli>
struct WithAlpha {
  static constexpr TypeClass kTypes = kFloat;
  float alpha;
  explicit WithAlpha(const Node& n) : alpha(n.attr_float(kName, float(kDefaultMilli) / 1000.0f)) {}
  static std::vector<AttrSpec> attrs() { return {{kName, kF}}; }
};
constexpr char kAlpha[] = "alpha";

struct Relu {
  static constexpr TypeClass kTypes = TypeClass::kSignedNumeric;
  template <typename T> T operator()(T x) const { return x < T(0) ? T(0) : x; }
};

struct LeakyRelu : WithAlpha<kAlpha, 10> {
  using WithAlpha::WithAlpha;
  template <typename T> T operator()(T x) const { return x < T(0) ? T(alpha) * x : x; }
};

struct Elu : WithAlpha<kAlpha, 1000> {
  using WithAlpha::WithAlpha;
  template <typename T> T operator()(T x) const { return x < T(0) ? T(alpha) * std::expm1(x) : x; }
};

struct Celu : WithAlpha<kAlpha, 1000> {
  using WithAlpha::WithAlpha;
  template <typename T> T operator()(T x) const {
    return std::max(T(0), x) + std::min(T(0), T(alpha) * std::expm1(x / T(alpha)));
  }
};

struct ThresholdedRelu : WithAlpha<kAlpha, 1000> {
  using WithAlpha::WithAlpha;
  template <typename T> T operator()(T x) const { return x > T(alpha) ? x : T(0); }
};

struct Swish : WithAlpha<kAlpha, 1000> {
  using WithAlpha::WithAlpha;
  template <typename T> T operator()(T x) const { return x * sigmoid(T(alpha) * x); }
};

// SwiGLU(a, b) = Swish_alpha(a) * b; a and b have the same shape (no broadcasting).
struct SwiGLU : WithAlpha<kAlpha, 1000> {
  using WithAlpha::WithAlpha;
  template <typename T> T operator()(T a, T b) const { return a * sigmoid(T(alpha) * a) * b; }
};

Status infer_swiglu(InferCtx& c) {
  const Type& a = c.input_type(0);
  const Type& b = c.input_type(1);
  if (a.has_rank() && b.has_rank()) {
    bool same = a.shape->rank() == b.shape->rank();
    for (size_t k = 0; same && k < a.shape->rank(); ++k) {
      const Dim& x = a.shape->dims[k];
      const Dim& y = b.shape->dims[k];
      same = !(x.is_static() && y.is_static() && x.value() != y.value());
    }
    if (!same) return c.error("A {} and B {} must have the same shape", a.to_string(), b.to_string());
  }
  return infer_binary<SwiGLU>(c);
}

struct Selu {
  static constexpr TypeClass kTypes = kFloat;
  float alpha, gamma;
  explicit Selu(const Node& n)
      : alpha(n.attr_float("alpha", 1.67326319217681884765625f)), gamma(n.attr_float("gamma", 1.05070102214813232421875f)) {}
  template <typename T> T operator()(T x) const {
    return T(gamma) * (x > T(0) ? x : T(alpha) * std::expm1(x));
  }
};

struct HardSigmoid {
  static constexpr TypeClass kTypes = kFloat;
  float alpha, beta;
  explicit HardSigmoid(const Node& n) : alpha(n.attr_float("alpha", 0.2f)), beta(n.attr_float("beta", 0.5f)) {}
  template <typename T> T operator()(T x) const {
    return std::max(T(0), std::min(T(1), T(alpha) * x + T(beta)));
  }
};

// Gelu: x * Phi(x), exactly (erf) or with the tanh approximation.
struct Gelu {
  static constexpr TypeClass kTypes = kFloat;
  bool tanh_approx;
  explicit Gelu(const Node& n) : tanh_approx(n.attr_string("approximate", "none") == "tanh") {}
  template <typename T> T operator()(T x) const {
    if (tanh_approx) {
      const T k = T(0.7978845608028654);  // sqrt(2/pi)
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    }
    return T(0.5) * x * (T(1) + std::erf(x * T(0.7071067811865476)));  // x / sqrt(2)
  }
};

Status infer_gelu(InferCtx& c) {
  std::string a = c.node().attr_string("approximate", "none");
  if (a != "none" && a != "tanh") return c.error("approximate must be 'none' or 'tanh', got '{}'", a);
  return infer_unary<Gelu>(c);
}

// Shrink is defined on integers too: compute in double, convert back saturating.
struct Shrink {
  static constexpr TypeClass kTypes = TypeClass::kNumeric;
  double lambd, bias;
  explicit Shrink(const Node& n) : lambd(n.attr_float("lambd", 0.5f)), bias(n.attr_float("bias", 0.0f)) {}
  template <typename T> T operator()(T x) const {
    double v = double(x);
    return saturate_cast<T>(v < -lambd ? v + bias : v > lambd ? v - bias : 0.0);
  }
};

// ---- PRelu: slope broadcasts to X's shape (unidirectionally) -------------------------------------

struct PReluFn {
  template <typename T> T operator()(T x, T slope) const {
    if constexpr (is_int_v<T>) return x > T(0) ? x : wrap_mul(x, slope);
    else return x > T(0) ? x : x * slope;
  }
};

Status infer_prelu(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, 2));
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kNumeric));
  KILN_ASSIGN_OR_RETURN(std::optional<Shape> s, broadcast_input_shapes(c));
  const Type& x = c.input_type(0);
  if (s && x.has_rank() && s->rank() != x.shape->rank()) {
    return c.error("slope {} must broadcast to X {}", c.input_type(1).to_string(), x.to_string());
  }
  c.set_output(0, x);
  return Status::ok();
}

Status prelu_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& slope = c.tensor(1);
  if (x.dtype() != slope.dtype()) {
    return c.error("X and slope must have the same element type, got {} and {}", dtype_name(x.dtype()),
                   dtype_name(slope.dtype()));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, broadcast_dims(c, {x.dims(), slope.dims()}));
  if (dims != x.dims()) {
    return c.error("slope {} must broadcast to X {}", dims_to_string(slope.dims()), dims_to_string(x.dims()));
  }
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (in_class<TypeClass::kNumeric, T>()) return map_output<T, T, T>(c, 0, PReluFn{}, x, slope);
    else return unsupported_dtype(c, x.dtype());
  });
}

// ---- Clip: optional scalar min and max inputs ------------------------------------------------------

Status infer_clip(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, 3));
  KILN_RETURN_IF_ERROR(c.tensor_dtype(0).status());
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kNumeric));
  for (size_t i = 1; i < 3; ++i) {
    const Type& t = c.input_type(i);
    if (c.has_input(i) && t.has_rank() && t.shape->numel().is_static() && t.shape->numel().value() != 1) {
      return c.error("input {} ({}) must be a scalar", i, t.to_string());
    }
  }
  c.set_output(0, c.input_type(0));
  return Status::ok();
}

// The bound from optional input i, or `dflt` when it is omitted.
template <typename T>
Expected<compute_t<T>> clip_bound(const KernelCtx& c, size_t i, compute_t<T> dflt) {
  if (!c.has_input(i)) return dflt;
  const Tensor& t = c.tensor(i);
  if (t.dtype() != dtype_of<T>() || t.numel() != 1) {
    return c.error("input {} must be a single {} value, got {}", i, dtype_name(dtype_of<T>()), t.summary());
  }
  return compute_t<T>(t.data<T>()[0]);
}

Status clip_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (in_class<TypeClass::kNumeric, T>()) {
      using C = compute_t<T>;
      using L = std::numeric_limits<C>;
      KILN_ASSIGN_OR_RETURN(C lo, clip_bound<T>(c, 1, L::has_infinity ? -L::infinity() : L::lowest()));
      KILN_ASSIGN_OR_RETURN(C hi, clip_bound<T>(c, 2, L::has_infinity ? L::infinity() : L::max()));
      // min(max(x, lo), hi) like numpy.clip: hi wins when lo > hi, and NaN stays NaN.
      auto clip = [lo, hi](C v) {
        v = v < lo ? lo : v;
        return hi < v ? hi : v;
      };
      return map_output<T, T>(c, 0, clip, x);
    } else {
      return unsupported_dtype(c, x.dtype());
    }
  });
}

}  // namespace

void register_activation_ops(OpRegistry& r) {
  r.def(OpKind::kRelu, unary_op<Relu>());
  r.def(OpKind::kLeakyRelu, unary_op<LeakyRelu>(LeakyRelu::attrs()));
  r.def(OpKind::kElu, unary_op<Elu>(Elu::attrs()));
  r.def(OpKind::kCelu, unary_op<Celu>(Celu::attrs()));
  r.def(OpKind::kThresholdedRelu, unary_op<ThresholdedRelu>(ThresholdedRelu::attrs()));
  r.def(OpKind::kSwish, unary_op<Swish>(Swish::attrs()));
  r.def(OpKind::kSwiGLU, binary_op<SwiGLU>(SwiGLU::attrs(), infer_swiglu));
  r.def(OpKind::kSelu, unary_op<Selu>({{"alpha", kF}, {"gamma", kF}}));
  r.def(OpKind::kHardSigmoid, unary_op<HardSigmoid>({{"alpha", kF}, {"beta", kF}}));
  r.def(OpKind::kShrink, unary_op<Shrink>({{"lambd", kF}, {"bias", kF}}));
  OpDef gelu = unary_op<Gelu>({{"approximate", Attribute::Kind::kString}});
  gelu.infer = infer_gelu;
  r.def(OpKind::kGelu, std::move(gelu));

  r.def(OpKind::kSigmoid, unary_fn<kFloat>([](auto x) { return sigmoid(x); }));
  r.def(OpKind::kTanh, unary_fn<kFloat>([](auto x) { return std::tanh(x); }));
  r.def(OpKind::kSoftplus, unary_fn<kFloat>([](auto x) { return softplus(x); }));
  r.def(OpKind::kSoftsign, unary_fn<kFloat>([](auto x) { return x / (decltype(x)(1) + std::abs(x)); }));
  r.def(OpKind::kMish, unary_fn<kFloat>([](auto x) { return x * std::tanh(softplus(x)); }));
  // HardSwish = x * HardSigmoid(x) with alpha = 1/6, beta = 0.5.
  r.def(OpKind::kHardSwish, unary_fn<kFloat>([](auto x) {
          using T = decltype(x);
          return x * std::max(T(0), std::min(T(1), x / T(6) + T(0.5)));
        }));

  r.def(OpKind::kPRelu, {.inputs = {2, 2}, .outputs = {1, 1}, .infer = infer_prelu, .cpu = prelu_cpu});
  r.def(OpKind::kClip, {.inputs = {1, 3}, .outputs = {1, 1}, .infer = infer_clip, .cpu = clip_cpu});
}

}  // namespace kiln
