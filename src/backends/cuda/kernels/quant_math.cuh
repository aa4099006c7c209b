// Device math of the quantize passes (quant.cu), in a header of its own so that
// bench/rint_quotient_check.cu checks this very function against the division it replaces.
#pragma once

namespace kiln::cuda::k {

// rintf(__fdiv_rn(x, scale)) (the quotient correctly rounded in f32, then to an integer, half to
// even) without the division where it cannot change the integer: x * inv (inv = 1/scale rounded;
// 0 when that is not finite) is within ~2^-22 of the quotient relative (3.6e-7 when inv is
// subnormal), so their nearest integers agree unless it lies within 5e-7 |y| of a half-integer.
// Only those divide, and so do |y| >= 1e6 (x * inv may overflow where the quotient does not; they
// are integers or saturate anyway), NaN, infinities and inv = 0. The division was most of these
// passes' time (bench/RESULTS.md, "thirty-fifth session").
inline __device__ float rint_quotient(float x, float scale, float inv) {
  const float y = x * inv;
  const float f = fabsf(y - truncf(y));
  if (inv == 0.0f || !(fabsf(y) < 1e6f) || fabsf(f - 0.5f) <= fabsf(y) * 5e-7f) return rintf(__fdiv_rn(x, scale));
  return rintf(y);
}

}  // namespace kiln::cuda::k
