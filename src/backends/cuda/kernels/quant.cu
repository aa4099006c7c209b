// Quantized products' element passes (QuantizedMatMul, lower_gemm_quant.cc): the activation
// quantized to int8 or float8 e4m3 before the GEMM, and a GEMM's raw sums (int32 from int8, f32
// from fp8 without epilogue scales) scaled back per column after it; DynamicQuantizeLinear.
#include <cuda_fp8.h>

#include <cmath>

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/quant_math.cuh"

namespace kiln::cuda::k {

namespace {

// y[i] = f(x[i]) over n elements, 16 bytes of x per load (and the matching run of y per store) where
// both pointers allow it: these passes are bound by memory, and element-wide accesses left them at a
// third of its bandwidth (bench/RESULTS.md, "thirty-fifth session").
template <class T, class U, class F>
__device__ void map_vectorized(const T* __restrict__ x, U* __restrict__ y, int64_t n, F f) {
  constexpr int V = 16 / sizeof(T);
  struct alignas(16) In {
    T v[V];
  };
  struct alignas(sizeof(U) * V) Out {
    U v[V];
  };
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % (sizeof(U) * V) == 0) {
    const int64_t nv = n / V;
    for (int64_t i = global_tid(); i < nv; i += global_threads()) {
      const In a = reinterpret_cast<const In*>(x)[i];
      Out b;
#pragma unroll
      for (int j = 0; j < V; ++j) b.v[j] = f(a.v[j]);
      reinterpret_cast<Out*>(y)[i] = b;
    }
    done = nv * V;
  }
  for (int64_t i = done + global_tid(); i < n; i += global_threads()) y[i] = f(x[i]);
}

// Threads for n elements taken 16 bytes of T at a time.
template <class T>
unsigned grid_vectorized(int64_t n) {
  return grid_for((n + int64_t(16 / sizeof(T)) - 1) / int64_t(16 / sizeof(T)));
}

float inverse_of(float scale) {
  const float inv = 1.0f / scale;
  return std::isfinite(inv) ? inv : 0.0f;
}

// As QuantizeLinear (ops/quantize.cc): x / scale correctly rounded in f32, half-to-even, plus the
// zero point, saturated to [lo, hi]; NaN -> 0. Stored minus `offset` (128 turns uint8 into int8).
template <class T>
__global__ void quantize_i8_kernel(const T* __restrict__ x, int8_t* __restrict__ y, int64_t n, float scale, float inv,
                                   float zp, float lo, float hi, float offset) {
  map_vectorized(x, y, n, [=](T v) {
    const float q = rint_quotient(to_f(v), scale, inv);
    return int8_t(q != q ? -offset : fminf(fmaxf(q + zp, lo), hi) - offset);
  });
}

// To float8 e4m3 with saturation (ONNX's saturate = 1: beyond +-448 -> +-448, NaN stays NaN).
template <class T>
__global__ void quantize_f8_kernel(const T* __restrict__ x, __nv_fp8_e4m3* __restrict__ y, int64_t n, float scale) {
  // The constructor rounds to nearest, satfinite.
  map_vectorized(x, y, n, [=](T v) { return __nv_fp8_e4m3(__fdiv_rn(to_f(v), scale)); });
}

// QuantizeLinear then DequantizeLinear in one pass (the values a QDQ model's product multiplies),
// in x's own type: int8 as quantize_i8_kernel then (q - zp) * scale; fp8 as quantize_f8_kernel
// then the e4m3 value times scale.
template <class T>
__global__ void fake_quant_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, float scale, float inv,
                                  float zp, float lo, float hi, bool fp8) {
  map_vectorized(x, y, n, [=](T in) {
    float q;
    if (fp8) {
      q = float(__nv_fp8_e4m3(__fdiv_rn(to_f(in), scale)));
    } else {
      const float r = rint_quotient(to_f(in), scale, inv);
      q = r != r ? -zp : fminf(fmaxf(r + zp, lo), hi) - zp;  // NaN: the stored integer 0, as QuantizeLinear
    }
    return from_f<T>(__fmul_rn(q, scale));
  });
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
    quantize_i8_kernel<<<grid_vectorized<T>(n), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<int8_t*>(y), n,
                                                                 scale, inverse_of(scale), zp, lo, hi, offset);
    return cudaGetLastError();
  });
}

cudaError_t quantize_fp8(DT dt, const void* x, void* y, int64_t n, float scale, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    quantize_f8_kernel<<<grid_vectorized<T>(n), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<__nv_fp8_e4m3*>(y), n, scale);
    return cudaGetLastError();
  });
}

cudaError_t fake_quant(DT dt, const void* x, void* y, int64_t n, float scale, float zp, float lo, float hi, bool fp8,
                       cudaStream_t s) {
  if (n < 0 || !(scale > 0)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fake_quant_kernel<<<grid_vectorized<T>(n), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n, scale,
                                                                inverse_of(scale), zp, lo, hi, fp8);
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

namespace {

// DynamicQuantizeLinear's range: one block of 1024 threads over x (0 included), then thread 0
// writes the scale and zero point the CPU reference computes (f32, correctly rounded).
template <class T>
__global__ void dynamic_range_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ scale,
                                     uint8_t* __restrict__ zp) {
  float mx = 0.f, mn = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_f(x[i]);
    mx = fmaxf(mx, v);
    mn = fminf(mn, v);
  }
  __shared__ float smx[32], smn[32];
  for (int o = 16; o > 0; o >>= 1) {
    mx = fmaxf(mx, __shfl_down_sync(0xffffffffu, mx, o));
    mn = fminf(mn, __shfl_down_sync(0xffffffffu, mn, o));
  }
  if ((threadIdx.x & 31) == 0) {
    smx[threadIdx.x >> 5] = mx;
    smn[threadIdx.x >> 5] = mn;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < blockDim.x / 32; ++w) {
      mx = fmaxf(mx, smx[w]);
      mn = fminf(mn, smn[w]);
    }
    const float s = __fdiv_rn(mx == mn ? 1.0f : __fsub_rn(mx, mn), 255.0f);
    *scale = s;
    *zp = static_cast<uint8_t>(rintf(fminf(fmaxf(__fsub_rn(0.0f, __fdiv_rn(mn, s)), 0.0f), 255.0f)));
  }
}

template <class T>
__global__ void dynamic_apply_kernel(const T* __restrict__ x, int64_t n, const float* __restrict__ scale,
                                     const uint8_t* __restrict__ zp, uint8_t* __restrict__ y) {
  const float s = *scale, z = static_cast<float>(*zp);
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    y[i] = static_cast<uint8_t>(fminf(fmaxf(rintf(__fdiv_rn(to_f(x[i]), s)) + z, 0.0f), 255.0f));
  }
}

}  // namespace

cudaError_t dynamic_quantize_u8(DT dt, const void* x, int64_t n, uint8_t* y, float* scale, uint8_t* zp, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xt = static_cast<const T*>(x);
    dynamic_range_kernel<T><<<1, 1024, 0, s>>>(xt, n, scale, zp);
    if (n > 0) dynamic_apply_kernel<T><<<grid_for(n), kBlock, 0, s>>>(xt, n, scale, zp, y);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
