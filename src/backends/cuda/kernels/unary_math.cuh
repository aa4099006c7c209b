// The float math of each k::Unary op, shared by the elementwise kernels (elementwise.cu) and the
// kernels that apply an activation of their own (squeeze_excite.cu).
#pragma once

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

// Op OP of x in f32 (p: its parameters, kernels.h UnaryParams).
template <Unary OP>
__device__ __forceinline__ float unary_f32(float x, UnaryParams p) {
  if constexpr (OP == Unary::kIdentity) return x;
  else if constexpr (OP == Unary::kRelu) return x < 0.f ? 0.f : x;  // keeps NaN, like max(x, 0)
  else if constexpr (OP == Unary::kSigmoid) return 1.f / (1.f + expf(-x));
  else if constexpr (OP == Unary::kTanh) return tanhf(x);
  else if constexpr (OP == Unary::kExp) return expf(x);
  else if constexpr (OP == Unary::kLog) return logf(x);
  else if constexpr (OP == Unary::kSqrt) return sqrtf(x);
  else if constexpr (OP == Unary::kReciprocal) return 1.f / x;
  else if constexpr (OP == Unary::kNeg) return -x;
  else if constexpr (OP == Unary::kAbs) return fabsf(x);
  else if constexpr (OP == Unary::kErf) return erff(x);
  else if constexpr (OP == Unary::kFloor) return floorf(x);
  else if constexpr (OP == Unary::kCeil) return ceilf(x);
  else if constexpr (OP == Unary::kSin) return sinf(x);
  else if constexpr (OP == Unary::kCos) return cosf(x);
  // log(1 + e^x) without overflow for large x or lost digits for very negative x.
  else if constexpr (OP == Unary::kSoftplus) return fmaxf(x, 0.f) + log1pf(expf(-fabsf(x)));
  else if constexpr (OP == Unary::kSign) return x > 0.f ? 1.f : (x < 0.f ? -1.f : x);  // 0 -> 0, NaN -> NaN
  else if constexpr (OP == Unary::kRound) return rintf(x);  // round half to even (default mode)
  else if constexpr (OP == Unary::kGeluErf) return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  else if constexpr (OP == Unary::kGeluTanh)
    return 0.5f * x * (1.f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  else if constexpr (OP == Unary::kClip) {  // NaN stays NaN; min > max gives max, as ONNX says
    const float v = x < p.a ? p.a : x;
    return v > p.b ? p.b : v;
  }
  else if constexpr (OP == Unary::kLeakyRelu) return x >= 0.f ? x : p.a * x;
  else if constexpr (OP == Unary::kElu) return x >= 0.f ? x : p.a * expm1f(x);
  else if constexpr (OP == Unary::kHardSigmoid) return fmaxf(0.f, fminf(1.f, p.a * x + p.b));
  else if constexpr (OP == Unary::kHardSwish) return x * fmaxf(0.f, fminf(1.f, x * (1.f / 6.f) + 0.5f));
  // SiLU follows most convolutions of EfficientNet/YOLO-style nets over whole feature maps: the
  // fast exponential and division (a few ulp in f32; 1 + e^-x past 2^126 gives 0 as x / inf
  // does) keep it a memory-bound pass (bench/RESULTS.md, twenty-eighth session).
  else if constexpr (OP == Unary::kSilu) return __fdividef(x, 1.f + __expf(-x));
  else if constexpr (OP == Unary::kSelu) return p.b * (x > 0.f ? x : p.a * expm1f(x));
  else if constexpr (OP == Unary::kCelu) return fmaxf(0.f, x) + fminf(0.f, p.a * expm1f(x / p.a));
  else if constexpr (OP == Unary::kThresholdedRelu) return x > p.a ? x : 0.f;
  else if constexpr (OP == Unary::kSwish) return x / (1.f + expf(-p.a * x));
  else if constexpr (OP == Unary::kMish) return x * tanhf(fmaxf(x, 0.f) + log1pf(expf(-fabsf(x))));
  else if constexpr (OP == Unary::kSoftsign) return x / (1.f + fabsf(x));
  else if constexpr (OP == Unary::kShrink) return x < -p.a ? x + p.b : (x > p.a ? x - p.b : 0.f);
  else if constexpr (OP == Unary::kTan) return tanf(x);
  else if constexpr (OP == Unary::kAtan) return atanf(x);
  else if constexpr (OP == Unary::kAsin) return asinf(x);
  else if constexpr (OP == Unary::kAcos) return acosf(x);
  else if constexpr (OP == Unary::kSinh) return sinhf(x);
  else if constexpr (OP == Unary::kCosh) return coshf(x);
  else if constexpr (OP == Unary::kAsinh) return asinhf(x);
  else if constexpr (OP == Unary::kAcosh) return acoshf(x);
  else if constexpr (OP == Unary::kAtanh) return atanhf(x);
  else return x;  // kNot: rejected by unary_ok for floats
}

}  // namespace kiln::cuda::k
