// Quantized products' element passes (QuantizedMatMul, lower_gemm_quant.cc): the activation
// quantized to int8 or float8 e4m3 before the GEMM, and a GEMM's raw sums (int32 from int8, f32
// from fp8 without epilogue scales) scaled back per column after it.
#include <cuda_fp8.h>

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

// As QuantizeLinear (ops/quantize.cc): x / scale correctly rounded in f32, half-to-even, plus the
// zero point, saturated to [lo, hi]; NaN -> 0. Stored minus `offset` (128 turns uint8 into int8).
template <class T>
__global__ void quantize_i8_kernel(const T* __restrict__ x, int8_t* __restrict__ y, int64_t n, float scale, float zp,
                                   float lo, float hi, float offset) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float q = rintf(__fdiv_rn(to_f(x[i]), scale));
    y[i] = int8_t(q != q ? -offset : fminf(fmaxf(q + zp, lo), hi) - offset);
  }
}

// To float8 e4m3 with saturation (ONNX's saturate = 1: beyond +-448 -> +-448, NaN stays NaN).
template <class T>
__global__ void quantize_f8_kernel(const T* __restrict__ x, __nv_fp8_e4m3* __restrict__ y, int64_t n, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    y[i] = __nv_fp8_e4m3(__fdiv_rn(to_f(x[i]), scale));  // the constructor rounds to nearest, satfinite
  }
}

template <class A, class T>
__global__ void dequant_cols_kernel(const A* __restrict__ acc, const float* __restrict__ alpha,
                                    const float* __restrict__ beta, T* __restrict__ y, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % cols;
    y[i] = from_f<T>(fmaf(float(acc[i]), alpha[c], beta[c]));
  }
}

}  // namespace

cudaError_t quantize_int8(DT dt, const void* x, void* y, int64_t n, float scale, float zp, float lo, float hi,
                          float offset, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    quantize_i8_kernel<<<grid_for(n), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<int8_t*>(y), n, scale, zp,
                                                      lo, hi, offset);
    return cudaGetLastError();
  });
}

cudaError_t quantize_fp8(DT dt, const void* x, void* y, int64_t n, float scale, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    quantize_f8_kernel<<<grid_for(n), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<__nv_fp8_e4m3*>(y), n, scale);
    return cudaGetLastError();
  });
}

cudaError_t dequant_cols(DT acc_dt, const void* acc, const float* alpha, const float* beta, DT dt, void* y, int64_t rows,
                         int64_t cols, cudaStream_t s) {
  if (rows < 0 || cols < 1 || (acc_dt != DT::kI32 && acc_dt != DT::kF32)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (acc_dt == DT::kI32) {
      dequant_cols_kernel<<<grid_for(rows * cols), kBlock, 0, s>>>(static_cast<const int32_t*>(acc), alpha, beta,
                                                                   static_cast<T*>(y), rows, cols);
    } else {
      dequant_cols_kernel<<<grid_for(rows * cols), kBlock, 0, s>>>(static_cast<const float*>(acc), alpha, beta,
                                                                   static_cast<T*>(y), rows, cols);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
