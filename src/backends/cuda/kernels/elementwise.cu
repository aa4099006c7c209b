// Elementwise kernels: unary, binary, where, cast, fill, poison (see kernels.h for the contract).
// The op is a template parameter so each (op, dtype) pair compiles to a straight-line loop; the
// launchers turn the runtime enums into those parameters.
#include <cmath>
#include <type_traits>

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/unary_math.cuh"

namespace kiln::cuda::k {

namespace {

// ---- generic contiguous and strided loops ------------------------------------------------------

// y[i] = f(x[i]) with V elements per vector access; the tail (< V elements) is done by the first
// threads of the grid after the vector loop.
template <int V, class In, class Out, class F>
__global__ void map1_kernel(const In* __restrict__ x, Out* __restrict__ y, int64_t n, F f) {
  const int64_t nv = n / V;
  const auto* xv = reinterpret_cast<const Pack<In, V>*>(x);
  auto* yv = reinterpret_cast<Pack<Out, V>*>(y);
  for (int64_t i = global_tid(); i < nv; i += global_threads()) {
    const Pack<In, V> a = xv[i];
    Pack<Out, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = f(a.v[j]);
    yv[i] = r;
  }
  const int64_t t = nv * V + global_tid();
  if (t < n) y[t] = f(x[t]);
}

template <int V, class In, class Out, class F>
__global__ void map2_kernel(const In* __restrict__ a, const In* __restrict__ b, Out* __restrict__ y, int64_t n, F f) {
  const int64_t nv = n / V;
  const auto* av = reinterpret_cast<const Pack<In, V>*>(a);
  const auto* bv = reinterpret_cast<const Pack<In, V>*>(b);
  auto* yv = reinterpret_cast<Pack<Out, V>*>(y);
  for (int64_t i = global_tid(); i < nv; i += global_threads()) {
    const Pack<In, V> p = av[i], q = bv[i];
    Pack<Out, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = f(p.v[j], q.v[j]);
    yv[i] = r;
  }
  const int64_t t = nv * V + global_tid();
  if (t < n) y[t] = f(a[t], b[t]);
}

// Vector width: 16 bytes of the wider side, so neither side's access exceeds 16 bytes.
template <class In, class Out>
inline constexpr int kVec = 16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));

template <class In, class Out, class F>
cudaError_t launch_map1(const void* x, void* y, int64_t n, F f, cudaStream_t s) {
  constexpr int V = kVec<In, Out>;
  const auto* xi = static_cast<const In*>(x);
  auto* yo = static_cast<Out*>(y);
  if (aligned_to(x, V * sizeof(In)) && aligned_to(y, V * sizeof(Out)))
    map1_kernel<V><<<grid_for(n / V + 1), kBlock, 0, s>>>(xi, yo, n, f);
  else
    map1_kernel<1><<<grid_for(n), kBlock, 0, s>>>(xi, yo, n, f);
  return cudaGetLastError();
}

template <class In, class Out, class F>
cudaError_t launch_map2(const void* a, const void* b, void* y, int64_t n, F f, cudaStream_t s) {
  constexpr int V = kVec<In, Out>;
  const auto* ai = static_cast<const In*>(a);
  const auto* bi = static_cast<const In*>(b);
  auto* yo = static_cast<Out*>(y);
  if (aligned_to(a, V * sizeof(In)) && aligned_to(b, V * sizeof(In)) && aligned_to(y, V * sizeof(Out)))
    map2_kernel<V><<<grid_for(n / V + 1), kBlock, 0, s>>>(ai, bi, yo, n, f);
  else
    map2_kernel<1><<<grid_for(n), kBlock, 0, s>>>(ai, bi, yo, n, f);
  return cudaGetLastError();
}

// Broadcasting binary with V outputs per thread along the innermost dim (V divides its extent),
// so a bias add costs one index decomposition per 16 bytes. With V > 1 each operand's innermost
// stride is 1 (vector load) or 0 (one value for all V), as nd_vectorizable checked.
template <int V, class U, class In, class Out, class F>
__global__ void binary_nd_kernel(const In* __restrict__ a, const In* __restrict__ b, Out* __restrict__ y, Indexer<2> ix,
                                 int64_t n_packs, F f) {
  const bool a_vec = ix.strides[0][ix.rank - 1] != 0, b_vec = ix.strides[1][ix.rank - 1] != 0;
  for (int64_t i = global_tid(); i < n_packs; i += global_threads()) {
    int64_t off[2];
    ix.offsets<U>(i * V, off);
    Pack<In, V> p, q;
    if constexpr (V == 1) {
      p.v[0] = a[off[0]];
      q.v[0] = b[off[1]];
    } else {
      if (a_vec) p = *reinterpret_cast<const Pack<In, V>*>(a + off[0]);
      else for (int j = 0; j < V; ++j) p.v[j] = a[off[0]];
      if (b_vec) q = *reinterpret_cast<const Pack<In, V>*>(b + off[1]);
      else for (int j = 0; j < V; ++j) q.v[j] = b[off[1]];
    }
    Pack<Out, V> r;
#pragma unroll
    for (int j = 0; j < V; ++j) r.v[j] = f(p.v[j], q.v[j]);
    reinterpret_cast<Pack<Out, V>*>(y)[i] = r;
  }
}

// Whether binary_nd_kernel<V> applies: see there; operands read as vectors must be aligned and
// keep every pack inside one aligned run (all their strides multiples of V).
template <int V>
bool nd_vectorizable(const Indexer<2>& ix, const void* a, const void* b, int in_bytes, const void* y, int out_bytes) {
  const int last = ix.rank - 1;
  if (ix.dims[last] % V != 0 || !aligned_to(y, int64_t{V} * out_bytes)) return false;
  const void* ptr[2] = {a, b};
  for (int k = 0; k < 2; ++k) {
    if (ix.strides[k][last] == 0) continue;
    if (ix.strides[k][last] != 1 || !aligned_to(ptr[k], int64_t{V} * in_bytes)) return false;
    for (int d = 0; d < last; ++d)
      if (ix.strides[k][d] % V != 0) return false;
  }
  return true;
}

template <class U, class T>
__global__ void where_kernel(const Bool8* __restrict__ c, const T* __restrict__ x, const T* __restrict__ z,
                             T* __restrict__ y, Indexer<3> ix, int64_t n) {
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    int64_t off[3];
    ix.offsets<U>(i, off);
    y[i] = c[off[0]].v ? x[off[1]] : z[off[2]];
  }
}

// ---- unary -------------------------------------------------------------------------------------

// f64's unary ops (the ones models and the ONNX tests use on doubles), computed in double.
template <Unary OP>
constexpr bool unary_f64_ok() {
  return OP == Unary::kIdentity || OP == Unary::kRelu || OP == Unary::kSigmoid || OP == Unary::kTanh ||
         OP == Unary::kExp || OP == Unary::kLog || OP == Unary::kSqrt || OP == Unary::kReciprocal ||
         OP == Unary::kNeg || OP == Unary::kAbs || OP == Unary::kErf || OP == Unary::kFloor || OP == Unary::kCeil ||
         OP == Unary::kSin || OP == Unary::kCos || OP == Unary::kSign || OP == Unary::kRound ||
         OP == Unary::kSoftplus;
}

template <Unary OP>
__device__ __forceinline__ double unary_f64(double x) {
  if constexpr (OP == Unary::kRelu) return x < 0.0 ? 0.0 : x;
  else if constexpr (OP == Unary::kSigmoid) return 1.0 / (1.0 + exp(-x));
  else if constexpr (OP == Unary::kTanh) return tanh(x);
  else if constexpr (OP == Unary::kExp) return exp(x);
  else if constexpr (OP == Unary::kLog) return log(x);
  else if constexpr (OP == Unary::kSqrt) return sqrt(x);
  else if constexpr (OP == Unary::kReciprocal) return 1.0 / x;
  else if constexpr (OP == Unary::kNeg) return -x;
  else if constexpr (OP == Unary::kAbs) return fabs(x);
  else if constexpr (OP == Unary::kErf) return erf(x);
  else if constexpr (OP == Unary::kFloor) return floor(x);
  else if constexpr (OP == Unary::kCeil) return ceil(x);
  else if constexpr (OP == Unary::kSin) return sin(x);
  else if constexpr (OP == Unary::kCos) return cos(x);
  else if constexpr (OP == Unary::kSign) return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x);
  else if constexpr (OP == Unary::kRound) return rint(x);
  else if constexpr (OP == Unary::kSoftplus) return fmax(x, 0.0) + log1p(exp(-fabs(x)));
  else return x;  // kIdentity
}

template <class T, Unary OP>
struct UnaryF {
  UnaryParams p;
  __device__ __forceinline__ T operator()(T x) const {
    if constexpr (std::is_same_v<T, Bool8>) {
      if constexpr (OP == Unary::kNot) return Bool8{static_cast<uint8_t>(x.v == 0)};
      else return Bool8{static_cast<uint8_t>(x.v != 0)};  // kIdentity
    } else if constexpr (std::is_integral_v<T>) {
      using Un = std::make_unsigned_t<T>;
      constexpr bool kSigned = std::is_signed_v<T>;
      const T neg = static_cast<T>(Un(0) - static_cast<Un>(x));  // wraps at the minimum, no UB
      if constexpr (OP == Unary::kNeg) return neg;
      else if constexpr (OP == Unary::kAbs || OP == Unary::kRelu) {
        if constexpr (kSigned) return x < 0 ? (OP == Unary::kAbs ? neg : T(0)) : x;
        else return x;
      } else if constexpr (OP == Unary::kSign) {
        if constexpr (kSigned) return static_cast<T>((x > 0) - (x < 0));
        else return static_cast<T>(x != 0);
      } else if constexpr (OP == Unary::kClip) {
        // The bounds are integers exact in float (the lowering checks); an absent one is +-inf and
        // one beyond T's range clamps to T's limit.
        constexpr T hi_t = static_cast<T>(static_cast<Un>(~Un(0)) >> (kSigned ? 1 : 0));
        constexpr T lo_t = kSigned ? static_cast<T>(-hi_t - 1) : T(0);
        const T lo = p.a <= static_cast<float>(lo_t) ? lo_t : static_cast<T>(p.a);
        const T hi = p.b >= static_cast<float>(hi_t) ? hi_t : static_cast<T>(p.b);
        const T v = x < lo ? lo : x;
        return v > hi ? hi : v;
      } else return x;  // kIdentity
    } else if constexpr (std::is_same_v<T, double>) {
      return unary_f64<OP>(x);
    } else {
      return from_f<T>(unary_f32<OP>(to_f(x), p));
    }
  }
};

template <class T>
constexpr bool unary_ok(Unary op) {
  if constexpr (std::is_same_v<T, Bool8>) return op == Unary::kNot || op == Unary::kIdentity;
  else if constexpr (std::is_integral_v<T>)
    return op == Unary::kIdentity || op == Unary::kNeg || op == Unary::kAbs || op == Unary::kRelu ||
           op == Unary::kSign || op == Unary::kClip;
  else if constexpr (kIsF32ish<T>) return op != Unary::kNot;
  else if constexpr (std::is_same_v<T, double>) {
    switch (op) {
#define KILN_F64_CASE(o) case Unary::o: return unary_f64_ok<Unary::o>();
      KILN_F64_CASE(kIdentity) KILN_F64_CASE(kRelu) KILN_F64_CASE(kSigmoid) KILN_F64_CASE(kTanh) KILN_F64_CASE(kExp)
      KILN_F64_CASE(kLog) KILN_F64_CASE(kSqrt) KILN_F64_CASE(kReciprocal) KILN_F64_CASE(kNeg) KILN_F64_CASE(kAbs)
      KILN_F64_CASE(kErf) KILN_F64_CASE(kFloor) KILN_F64_CASE(kCeil) KILN_F64_CASE(kSin) KILN_F64_CASE(kCos)
      KILN_F64_CASE(kSign) KILN_F64_CASE(kRound) KILN_F64_CASE(kSoftplus)
#undef KILN_F64_CASE
      default: return false;
    }
  }
  else return false;
}

template <Unary OP>
using UnaryC = std::integral_constant<Unary, OP>;

template <class F>
cudaError_t with_unary(Unary op, F&& f) {
  switch (op) {
    case Unary::kIdentity: return f(UnaryC<Unary::kIdentity>{});
    case Unary::kRelu: return f(UnaryC<Unary::kRelu>{});
    case Unary::kSigmoid: return f(UnaryC<Unary::kSigmoid>{});
    case Unary::kTanh: return f(UnaryC<Unary::kTanh>{});
    case Unary::kExp: return f(UnaryC<Unary::kExp>{});
    case Unary::kLog: return f(UnaryC<Unary::kLog>{});
    case Unary::kSqrt: return f(UnaryC<Unary::kSqrt>{});
    case Unary::kReciprocal: return f(UnaryC<Unary::kReciprocal>{});
    case Unary::kNeg: return f(UnaryC<Unary::kNeg>{});
    case Unary::kAbs: return f(UnaryC<Unary::kAbs>{});
    case Unary::kErf: return f(UnaryC<Unary::kErf>{});
    case Unary::kFloor: return f(UnaryC<Unary::kFloor>{});
    case Unary::kCeil: return f(UnaryC<Unary::kCeil>{});
    case Unary::kSin: return f(UnaryC<Unary::kSin>{});
    case Unary::kCos: return f(UnaryC<Unary::kCos>{});
    case Unary::kSoftplus: return f(UnaryC<Unary::kSoftplus>{});
    case Unary::kSign: return f(UnaryC<Unary::kSign>{});
    case Unary::kRound: return f(UnaryC<Unary::kRound>{});
    case Unary::kGeluErf: return f(UnaryC<Unary::kGeluErf>{});
    case Unary::kGeluTanh: return f(UnaryC<Unary::kGeluTanh>{});
    case Unary::kClip: return f(UnaryC<Unary::kClip>{});
    case Unary::kLeakyRelu: return f(UnaryC<Unary::kLeakyRelu>{});
    case Unary::kElu: return f(UnaryC<Unary::kElu>{});
    case Unary::kHardSigmoid: return f(UnaryC<Unary::kHardSigmoid>{});
    case Unary::kHardSwish: return f(UnaryC<Unary::kHardSwish>{});
    case Unary::kSilu: return f(UnaryC<Unary::kSilu>{});
    case Unary::kNot: return f(UnaryC<Unary::kNot>{});
    case Unary::kSelu: return f(UnaryC<Unary::kSelu>{});
    case Unary::kCelu: return f(UnaryC<Unary::kCelu>{});
    case Unary::kThresholdedRelu: return f(UnaryC<Unary::kThresholdedRelu>{});
    case Unary::kSwish: return f(UnaryC<Unary::kSwish>{});
    case Unary::kMish: return f(UnaryC<Unary::kMish>{});
    case Unary::kSoftsign: return f(UnaryC<Unary::kSoftsign>{});
    case Unary::kShrink: return f(UnaryC<Unary::kShrink>{});
    case Unary::kTan: return f(UnaryC<Unary::kTan>{});
    case Unary::kAtan: return f(UnaryC<Unary::kAtan>{});
    case Unary::kAsin: return f(UnaryC<Unary::kAsin>{});
    case Unary::kAcos: return f(UnaryC<Unary::kAcos>{});
    case Unary::kSinh: return f(UnaryC<Unary::kSinh>{});
    case Unary::kCosh: return f(UnaryC<Unary::kCosh>{});
    case Unary::kAsinh: return f(UnaryC<Unary::kAsinh>{});
    case Unary::kAcosh: return f(UnaryC<Unary::kAcosh>{});
    case Unary::kAtanh: return f(UnaryC<Unary::kAtanh>{});
  }
  return cudaErrorInvalidValue;
}

// ---- binary ------------------------------------------------------------------------------------

__host__ __device__ constexpr bool is_compare(Binary op) {
  return op == Binary::kEqual || op == Binary::kLess || op == Binary::kLessOrEqual || op == Binary::kGreater ||
         op == Binary::kGreaterOrEqual;
}
__host__ __device__ constexpr bool is_logic(Binary op) {
  return op == Binary::kAnd || op == Binary::kOr || op == Binary::kXor;
}

template <class T>
constexpr bool binary_ok(Binary op) {
  if constexpr (std::is_same_v<T, Bool8>) return is_logic(op) || op == Binary::kEqual;
  else if constexpr (std::is_integral_v<T>) return !is_logic(op);
  else if constexpr (kIsF32ish<T> || std::is_same_v<T, double>)
    return !is_logic(op) && op != Binary::kShiftLeft && op != Binary::kShiftRight;
  else return false;
}

template <Binary OP, class C>
__device__ __forceinline__ bool compare(C a, C b) {
  if constexpr (OP == Binary::kEqual) return a == b;
  else if constexpr (OP == Binary::kLess) return a < b;
  else if constexpr (OP == Binary::kLessOrEqual) return a <= b;
  else if constexpr (OP == Binary::kGreater) return a > b;
  else return a >= b;
}

// F is float (f32, f16 and bf16 compute in it) or double.
template <Binary OP, class F>
__device__ __forceinline__ F binary_fp(F a, F b) {
  if constexpr (OP == Binary::kAdd) return a + b;
  else if constexpr (OP == Binary::kSub) return a - b;
  else if constexpr (OP == Binary::kMul) return a * b;
  else if constexpr (OP == Binary::kDiv) return a / b;
  else if constexpr (OP == Binary::kPow) return pow(a, b);
  else if constexpr (OP == Binary::kMax) return (a > b || a != a) ? a : b;  // NaN propagates
  else if constexpr (OP == Binary::kMin) return (a < b || a != a) ? a : b;
  else if constexpr (OP == Binary::kPRelu) return a < F(0) ? a * b : a;
  else return fmod(a, b);  // kMod: floats require fmod=1 in ONNX, which is C fmod
}

template <Binary OP, class T>
__device__ __forceinline__ T binary_int(T a, T b) {
  using Un = std::make_unsigned_t<T>;
  // Add/Sub/Mul wrap in two's complement (through unsigned, which has no overflow UB).
  if constexpr (OP == Binary::kAdd) return static_cast<T>(static_cast<Un>(a) + static_cast<Un>(b));
  else if constexpr (OP == Binary::kSub) return static_cast<T>(static_cast<Un>(a) - static_cast<Un>(b));
  else if constexpr (OP == Binary::kMul) return static_cast<T>(static_cast<Un>(a) * static_cast<Un>(b));
  else if constexpr (OP == Binary::kDiv) {
    // Truncating; x/0 is undefined in ONNX and gives 0 here; MIN/-1 wraps instead of trapping UB.
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return static_cast<T>(Un(0) - static_cast<Un>(a));
    }
    return static_cast<T>(a / b);
  } else if constexpr (OP == Binary::kMod) {
    // Python-style (fmod=0): the result takes the divisor's sign.
    if (b == 0) return 0;
    if constexpr (std::is_signed_v<T>) {
      if (b == -1) return 0;
      T r = static_cast<T>(a % b);
      if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
      return r;
    } else {
      return static_cast<T>(a % b);
    }
  } else if constexpr (OP == Binary::kPow) {
    if constexpr (std::is_signed_v<T>) {
      if (b < 0) return a == 1 ? T(1) : (a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0));  // trunc(a^b)
    }
    Un r = 1, base = static_cast<Un>(a);
    for (T e = b; e != 0; e >>= 1) {
      if (e & 1) r *= base;
      base *= base;
    }
    return static_cast<T>(r);
  } else if constexpr (OP == Binary::kMax) return a > b ? a : b;
  else if constexpr (OP == Binary::kPRelu) {
    if constexpr (std::is_signed_v<T>) return a < 0 ? static_cast<T>(static_cast<Un>(a) * static_cast<Un>(b)) : a;
    else return a;
  } else if constexpr (OP == Binary::kShiftLeft || OP == Binary::kShiftRight) {
    // A shift by the width or more (a negative amount included) gives what sign extension alone
    // gives: -1 for a negative value shifted right, else 0, as the CPU reference. Right shifts of
    // signed values are arithmetic.
    if (static_cast<uint64_t>(static_cast<Un>(b)) >= sizeof(T) * 8) {  // a negative b is huge unsigned
      if constexpr (std::is_signed_v<T>) {
        if (OP == Binary::kShiftRight && a < T(0)) return T(-1);
      }
      return T(0);
    }
    if constexpr (OP == Binary::kShiftLeft) return static_cast<T>(static_cast<Un>(a) << static_cast<Un>(b));
    else return static_cast<T>(a >> b);
  } else return a < b ? a : b;  // kMin
}

template <class T, Binary OP>
using BinaryOut = std::conditional_t<is_compare(OP) || is_logic(OP), Bool8, T>;

template <class T, Binary OP>
struct BinaryF {
  __device__ __forceinline__ BinaryOut<T, OP> operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, Bool8>) {
      const bool p = a.v != 0, q = b.v != 0;
      bool r;
      if constexpr (OP == Binary::kAnd) r = p && q;
      else if constexpr (OP == Binary::kOr) r = p || q;
      else r = p != q;  // kXor; kEqual is its negation
      if constexpr (OP == Binary::kEqual) r = !r;
      return Bool8{static_cast<uint8_t>(r)};
    } else if constexpr (is_compare(OP)) {
      if constexpr (kIsF32ish<T>) return Bool8{static_cast<uint8_t>(compare<OP>(to_f(a), to_f(b)))};
      else return Bool8{static_cast<uint8_t>(compare<OP>(a, b))};
    } else if constexpr (kIsF32ish<T>) {
      return from_f<T>(binary_fp<OP>(to_f(a), to_f(b)));
    } else if constexpr (std::is_same_v<T, double>) {
      return binary_fp<OP>(a, b);
    } else {
      return binary_int<OP>(a, b);
    }
  }
};

template <Binary OP>
using BinaryC = std::integral_constant<Binary, OP>;

template <class F>
cudaError_t with_binary(Binary op, F&& f) {
  switch (op) {
    case Binary::kAdd: return f(BinaryC<Binary::kAdd>{});
    case Binary::kSub: return f(BinaryC<Binary::kSub>{});
    case Binary::kMul: return f(BinaryC<Binary::kMul>{});
    case Binary::kDiv: return f(BinaryC<Binary::kDiv>{});
    case Binary::kPow: return f(BinaryC<Binary::kPow>{});
    case Binary::kMax: return f(BinaryC<Binary::kMax>{});
    case Binary::kMin: return f(BinaryC<Binary::kMin>{});
    case Binary::kMod: return f(BinaryC<Binary::kMod>{});
    case Binary::kEqual: return f(BinaryC<Binary::kEqual>{});
    case Binary::kLess: return f(BinaryC<Binary::kLess>{});
    case Binary::kLessOrEqual: return f(BinaryC<Binary::kLessOrEqual>{});
    case Binary::kGreater: return f(BinaryC<Binary::kGreater>{});
    case Binary::kGreaterOrEqual: return f(BinaryC<Binary::kGreaterOrEqual>{});
    case Binary::kAnd: return f(BinaryC<Binary::kAnd>{});
    case Binary::kOr: return f(BinaryC<Binary::kOr>{});
    case Binary::kXor: return f(BinaryC<Binary::kXor>{});
    case Binary::kPRelu: return f(BinaryC<Binary::kPRelu>{});
    case Binary::kShiftLeft: return f(BinaryC<Binary::kShiftLeft>{});
    case Binary::kShiftRight: return f(BinaryC<Binary::kShiftRight>{});
  }
  return cudaErrorInvalidValue;
}

bool same_dims(const NdStrides& a, const NdStrides& b) {
  if (a.rank != b.rank) return false;
  for (int d = 0; d < a.rank && d < kMaxRank; ++d)
    if (a.dims[d] != b.dims[d]) return false;
  return true;
}

template <class From, class To>
struct CastF {
  __device__ __forceinline__ To operator()(From v) const { return convert<To>(v); }
};

// The value is converted on the device (the conversions are device functions), once per thread:
// noise next to the stores.
template <int V, class T>
__global__ void fill_kernel(T* __restrict__ y, int64_t n, double value) {
  const T v = convert<T>(value);
  Pack<T, V> p;
#pragma unroll
  for (int j = 0; j < V; ++j) p.v[j] = v;
  const int64_t nv = n / V;
  auto* yv = reinterpret_cast<Pack<T, V>*>(y);
  for (int64_t i = global_tid(); i < nv; i += global_threads()) yv[i] = p;
  const int64_t t = nv * V + global_tid();
  if (t < n) y[t] = v;
}

}  // namespace

cudaError_t unary(Unary op, DT dt, const void* x, void* y, int64_t n, UnaryParams p, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return with_unary(op, [&](auto opc) {
    return dispatch_dt(dt, [&](auto tag) -> cudaError_t {
      using T = typename decltype(tag)::type;
      constexpr Unary kOp = decltype(opc)::value;
      if constexpr (!unary_ok<T>(kOp)) return cudaErrorInvalidValue;
      else return launch_map1<T, T>(x, y, n, UnaryF<T, kOp>{p}, s);
    });
  });
}

cudaError_t binary(Binary op, DT dt, const void* a, const NdStrides& sa, const void* b, const NdStrides& sb, void* y,
                   cudaStream_t s) {
  if (!same_dims(sa, sb)) return cudaErrorInvalidValue;
  const int64_t* const ops[2] = {sa.strides, sb.strides};
  Indexer<2> ix;
  int64_t n = 0;
  if (!make_indexer(sa.rank, sa.dims, ops, &ix, &n)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return with_binary(op, [&](auto opc) {
    return dispatch_dt(dt, [&](auto tag) -> cudaError_t {
      using T = typename decltype(tag)::type;
      constexpr Binary kOp = decltype(opc)::value;
      if constexpr (!binary_ok<T>(kOp)) {
        return cudaErrorInvalidValue;
      } else {
        using Out = BinaryOut<T, kOp>;
        const BinaryF<T, kOp> f;
        // Same dims and both contiguous: coalescing left one dim of stride 1 for each.
        if (ix.rank == 1 && ix.strides[0][0] == 1 && ix.strides[1][0] == 1)
          return launch_map2<T, Out>(a, b, y, n, f, s);
        const auto* at = static_cast<const T*>(a);
        const auto* bt = static_cast<const T*>(b);
        auto* yo = static_cast<Out*>(y);
        constexpr int V = kVec<T, Out>;
        if (nd_vectorizable<V>(ix, a, b, sizeof(T), y, sizeof(Out))) {
          if (fits_u32(n))
            binary_nd_kernel<V, uint32_t><<<grid_for(n / V), kBlock, 0, s>>>(at, bt, yo, ix, n / V, f);
          else
            binary_nd_kernel<V, uint64_t><<<grid_for(n / V), kBlock, 0, s>>>(at, bt, yo, ix, n / V, f);
        } else if (fits_u32(n)) {
          binary_nd_kernel<1, uint32_t><<<grid_for(n), kBlock, 0, s>>>(at, bt, yo, ix, n, f);
        } else {
          binary_nd_kernel<1, uint64_t><<<grid_for(n), kBlock, 0, s>>>(at, bt, yo, ix, n, f);
        }
        return cudaGetLastError();
      }
    });
  });
}

cudaError_t where(DT dt, const void* cond, const NdStrides& sc, const void* x, const NdStrides& sx, const void* z,
                  const NdStrides& sz, void* y, cudaStream_t s) {
  if (!same_dims(sc, sx) || !same_dims(sc, sz)) return cudaErrorInvalidValue;
  const int64_t* const ops[3] = {sc.strides, sx.strides, sz.strides};
  Indexer<3> ix;
  int64_t n = 0;
  if (!make_indexer(sc.rank, sc.dims, ops, &ix, &n)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  // Where only moves data, so any dtype is its byte width.
  return dispatch_bytes(dt_size(dt), [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if constexpr (sizeof(T) > 8) {
      return cudaErrorInvalidValue;
    } else {
      const auto* c = static_cast<const Bool8*>(cond);
      const auto* xt = static_cast<const T*>(x);
      const auto* zt = static_cast<const T*>(z);
      auto* yt = static_cast<T*>(y);
      if (fits_u32(n))
        where_kernel<uint32_t><<<grid_for(n), kBlock, 0, s>>>(c, xt, zt, yt, ix, n);
      else
        where_kernel<uint64_t><<<grid_for(n), kBlock, 0, s>>>(c, xt, zt, yt, ix, n);
      return cudaGetLastError();
    }
  });
}

cudaError_t cast(DT from, DT to, const void* x, void* y, int64_t n, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch_dt(from, [&](auto from_tag) {
    return dispatch_dt(to, [&](auto to_tag) {
      using From = typename decltype(from_tag)::type;
      using To = typename decltype(to_tag)::type;
      return launch_map1<From, To>(x, y, n, CastF<From, To>{}, s);
    });
  });
}

namespace {
// One row per blockIdx.y step. Each thread writes 16 aligned bytes of the destination row (GPT-2's
// fp32 logits have odd rows, so a row's first few elements go before the first aligned chunk)
// and reads its source elements one by one: consecutive threads still read consecutive bytes.
// The stores are what matter (fp32 out is twice the fp16 in).
template <class From, class To>
__global__ void cast_rows_kernel(const From* __restrict__ x, int64_t ldx, To* __restrict__ y, int64_t ldy, int64_t rows,
                                 int64_t cols) {
  constexpr int kV = 16 / int(sizeof(To));
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const From* xr = x + r * ldx;
    To* yr = y + r * ldy;
    int64_t head = int64_t((16 - (reinterpret_cast<uintptr_t>(yr) & 15)) & 15) / int64_t(sizeof(To));
    if (head > cols) head = cols;
    if (t < head) yr[t] = convert<To>(xr[t]);
    const int64_t vecs = (cols - head) / kV;
    for (int64_t i = t; i < vecs; i += stride) {
      const int64_t c = head + i * kV;
      alignas(16) To pack[kV];
#pragma unroll
      for (int e = 0; e < kV; ++e) pack[e] = convert<To>(xr[c + e]);
      *reinterpret_cast<uint4*>(yr + c) = *reinterpret_cast<const uint4*>(pack);
    }
    const int64_t tail = head + vecs * kV;
    if (tail + t < cols) yr[tail + t] = convert<To>(xr[tail + t]);
  }
}
}  // namespace

cudaError_t cast_rows(DT from, DT to, const void* x, int64_t ldx, void* y, int64_t ldy, int64_t rows, int64_t cols,
                      cudaStream_t s) {
  if (rows < 0 || cols < 0 || ldx < cols || ldy < cols) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  return dispatch_dt(from, [&](auto from_tag) {
    return dispatch_dt(to, [&](auto to_tag) {
      using From = typename decltype(from_tag)::type;
      using To = typename decltype(to_tag)::type;
      // Head and tail need up to 16 / sizeof(To) - 1 threads each: any block size covers them.
      int64_t per_row = (cols + 16 / int64_t(sizeof(To)) - 1) / (16 / int64_t(sizeof(To)));
      dim3 grid(unsigned(std::min<int64_t>((per_row + kBlock - 1) / kBlock, 64)), unsigned(std::min<int64_t>(rows, 65535)));
      cast_rows_kernel<From, To><<<grid, kBlock, 0, s>>>(static_cast<const From*>(x), ldx, static_cast<To*>(y), ldy, rows,
                                                         cols);
      return cudaGetLastError();
    });
  });
}

cudaError_t fill(DT dt, void* y, int64_t n, double value, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int V = 16 / sizeof(T);
    auto* yt = static_cast<T*>(y);
    if (aligned_to(y, 16))
      fill_kernel<V><<<grid_for(n / V + 1), kBlock, 0, s>>>(yt, n, value);
    else
      fill_kernel<1><<<grid_for(n), kBlock, 0, s>>>(yt, n, value);
    return cudaGetLastError();
  });
}

cudaError_t poison(void* y, size_t n_bytes, unsigned char byte, cudaStream_t s) {
  if (n_bytes == 0) return cudaSuccess;
  // A memset node: capturable, and as fast as the copy engines allow.
  const cudaError_t e = cudaMemsetAsync(y, byte, n_bytes, s);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace kiln::cuda::k
