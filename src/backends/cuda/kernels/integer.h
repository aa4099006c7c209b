// The integer products' conversions (integer.cu), for MatMulInteger, ConvInteger, QLinearMatMul and
// QLinearConv computed as exact float products (lower_integer.cc).
#pragma once

#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda::k {

// y (f32 or f64) = x - zp over n elements of x (i8 or u8); zp (x's dtype, may be null: 0) is one
// value, or one per slice: element i takes zp[(i / zp_inner) % zp_len].
cudaError_t int_center(DT xdt, const void* x, int64_t n, const void* zp, int64_t zp_inner, int64_t zp_len, DT ydt,
                       void* y, cudaStream_t s);

// y (i32, i8 or u8) = saturate(round_half_even((acc[i] + bias) * factor + zp)), in f64 (an i32
// output wraps instead, as the CPU reference stores an integer sum), with acc
// (f32 or f64) an exact integer sum and bias = bias[(i / b_inner) % b_len] (int32; null: 0). The
// factor is a host table, factor[(i / f_inner) % f_len], or computed at run time from scales read
// on the device as the CPU reference computes it: round(round(sa * sb) / sy) rounded to round_dt
// each time, sa = scale_a[(i / a_inner) % a_len], sb = scale_b[(i / b2_inner) % b2_len], sy =
// scale_y[0]; neither: 1. zp: zp_ptr[0] (u8 or i8) when given, else zp.
struct Requantize {
  DT acc_dt = DT::kF64, ydt = DT::kI32;
  int64_t n = 0;
  const int32_t* bias = nullptr;
  int64_t b_inner = 1, b_len = 1;
  const double* factor = nullptr;
  int64_t f_inner = 1, f_len = 1;
  const void *scale_a = nullptr, *scale_b = nullptr, *scale_y = nullptr;
  DT a_dt = DT::kF32, b_dt = DT::kF32, y_dt = DT::kF32, round_dt = DT::kF32;
  int64_t a_inner = 1, a_len = 1, b2_inner = 1, b2_len = 1;
  double zp = 0;
  const void* zp_ptr = nullptr;
  DT zp_dt = DT::kU8;
};
cudaError_t requantize(const Requantize& r, const void* acc, void* y, cudaStream_t s);

}  // namespace kiln::cuda::k
