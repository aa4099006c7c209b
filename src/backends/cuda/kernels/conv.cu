// Depthwise convolution, NHWC. One thread per output element with the channel fastest, so a
// warp reads 32 consecutive channels of one input pixel (coalesced) and the filter laid out
// [r, s, c] likewise. It is memory-bound (9 MACs per output for 3x3); the re-reads of
// neighbouring pixels hit L1/L2.
//
// Also the input transform of convolutions over few channels (an RGB image): x, in any layout,
// becomes NHWC with 8 or 16 channels per pixel, optionally folding 2x2 blocks of pixels into
// channels (space-to-depth) so that a stride-2 convolution becomes a stride-1 one over 4x the
// channels (lower_conv.cc explains the filter side).
#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

template <class T>
__global__ void depthwise_kernel(const T* __restrict__ x, const T* __restrict__ f, const T* __restrict__ bias,
                                 T* __restrict__ y, DepthwiseShape sh, int act, float lo, float hi, int64_t total) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int c = int(i % sh.c);
    int64_t t = i / sh.c;
    int q = int(t % sh.q);
    t /= sh.q;
    int p = int(t % sh.p);
    int n = int(t / sh.p);
    float acc = bias ? to_f(bias[c]) : 0.0f;
    for (int r = 0; r < sh.r; ++r) {
      int hi_ = p * sh.stride_h - sh.pad_h + r * sh.dil_h;
      if (hi_ < 0 || hi_ >= sh.h) continue;
      for (int s = 0; s < sh.s; ++s) {
        int wi = q * sh.stride_w - sh.pad_w + s * sh.dil_w;
        if (wi < 0 || wi >= sh.w) continue;
        float xv = to_f(x[((int64_t(n) * sh.h + hi_) * sh.w + wi) * sh.c + c]);
        if (sh.in_clip) xv = fminf(fmaxf(xv, sh.in_lo), sh.in_hi);
        acc += xv * to_f(f[(r * sh.s + s) * sh.c + c]);
      }
    }
    if (act == 1) acc = fmaxf(acc, 0.0f);
    else if (act == 2) acc = fminf(fmaxf(acc, lo), hi);
    y[i] = from_f<T>(acc);
  }
}

// The same with V consecutive channels per thread (16-byte loads and stores), when C % V == 0.
template <class T, int V>
struct alignas(16) Vec {
  T v[V];
};

template <class T, int V>
__global__ void depthwise_vec_kernel(const T* __restrict__ x, const T* __restrict__ f, const T* __restrict__ bias,
                                     T* __restrict__ y, DepthwiseShape sh, int act, float lo, float hi, int64_t total) {
  using W = Vec<T, V>;
  int cv = sh.c / V;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int c = int(i % cv) * V;
    int64_t t = i / cv;
    int q = int(t % sh.q);
    t /= sh.q;
    int p = int(t % sh.p);
    int n = int(t / sh.p);
    float acc[V];
    if (bias) {
      W b = *reinterpret_cast<const W*>(bias + c);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = to_f(b.v[j]);
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = 0.0f;
    }
    for (int r = 0; r < sh.r; ++r) {
      int hi_ = p * sh.stride_h - sh.pad_h + r * sh.dil_h;
      if (hi_ < 0 || hi_ >= sh.h) continue;
      for (int s = 0; s < sh.s; ++s) {
        int wi = q * sh.stride_w - sh.pad_w + s * sh.dil_w;
        if (wi < 0 || wi >= sh.w) continue;
        W xv = *reinterpret_cast<const W*>(x + ((int64_t(n) * sh.h + hi_) * sh.w + wi) * sh.c + c);
        W fv = *reinterpret_cast<const W*>(f + (r * sh.s + s) * sh.c + c);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          float xj = to_f(xv.v[j]);
          if (sh.in_clip) xj = fminf(fmaxf(xj, sh.in_lo), sh.in_hi);
          acc[j] += xj * to_f(fv.v[j]);
        }
      }
    }
    W out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float a = acc[j];
      if (act == 1) a = fmaxf(a, 0.0f);
      else if (act == 2) a = fminf(fmaxf(a, lo), hi);
      out.v[j] = from_f<T>(a);
    }
    *reinterpret_cast<W*>(y + (i / cv) * sh.c + c) = out;
  }
}

// One thread per output pixel: gathers its b*b*c values through x's strides (zero outside the
// image) and writes cp of them (the rest zero) as 16-byte packs. Elements are moved as raw 16-bit
// words (fp16 and bf16 alike; zero is 0 in both).
template <int CP>
__global__ void space_to_depth_kernel(const uint16_t* __restrict__ x, SpaceToDepthShape sh, uint16_t* __restrict__ y,
                                      int64_t total) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    int64_t X = i % sh.wo, t = i / sh.wo, Y = t % sh.ho, n = t / sh.ho;
    Pack<uint16_t, 8> out[CP / 8];
#pragma unroll
    for (int ch = 0; ch < CP; ++ch) {
      uint16_t v = 0;
      const int cell = ch / int(sh.c), c = ch % int(sh.c);
      const int64_t h = Y * sh.block + cell / sh.block - sh.top, w = X * sh.block + cell % sh.block - sh.left;
      if (cell < sh.block * sh.block && h >= 0 && h < sh.h && w >= 0 && w < sh.w) v = x[n * sh.sn + c * sh.sc + h * sh.sh + w * sh.sw];
      out[ch / 8].v[ch % 8] = v;
    }
#pragma unroll
    for (int p = 0; p < CP / 8; ++p) reinterpret_cast<Pack<uint16_t, 8>*>(y)[i * (CP / 8) + p] = out[p];
  }
}

}  // namespace

cudaError_t space_to_depth_nhwc(const void* x, const SpaceToDepthShape& sh, void* y, cudaStream_t s) {
  if (sh.c < 1 || sh.block < 1 || (sh.cp != 8 && sh.cp != 16) || sh.block * sh.block * sh.c > sh.cp ||
      reinterpret_cast<uintptr_t>(y) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  int64_t total = sh.n * sh.ho * sh.wo;
  if (total == 0) return cudaSuccess;
  const auto* xs = static_cast<const uint16_t*>(x);
  auto* ys = static_cast<uint16_t*>(y);
  if (sh.cp == 8) {
    space_to_depth_kernel<8><<<grid_for(total), kBlock, 0, s>>>(xs, sh, ys, total);
  } else {
    space_to_depth_kernel<16><<<grid_for(total), kBlock, 0, s>>>(xs, sh, ys, total);
  }
  return cudaGetLastError();
}

cudaError_t depthwise_conv2d_nhwc(DT dt, const void* x, const void* filter, const void* bias, void* y,
                                  const DepthwiseShape& sh, int act, float lo, float hi, cudaStream_t s) {
  int64_t total = int64_t(sh.n) * sh.p * sh.q * sh.c;
  if (total == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int V = 16 / int(sizeof(T));
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (sh.c % V == 0 && aligned(x) && aligned(filter) && aligned(y) && (!bias || aligned(bias))) {
      int64_t work = total / V;
      depthwise_vec_kernel<T, V><<<grid_for(work), kBlock, 0, s>>>(
          static_cast<const T*>(x), static_cast<const T*>(filter), static_cast<const T*>(bias), static_cast<T*>(y), sh,
          act, lo, hi, work);
      return cudaGetLastError();
    }
    depthwise_kernel<T><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(filter),
                                                         static_cast<const T*>(bias), static_cast<T*>(y), sh, act, lo,
                                                         hi, total);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
