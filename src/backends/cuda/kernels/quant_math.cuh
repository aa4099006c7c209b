// Device math of the quantize passes (quant.cu), in a header of its own so that
// bench/rint_quotient_check.cu checks this very function against the division it replaces.
#pragma once

namespace kiln::cuda::k {

// rintf(__fdiv_rn(x, scale)) (the quotient correctly rounded in f32, then to an integer, half to
// even) without the division where it cannot change the integer: x * inv (inv = 1/scale rounded;
// 0 when that is not finite) is within 2^-22 of the quotient relative, so their nearest integers
// agree unless it lies that close to a half-integer, and only those (and inv = 0) divide. The
// division was most of these passes' time (bench/RESULTS.md, "thirty-fifth session").
inline __device__ float rint_quotient(float x, float scale, float inv) {
  const float y = x * inv;
  const float f = fabsf(y - truncf(y));
  if (inv == 0.0f || fabsf(f - 0.5f) <= fabsf(y) * 5e-7f) return rintf(__fdiv_rn(x, scale));
  return rintf(y);  // NaN and infinities come out as the division's would
}

}  // namespace kiln::cuda::k
