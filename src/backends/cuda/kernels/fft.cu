// k::fft_pack and k::fft_unpack (fft.h).
#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/fft.h"

namespace kiln::cuda::k {

namespace {

template <class T, class C>
__global__ void pack_kernel(FftPack p, const T* __restrict__ x, const T* __restrict__ window, C* __restrict__ z) {
  const int64_t rows = p.frames > 0 ? p.outer * p.frames : p.outer * p.inner, total = rows * p.n;
  for (int64_t e = global_tid(); e < total; e += global_threads()) {
    const int64_t row = e / p.n, t = e % p.n;
    double re = 0, im = 0;
    if (p.frames > 0) {
      const int64_t b = row / p.frames, pos = row % p.frames * p.step + t;
      if (pos < p.in_len) {
        const T* q = x + (b * p.in_len + pos) * p.in_comp;
        const double w = window ? static_cast<double>(widen(window[t])) : 1.0;
        re = w * static_cast<double>(widen(q[0]));
        im = p.in_comp == 2 ? w * static_cast<double>(widen(q[1])) : 0.0;
      }
    } else {
      const int64_t o = row / p.inner, i = row % p.inner;
      const bool mirrored = p.irfft && t > p.n / 2;  // conj(z[n - t])
      const int64_t src = mirrored ? p.n - t : t;
      if (src < p.used) {
        const T* q = x + ((o * p.in_len + src) * p.inner + i) * p.in_comp;
        re = static_cast<double>(widen(q[0]));
        im = p.in_comp == 2 ? static_cast<double>(widen(q[1])) : 0.0;
        if (mirrored) im = -im;
      }
    }
    if constexpr (std::is_same_v<C, double2>) {
      z[e] = make_double2(re, im);
    } else {
      z[e] = make_float2(static_cast<float>(re), static_cast<float>(im));
    }
  }
}

template <class T, class C>
__global__ void unpack_kernel(FftUnpack p, const C* __restrict__ z, T* __restrict__ y) {
  const int64_t total = p.outer * p.out_len * p.inner * p.out_comp;
  for (int64_t e = global_tid(); e < total; e += global_threads()) {
    const int64_t part = e % p.out_comp, r = e / p.out_comp;
    const int64_t i = r % p.inner, k = r / p.inner % p.out_len, o = r / p.inner / p.out_len;
    const C v = z[(o * p.inner + i) * p.n + k];
    y[e] = narrow<T>(static_cast<double>(part == 0 ? v.x : v.y) * p.scale);
  }
}

}  // namespace

cudaError_t fft_pack(const FftPack& p, const void* x, const void* window, void* z, cudaStream_t s) {
  const int64_t rows = p.frames > 0 ? p.outer * p.frames : p.outer * p.inner;
  if (p.n < 1 || rows < 0 || p.in_len < 1 || (p.in_comp != 1 && p.in_comp != 2)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return dispatch_float(p.dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const unsigned grid = grid_for(rows * p.n);
    if (p.f64) {
      pack_kernel<T, double2><<<grid, kBlock, 0, s>>>(p, static_cast<const T*>(x), static_cast<const T*>(window), static_cast<double2*>(z));
    } else {
      pack_kernel<T, float2><<<grid, kBlock, 0, s>>>(p, static_cast<const T*>(x), static_cast<const T*>(window), static_cast<float2*>(z));
    }
    return cudaGetLastError();
  });
}

cudaError_t fft_unpack(const FftUnpack& p, const void* z, void* y, cudaStream_t s) {
  const int64_t total = p.outer * p.out_len * p.inner * p.out_comp;
  if (p.n < 1 || p.out_len > p.n || (p.out_comp != 1 && p.out_comp != 2) || total < 0) return cudaErrorInvalidValue;
  if (total == 0) return cudaSuccess;
  return dispatch_float(p.dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.f64) {
      unpack_kernel<T, double2><<<grid_for(total), kBlock, 0, s>>>(p, static_cast<const double2*>(z), static_cast<T*>(y));
    } else {
      unpack_kernel<T, float2><<<grid_for(total), kBlock, 0, s>>>(p, static_cast<const float2*>(z), static_cast<T*>(y));
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
