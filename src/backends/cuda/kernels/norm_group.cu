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
// NHWC inputs (a convolution's output in half builds) have their own statistics kernel.
#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

constexpr int kChunk = 8192;  // values per statistics block
constexpr int kStatBlock = 256;

struct Partial {
  float n, mean, m2;
};

template <class T>
__global__ void group_stats_kernel(const T* __restrict__ x, int64_t row_len, int64_t chunks, Partial* __restrict__ out) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x, chunk = blockIdx.y;
  const int64_t begin = chunk * kChunk, end = begin + kChunk < row_len ? begin + kChunk : row_len;
  const T* xr = x + row * row_len;
  float sum = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) sum += to_f(xr[i]);
  const float cnt = static_cast<float>(end - begin);
  const float mean = group_reduce<kStatBlock, false>(sum, smem) / cnt;
  float sq = 0.f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float d = to_f(xr[i]) - mean;
    sq += d * d;
  }
  const float m2 = group_reduce<kStatBlock, false>(sq, smem);
  if (threadIdx.x == 0) out[row * chunks + chunk] = Partial{cnt, mean, m2};
}

// stats[row] = (mean, 1 / sqrt(var + eps)).
__global__ void group_merge_kernel(const Partial* __restrict__ parts, int64_t rows, int64_t chunks, float eps,
                                   float2* __restrict__ stats) {
  for (int64_t r = global_tid(); r < rows; r += global_threads()) {
    float n = 0.f, mean = 0.f, m2 = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
      const Partial p = parts[r * chunks + c];
      const float tot = n + p.n, d = p.mean - mean;
      mean += d * (p.n / tot);
      m2 += p.m2 + d * d * (n * p.n / tot);
      n = tot;
    }
    const float var = fmaxf(m2 / n, 0.f);
    stats[r] = make_float2(mean, rsqrtf(var + eps));
  }
}

__device__ __forceinline__ float activate(float v, int act) {
  switch (act) {
    case 1: return fmaxf(v, 0.f);                  // Relu
    case 2: return v / (1.f + __expf(-v));          // SiLU (x * sigmoid(x))
    default: return v;
  }
}

template <class U, class T>
__global__ void group_apply_kernel(const T* __restrict__ x, const float2* __restrict__ stats, const float* __restrict__ scale,
                                   const float* __restrict__ shift, T* __restrict__ y, int64_t c, int64_t per_group,
                                   int64_t spatial, int64_t total, int act) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const U ch_all = static_cast<U>(i) / static_cast<U>(spatial);  // n * c + ch
    const U ch = ch_all % static_cast<U>(c), nb = ch_all / static_cast<U>(c);
    const float2 s = stats[static_cast<int64_t>(nb) * (c / per_group) + static_cast<int64_t>(ch / static_cast<U>(per_group))];
    const float v = (to_f(x[i]) - s.x) * s.y * scale[ch] + shift[ch];
    y[i] = from_f<T>(activate(v, act));
  }
}

// NHWC: x is [n, spatial, c], a group's values are strided runs of c / groups channels. A block takes
// `pixels` pixels of one image: threadIdx.x walks channels (coalesced), threadIdx.y pixels; the
// per-channel sums land in shared memory and fold into per-group (count, mean, M2) partials,
// stored where the NCHW kernel stores them (row = image * groups + group), so one merge serves both.
constexpr int64_t kPixels = 256;  // pixels per statistics block

template <class T>
__global__ void group_stats_nhwc_kernel(const T* __restrict__ x, int64_t spatial, int64_t c, int64_t groups,
                                        int64_t chunks, int64_t pixels, Partial* __restrict__ out) {
  // [blockDim.y * c] per-thread-row sums, [c] per-channel sums, [groups] group means. The sums are
  // folded in a fixed order (no atomics), so a forward gives the same bits every run.
  extern __shared__ float sh[];
  const int64_t rows = blockDim.y;
  float* part = sh;
  float* ch = sh + rows * c;
  float* gmean = ch + c;
  const int64_t nb = blockIdx.y, chunk = blockIdx.x;
  const int64_t p0 = chunk * pixels, p1 = p0 + pixels < spatial ? p0 + pixels : spatial;
  const T* xb = x + nb * spatial * c;
  const int64_t per = c / groups;
  const float cnt = static_cast<float>((p1 - p0) * per);
  const int64_t tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = int64_t(blockDim.x) * blockDim.y;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t k = threadIdx.x; k < c; k += blockDim.x) {
      const float m = pass == 0 ? 0.f : gmean[k / per];
      float acc = 0.f;
      for (int64_t p = p0 + threadIdx.y; p < p1; p += blockDim.y) {
        const float v = to_f(xb[p * c + k]);
        acc += pass == 0 ? v : (v - m) * (v - m);
      }
      part[threadIdx.y * c + k] = acc;
    }
    __syncthreads();
    for (int64_t k = tid; k < c; k += nthreads) {
      float sum = 0.f;
      for (int64_t r = 0; r < rows; ++r) sum += part[r * c + k];
      ch[k] = sum;
    }
    __syncthreads();
    for (int64_t g = tid; g < groups; g += nthreads) {
      float sum = 0.f;
      for (int64_t k = g * per; k < (g + 1) * per; ++k) sum += ch[k];
      if (pass == 0) {
        gmean[g] = sum / cnt;
      } else {
        out[(nb * groups + g) * chunks + chunk] = Partial{cnt, gmean[g], sum};
      }
    }
    __syncthreads();
  }
}

template <class U, class T>
__global__ void group_apply_nhwc_kernel(const T* __restrict__ x, const float2* __restrict__ stats,
                                        const float* __restrict__ scale, const float* __restrict__ shift, T* __restrict__ y,
                                        int64_t c, int64_t per_group, int64_t image, int64_t total, int act) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const U ch = static_cast<U>(i) % static_cast<U>(c), nb = static_cast<U>(i) / static_cast<U>(image);
    const float2 s = stats[static_cast<int64_t>(nb) * (c / per_group) + static_cast<int64_t>(ch / static_cast<U>(per_group))];
    const float v = (to_f(x[i]) - s.x) * s.y * scale[ch] + shift[ch];
    y[i] = from_f<T>(activate(v, act));
  }
}

}  // namespace

int64_t group_norm_nhwc_blocks(int64_t n, int64_t spatial) { return n * ((spatial + kPixels - 1) / kPixels); }

size_t group_norm_nhwc_smem(int64_t c, int64_t groups) {
  const int64_t rows = 256 / (c >= 128 ? 128 : (c >= 64 ? 64 : 32));
  return size_t((rows + 1) * c + groups) * sizeof(float);
}

size_t group_norm_nhwc_scratch_bytes(int64_t n, int64_t c, int64_t groups, int64_t spatial) {
  if (groups <= 0) return 0;
  const int64_t chunks = (spatial + kPixels - 1) / kPixels;
  return size_t(n * groups) * (sizeof(float2) + size_t(chunks < 1 ? 1 : chunks) * sizeof(Partial));
}

cudaError_t group_norm_nhwc(DT dt, const void* x, const float* scale, const float* shift, void* y, int64_t n, int64_t c,
                            int64_t groups, int64_t spatial, float eps, int act, void* scratch, cudaStream_t s) {
  if (n < 0 || c < 1 || spatial < 0 || groups <= 0 || c % groups != 0 || act < 0 || act > 2) return cudaErrorInvalidValue;
  if (n == 0 || spatial == 0) return cudaSuccess;
  const int64_t px = kPixels, chunks = (spatial + px - 1) / px, rows = n * groups;
  const unsigned bx = c >= 128 ? 128u : (c >= 64 ? 64u : 32u);
  const dim3 block(bx, 256u / bx);
  const size_t smem = group_norm_nhwc_smem(c, groups);
  if (chunks > 0x7fffffff || n > 65535 || smem > 48 * 1024) return cudaErrorInvalidValue;
  auto* stats = static_cast<float2*>(scratch);
  auto* parts = reinterpret_cast<Partial*>(stats + rows);
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* xt = static_cast<const T*>(x);
    group_stats_nhwc_kernel<T><<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(n)), block, smem, s>>>(
        xt, spatial, c, groups, chunks, px, parts);
    group_merge_kernel<<<grid_for(rows), kBlock, 0, s>>>(parts, rows, chunks, eps, stats);
    const int64_t total = n * spatial * c;
    if (fits_u32(total)) {
      group_apply_nhwc_kernel<uint32_t, T><<<grid_for(total), kBlock, 0, s>>>(xt, stats, scale, shift, static_cast<T*>(y), c,
                                                                             c / groups, spatial * c, total, act);
    } else {
      group_apply_nhwc_kernel<uint64_t, T><<<grid_for(total), kBlock, 0, s>>>(xt, stats, scale, shift, static_cast<T*>(y), c,
                                                                             c / groups, spatial * c, total, act);
    }
    return cudaGetLastError();
  });
}

size_t group_norm_scratch_bytes(int64_t n, int64_t c, int64_t groups, int64_t spatial) {
  if (groups <= 0) return 0;
  const int64_t rows = n * groups, row_len = (c / groups) * spatial;
  const int64_t chunks = (row_len + kChunk - 1) / kChunk;
  return size_t(rows) * (sizeof(float2) + size_t(chunks < 1 ? 1 : chunks) * sizeof(Partial));
}

cudaError_t group_norm(DT dt, const void* x, const float* scale, const float* shift, void* y, int64_t n, int64_t c,
                       int64_t groups, int64_t spatial, float eps, int act, void* scratch, cudaStream_t s) {
  if (n < 0 || c < 0 || spatial < 0 || groups <= 0 || c % groups != 0 || act < 0 || act > 2) return cudaErrorInvalidValue;
  const int64_t rows = n * groups, row_len = (c / groups) * spatial;
  if (rows == 0 || row_len == 0) return cudaSuccess;
  const int64_t chunks = (row_len + kChunk - 1) / kChunk;
  if (chunks > 65535 || rows > 0x7fffffff) return cudaErrorInvalidValue;  // grid.y and grid.x limits
  auto* stats = static_cast<float2*>(scratch);
  auto* parts = reinterpret_cast<Partial*>(stats + rows);
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* xt = static_cast<const T*>(x);
    group_stats_kernel<T><<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(chunks)), kStatBlock, 0, s>>>(
        xt, row_len, chunks, parts);
    group_merge_kernel<<<grid_for(rows), kBlock, 0, s>>>(parts, rows, chunks, eps, stats);
    const int64_t total = rows * row_len;
    if (fits_u32(total)) {
      group_apply_kernel<uint32_t, T><<<grid_for(total), kBlock, 0, s>>>(xt, stats, scale, shift, static_cast<T*>(y), c,
                                                                        c / groups, spatial, total, act);
    } else {
      group_apply_kernel<uint64_t, T><<<grid_for(total), kBlock, 0, s>>>(xt, stats, scale, shift, static_cast<T*>(y), c,
                                                                        c / groups, spatial, total, act);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
