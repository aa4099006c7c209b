// Squeeze-and-excitation's gate in one launch: the spatial mean of x per image and channel, then
// two small fully connected layers with their activations, g = act2(b2 + W2 act1(b1 + W1 mean)).
// Exporters write it as GlobalAveragePool (or ReduceMean), Conv 1x1, an activation, Conv 1x1 and a
// Sigmoid: five to seven launches of a few microseconds each at batch 1, where the work is tiny.
//
// One cooperative launch, every block resident, in four phases split by grid barriers: blocks sum
// runs of an image's pixels per channel (`part`), then add the runs up into the mean, then a group
// of lanes per output row computes each layer (16-byte weight loads along the row). Spreading the
// layers over the GPU matters: with both layers done by one block per image, MobileNetV3-Large at
// batch 1 went from 0.328 to 0.619 ms (bench/RESULTS.md, forty-second session). Every sum is in a
// fixed order: a forward gives the same bits every run.
#include <cooperative_groups.h>

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/unary_math.cuh"

namespace kiln::cuda::k {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The activations squeeze_excite_act_ok lists, as the elementwise kernels compute them.
__device__ __forceinline__ float se_act(Unary op, float x, UnaryParams p) {
  switch (op) {
    case Unary::kRelu: return unary_f32<Unary::kRelu>(x, p);
    case Unary::kSigmoid: return unary_f32<Unary::kSigmoid>(x, p);
    case Unary::kTanh: return unary_f32<Unary::kTanh>(x, p);
    case Unary::kHardSigmoid: return unary_f32<Unary::kHardSigmoid>(x, p);
    case Unary::kHardSwish: return unary_f32<Unary::kHardSwish>(x, p);
    case Unary::kSilu: return unary_f32<Unary::kSilu>(x, p);
    case Unary::kClip: return unary_f32<Unary::kClip>(x, p);
    case Unary::kLeakyRelu: return unary_f32<Unary::kLeakyRelu>(x, p);
    case Unary::kGeluErf: return unary_f32<Unary::kGeluErf>(x, p);
    case Unary::kGeluTanh: return unary_f32<Unary::kGeluTanh>(x, p);
    default: return x;  // kIdentity
  }
}

// Sums of pixels [p0, p1) of image `img` per channel, for channel vectors [vb, vb + 256) (channels
// last) or channels [vb, vb + 8) (first), into part_row (c floats).
//
// Channels last: a thread reads V consecutive channels of a pixel (16 bytes where possible),
// 256 / vectors strands of pixels per block, combined in strand order through `red` (kThreads * V).
template <class T, int V>
__device__ void pool_channels_last(const T* __restrict__ x, int64_t img, int64_t spatial, int c, int vb, int p0, int p1,
                                   float* __restrict__ part_row, float* red) {
  const int nv = min(kThreads, c / V - vb), strands = kThreads / nv, tid = threadIdx.x, j = tid % nv, st = tid / nv;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.f;
  if (st < strands) {
    const T* base = x + img * spatial * c + int64_t(vb + j) * V;
#pragma unroll 4
    for (int p = p0 + st; p < p1; p += strands) {
      const Pack<T, V> v = *reinterpret_cast<const Pack<T, V>*>(base + int64_t(p) * c);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += to_f(v.v[k]);
    }
  }
  __syncthreads();  // red's previous use is over
  if (st < strands) {
#pragma unroll
    for (int k = 0; k < V; ++k) red[(st * nv + j) * V + k] = acc[k];
  }
  __syncthreads();
  for (int e = tid; e < nv * V; e += kThreads) {
    float s = 0.f;
    for (int q = 0; q < strands; ++q) s += red[q * nv * V + e];
    part_row[vb * V + e] = s;
  }
}

// Channels first ([n, c, spatial]): a warp per channel, lanes along the pixels.
template <class T>
__device__ void pool_channels_first(const T* __restrict__ x, int64_t img, int64_t spatial, int c, int vb, int p0, int p1,
                                    float* __restrict__ part_row) {
  const int ch = vb + int(threadIdx.x / 32), lane = threadIdx.x % 32;
  if (ch >= c) return;
  const T* row = x + (img * c + ch) * spatial;
  float s = 0.f;
#pragma unroll 4
  for (int p = p0 + lane; p < p1; p += 32) s += to_f(row[p]);
  s = warp_sum(s);
  if (lane == 0) part_row[ch] = s;
}

// out[i, r] = act(b[r] + w[r, :] . in[i, :]) for n images and `rows` rows of k weights (T, V-wide
// loads: 16 bytes where k and w allow), in f32 (n x k). A group of G lanes per (image, row), G the
// power of two that covers a row in one load each (at most a warp): a layer of 8 inputs is a
// thread's alone, one of 1152 a warp's. Out is T or float.
template <class T, int V, class Out>
__device__ void fc_rows(const T* __restrict__ w, const T* __restrict__ b, const float* __restrict__ in, Out* out,
                        int64_t n, int rows, int k, Unary act, UnaryParams p) {
  int g = 1;
  while (g < 32 && g * V < k) g *= 2;
  const int lane = threadIdx.x % 32, sub = lane % g, per_warp = 32 / g;
  const int64_t warps = int64_t(gridDim.x) * kWarps, units = n * rows;
  // Uniform over a warp (the shuffles need every lane): a warp takes per_warp units a round.
  for (int64_t base = (int64_t(blockIdx.x) * kWarps + threadIdx.x / 32) * per_warp; base < units; base += warps * per_warp) {
    const int64_t u = base + lane / g;
    float d = 0.f;
    if (u < units) {
      const int64_t img = u / rows;
      const T* wr = w + (u - img * rows) * k;
      const float* xi = in + img * k;
#pragma unroll 4
      for (int j = sub * V; j < k; j += g * V) {
        const Pack<T, V> wv = *reinterpret_cast<const Pack<T, V>*>(wr + j);
#pragma unroll
        for (int e = 0; e < V; ++e) d += to_f(wv.v[e]) * __ldcg(xi + j + e);
      }
    }
    for (int o = g / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (u < units && sub == 0) {
      const int r = int(u % rows);
      const float v = se_act(act, d + (b ? to_f(b[r]) : 0.f), p);
      if constexpr (std::is_same_v<Out, float>) out[u] = v;
      else out[u] = from_f<Out>(v);
    }
  }
}

// pooled[i, ch] = (sum of the runs' sums) / spatial: a block per 32 channels of an image, its warps
// taking every eighth run, combined in warp order.
__device__ void mean_of_runs(const float* __restrict__ part, float* __restrict__ pooled, float* red, int64_t n, int c,
                             int splits, float inv) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, chunks = (c + 31) / 32;
  for (int64_t u = blockIdx.x; u < n * chunks; u += gridDim.x) {
    const int64_t img = u / chunks;
    const int ch = int(u - img * chunks) * 32 + lane;
    float s = 0.f;
    if (ch < c) {
      const float* pi = part + img * splits * c + ch;
#pragma unroll 4
      for (int q = warp; q < splits; q += kWarps) s += __ldcg(pi + int64_t(q) * c);
    }
    __syncthreads();  // red's previous use is over
    red[warp * 32 + lane] = s;
    __syncthreads();
    if (warp == 0 && ch < c) {
      float t = 0.f;
      for (int q = 0; q < kWarps; ++q) t += red[q * 32 + lane];
      pooled[img * c + ch] = t * inv;
    }
  }
}

// V: x's channel vector; W1 / W2: the layers' weight vectors (16 bytes where c or cr and the
// pointers allow, else 1).
template <class T, int V, bool kLast, int W1, int W2>
__global__ void __launch_bounds__(kThreads) squeeze_excite_kernel(SqueezeExciteArgs a, int splits, int rows) {
  namespace cg = cooperative_groups;
  extern __shared__ float red[];  // kThreads * V
  const int c = int(a.c), cr = int(a.cr);
  const int64_t n = a.n;
  const T* x = static_cast<const T*>(a.x);
  float* pooled = a.part + n * splits * c;  // [n, c]
  float* hidden = pooled + n * c;           // [n, cr]
  // Units of (image, run of pixels, channel chunk): 256 vectors channels last, a warp's channel first.
  const int chunk = kLast ? kThreads * V : kWarps, chunks = (c + chunk - 1) / chunk;
  for (int64_t u = blockIdx.x; u < n * splits * chunks; u += gridDim.x) {
    const int64_t run = u / chunks;  // image * splits + split
    const int vb = int(u - run * chunks) * (kLast ? kThreads : kWarps);
    const int split = int(run % splits), p0 = split * rows, p1 = min(int(a.spatial), p0 + rows);
    if constexpr (kLast) {
      pool_channels_last<T, V>(x, run / splits, a.spatial, c, vb, p0, p1, a.part + run * c, red);
    } else {
      pool_channels_first<T>(x, run / splits, a.spatial, c, vb, p0, p1, a.part + run * c);
    }
  }
  cg::this_grid().sync();
  mean_of_runs(a.part, pooled, red, n, c, splits, 1.f / float(a.spatial));
  cg::this_grid().sync();
  fc_rows<T, W1, float>(static_cast<const T*>(a.w1), static_cast<const T*>(a.b1), pooled, hidden, n, cr, c, a.act1, a.p1);
  cg::this_grid().sync();
  fc_rows<T, W2, T>(static_cast<const T*>(a.w2), static_cast<const T*>(a.b2), hidden, static_cast<T*>(a.g), n, c, cr,
                    a.act2, a.p2);
}

}  // namespace

bool squeeze_excite_act_ok(Unary op) {
  switch (op) {
    case Unary::kIdentity: case Unary::kRelu: case Unary::kSigmoid: case Unary::kTanh: case Unary::kHardSigmoid:
    case Unary::kHardSwish: case Unary::kSilu: case Unary::kClip: case Unary::kLeakyRelu: case Unary::kGeluErf:
    case Unary::kGeluTanh:
      return true;
    default:
      return false;
  }
}

int squeeze_excite_splits(int64_t c, int64_t spatial, bool channels_last) {
  if (c < 1 || spatial < 1) return 1;
  // About 8k elements a block's unit (32 16-byte loads a thread channels last; a channel first, a
  // warp's 256 pixels), at most 64 runs: the mean adds them up.
  const int64_t per_pixel = channels_last ? std::min<int64_t>(c, 2048) : kWarps;
  int64_t s = std::max<int64_t>(1, std::min<int64_t>(spatial * per_pixel / 8192, std::min<int64_t>(spatial, 64)));
  const int64_t rows = (spatial + s - 1) / s;
  return int((spatial + rows - 1) / rows);  // each run then has at least one pixel
}

size_t squeeze_excite_scratch_bytes(int64_t n, int64_t c, int64_t cr, int splits) {
  return size_t(n * (c * splits + c + cr)) * sizeof(float);
}

namespace {

template <class T>
bool vec_ok(const void* p, int64_t k) {
  return k % (16 / int64_t(sizeof(T))) == 0 && aligned_to(p, 16);
}

// Calls f with the kernel for a's dtype and layout, its vector widths (vec: x's, w1's, w2's 16-byte
// vectors where 1, bit 0, 1 and 2; null: where the pointers allow), and its shared memory.
template <class F>
cudaError_t with_kernel(const SqueezeExciteArgs& a, const int* vec, F&& f) {
  return dispatch_f32ish(a.dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    const bool xv = a.channels_last && (vec ? (*vec & 1) : vec_ok<T>(a.x, a.c));
    const bool w1v = vec ? (*vec & 2) : vec_ok<T>(a.w1, a.c), w2v = vec ? (*vec & 4) : vec_ok<T>(a.w2, a.cr);
    auto pick = [&](auto xw, auto last) -> cudaError_t {
      constexpr int V = decltype(xw)::value;
      constexpr bool L = decltype(last)::value;
      const size_t smem = size_t(kThreads * V) * sizeof(float);
      if (w1v && w2v) return f(squeeze_excite_kernel<T, V, L, kV, kV>, smem);
      if (w1v) return f(squeeze_excite_kernel<T, V, L, kV, 1>, smem);
      if (w2v) return f(squeeze_excite_kernel<T, V, L, 1, kV>, smem);
      return f(squeeze_excite_kernel<T, V, L, 1, 1>, smem);
    };
    if (!a.channels_last) return pick(std::integral_constant<int, 1>{}, std::false_type{});
    return xv ? pick(std::integral_constant<int, kV>{}, std::true_type{}) : pick(std::integral_constant<int, 1>{}, std::true_type{});
  });
}

// Sizes the kernel's 32-bit pixel loops and 64-bit offsets take (compared by division: a malformed
// engine file's sizes must not overflow the checks themselves).
bool bad_args(const SqueezeExciteArgs& a, int splits) {
  return a.n < 1 || a.n > 65535 || a.c < 1 || a.c > kSqueezeExciteMaxC || a.cr < 1 || a.cr > kSqueezeExciteMaxCr ||
         a.spatial < 1 || a.spatial > (INT32_MAX / 2) / a.c || splits < 1 || splits > a.spatial ||
         !squeeze_excite_act_ok(a.act1) || !squeeze_excite_act_ok(a.act2);
}

}  // namespace

int squeeze_excite_blocks(const SqueezeExciteArgs& a, int splits) {
  if (bad_args(a, splits)) return 0;
  // The fewest resident blocks of any form the launch may take (it picks by the pointers' alignment).
  int per_sm = INT32_MAX, dev = 0, sms = 0;
  cudaError_t e = cudaSuccess;
  for (int vec = 0; vec < 8 && e == cudaSuccess; ++vec) {
    e = with_kernel(a, &vec, [&](auto kern, size_t smem) {
      int fit = 0;
      const cudaError_t r = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kern, kThreads, smem);
      per_sm = std::min(per_sm, fit);
      return r;
    });
  }
  if (e != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // As many blocks as the widest phase has work for (pooling units, 32 means a block, or at most a
  // warp per row of either layer), at most what fits at once.
  const int64_t chunk = a.channels_last ? kThreads * (16 / dt_size(a.dt)) : kWarps;  // the kernel's channel chunk
  const int64_t want = std::max<int64_t>(std::max<int64_t>(a.n * splits * ((a.c + chunk - 1) / chunk), a.n * ((a.c + 31) / 32)),
                                         (a.n * std::max(a.c, a.cr) + kWarps - 1) / kWarps);
  return int(std::min<int64_t>(want, int64_t(per_sm) * sms));
}

cudaError_t squeeze_excite(const SqueezeExciteArgs& a, int splits, int blocks, cudaStream_t s) {
  if (bad_args(a, splits) || blocks < 1 || !a.part) return cudaErrorInvalidValue;
  const int rows = int((a.spatial + splits - 1) / splits);
  if ((a.spatial + rows - 1) / rows != splits) return cudaErrorInvalidValue;  // a run without pixels
  return with_kernel(a, nullptr, [&](auto kern, size_t smem) {
    return launch_cooperative(kern, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), smem, s, a, splits, rows);
  });
}

}  // namespace kiln::cuda::k
