// GroupNormalization and InstanceNormalization (a group per channel) over NCHW-ordered x viewed as
// [n, c, spatial]: each (batch, group) row of (c / groups) * spatial values is normalized with its
// own mean and variance, then scaled and shifted per channel, then optionally activated.
//
// Rows are few and long in the models that use it (a diffusion UNet: 32 groups, 10^4..10^5 values
// per row), so one block per row would leave most SMs idle. Statistics are computed in three
// launches: every block takes one chunk of one row and writes the chunk's count, mean and sum of
// squared deviations (two passes over the chunk, the second from L2); one thread per row merges
// the chunks (Chan et al.'s pairwise update, stable where sum/sum-of-squares cancels); an
// elementwise pass applies the row's statistics with the channel's scale and shift. All math in f32.
// NHWC inputs (a convolution's output in half builds) have their own statistics kernel, and a path
// in one cooperative launch (group_norm_one_kernel).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

constexpr int kChunk = 8192;  // values per statistics block
constexpr int kStatBlock = 256;

struct Partial {
  float n, mean, m2;
};

// xb: the optional input bias (GroupNormArgs::x_bias), bstride elements per image.
template <class T>
__global__ void group_stats_kernel(const T* __restrict__ x, const T* __restrict__ xb, int64_t bstride, int64_t groups,
                                   int64_t per, int64_t spatial, int64_t chunks, Partial* __restrict__ out) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x, chunk = blockIdx.y, row_len = per * spatial;
  const int64_t begin = chunk * kChunk, end = begin + kChunk < row_len ? begin + kChunk : row_len;
  const T* xr = x + row * row_len;
  const T* br = xb ? xb + (row / groups) * bstride + (row % groups) * per : nullptr;  // the row's first channel
  auto value = [&](int64_t i) { return br ? to_f(xr[i]) + to_f(br[i / spatial]) : to_f(xr[i]); };
  float sum = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) sum += value(i);
  const float cnt = static_cast<float>(end - begin);
  const float mean = group_reduce<kStatBlock, false>(sum, smem) / cnt;
  float sq = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float d = value(i) - mean;
    sq += d * d;
  }
  const float m2 = group_reduce<kStatBlock, false>(sq, smem);
  if (threadIdx.x == 0) out[row * chunks + chunk] = Partial{cnt, mean, m2};
}

// Chan et al.'s pairwise update of (count, mean, M2) a with b; empty parts leave a as it is.
__device__ __forceinline__ Partial chan_merge(Partial a, Partial b) {
  const float tot = a.n + b.n;
  if (b.n == 0.f) return a;
  if (a.n == 0.f) return b;
  const float d = b.mean - a.mean;
  return Partial{tot, a.mean + d * (b.n / tot), a.m2 + b.m2 + d * d * (a.n * b.n / tot)};
}

// stats[row] = (mean, 1 / sqrt(var + eps)): a warp per row, lane l merging chunks l, l + 32, ...,
// then the lanes' results in a butterfly. Fixed order, so a forward gives the same bits every run.
__global__ void group_merge_kernel(const Partial* __restrict__ parts, int64_t rows, int64_t chunks, float eps,
                                   float2* __restrict__ stats) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    Partial acc{0.f, 0.f, 0.f};
    for (int64_t c = lane; c < chunks; c += 32) acc = chan_merge(acc, parts[r * chunks + c]);
    for (int off = 16; off > 0; off /= 2) {
      const Partial o{__shfl_xor_sync(0xffffffffu, acc.n, off), __shfl_xor_sync(0xffffffffu, acc.mean, off),
                      __shfl_xor_sync(0xffffffffu, acc.m2, off)};
      // Both lanes of a pair merge in the same order (lower lane first): identical results.
      acc = (lane & off) ? chan_merge(o, acc) : chan_merge(acc, o);
    }
    if (lane == 0) stats[r] = make_float2(acc.mean, rsqrtf(fmaxf(acc.m2 / acc.n, 0.f) + eps));
  }
}

// Enough warps for `rows` rows (one each), in kBlock-thread blocks.
unsigned merge_blocks(int64_t rows) {
  const int64_t per_block = kBlock / 32, blocks = (rows + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

__device__ __forceinline__ float activate(float v, int act) {
  switch (act) {
    case 1: return fmaxf(v, 0.f);                  // Relu
    case 2: return __fdividef(v, 1.f + __expf(-v));  // SiLU (x * sigmoid(x)); 0 where exp overflows
    default: return v;
  }
}

template <class U, class T>
__global__ void group_apply_kernel(const T* __restrict__ x, const T* __restrict__ xb, int64_t bstride,
                                   const float2* __restrict__ stats, const float* __restrict__ scale,
                                   const float* __restrict__ shift, T* __restrict__ y, int64_t c, int64_t per_group,
                                   int64_t spatial, int64_t total, int act) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const U ch_all = static_cast<U>(i) / static_cast<U>(spatial);  // n * c + ch
    const U ch = ch_all % static_cast<U>(c), nb = ch_all / static_cast<U>(c);
    const float2 s = stats[static_cast<int64_t>(nb) * (c / per_group) + static_cast<int64_t>(ch / static_cast<U>(per_group))];
    const float xv = xb ? to_f(x[i]) + to_f(xb[static_cast<int64_t>(nb) * bstride + ch]) : to_f(x[i]);
    const float v = (xv - s.x) * s.y * scale[ch] + shift[ch];
    y[i] = from_f<T>(activate(v, act));
  }
}

// NHWC: x is [n, spatial, c], a group's values are strided runs of c / groups channels. A block takes
// `pixels` pixels of one image (group_norm_nhwc_pixels: 256, fewer where that would leave SMs idle).
// Its threads form rows of `slots` threads, each thread a vector of V channels (16 bytes where c
// allows), each row every rows-th pixel: one pass, coalesced 16-byte loads. A thread keeps a sum and
// sum of squares per channel shifted by the first value it read (the shifted-data algorithm: no
// cancellation when the mean is far from zero), turns them into (mean, M2) in shared memory, and
// the block folds rows into channels and channels into groups: the group's partial, stored where
// the NCHW kernel stores them (row = image * groups + group), so one merge serves both. Fixed order throughout (no atomics): a forward gives the same bits every run.
constexpr int64_t kPixels = 256, kMinPixels = 32;  // pixels per statistics block
constexpr int kNhwcThreads = 256, kOneThreads = 512;

template <class T>
constexpr int vec_width() { return int(16 / sizeof(T)); }

// Threads per pixel row of a statistics block, and rows per block.
__host__ __device__ inline int nhwc_slots(int64_t vectors) { return vectors < kNhwcThreads ? int(vectors) : kNhwcThreads; }

template <class T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = to_f(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) f[j] = to_f(p[j]);
  }
}

template <class T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int j = 0; j < V; ++j) e[j] = from_f<T>(f[j]);
    *reinterpret_cast<uint4*>(p) = u;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) p[j] = from_f<T>(f[j]);
  }
}

// The input bias (GroupNormArgs::x_bias) of an image's V channels from ch0, or zeros.
template <class T, int V>
__device__ __forceinline__ void load_bias(const T* xb, int64_t bstride, int64_t nb, int64_t ch0, float (&b)[V]) {
#pragma unroll
  for (int j = 0; j < V; ++j) b[j] = xb ? to_f(xb[nb * bstride + ch0 + j]) : 0.f;
}

template <class T, int V>
__global__ void __launch_bounds__(kNhwcThreads) group_stats_nhwc_kernel(const T* __restrict__ x, const T* __restrict__ xb,
                                                                        int64_t bstride, int64_t spatial,
                                                                        int64_t c, int64_t groups, int64_t chunks,
                                                                        int64_t pixels, Partial* __restrict__ out) {
  extern __shared__ float sh[];  // [rows][c] means, then [rows][c] M2s
  const int64_t vectors = c / V;
  const int slots = nhwc_slots(vectors), rows = kNhwcThreads / slots;
  const int row = int(threadIdx.x) / slots, slot0 = int(threadIdx.x) % slots;
  const int64_t nb = blockIdx.y, chunk = blockIdx.x;
  const int64_t p0 = chunk * pixels, p1 = p0 + pixels < spatial ? p0 + pixels : spatial;
  const T* xi = x + nb * spatial * c;
  float* smean = sh;
  float* sm2 = sh + int64_t(rows) * c;
  // Row r takes pixels p0 + r, p0 + r + rows, ...: q of them, one more for the first rem rows.
  const int q = int((p1 - p0) / rows), rem = int((p1 - p0) % rows);
  auto row_count = [&](int r) { return float(q + (r < rem ? 1 : 0)); };
  if (row < rows) {
    const float cnt = row_count(row);
    for (int64_t s = slot0; s < vectors; s += slots) {
      float k[V], sum[V], sq[V], b[V];
      load_bias<T, V>(xb, bstride, nb, s * V, b);
#pragma unroll
      for (int j = 0; j < V; ++j) k[j] = sum[j] = sq[j] = 0.f;
      if (p0 + row < p1) load_vec<T, V>(xi + (p0 + row) * c + s * V, k);
      for (int64_t p = p0 + row; p < p1; p += rows) {
        float v[V];
        load_vec<T, V>(xi + p * c + s * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = v[j] - k[j];  // the bias cancels: shifted by the first value, biased alike
          sum[j] += d;
          sq[j] += d * d;
        }
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t ch = s * V + j;
        smean[row * c + ch] = cnt > 0.f ? k[j] + b[j] + sum[j] / cnt : 0.f;
        sm2[row * c + ch] = cnt > 0.f ? fmaxf(sq[j] - sum[j] * sum[j] / cnt, 0.f) : 0.f;
      }
    }
  }
  __syncthreads();
  // Rows into channels, then channels into groups, each as a sum over equal-weight parts: the mean
  // of the parts' means weighted by their counts, and M2 = sum of (M2_i + n_i (mean_i - mean)^2),
  // deviations from the merged mean (no cancellation), one division per merge.
  const float block_n = float(p1 - p0);
  for (int64_t ch = threadIdx.x; ch < c; ch += blockDim.x) {
    float sum = 0.f;
    for (int r = 0; r < rows; ++r) sum += row_count(r) * smean[r * c + ch];
    const float mean = sum / block_n;
    float m2 = 0.f;
    for (int r = 0; r < rows; ++r) {
      const float d = smean[r * c + ch] - mean;
      m2 += sm2[r * c + ch] + row_count(r) * d * d;
    }
    smean[ch] = mean;  // row 0's slots: only this thread reads channel ch's
    sm2[ch] = m2;
  }
  __syncthreads();
  const int64_t per = c / groups;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    float sum = 0.f;
    for (int64_t ch = g * per; ch < (g + 1) * per; ++ch) sum += smean[ch];
    const float mean = sum / float(per);
    float m2 = 0.f;
    for (int64_t ch = g * per; ch < (g + 1) * per; ++ch) {
      const float d = smean[ch] - mean;
      m2 += sm2[ch] + block_n * d * d;
    }
    out[(nb * groups + g) * chunks + chunk] = Partial{block_n * float(per), mean, m2};
  }
}

// y = act((x - mean) * inv_std * scale + shift), a vector of V channels per thread.
template <class U, class T, int V>
__global__ void group_apply_nhwc_kernel(const T* __restrict__ x, const T* __restrict__ xb, int64_t bstride,
                                        const float2* __restrict__ stats, const float* __restrict__ scale,
                                        const float* __restrict__ shift, T* __restrict__ y, int64_t c, int64_t per_group,
                                        int64_t spatial, int64_t vectors_total, int act) {
  const U vectors = static_cast<U>(c / V), per = static_cast<U>(per_group);
  for (int64_t i = global_tid(); i < vectors_total; i += global_threads()) {
    const U slot = static_cast<U>(i) % vectors, nb = static_cast<U>(i) / vectors / static_cast<U>(spatial);
    const float2* st = stats + static_cast<int64_t>(nb) * (c / per_group);
    float v[V], b[V];
    load_vec<T, V>(x + i * V, v);
    load_bias<T, V>(xb, bstride, nb, static_cast<int64_t>(slot) * V, b);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const U ch = slot * V + j;
      const float2 s = st[ch / per];
      v[j] = activate((v[j] + b[j] - s.x) * s.y * scale[ch] + shift[ch], act);
    }
    store_vec<T, V>(y + i * V, v);
  }
}

// The whole normalization in one cooperative launch, for channel vectors that fit one block
// (c / V <= kOneThreads): `b` blocks per image (grid b x n, all resident at once), block r taking an
// equal share of the image's pixels. A thread keeps one vector slot (V channels) and walks its
// pixels with a stride of `lanes` pixels, so its channels, scale and shift never change and the
// loops divide nothing. One pass gives each block's per-group sums of (v - K) and (v - K)^2, K the
// group's first value in the image (the shifted-data method: no cancellation where the mean is far
// from zero, and sums that merge by adding); after a grid barrier every block adds the image's b
// partials for each group in a fixed order (the same bits in every block and every run), and
// normalizes its pixels, re-read from L1/L2. One shift per group, not the three-launch path's
// pairwise (Chan) merges: the variance cancels only where the group's first value lies many
// standard deviations from its mean. The build times it against the three launches per shape
// (lower_norm.cc; bench/RESULTS.md, thirty-seventh session, also for the designs that lost).
// kResident: every thread has at most two pixels (a small image, or many blocks), which stay in its
// registers from the statistics to the output; otherwise it walks its pixels again, four loads at a time.
template <class T, int V, bool kResident>
__global__ void __launch_bounds__(kOneThreads) group_norm_one_kernel(const T* __restrict__ x, const T* __restrict__ xb,
                                                                     int64_t bstride, const float* __restrict__ scale,
                                                                     const float* __restrict__ shift, T* __restrict__ y,
                                                                     int spatial, int c, int groups, float eps, int act,
                                                                     float2* __restrict__ parts) {
  namespace cg = cooperative_groups;
  extern __shared__ float sh[];  // s1[lanes][c], s2[lanes][c], then per group: mean, inv_std
  // Offsets inside one image are 32-bit (the host checks spatial * c < 2^31): the kernel is short,
  // and its time at batch 1 goes to its instruction count (bench/RESULTS.md, forty-first session).
  const int nblk = int(gridDim.x), r = int(blockIdx.x);
  const int vectors = c / V, lanes = kOneThreads / vectors;  // lanes >= 1 (the host checks)
  const int tid = int(threadIdx.x), slot = tid % vectors, lane = tid / vectors;
  const bool active = lane < lanes;
  const int share = (spatial + nblk - 1) / nblk;
  const int p0 = min(r * share, spatial), p1 = min(p0 + share, spatial);
  const int per = c / groups;
  // A channel's group without an integer division: exact for channels below 2^22 (c <= 4096 here).
  const float inv_per = 1.f / float(per);
  auto group_of = [&](int ch) { return int((float(ch) + 0.5f) * inv_per); };
  float* s1 = sh;
  float* s2 = s1 + lanes * c;
  float* mean = s2 + lanes * c;
  float* inv = mean + groups;
  const int64_t image = int64_t(blockIdx.y) * spatial * c;
  const T* xi = x + image;
  const T* xs = xi + slot * V;
  T* yb = y + image + slot * V;
  float2* pi = parts + int64_t(blockIdx.y) * nblk * groups;  // [block][group] of this image
  const T* bi = xb ? xb + blockIdx.y * bstride : nullptr;    // this image's input bias
  auto first = [&](int g) { return to_f(xi[g * per]) + (bi ? to_f(bi[g * per]) : 0.f); };  // K, biased too
  float bv[V], sc[V], sf[V];  // the input bias, scale and shift of this thread's channels, read up front
  load_bias<T, V>(xb, bstride, blockIdx.y, int64_t(slot) * V, bv);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sc[j] = scale[slot * V + j];
    sf[j] = shift[slot * V + j];
  }

  // f(pixel, its V values + bias) for each of this thread's pixels, kBatch loads issued before the
  // first use; a resident thread's (at most two) are loaded once and kept.
  constexpr int kBatch = kResident ? 2 : 4;
  float held[kBatch][V];
  auto load = [&](int p, float(&v)[kBatch][V]) {
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (p + u * lanes < p1) {
        load_vec<T, V>(xs + (p + u * lanes) * c, v[u]);
#pragma unroll
        for (int j = 0; j < V; ++j) v[u][j] += bv[j];
      }
    }
  };
  if (kResident) load(p0 + lane, held);
  auto walk = [&](auto f) {
    for (int p = p0 + lane; p < p1; p += kBatch * lanes) {
      if (!kResident) load(p, held);
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (p + u * lanes < p1) f(p + u * lanes, held[u]);
      }
      if (kResident) break;
    }
  };

  float kv[V], a1[V], a2[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    kv[j] = first(group_of(slot * V + j));  // K: the group's first value in the image
    a1[j] = a2[j] = 0.f;
  }
  if (active) {
    walk([&](int, const float(&v)[V]) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float d = v[j] - kv[j];
        a1[j] += d;
        a2[j] += d * d;
      }
    });
  }
  // Lanes of one warp that share a slot (32 / vectors of them where that divides) add with
  // shuffles first (both lanes of a pair get the same sum): a row per warp goes to shared memory.
  const bool in_warp = vectors < 32 && 32 % vectors == 0;
  if (in_warp) {
    for (int off = vectors; off < 32; off *= 2) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float o1 = __shfl_xor_sync(0xffffffffu, a1[j], off), o2 = __shfl_xor_sync(0xffffffffu, a2[j], off);
        a1[j] += o1;
        a2[j] += o2;
      }
    }
  }
  const int row = in_warp ? tid / 32 : lane, stored = in_warp ? kOneThreads / 32 : lanes;
  if (active && (!in_warp || (tid & 31) < vectors)) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      s1[row * c + slot * V + j] = a1[j];
      s2[row * c + slot * V + j] = a2[j];
    }
  }
  __syncthreads();
  for (int rows = stored; rows > 1;) {  // rows [half, rows) onto [0, rows - half), a tree
    const int half = (rows + 1) / 2;
    for (int i = tid; i < (rows - half) * c; i += kOneThreads) {
      s1[i] += s1[half * c + i];
      s2[i] += s2[half * c + i];
    }
    __syncthreads();
    rows = half;
  }
  // Channels into groups: by shuffles where a group's channels share a warp (a power of two of
  // them, up to 32), else a thread per group.
  if ((per & (per - 1)) == 0 && per <= 32) {
    for (int ch0 = 0; ch0 < c; ch0 += kOneThreads) {
      const int ch = ch0 + tid;
      float t1 = ch < c ? s1[ch] : 0.f, t2 = ch < c ? s2[ch] : 0.f;
      for (int off = 1; off < per; off *= 2) {
        t1 += __shfl_xor_sync(0xffffffffu, t1, off);
        t2 += __shfl_xor_sync(0xffffffffu, t2, off);
      }
      if (ch < c && ch % per == 0) {
        pi[r * groups + ch / per] = make_float2(t1, t2);
        mean[ch / per] = first(ch / per);  // K, read before any block writes y; the mean once merged
      }
    }
  } else {
    for (int g = tid; g < groups; g += kOneThreads) {
      float t1 = 0.f, t2 = 0.f;
      for (int ch = g * per; ch < (g + 1) * per; ++ch) {
        t1 += s1[ch];
        t2 += s2[ch];
      }
      pi[r * groups + g] = make_float2(t1, t2);
      mean[g] = first(g);
    }
  }
  cg::this_grid().sync();  // also this block's barrier: mean[] holds every group's K
  // A group's b partials: 16 lanes of a warp each add every 16th, then a butterfly.
  constexpr int kSub = 16;
  const int sub = tid % kSub;
  const float rcount = 1.f / (float(spatial) * float(per));
  for (int g0 = 0; g0 < groups; g0 += kOneThreads / kSub) {
    const int g = g0 + tid / kSub;
    float t1 = 0.f, t2 = 0.f;
    if (g < groups) {
#pragma unroll 4
      for (int i = sub; i < nblk; i += kSub) {
        const float2 q = pi[i * groups + g];
        t1 += q.x;
        t2 += q.y;
      }
    }
    for (int off = 1; off < kSub; off *= 2) {
      t1 += __shfl_xor_sync(0xffffffffu, t1, off);
      t2 += __shfl_xor_sync(0xffffffffu, t2, off);
    }
    if (g < groups && sub == 0) {
      const float m = t1 * rcount;
      mean[g] += m;
      inv[g] = rsqrtf(fmaxf(t2 * rcount - m * m, 0.f) + eps);
    }
  }
  __syncthreads();
  if (!active) return;
  float ka[V], kb[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int g = group_of(slot * V + j);
    ka[j] = sc[j] * inv[g];
    kb[j] = sf[j] - mean[g] * ka[j];
  }
  // The activation chosen once, outside the per-value loop.
  auto apply = [&](auto fn) {
    walk([&](int p, const float(&v)[V]) {
      float o[V];
#pragma unroll
      for (int j = 0; j < V; ++j) o[j] = fn(v[j] * ka[j] + kb[j]);
      store_vec<T, V>(yb + p * c, o);
    });
  };
  if (act == 2) {
    apply([](float v) { return activate(v, 2); });
  } else if (act == 1) {
    apply([](float v) { return activate(v, 1); });
  } else {
    apply([](float v) { return v; });
  }
}

}  // namespace

int64_t group_norm_nhwc_pixels(int64_t n, int64_t spatial, int64_t target_blocks) {
  if (n < 1 || spatial < 1 || target_blocks < 1) return kPixels;
  const int64_t want = (n * spatial + target_blocks - 1) / target_blocks;
  return want < kMinPixels ? kMinPixels : want > kPixels ? kPixels : want;
}

size_t group_norm_nhwc_smem(DT dt, int64_t c) {
  const int v = dt == DT::kF32 ? vec_width<float>() : vec_width<__half>();
  const int64_t vectors = c % v == 0 ? c / v : c;
  return size_t(2 * (kNhwcThreads / nhwc_slots(vectors)) * c) * sizeof(float);
}

namespace {

// The one-launch kernel's shared memory for vectors of v channels: the two row-sum tables, then
// each group's mean and 1 / std.
size_t one_smem(int v, int64_t c, int64_t groups) {
  return size_t(2 * int64_t(kOneThreads / (c / v)) * c + 2 * groups) * sizeof(float);
}

// The one-launch kernel for dt's vector width (16 bytes where c and the pointers allow): launched
// cooperatively (grid b x n), or with `blocks` set to how many of its blocks fit the GPU at once.
cudaError_t run_one(const GroupNormArgs& a, int b, cudaStream_t s, int* blocks = nullptr) {
  const int64_t c = a.c, groups = a.groups;
  return dispatch_f32ish(a.dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    constexpr int kV = vec_width<T>();
    const bool aligned = c % kV == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
    // Resident where each thread has at most two pixels (a small image).
    auto resident = [&](int v) {
      const int64_t lanes = kOneThreads / std::max<int64_t>(c / v, 1);
      return b >= 1 && (a.spatial + b - 1) / b <= 2 * lanes;
    };
    auto go = [&](auto width, auto batch) -> cudaError_t {
      constexpr int V = decltype(width)::value;
      const size_t smem = one_smem(V, c, groups);
      if (c / V > kOneThreads || smem > 48 * 1024 || a.spatial * c > INT32_MAX) return cudaErrorInvalidValue;
      auto* kern = group_norm_one_kernel<T, V, decltype(batch)::value>;  // the non-resident form where probing
      if (blocks) {  // the fewer of both batch widths' resident blocks: either may run
        int per_sm = 0, per_sm2 = 0, dev = 0, sms = 0;
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, kOneThreads, smem);
        if (e == cudaSuccess) {
          e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm2, group_norm_one_kernel<T, V, true>, kOneThreads, smem);
        }
        if (e == cudaSuccess) e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        *blocks = e == cudaSuccess ? std::min(per_sm, per_sm2) * sms : 0;
        return e;
      }
      return launch_cooperative(kern, dim3(static_cast<unsigned>(b), static_cast<unsigned>(a.n)), dim3(kOneThreads), smem, s,
                                static_cast<const T*>(a.x), static_cast<const T*>(a.x_bias), a.bias_stride,
                                a.scale, a.shift, static_cast<T*>(a.y), int(a.spatial), int(c), int(groups), a.eps, a.act,
                                static_cast<float2*>(a.scratch));
    };
    using Held = std::true_type;
    using Walked = std::false_type;
    if (aligned) {
      return resident(kV) ? go(std::integral_constant<int, kV>{}, Held{}) : go(std::integral_constant<int, kV>{}, Walked{});
    }
    return resident(1) ? go(std::integral_constant<int, 1>{}, Held{}) : go(std::integral_constant<int, 1>{}, Walked{});
  });
}

}  // namespace

size_t group_norm_nhwc_scratch_bytes(int64_t n, int64_t groups, int64_t spatial, int64_t pixels) {
  if (groups <= 0 || pixels < 1) return 0;
  const int64_t chunks = (spatial + pixels - 1) / pixels;
  return size_t(n * groups) * (sizeof(float2) + size_t(chunks < 1 ? 1 : chunks) * sizeof(Partial));
}

namespace {

bool bad_args(const GroupNormArgs& a) {
  return a.n < 0 || a.c < 0 || a.spatial < 0 || a.groups <= 0 || a.c % a.groups != 0 || a.act < 0 || a.act > 2 ||
         (a.x_bias && a.bias_stride != 0 && a.bias_stride != a.c);
}

}  // namespace

cudaError_t group_norm_nhwc(const GroupNormArgs& a, int64_t pixels, cudaStream_t s) {
  if (bad_args(a) || pixels < 1) return cudaErrorInvalidValue;
  const int64_t n = a.n, c = a.c, groups = a.groups, spatial = a.spatial;
  if (n == 0 || spatial == 0 || c == 0) return cudaSuccess;
  const int64_t chunks = (spatial + pixels - 1) / pixels, rows = n * groups;
  const size_t smem = group_norm_nhwc_smem(a.dt, c);
  if (chunks > 0x7fffffff || n > 65535 || smem > 48 * 1024) return cudaErrorInvalidValue;
  auto* stats = static_cast<float2*>(a.scratch);
  auto* parts = reinterpret_cast<Partial*>(stats + rows);
  return dispatch_f32ish(a.dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto run = [&](auto width) {
      constexpr int V = decltype(width)::value;
      const auto* xt = static_cast<const T*>(a.x);
      const auto* xb = static_cast<const T*>(a.x_bias);
      group_stats_nhwc_kernel<T, V><<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(n)), kNhwcThreads, smem, s>>>(
          xt, xb, a.bias_stride, spatial, c, groups, chunks, pixels, parts);
      group_merge_kernel<<<merge_blocks(rows), kBlock, 0, s>>>(parts, rows, chunks, a.eps, stats);
      const int64_t vectors = n * spatial * (c / V);
      if (fits_u32(vectors * V)) {
        group_apply_nhwc_kernel<uint32_t, T, V><<<grid_for(vectors), kBlock, 0, s>>>(
            xt, xb, a.bias_stride, stats, a.scale, a.shift, static_cast<T*>(a.y), c, c / groups, spatial, vectors, a.act);
      } else {
        group_apply_nhwc_kernel<uint64_t, T, V><<<grid_for(vectors), kBlock, 0, s>>>(
            xt, xb, a.bias_stride, stats, a.scale, a.shift, static_cast<T*>(a.y), c, c / groups, spatial, vectors, a.act);
      }
      return cudaGetLastError();
    };
    // 16-byte vectors where every pixel's channels start on a 16-byte boundary.
    constexpr int kV = vec_width<T>();
    const bool aligned = c % kV == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
    return aligned ? run(std::integral_constant<int, kV>{}) : run(std::integral_constant<int, 1>{});
  });
}

int group_norm_nhwc_one_blocks(DT dt, int64_t n, int64_t c, int64_t groups, int64_t spatial) {
  if (n < 1 || c < 1 || groups < 1 || c % groups != 0 || spatial < 1 || n > 65535) return 0;
  int fit = 0;
  // Null pointers are aligned: the widest vectors, as an aligned run takes them (an unaligned one
  // needs no more room).
  if (run_one(group_norm_shape(dt, n, c, groups, spatial), 0, nullptr, &fit) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // One block per SM where the batch allows (more would add to the barrier and the merge, not to
  // the bandwidth), as many as fit where the images outnumber the SMs.
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const int64_t total = n <= sms && sms < fit ? sms : fit;
  const int64_t b = total / n < spatial ? total / n : spatial;
  return int(b);
}

size_t group_norm_nhwc_one_scratch_bytes(int64_t n, int64_t groups, int b) { return size_t(n * groups * b) * sizeof(float2); }

cudaError_t group_norm_nhwc_one_launch(const GroupNormArgs& a, int b, cudaStream_t s) {
  if (bad_args(a) || b < 1 || a.n > 65535) return cudaErrorInvalidValue;
  if (a.n == 0 || a.spatial == 0 || a.c == 0) return cudaSuccess;
  const cudaError_t e = run_one(a, b, s);
  return e != cudaSuccess ? e : cudaGetLastError();
}

size_t group_norm_scratch_bytes(int64_t n, int64_t c, int64_t groups, int64_t spatial) {
  if (groups <= 0) return 0;
  const int64_t rows = n * groups, row_len = (c / groups) * spatial;
  const int64_t chunks = (row_len + kChunk - 1) / kChunk;
  return size_t(rows) * (sizeof(float2) + size_t(chunks < 1 ? 1 : chunks) * sizeof(Partial));
}

cudaError_t group_norm(const GroupNormArgs& a, cudaStream_t s) {
  if (bad_args(a)) return cudaErrorInvalidValue;
  const int64_t c = a.c, groups = a.groups, spatial = a.spatial, per = c / groups;
  const int64_t rows = a.n * groups, row_len = per * spatial;
  if (rows == 0 || row_len == 0) return cudaSuccess;
  const int64_t chunks = (row_len + kChunk - 1) / kChunk;
  if (chunks > 65535 || rows > 0x7fffffff) return cudaErrorInvalidValue;  // grid.y and grid.x limits
  auto* stats = static_cast<float2*>(a.scratch);
  auto* parts = reinterpret_cast<Partial*>(stats + rows);
  return dispatch_f32ish(a.dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* xt = static_cast<const T*>(a.x);
    const auto* xb = static_cast<const T*>(a.x_bias);
    group_stats_kernel<T><<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(chunks)), kStatBlock, 0, s>>>(
        xt, xb, a.bias_stride, groups, per, spatial, chunks, parts);
    group_merge_kernel<<<merge_blocks(rows), kBlock, 0, s>>>(parts, rows, chunks, a.eps, stats);
    const int64_t total = rows * row_len;
    if (fits_u32(total)) {
      group_apply_kernel<uint32_t, T><<<grid_for(total), kBlock, 0, s>>>(xt, xb, a.bias_stride, stats, a.scale, a.shift,
                                                                        static_cast<T*>(a.y), c, per, spatial, total, a.act);
    } else {
      group_apply_kernel<uint64_t, T><<<grid_for(total), kBlock, 0, s>>>(xt, xb, a.bias_stride, stats, a.scale, a.shift,
                                                                        static_cast<T*>(a.y), c, per, spatial, total, a.act);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
