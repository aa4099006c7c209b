// Row-wise normalizations: Softmax/LogSoftmax, LayerNorm, RMSNorm; and the per-channel affine that
// inference BatchNormalization folds into. All math in f32.
//
// A row is handled by a group of TPR threads: one warp (4 rows per 128-thread block) for rows of
// up to 1024 elements, else a whole block of 128 to 512 threads. The row is read once into
// registers (E values per thread, in packs of V contiguous elements so half rows load 16 bytes at
// a time), the statistics are reduced with shuffles, and the row is written from the registers.
// Rows too long for registers (> 512 * 32, or 512 * 16 unvectorized) take a multi-pass kernel
// that re-reads the row (mostly from L2).
#include <initializer_list>
#include <type_traits>

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

constexpr int kWarpRowsPerBlock = 4;
constexpr int kRowBlock = 512;  // threads per row for the longest rows and the multi-pass kernels
constexpr int kMaxItems = 32;   // f32 values cached per thread

template <int N>
using IntC = std::integral_constant<int, N>;

// The group of this thread and its lane within it; rows are strided over the grid's groups.
template <int TPR>
struct RowGroup {
  static constexpr int kGroups = TPR == 32 ? kWarpRowsPerBlock : 1;
  int lane = static_cast<int>(threadIdx.x) % TPR;
  int64_t first = static_cast<int64_t>(blockIdx.x) * kGroups + threadIdx.x / TPR;
  int64_t step = static_cast<int64_t>(gridDim.x) * kGroups;
};

// Pack q of this thread is p * TPR + lane; element e of it is column q * V + e. With V > 1 the
// launcher guaranteed cols % V == 0 and 16-byte-aligned rows, so a pack is all in or all out.
template <int TPR, int V, int E, class T>
__device__ __forceinline__ void load_row(const T* __restrict__ row, int64_t cols, int lane, float (&v)[E], float pad) {
#pragma unroll
  for (int p = 0; p < E / V; ++p) {
    const int64_t q = static_cast<int64_t>(p) * TPR + lane;
    if (q * V < cols) {
      const Pack<T, V> pk = reinterpret_cast<const Pack<T, V>*>(row)[q];
#pragma unroll
      for (int e = 0; e < V; ++e) v[p * V + e] = to_f(pk.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) v[p * V + e] = pad;
    }
  }
}

// Stores V f32 values as pack q of a row of Y: one Pack<Y, V> when Y is the input's type, 16-byte
// pieces otherwise (an f32 output of a half LayerNorm: 32 bytes per pack, rows 16-byte aligned).
template <int V, class Y>
__device__ __forceinline__ void store_pack(Y* __restrict__ row, int64_t q, const float (&o)[V]) {
  constexpr int kPer = 16 / int(sizeof(Y)) < V ? 16 / int(sizeof(Y)) : V;  // elements per piece
  static_assert(V % kPer == 0, "pack splits into whole pieces");
#pragma unroll
  for (int c = 0; c < V / kPer; ++c) {
    Pack<Y, kPer> pk;
#pragma unroll
    for (int e = 0; e < kPer; ++e) pk.v[e] = from_f<Y>(o[c * kPer + e]);
    reinterpret_cast<Pack<Y, kPer>*>(row + q * V)[c] = pk;
  }
}

// row[c] = f(v[c], c) for every valid column; f returns f32.
template <int TPR, int V, int E, class T, class F>
__device__ __forceinline__ void store_row(T* __restrict__ row, int64_t cols, int lane, const float (&v)[E], F f) {
#pragma unroll
  for (int p = 0; p < E / V; ++p) {
    const int64_t q = static_cast<int64_t>(p) * TPR + lane;
    if (q * V < cols) {
      Pack<T, V> pk;
#pragma unroll
      for (int e = 0; e < V; ++e) pk.v[e] = from_f<T>(f(v[p * V + e], q * V + e));
      reinterpret_cast<Pack<T, V>*>(row)[q] = pk;
    }
  }
}

template <int TPR, int V, int E, class T>
__global__ void __launch_bounds__(TPR == 32 ? 32 * kWarpRowsPerBlock : TPR)
    softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, bool log, bool zero_masked) {
  __shared__ float smem[32];
  const RowGroup<TPR> g;
  for (int64_t r = g.first; r < rows; r += g.step) {
    float v[E];
    load_row<TPR, V>(x + r * cols, cols, g.lane, v, -INFINITY);
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < E; ++i) m = fmaxf(m, v[i]);
    m = group_reduce<TPR, true>(m, smem);
    // v keeps x: the exponentials are recomputed at the store, which is cheaper than a second
    // register array, and LogSoftmax needs x - m exactly rather than log(exp(x - m)).
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < E; ++i) sum += expf(v[i] - m);  // padding: exp(-inf) = 0
    sum = group_reduce<TPR, false>(sum, smem);
    const float lse = logf(sum), inv = 1.f / sum;
    const bool masked = zero_masked && m == -INFINITY;  // every element -inf: zeros, not 0 / 0
    if (log)
      store_row<TPR, V>(y + r * cols, cols, g.lane, v, [&](float a, int64_t) { return a - m - lse; });
    else
      store_row<TPR, V>(y + r * cols, cols, g.lane, v, [&](float a, int64_t) { return masked ? 0.f : expf(a - m) * inv; });
  }
}

// kEarly: the scale and bias are requested before the reductions, so their latency hides behind
// them; that holds their registers across the reductions (80 instead of 54 for BERT's rows of 768
// halves, 24 warps per SM instead of 36), which loses where rows are many and memory throughput
// is what counts: on BERT-base, late reads win at batch 64 (8192 rows) and early ones at batch 1
// (128 rows) (bench/RESULTS.md, "(eighth session) — attention kernel rework, LayerNorm
// register/latency choice, MobileNetV2 b256 vs max-autotune (issue 4)"). The launcher takes early
// while every row's group can be resident at once.
// Y: the output's type, T or (a half LayerNorm whose output is the model's f32 output) float.
template <int TPR, int V, int E, class T, bool kEarly, class Y>
__global__ void __launch_bounds__(TPR == 32 ? 32 * kWarpRowsPerBlock : TPR)
    layer_norm_kernel(const T* __restrict__ x, const T* __restrict__ scale, const T* __restrict__ bias,
                      Y* __restrict__ y, int64_t rows, int64_t cols, float eps, bool rms) {
  __shared__ float smem[32];
  pdl_wait();               // launched with programmatic serialization: x is the previous kernel's
  pdl_launch_dependents();  // the next GEMM may start (and stream its weight)
  const RowGroup<TPR> g;
  const float inv_cols = 1.f / static_cast<float>(cols);
  for (int64_t r = g.first; r < rows; r += g.step) {
    float v[E];
    load_row<TPR, V>(x + r * cols, cols, g.lane, v, 0.f);
    // This lane's scale and bias packs (one 16-byte load per pack), here when kEarly, else at the store.
    Pack<T, V> sp[E / V], bp[E / V];
    auto load_affine = [&](int p) {
      const int64_t q = static_cast<int64_t>(p) * TPR + g.lane;
      if (q * V < cols) {
        sp[p] = reinterpret_cast<const Pack<T, V>*>(scale)[q];
        if (bias != nullptr) bp[p] = reinterpret_cast<const Pack<T, V>*>(bias)[q];
      }
    };
    if constexpr (kEarly) {
#pragma unroll
      for (int p = 0; p < E / V; ++p) load_affine(p);
    }
    float mean = 0.f;
    if (!rms) {
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < E; ++i) sum += v[i];
      mean = group_reduce<TPR, false>(sum, smem) * inv_cols;
    }
    // Second pass over the registers: sum of squared deviations, no cancellation. Padding
    // slots hold 0 and must not contribute (0 - mean)^2.
    float sq = 0.f;
#pragma unroll
    for (int p = 0; p < E / V; ++p) {
      const bool valid = (static_cast<int64_t>(p) * TPR + g.lane) * V < cols;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = v[p * V + e] - mean;
        sq += valid ? d * d : 0.f;
      }
    }
    const float rstd = rsqrtf(group_reduce<TPR, false>(sq, smem) * inv_cols + eps);
#pragma unroll
    for (int p = 0; p < E / V; ++p) {
      const int64_t q = static_cast<int64_t>(p) * TPR + g.lane;
      if (q * V >= cols) continue;
      if constexpr (!kEarly) load_affine(p);
      float o[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float n = (v[p * V + e] - mean) * rstd * to_f(sp[p].v[e]);
        o[e] = bias != nullptr ? n + to_f(bp[p].v[e]) : n;
      }
      store_pack<V>(y + r * cols, q, o);
    }
  }
}

// ---- rows longer than the register cache: one block per row, the row re-read from memory ----
// Packs of V elements as above (V == 1 when the rows are not 16-byte aligned).

template <int V, class T>
__global__ void __launch_bounds__(kRowBlock)
    softmax_long_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, bool log, bool zero_masked) {
  __shared__ float smem[32];
  const int64_t packs = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const auto* xr = reinterpret_cast<const Pack<T, V>*>(x + r * cols);
    auto* yr = reinterpret_cast<Pack<T, V>*>(y + r * cols);
    // Online max and rescaled sum in one read (Milakov & Gimelshein 2018), rescaling once a pack.
    float m = -INFINITY, s = 0.f;
    for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
      const Pack<T, V> p = xr[q];
      float pm = -INFINITY;
#pragma unroll
      for (int e = 0; e < V; ++e) pm = fmaxf(pm, to_f(p.v[e]));
      const float mn = fmaxf(m, pm);
      if (mn == -INFINITY) continue;  // all -inf so far: exp(-inf - -inf) would be NaN
      s *= expf(m - mn);
#pragma unroll
      for (int e = 0; e < V; ++e) s += expf(to_f(p.v[e]) - mn);  // a NaN element makes s NaN
      m = mn;
    }
    const float bm = group_reduce<kRowBlock, true>(m, smem);
    const float sum = group_reduce<kRowBlock, false>(m == -INFINITY ? 0.f : s * expf(m - bm), smem);
    const float lse = logf(sum), inv = 1.f / sum;
    const bool masked = zero_masked && bm == -INFINITY;  // every element -inf: zeros, not 0 / 0
    for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
      const Pack<T, V> p = xr[q];
      Pack<T, V> o;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float a = to_f(p.v[e]);
        o.v[e] = from_f<T>(log ? a - bm - lse : masked ? 0.f : expf(a - bm) * inv);
      }
      yr[q] = o;
    }
  }
}

template <int V, class T, class Y>
__global__ void __launch_bounds__(kRowBlock)
    layer_norm_long_kernel(const T* __restrict__ x, const T* __restrict__ scale, const T* __restrict__ bias,
                           Y* __restrict__ y, int64_t rows, int64_t cols, float eps, bool rms) {
  __shared__ float smem[32];
  pdl_wait();
  pdl_launch_dependents();
  const float inv_cols = 1.f / static_cast<float>(cols);
  const int64_t packs = cols / V;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const auto* xr = reinterpret_cast<const Pack<T, V>*>(x + r * cols);
    Y* yr = y + r * cols;
    float mean = 0.f;
    if (!rms) {
      float sum = 0.f;
      for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
        const Pack<T, V> p = xr[q];
#pragma unroll
        for (int e = 0; e < V; ++e) sum += to_f(p.v[e]);
      }
      mean = group_reduce<kRowBlock, false>(sum, smem) * inv_cols;
    }
    float sq = 0.f;
    for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
      const Pack<T, V> p = xr[q];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = to_f(p.v[e]) - mean;
        sq += d * d;
      }
    }
    const float rstd = rsqrtf(group_reduce<kRowBlock, false>(sq, smem) * inv_cols + eps);
    for (int64_t q = threadIdx.x; q < packs; q += blockDim.x) {
      const Pack<T, V> p = xr[q];
      float o[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int64_t c = q * V + e;
        const float n = (to_f(p.v[e]) - mean) * rstd * to_f(scale[c]);
        o[e] = bias != nullptr ? n + to_f(bias[c]) : n;
      }
      store_pack<V>(yr, q, o);
    }
  }
}

// Picks TPR (threads per row), V (pack width) and E (values per thread, a power of two >= V, or 3V) for
// a row of `cols`, and calls f(IntC<TPR>, IntC<V>, IntC<E>); TPR == 0 means "too long, use the
// multi-pass kernel".
template <int TPR, int V, int E, int kMaxE, class F>
cudaError_t pick_items(int64_t cols, F& f) {
  if constexpr (E >= kMaxE) return f(IntC<TPR>{}, IntC<V>{}, IntC<E>{});
  else if (cols <= int64_t{TPR} * E) return f(IntC<TPR>{}, IntC<V>{}, IntC<E>{});
  else return pick_items<TPR, V, E * 2, kMaxE>(cols, f);
}

// Longer rows get more threads, the fewest that keep E <= 32 (E <= 16 unvectorized: at 32, scalar
// loads each keep a 64-bit address live and the 512-thread LayerNorm spills). Few threads per
// row mean short barriers and more rows in flight per SM.
template <class T, class F>
cudaError_t pick_row_config(int64_t cols, bool vec_ok, F&& f) {
  constexpr int kV = 16 / sizeof(T);
  // Three packs per lane for rows of (64, 96] packs (768 halves: BERT, GPT-2, ViT): the power-of-two
  // step would hold a fourth, never-valid pack, and those registers cap the blocks per SM.
  if (vec_ok && cols > 32 * 2 * kV && cols <= 32 * 3 * kV) return f(IntC<32>{}, IntC<kV>{}, IntC<3 * kV>{});
  if (cols <= 32 * kMaxItems)
    return vec_ok ? pick_items<32, kV, kV, kMaxItems>(cols, f) : pick_items<32, 1, 1, kMaxItems>(cols, f);
  if (vec_ok) {
    if (cols <= 128 * kMaxItems) return pick_items<128, kV, kMaxItems / 2, kMaxItems>(cols, f);
    if (cols <= 256 * kMaxItems) return f(IntC<256>{}, IntC<kV>{}, IntC<kMaxItems>{});
    if (cols <= kRowBlock * kMaxItems) return f(IntC<kRowBlock>{}, IntC<kV>{}, IntC<kMaxItems>{});
  } else {
    if (cols <= 128 * kMaxItems / 2) return f(IntC<128>{}, IntC<1>{}, IntC<kMaxItems / 2>{});
    if (cols <= 256 * kMaxItems / 2) return f(IntC<256>{}, IntC<1>{}, IntC<kMaxItems / 2>{});
    if (cols <= kRowBlock * kMaxItems / 2) return f(IntC<kRowBlock>{}, IntC<1>{}, IntC<kMaxItems / 2>{});
  }
  return f(IntC<0>{}, IntC<1>{}, IntC<1>{});
}

// 16-byte packs need every row (hence cols * sizeof(T)) and every pointer 16-byte aligned.
template <class T>
bool rows_vectorizable(int64_t cols, std::initializer_list<const void*> ptrs) {
  if ((cols * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
  for (const void* p : ptrs)
    if (p != nullptr && !aligned_to(p, 16)) return false;
  return true;
}

template <int TPR>
unsigned row_grid(int64_t rows) {
  constexpr int groups = TPR == 32 ? kWarpRowsPerBlock : 1;
  const int64_t g = (rows + groups - 1) / groups;
  return static_cast<unsigned>(g < kMaxGrid * 16 ? g : kMaxGrid * 16);
}

template <int TPR>
constexpr int row_block() {
  return TPR == 32 ? 32 * kWarpRowsPerBlock : TPR;
}

template <class T, class Y>
cudaError_t launch_norm(const T* xt, const T* st, const T* bt, Y* yt, int64_t rows, int64_t cols, float eps, bool rms,
                        bool vec, bool pdl, cudaStream_t s) {
  return pick_row_config<T>(cols, vec, [&](auto tpr, auto v, auto e) {
    constexpr int kTpr = decltype(tpr)::value, kV = decltype(v)::value, kE = decltype(e)::value;
    if constexpr (kTpr == 0) {
      return vec ? launch_pdl(pdl, layer_norm_long_kernel<16 / sizeof(T), T, Y>, row_grid<1>(rows), kRowBlock, s, xt, st, bt,
                              yt, rows, cols, eps, rms)
                 : launch_pdl(pdl, layer_norm_long_kernel<1, T, Y>, row_grid<1>(rows), kRowBlock, s, xt, st, bt, yt, rows,
                              cols, eps, rms);
    } else {
      auto early = layer_norm_kernel<kTpr, kV, kE, T, true, Y>;
      static const int per_sm = [&] {  // blocks of `early` per SM: fixed by the kernel and the build's arch
        int n = 0;
        return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, early, row_block<kTpr>(), 0) == cudaSuccess ? n : 0;
      }();
      const bool resident = int64_t{row_grid<kTpr>(rows)} <= int64_t{per_sm} * sm_count();
      return launch_pdl(pdl, resident ? early : layer_norm_kernel<kTpr, kV, kE, T, false, Y>, row_grid<kTpr>(rows),
                        row_block<kTpr>(), s, xt, st, bt, yt, rows, cols, eps, rms);
    }
  });
}

cudaError_t norm_impl(DT dt, const void* x, const void* scale, const void* bias, void* y, DT y_dt, int64_t rows,
                      int64_t cols, float eps, bool rms, bool pdl, cudaStream_t s) {
  if (rows < 0 || cols < 0 || scale == nullptr) return cudaErrorInvalidValue;
  if (y_dt != dt && (y_dt != DT::kF32 || (dt != DT::kF16 && dt != DT::kBF16))) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* xt = static_cast<const T*>(x);
    const auto* st = static_cast<const T*>(scale);
    const auto* bt = static_cast<const T*>(bias);
    const bool vec = rows_vectorizable<T>(cols, {x, y, scale, bias});
    if constexpr (kIsHalfLike<T>) {
      if (y_dt == DT::kF32) return launch_norm(xt, st, bt, static_cast<float*>(y), rows, cols, eps, rms, vec, pdl, s);
    }
    return launch_norm(xt, st, bt, static_cast<T*>(y), rows, cols, eps, rms, vec, pdl, s);
  });
}

// kChannelsLast: inner == 1 and c % V == 0, so a pack holds V consecutive channels (NHWC); else a
// pack never straddles two channels (the launcher checked inner % V == 0).
template <int V, bool kChannelsLast, class T>
__global__ void channel_affine_kernel(const T* __restrict__ x, const float* __restrict__ scale,
                                      const float* __restrict__ shift, T* __restrict__ y, int64_t c,
                                      int64_t inner_packs, int64_t n_packs, float lo, float hi) {
  const auto* xv = reinterpret_cast<const Pack<T, V>*>(x);
  auto* yv = reinterpret_cast<Pack<T, V>*>(y);
  for (int64_t i = global_tid(); i < n_packs; i += global_threads()) {
    const int64_t ch = kChannelsLast ? (i * V) % c : (i / inner_packs) % c;
    const Pack<T, V> p = xv[i];
    Pack<T, V> r;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const int64_t k = kChannelsLast ? ch + e : ch;
      const float v = fmaf(to_f(p.v[e]), scale[k], shift[k]);
      r.v[e] = from_f<T>(v < lo ? lo : v > hi ? hi : v);  // NaN passes through, as Relu and Clip keep it
    }
    yv[i] = r;
  }
}

}  // namespace

cudaError_t softmax(DT dt, const void* x, void* y, int64_t rows, int64_t cols, bool log, bool zero_masked, cudaStream_t s) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* xt = static_cast<const T*>(x);
    auto* yt = static_cast<T*>(y);
    const bool vec = rows_vectorizable<T>(cols, {x, y});
    return pick_row_config<T>(cols, vec, [&](auto tpr, auto v, auto e) {
      constexpr int kTpr = decltype(tpr)::value, kV = decltype(v)::value, kE = decltype(e)::value;
      if constexpr (kTpr == 0) {
        if (vec)
          softmax_long_kernel<16 / sizeof(T)><<<row_grid<1>(rows), kRowBlock, 0, s>>>(xt, yt, rows, cols, log, zero_masked);
        else
          softmax_long_kernel<1><<<row_grid<1>(rows), kRowBlock, 0, s>>>(xt, yt, rows, cols, log, zero_masked);
      } else {
        softmax_kernel<kTpr, kV, kE><<<row_grid<kTpr>(rows), row_block<kTpr>(), 0, s>>>(xt, yt, rows, cols, log, zero_masked);
      }
      return cudaGetLastError();
    });
  });
}

cudaError_t layer_norm(DT dt, const void* x, const void* scale, const void* bias, void* y, DT y_dt, int64_t rows,
                       int64_t cols, float eps, cudaStream_t s, bool pdl) {
  return norm_impl(dt, x, scale, bias, y, y_dt, rows, cols, eps, /*rms=*/false, pdl, s);
}

cudaError_t rms_norm(DT dt, const void* x, const void* scale, void* y, DT y_dt, int64_t rows, int64_t cols, float eps,
                     cudaStream_t s, bool pdl) {
  return norm_impl(dt, x, scale, nullptr, y, y_dt, rows, cols, eps, /*rms=*/true, pdl, s);
}

cudaError_t channel_affine(DT dt, const void* x, const float* scale, const float* shift, void* y, int64_t outer,
                           int64_t c, int64_t inner, float lo, float hi, cudaStream_t s) {
  if (outer < 0 || c < 0 || inner < 0) return cudaErrorInvalidValue;
  const int64_t n = outer * c * inner;
  if (n == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kV = 16 / sizeof(T);
    const auto* xt = static_cast<const T*>(x);
    auto* yt = static_cast<T*>(y);
    const bool aligned = aligned_to(x, 16) && aligned_to(y, 16);
    if (inner % kV == 0 && aligned)
      channel_affine_kernel<kV, false><<<grid_for(n / kV), kBlock, 0, s>>>(xt, scale, shift, yt, c, inner / kV, n / kV,
                                                                           lo, hi);
    else if (inner == 1 && c % kV == 0 && aligned)
      channel_affine_kernel<kV, true><<<grid_for(n / kV), kBlock, 0, s>>>(xt, scale, shift, yt, c, 1, n / kV, lo, hi);
    else
      channel_affine_kernel<1, false><<<grid_for(n), kBlock, 0, s>>>(xt, scale, shift, yt, c, inner, n, lo, hi);
    return cudaGetLastError();
  });
}

namespace {

// One block per row (rows strided over the grid): the mean, then the variance around it, in f32.
template <class T, class Y>
__global__ void row_moments_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, float eps, Y* __restrict__ mean,
                                   Y* __restrict__ inv_std) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* row = x + r * cols;
    float s = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += to_f(row[c]);
    const float m = group_reduce<kBlock, false>(s, smem) / static_cast<float>(cols);
    float q = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float d = to_f(row[c]) - m;
      q += d * d;
    }
    const float var = group_reduce<kBlock, false>(q, smem) / static_cast<float>(cols);
    if (threadIdx.x == 0) {
      if (mean) mean[r] = from_f<Y>(m);
      if (inv_std) inv_std[r] = from_f<Y>(rsqrtf(var + eps));
    }
  }
}

}  // namespace

cudaError_t row_moments(DT dt, const void* x, int64_t rows, int64_t cols, float eps, DT out_dt, void* mean,
                        void* inv_std, cudaStream_t s) {
  if (rows < 0 || cols < 1) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_f32ish(out_dt, [&](auto otag) {
      using Y = typename decltype(otag)::type;
      const unsigned grid = static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid);
      row_moments_kernel<T, Y><<<grid, kBlock, 0, s>>>(static_cast<const T*>(x), rows, cols, eps, static_cast<Y*>(mean),
                                                        static_cast<Y*>(inv_std));
      return cudaGetLastError();
    });
  });
}

}  // namespace kiln::cuda::k
