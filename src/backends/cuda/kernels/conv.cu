// Depthwise convolution, NHWC. One thread per group of consecutive channels of an output pixel,
// the channels fastest, so a warp reads consecutive channels of one input pixel (coalesced) and
// the filter laid out [r, s, c] likewise. It is memory-bound (9 MACs per output for 3x3); the re-reads of
// neighbouring pixels hit L1/L2.
//
// Also the input transform of convolutions over few channels (an RGB image): x, in any layout,
// becomes NHWC with 8 or 16 channels per pixel, optionally folding 2x2 blocks of pixels into
// channels (space-to-depth) so that a stride-2 convolution becomes a stride-1 one over 4x the
// channels (lower_conv.cc explains the filter side).
#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

// V consecutive channels per thread, loaded and stored as one word of V elements: 16 bytes when C
// allows (8 fp16 channels), else the widest of 8, 4 or 2 bytes that divides C (ShuffleNet's 58 and
// 116 channels: 2 and 4), 1 element at worst. U indexes the outputs (uint32_t when they fit: the
// divisions that split an index into pixel and channel are most of a thread's work otherwise).
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// x after the fused input activation `in` (DwInput; uniform over the grid).
__device__ __forceinline__ float dw_input(float x, int in, float a, float b) {
  if (in == int(DwInput::kClip)) {  // NaN stays NaN, as Clip's own kernel keeps it
    const float v = x < a ? a : x;
    return v > b ? b : v;
  }
  if (in == int(DwInput::kHardSwish)) return x * fmaxf(0.f, fminf(1.f, x * (1.f / 6.f) + 0.5f));
  if (in == int(DwInput::kLeakyRelu)) return x >= 0.f ? x : a * x;
  return x;
}

template <class T, int V, class U>
__global__ void depthwise_kernel(const T* __restrict__ x, const T* __restrict__ f, const T* __restrict__ bias,
                                 T* __restrict__ y, DepthwiseShape sh, int act, float lo, float hi, U total) {
  using W = Pack<T, V>;
  const U cv = U(sh.c / V);
  for (U i = U(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += U(gridDim.x) * blockDim.x) {
    const int c = int(i % cv) * V;
    U t = i / cv;
    const int q = int(t % U(sh.q));
    t /= U(sh.q);
    const int p = int(t % U(sh.p));
    const int n = int(t / U(sh.p));
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
          if (sh.in_act) xj = dw_input(xj, sh.in_act, sh.in_a, sh.in_b);
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
      else if (act == 3) a = a / (1.0f + __expf(-a));  // SiLU, x * sigmoid(x)
      out.v[j] = from_f<T>(a);
    }
    *reinterpret_cast<W*>(y + int64_t(i / cv) * sh.c + c) = out;
  }
}

// Launches with the widest word, V elements down to one, that divides C and aligns every pointer.
template <class T, int V>
cudaError_t launch_depthwise(const void* x, const void* filter, const void* bias, void* y, const DepthwiseShape& sh,
                             int act, float lo, float hi, int64_t total, cudaStream_t s) {
  if constexpr (V > 1) {
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * V) == 0; };
    if (sh.c % V != 0 || !aligned(x) || !aligned(filter) || !aligned(y) || (bias && !aligned(bias))) {
      return launch_depthwise<T, V / 2>(x, filter, bias, y, sh, act, lo, hi, total, s);
    }
  }
  const int64_t work = total / V;
  const auto* xt = static_cast<const T*>(x);
  const auto* ft = static_cast<const T*>(filter);
  const auto* bt = static_cast<const T*>(bias);
  auto* yt = static_cast<T*>(y);
  if (fits_u32(work + kBlock * int64_t(kMaxGrid))) {
    depthwise_kernel<T, V, uint32_t><<<grid_for(work), kBlock, 0, s>>>(xt, ft, bt, yt, sh, act, lo, hi, uint32_t(work));
  } else {
    depthwise_kernel<T, V, uint64_t><<<grid_for(work), kBlock, 0, s>>>(xt, ft, bt, yt, sh, act, lo, hi, uint64_t(work));
  }
  return cudaGetLastError();
}

// One thread per output pixel: gathers its b*b*c values through x's strides (zero outside the
// image) and writes cp of them (the rest zero) as 16-byte packs of Out (fp16 or bf16). In is Out
// itself (the values move unchanged) or float (a model's f32 image read as the host staged it,
// converted here: the input needs no separate cast pass).
template <class Out, class In>
__device__ __forceinline__ uint16_t s2d_bits(In v) {
  if constexpr (std::is_same_v<In, Out>) {
    return reinterpret_cast<const uint16_t&>(v);
  } else {
    const Out o = from_f<Out>(v);
    return reinterpret_cast<const uint16_t&>(o);
  }
}

template <int CP, class Out, class In>
__global__ void space_to_depth_kernel(const In* __restrict__ x, SpaceToDepthShape sh, uint16_t* __restrict__ y,
                                      int64_t total) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    int64_t X = i % sh.wo, t = i / sh.wo, Y = t % sh.ho, n = t / sh.ho;
    Pack<uint16_t, 8> out[CP / 8];
#pragma unroll
    for (int ch = 0; ch < CP; ++ch) {
      uint16_t v = 0;
      const int cell = ch / int(sh.c), c = ch % int(sh.c);
      const int64_t h = Y * sh.block + cell / sh.block - sh.top, w = X * sh.block + cell % sh.block - sh.left;
      if (cell < sh.block * sh.block && h >= 0 && h < sh.h && w >= 0 && w < sh.w) {
        v = s2d_bits<Out>(x[n * sh.sn + c * sh.sc + h * sh.sh + w * sh.sw]);
      }
      out[ch / 8].v[ch % 8] = v;
    }
#pragma unroll
    for (int p = 0; p < CP / 8; ++p) reinterpret_cast<Pack<uint16_t, 8>*>(y)[i * (CP / 8) + p] = out[p];
  }
}

// Block 2 with C channels known at compile time (ResNet's RGB stem: C = 3, CP = 16), 32-bit pixel
// indices: the generic kernel's per-channel 64-bit divisions made it ~3x its memory time at batch
// 256 (bench/RESULTS.md, "ResNet-50: input image read by space-to-depth, kiln's max pooling, conv
// algorithms re-timed (c955006, 9be7bf1, 285d861)").
template <int CP, int C, class Out, class In>
__global__ void space_to_depth2_kernel(const In* __restrict__ x, SpaceToDepthShape sh, uint16_t* __restrict__ y,
                                       int total) {
  const int wo = int(sh.wo), ho = int(sh.ho), hh = int(sh.h), ww = int(sh.w), top = int(sh.top), left = int(sh.left);
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < total; i += int(gridDim.x * blockDim.x)) {
    const int X = i % wo, t = i / wo, Y = t % ho, n = t / ho;
    Pack<uint16_t, 8> out[CP / 8];
#pragma unroll
    for (int p = 0; p < CP / 8; ++p)
#pragma unroll
      for (int e = 0; e < 8; ++e) out[p].v[e] = 0;
    const In* xn = x + n * sh.sn;
#pragma unroll
    for (int dy = 0; dy < 2; ++dy) {
      const int h = 2 * Y + dy - top;
      if (h < 0 || h >= hh) continue;
#pragma unroll
      for (int dx = 0; dx < 2; ++dx) {
        const int w = 2 * X + dx - left;
        if (w < 0 || w >= ww) continue;
        const In* px = xn + h * sh.sh + w * sh.sw;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const int ch = (dy * 2 + dx) * C + c;
          out[ch / 8].v[ch % 8] = s2d_bits<Out>(px[c * sh.sc]);
        }
      }
    }
#pragma unroll
    for (int p = 0; p < CP / 8; ++p) reinterpret_cast<Pack<uint16_t, 8>*>(y)[int64_t(i) * (CP / 8) + p] = out[p];
  }
}

template <int CP, class Out, class In>
cudaError_t launch_s2d(const In* x, const SpaceToDepthShape& sh, uint16_t* y, int64_t total, cudaStream_t s) {
  auto fast = [&](auto c) {
    constexpr int kC = decltype(c)::value;
    space_to_depth2_kernel<CP, kC, Out, In><<<grid_for(total), kBlock, 0, s>>>(x, sh, y, int(total));
  };
  const bool small = total < (int64_t{1} << 31) && sh.n * sh.sn < (int64_t{1} << 31);
  if (sh.block == 2 && small && sh.c == 3) fast(std::integral_constant<int, 3>());
  else if (sh.block == 2 && small && sh.c == 1) fast(std::integral_constant<int, 1>());
  else if (sh.block == 2 && small && sh.c == 4) fast(std::integral_constant<int, 4>());
  else space_to_depth_kernel<CP, Out, In><<<grid_for(total), kBlock, 0, s>>>(x, sh, y, total);
  return cudaGetLastError();
}

template <class Out, class In>
cudaError_t s2d_cp(const void* x, const SpaceToDepthShape& sh, void* y, int64_t total, cudaStream_t s) {
  const auto* xs = static_cast<const In*>(x);
  auto* ys = static_cast<uint16_t*>(y);
  return sh.cp == 8 ? launch_s2d<8, Out>(xs, sh, ys, total, s) : launch_s2d<16, Out>(xs, sh, ys, total, s);
}

}  // namespace

cudaError_t space_to_depth_nhwc(const void* x, DT x_dt, const SpaceToDepthShape& sh, void* y, DT y_dt, cudaStream_t s) {
  if (sh.c < 1 || sh.block < 1 || (sh.cp != 8 && sh.cp != 16) || sh.block * sh.block * sh.c > sh.cp ||
      reinterpret_cast<uintptr_t>(y) % 16 != 0 || (y_dt != DT::kF16 && y_dt != DT::kBF16) ||
      (x_dt != y_dt && x_dt != DT::kF32)) {
    return cudaErrorInvalidValue;
  }
  int64_t total = sh.n * sh.ho * sh.wo;
  if (total == 0) return cudaSuccess;
  if (x_dt == DT::kF32) {
    return y_dt == DT::kF16 ? s2d_cp<__half, float>(x, sh, y, total, s) : s2d_cp<__nv_bfloat16, float>(x, sh, y, total, s);
  }
  return y_dt == DT::kF16 ? s2d_cp<__half, __half>(x, sh, y, total, s)
                          : s2d_cp<__nv_bfloat16, __nv_bfloat16>(x, sh, y, total, s);
}

cudaError_t depthwise_conv2d_nhwc(DT dt, const void* x, const void* filter, const void* bias, void* y,
                                  const DepthwiseShape& sh, int act, float lo, float hi, cudaStream_t s) {
  int64_t total = int64_t(sh.n) * sh.p * sh.q * sh.c;
  if (total == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return launch_depthwise<T, 16 / int(sizeof(T))>(x, filter, bias, y, sh, act, lo, hi, total, s);
  });
}

namespace {

// One thread per 8 channels of one output pixel: 16-byte loads of the window's pixels (NHWC keeps a
// pixel's channels contiguous, so a warp reads whole 128-byte lines), the maximum in pairs. Pads
// never win (skipped); NaN does not propagate, as cuDNN's CUDNN_NOT_PROPAGATE_NAN.
template <class T, class T2>
__global__ void max_pool_nhwc_kernel(const T* __restrict__ x, PoolShape s, T* __restrict__ y, int total) {
  const int c8 = s.c / 8;
  for (int i = int(blockIdx.x * blockDim.x + threadIdx.x); i < total; i += int(gridDim.x * blockDim.x)) {
    const int cv = i % c8, t = i / c8, q = t % s.q, t2 = t / s.q, p = t2 % s.p, n = t2 / s.p;
    T2 m[4];
    const T2 lowest = T2{T(-INFINITY), T(-INFINITY)};
#pragma unroll
    for (int e = 0; e < 4; ++e) m[e] = lowest;
    const int h0 = p * s.sh - s.ph, w0 = q * s.sw - s.pw;
    for (int r = 0; r < s.kh; ++r) {
      const int h = h0 + r;
      if (h < 0 || h >= s.h) continue;
      for (int k = 0; k < s.kw; ++k) {
        const int w = w0 + k;
        if (w < 0 || w >= s.w) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(x + ((int64_t(n) * s.h + h) * s.w + w) * s.c + cv * 8);
        const T2* pv = reinterpret_cast<const T2*>(&v);
#pragma unroll
        for (int e = 0; e < 4; ++e) m[e] = __hmax2(m[e], pv[e]);
      }
    }
    *reinterpret_cast<uint4*>(y + ((int64_t(n) * s.p + p) * s.q + q) * s.c + cv * 8) = *reinterpret_cast<const uint4*>(m);
  }
}

}  // namespace

cudaError_t max_pool_nhwc(DT dt, const void* x, const PoolShape& s, void* y, cudaStream_t st) {
  if ((dt != DT::kF16 && dt != DT::kBF16) || s.c % 8 != 0 || s.kh < 1 || s.kw < 1 || s.sh < 1 || s.sw < 1 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(y) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = int64_t(s.n) * s.p * s.q * (s.c / 8);
  if (total == 0) return cudaSuccess;
  if (total >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  if (dt == DT::kF16) {
    max_pool_nhwc_kernel<__half, __half2><<<grid_for(total), kBlock, 0, st>>>(static_cast<const __half*>(x), s,
                                                                           static_cast<__half*>(y), int(total));
  } else {
    max_pool_nhwc_kernel<__nv_bfloat16, __nv_bfloat162><<<grid_for(total), kBlock, 0, st>>>(
        static_cast<const __nv_bfloat16*>(x), s, static_cast<__nv_bfloat16*>(y), int(total));
  }
  return cudaGetLastError();
}

}  // namespace kiln::cuda::k
