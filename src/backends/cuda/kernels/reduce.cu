// Reductions over the middle axis of [outer, n, inner]: Reduce* ops and ArgMax/ArgMin.
//
// inner == 1: each output reduces a contiguous row, so a warp (short rows) or a block (long rows)
// reads it coalesced and combines with shuffles. inner > 1: consecutive threads take consecutive
// outputs, so each step along n reads a contiguous run of x; when there are few outputs, a block's
// threadIdx.y also splits n and the partials are combined in shared memory.
//
// Every reduction is a reducer R: Acc init(), add(Acc, T x, int64 k) (x at index k along n; one
// accumulator sees increasing k), combine(Acc, Acc) and Out finish(Acc, n). finish(init()) is
// the reduction of nothing: ONNX gives the identity (0, 1, -inf, ...) for an empty axis.
#include <type_traits>

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

template <class V>
struct ArgAcc {
  V v;
  int64_t i;  // -1: empty
};

__device__ __forceinline__ float shfl_xor(float a, int o) { return __shfl_xor_sync(0xffffffffu, a, o); }
__device__ __forceinline__ int64_t shfl_xor(int64_t a, int o) {
  return static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(a), o));
}
__device__ __forceinline__ double shfl_xor(double a, int o) { return __shfl_xor_sync(0xffffffffu, a, o); }

// LogSumExp's accumulator: the running max and the sum of exp(x - max).
template <class F>
struct Lse {
  F m, s;
};
template <class F>
__device__ __forceinline__ Lse<F> shfl_xor(Lse<F> a, int o) {
  return {shfl_xor(a.m, o), shfl_xor(a.s, o)};
}
template <class V>
__device__ __forceinline__ ArgAcc<V> shfl_xor(ArgAcc<V> a, int o) {
  return {shfl_xor(a.v, o), shfl_xor(a.i, o)};
}

template <class F>
__device__ __forceinline__ F nan_max(F a, F b) { return (a > b || a != a) ? a : b; }
template <class F>
__device__ __forceinline__ F nan_min(F a, F b) { return (a < b || a != a) ? a : b; }

// f32 accumulation for kF32/kF16/kBF16, f64 for kF64.
template <Reduce OP, class T>
struct FloatReducer {
  using F = std::conditional_t<std::is_same_v<T, double>, double, float>;
  using Acc = std::conditional_t<OP == Reduce::kLogSumExp, Lse<F>, F>;
  using Out = T;
  static __device__ __forceinline__ Acc init() {
    if constexpr (OP == Reduce::kLogSumExp) return Lse<F>{F(-INFINITY), F(0)};
    else if constexpr (OP == Reduce::kMax) return F(-INFINITY);
    else if constexpr (OP == Reduce::kMin) return F(INFINITY);
    else if constexpr (OP == Reduce::kProd) return F(1);
    else return F(0);
  }
  static __device__ __forceinline__ F load(T x) {
    if constexpr (std::is_same_v<T, double>) return x;
    else return to_f(x);
  }
  static __device__ __forceinline__ Out store(F a) {
    if constexpr (std::is_same_v<T, double>) return a;
    else return from_f<T>(a);
  }
  static __device__ __forceinline__ Acc combine(Acc a, Acc b) {
    if constexpr (OP == Reduce::kLogSumExp) {
      const F m = nan_max(a.m, b.m);
      // exp(inf - inf) would be NaN: an infinite max decides the result by itself (the sum is 0
      // for -inf, which also covers the empty accumulator, and 1 for +inf).
      if (isinf(m)) return Lse<F>{m, m > F(0) ? F(1) : F(0)};
      return Lse<F>{m, a.s * exp(a.m - m) + b.s * exp(b.m - m)};
    } else if constexpr (OP == Reduce::kMax) {
      return nan_max(a, b);
    } else if constexpr (OP == Reduce::kMin) {
      return nan_min(a, b);
    } else if constexpr (OP == Reduce::kProd) {
      return a * b;
    } else {
      return a + b;
    }
  }
  static __device__ __forceinline__ Acc add(Acc a, T xt, int64_t) {
    const F x = load(xt);
    if constexpr (OP == Reduce::kLogSumExp) return combine(a, Lse<F>{x, F(1)});
    else if constexpr (OP == Reduce::kSumSquare || OP == Reduce::kL2) return fma(x, x, a);
    else if constexpr (OP == Reduce::kL1) return a + fabs(x);
    else return combine(a, x);
  }
  static __device__ __forceinline__ Out finish(Acc a, int64_t n) {
    if constexpr (OP == Reduce::kLogSumExp) return store(a.m + log(a.s));  // n == 0: log 0 = -inf
    else if constexpr (OP == Reduce::kMean) return store(a / static_cast<F>(n));
    else if constexpr (OP == Reduce::kL2) return store(sqrt(a));
    else return store(a);
  }
};

// Integer kSum (wrapping i64 accumulation), kMax, kMin with no float round trip.
template <Reduce OP, class T>
struct IntReducer {
  using Acc = int64_t;
  using Out = T;
  static __device__ __forceinline__ Acc init() {
    if constexpr (OP == Reduce::kMax) return std::is_same_v<T, int64_t> ? INT64_MIN : INT32_MIN;
    else if constexpr (OP == Reduce::kMin) return std::is_same_v<T, int64_t> ? INT64_MAX : INT32_MAX;
    else return 0;
  }
  static __device__ __forceinline__ Acc combine(Acc a, Acc b) {
    if constexpr (OP == Reduce::kMax) return a > b ? a : b;
    else if constexpr (OP == Reduce::kMin) return a < b ? a : b;
    else return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
  static __device__ __forceinline__ Acc add(Acc a, T x, int64_t) { return combine(a, static_cast<int64_t>(x)); }
  static __device__ __forceinline__ Out finish(Acc a, int64_t) { return static_cast<T>(a); }
};

// ArgMax/ArgMin; ties keep the lower index (kLast: the higher, select_last_index=1). NaN beats
// every number in both (numpy's and PyTorch's choice), the first NaN among NaNs (kLast: the last),
// as the CPU reference.
template <bool kIsMax, class T, bool kLast = false>
struct ArgReducer {
  using V = std::conditional_t<kIsF32ish<T>, float, int64_t>;
  using Acc = ArgAcc<V>;
  using Out = int64_t;
  static __device__ __forceinline__ Acc init() { return {V(0), -1}; }
  static __device__ __forceinline__ Acc pick(Acc a, Acc b) { return (kLast ? b.i > a.i : b.i < a.i) ? b : a; }
  static __device__ __forceinline__ Acc combine(Acc a, Acc b) {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    if constexpr (std::is_same_v<V, float>) {
      const bool an = a.v != a.v, bn = b.v != b.v;
      if (an || bn) return an && bn ? pick(a, b) : bn ? b : a;
    }
    if (a.v == b.v) return pick(a, b);
    return (kIsMax ? b.v > a.v : b.v < a.v) ? b : a;
  }
  // Indices reach one accumulator in increasing order, so the incumbent keeps ties (kLast: the
  // newcomer takes them): a cheaper test than combine's, and this is the per-element hot path.
  static __device__ __forceinline__ Acc add(Acc a, T xt, int64_t k) {
    V x;
    if constexpr (std::is_same_v<V, float>) x = to_f(xt);
    else x = static_cast<V>(xt);
    bool take = kIsMax ? x > a.v : x < a.v;
    if constexpr (kLast) take = take || x == a.v;
    if constexpr (std::is_same_v<V, float>) take = take || (x != x && (a.v == a.v || kLast));
    return a.i < 0 || take ? Acc{x, k} : a;
  }
  static __device__ __forceinline__ Out finish(Acc a, int64_t) { return a.i < 0 ? 0 : a.i; }
};

// Combine over TPR threads (a warp, or the whole block when TPR > 32); lane 0 of the group ends
// with the result. The combining order is a tree, not index order: fine for the sums (up to
// rounding) and for ArgReducer, whose ties are broken by index rather than by order.
template <int TPR, class R>
__device__ __forceinline__ typename R::Acc group_combine(typename R::Acc a, typename R::Acc* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) a = R::combine(a, shfl_xor(a, o));
  if constexpr (TPR > 32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) smem[warp] = a;
    __syncthreads();
    if (warp == 0) {
      a = lane < TPR / 32 ? smem[lane] : R::init();
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) a = R::combine(a, shfl_xor(a, o));
    }
    __syncthreads();  // smem is reused by the next row
  }
  return a;
}

constexpr int kWarpRows = 4;      // rows per 128-thread block in the warp-per-row kernel
constexpr int kRowBlock = 512;    // threads per row for long rows
constexpr int64_t kWarpRowMax = 2048;

// inner == 1: rows of n contiguous elements, one group of TPR threads per row, reading packs of V
// elements (the launcher checked n % V == 0 and alignment). Each thread's k increases.
template <int TPR, int V, class R, class T>
__global__ void __launch_bounds__(TPR == 32 ? 32 * kWarpRows : TPR)
    reduce_rows_kernel(const T* __restrict__ x, typename R::Out* __restrict__ y, int64_t rows, int64_t n) {
  using Acc = typename R::Acc;
  __shared__ Acc smem[32];
  constexpr int groups = TPR == 32 ? kWarpRows : 1;
  const int lane = threadIdx.x % TPR;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * groups + threadIdx.x / TPR; r < rows;
       r += static_cast<int64_t>(gridDim.x) * groups) {
    const auto* xr = reinterpret_cast<const Pack<T, V>*>(x + r * n);
    Acc a = R::init();
    for (int64_t k = lane; k < n / V; k += TPR) {
      const Pack<T, V> p = xr[k];
#pragma unroll
      for (int e = 0; e < V; ++e) a = R::add(a, p.v[e], k * V + e);
    }
    a = group_combine<TPR, R>(a, smem);
    if (lane == 0) y[r] = R::finish(a, n);
  }
}

// inner > 1: block (BX, TY) handles BX consecutive outputs; threadIdx.y splits n in TY strands.
// Loops are uniform over the block so that the barriers are reached by every thread.
template <class R, class T>
__global__ void __launch_bounds__(256)
    reduce_cols_kernel(const T* __restrict__ x, typename R::Out* __restrict__ y, int64_t outputs, int64_t n,
                       int64_t inner) {
  using Acc = typename R::Acc;
  __shared__ Acc smem[256];
  const int bx = blockDim.x, ty = blockDim.y;
  const int64_t step = static_cast<int64_t>(gridDim.x) * bx;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * bx; base < outputs; base += step) {
    const int64_t out = base + threadIdx.x;
    Acc a = R::init();
    if (out < outputs) {
      const int64_t o = out / inner, i = out - o * inner;
      const T* xo = x + o * n * inner + i;
      for (int64_t k = threadIdx.y; k < n; k += ty) a = R::add(a, xo[k * inner], k);
    }
    if (ty > 1) {
      smem[threadIdx.y * bx + threadIdx.x] = a;
      __syncthreads();
      if (threadIdx.y == 0)
        for (int j = 1; j < ty; ++j) a = R::combine(a, smem[j * bx + threadIdx.x]);
      __syncthreads();
    }
    if (threadIdx.y == 0 && out < outputs) y[out] = R::finish(a, n);
  }
}

// inner > 1 with inner a multiple of V and 16-byte rows (an NHWC global pool: inner = channels):
// each thread reduces V consecutive outputs from one 16-byte load per step along n, a block holding
// BX such vectors by 256 / BX strands of n, combined in shared memory in strand order. One
// element-wide load per output per step (the kernel above) reaches about a quarter of the memory
// bandwidth at these shapes (bench/RESULTS.md, twenty-eighth session).
template <class R, class T, int V, int BX>
__global__ void __launch_bounds__(256)
    reduce_cols_vec_kernel(const T* __restrict__ x, typename R::Out* __restrict__ y, int64_t vectors, int64_t n,
                           int64_t inner) {
  using Acc = typename R::Acc;
  constexpr int kTY = 256 / BX;
  __shared__ Acc smem[kTY][BX][V];
  const int64_t inner_v = inner / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * BX;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * BX; base < vectors; base += step) {
    const int64_t vo = base + threadIdx.x;
    Acc a[V];
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = R::init();
    if (vo < vectors) {
      const int64_t o = vo / inner_v, i = (vo - o * inner_v) * V;
      const T* xo = x + o * n * inner + i;
      for (int64_t k = threadIdx.y; k < n; k += kTY) {
        const Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(xo + k * inner);
#pragma unroll
        for (int j = 0; j < V; ++j) a[j] = R::add(a[j], p.v[j], k);
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) smem[threadIdx.y][threadIdx.x][j] = a[j];
    __syncthreads();
    if (threadIdx.y == 0 && vo < vectors) {
      for (int t = 1; t < kTY; ++t) {
#pragma unroll
        for (int j = 0; j < V; ++j) a[j] = R::combine(a[j], smem[t][threadIdx.x][j]);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) y[vo * V + j] = R::finish(a[j], n);
    }
    __syncthreads();
  }
}

// inner > 1 with few outputs and a long axis (a global average pool of NHWC at batch 1: 32 outputs
// over 12544 pixels): grid.y splits n in chunks, each block writing its outputs' partial
// accumulators to `part` ([splits, outputs]); reduce_parts_kernel then combines them in order.
template <class R, class T>
__global__ void __launch_bounds__(256)
    reduce_cols_split_kernel(const T* __restrict__ x, typename R::Acc* __restrict__ part, int64_t outputs, int64_t n,
                             int64_t inner, int64_t chunk) {
  using Acc = typename R::Acc;
  __shared__ Acc smem[256];
  const int bx = blockDim.x, ty = blockDim.y;
  const int64_t out = static_cast<int64_t>(blockIdx.x) * bx + threadIdx.x;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * chunk, k1 = k0 + chunk < n ? k0 + chunk : n;
  Acc a = R::init();
  if (out < outputs) {
    const int64_t o = out / inner, i = out - o * inner;
    const T* xo = x + o * n * inner + i;
    for (int64_t k = k0 + threadIdx.y; k < k1; k += ty) a = R::add(a, xo[k * inner], k);
  }
  smem[threadIdx.y * bx + threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.y == 0 && out < outputs) {
    for (int j = 1; j < ty; ++j) a = R::combine(a, smem[j * bx + threadIdx.x]);
    part[blockIdx.y * outputs + out] = a;
  }
}

template <class R>
__global__ void reduce_parts_kernel(const typename R::Acc* __restrict__ part, typename R::Out* __restrict__ y,
                                    int64_t outputs, int64_t splits, int64_t n) {
  for (int64_t out = global_tid(); out < outputs; out += global_threads()) {
    typename R::Acc a = part[out];
    for (int64_t j = 1; j < splits; ++j) a = R::combine(a, part[j * outputs + out]);
    y[out] = R::finish(a, n);
  }
}

template <class R, class T>
cudaError_t launch_reduce(const void* xv, void* yv, int64_t outer, int64_t n, int64_t inner, cudaStream_t s,
                          void* ws = nullptr, size_t ws_bytes = 0) {
  const auto* x = static_cast<const T*>(xv);
  auto* y = static_cast<typename R::Out*>(yv);
  const int64_t outputs = outer * inner;
  if (inner == 1) {
    constexpr int kV = 16 / sizeof(T);
    const bool vec = n % kV == 0 && aligned_to(x, 16);
    const int64_t g = n <= kWarpRowMax ? (outer + kWarpRows - 1) / kWarpRows : outer;
    const unsigned grid = static_cast<unsigned>(g < kMaxGrid * 16 ? g : kMaxGrid * 16);
    if (n <= kWarpRowMax && vec)
      reduce_rows_kernel<32, kV, R><<<grid, 32 * kWarpRows, 0, s>>>(x, y, outer, n);
    else if (n <= kWarpRowMax)
      reduce_rows_kernel<32, 1, R><<<grid, 32 * kWarpRows, 0, s>>>(x, y, outer, n);
    else if (vec)
      reduce_rows_kernel<kRowBlock, kV, R><<<grid, kRowBlock, 0, s>>>(x, y, outer, n);
    else
      reduce_rows_kernel<kRowBlock, 1, R><<<grid, kRowBlock, 0, s>>>(x, y, outer, n);
    return cudaGetLastError();
  }
  // Vectors of outputs where rows allow 16-byte loads and there are blocks enough for every SM:
  // 32 vectors by 8 strands, or 8 by 32 when fewer (128-byte runs either way).
  if constexpr (sizeof(typename R::Acc) <= 8 && sizeof(T) <= 4) {
    constexpr int kV = 16 / sizeof(T);
    const int64_t vectors = outputs / kV, sms = sm_count();
    if (inner % kV == 0 && aligned_to(x, 16) && vectors >= 8 * sms) {
      if (vectors >= 32 * 2 * sms) {
        const int64_t g = (vectors + 31) / 32;
        reduce_cols_vec_kernel<R, T, kV, 32><<<static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid), dim3(32, 8), 0, s>>>(
            x, y, vectors, n, inner);
      } else {
        const int64_t g = (vectors + 7) / 8;
        reduce_cols_vec_kernel<R, T, kV, 8><<<static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid), dim3(8, 32), 0, s>>>(
            x, y, vectors, n, inner);
      }
      return cudaGetLastError();
    }
  }
  // Split n over more strands the fewer outputs there are, aiming at ~512k threads in flight (one
  // load each per step). At least 16 consecutive outputs per block keep reads in whole sectors.
  int ty = 1;
  while (ty < 16 && outputs * ty < (int64_t{1} << 19) && ty * 2 <= n) ty *= 2;
  const int bx = 256 / ty;
  if (ty == 16) {
    // Still short of threads: split n over grid.y too, each strand of a chunk taking >= 8 elements.
    const int64_t x_blocks = (outputs + bx - 1) / bx;
    int64_t splits = (int64_t{1} << 10) / x_blocks;  // ~1k blocks of 256
    if (splits > n / (ty * 8)) splits = n / (ty * 8);
    if (splits > 65535) splits = 65535;
    using Acc = typename R::Acc;
    if (splits >= 2 && ws && ws_bytes >= static_cast<size_t>(splits * outputs) * sizeof(Acc) &&
        aligned_to(ws, alignof(Acc))) {
      const int64_t chunk = (n + splits - 1) / splits;
      splits = (n + chunk - 1) / chunk;
      auto* part = static_cast<Acc*>(ws);
      reduce_cols_split_kernel<R><<<dim3(static_cast<unsigned>(x_blocks), static_cast<unsigned>(splits)),
                                    dim3(bx, ty), 0, s>>>(x, part, outputs, n, inner, chunk);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      reduce_parts_kernel<R><<<grid_for(outputs), kBlock, 0, s>>>(part, y, outputs, splits, n);
      return cudaGetLastError();
    }
  }
  const int64_t g = (outputs + bx - 1) / bx;
  reduce_cols_kernel<R><<<static_cast<unsigned>(g < kMaxGrid * 4 ? g : kMaxGrid * 4), dim3(bx, ty), 0, s>>>(
      x, y, outputs, n, inner);
  return cudaGetLastError();
}

bool bad_shape(int64_t outer, int64_t n, int64_t inner) { return outer < 0 || n < 0 || inner < 0; }

template <Reduce OP>
using ReduceC = std::integral_constant<Reduce, OP>;

template <class F>
cudaError_t with_reduce(Reduce op, F&& f) {
  switch (op) {
    case Reduce::kSum: return f(ReduceC<Reduce::kSum>{});
    case Reduce::kMean: return f(ReduceC<Reduce::kMean>{});
    case Reduce::kMax: return f(ReduceC<Reduce::kMax>{});
    case Reduce::kMin: return f(ReduceC<Reduce::kMin>{});
    case Reduce::kProd: return f(ReduceC<Reduce::kProd>{});
    case Reduce::kSumSquare: return f(ReduceC<Reduce::kSumSquare>{});
    case Reduce::kL1: return f(ReduceC<Reduce::kL1>{});
    case Reduce::kL2: return f(ReduceC<Reduce::kL2>{});
    case Reduce::kLogSumExp: return f(ReduceC<Reduce::kLogSumExp>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t reduce(Reduce op, DT dt, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s,
                   void* ws, size_t ws_bytes) {
  if (bad_shape(outer, n, inner)) return cudaErrorInvalidValue;
  // n == 0 with outputs: they get the reduction's identity (0, -inf, ...), as ONNX specifies.
  if (outer == 0 || inner == 0) return cudaSuccess;
  return with_reduce(op, [&](auto opc) {
    constexpr Reduce kOp = decltype(opc)::value;
    return dispatch_dt(dt, [&](auto tag) -> cudaError_t {
      using T = typename decltype(tag)::type;
      if constexpr (kIsF32ish<T> || std::is_same_v<T, double>) {
        return launch_reduce<FloatReducer<kOp, T>, T>(x, y, outer, n, inner, s, ws, ws_bytes);
      } else if constexpr ((std::is_same_v<T, int64_t> || std::is_same_v<T, int32_t>) &&
                           (kOp == Reduce::kSum || kOp == Reduce::kMax || kOp == Reduce::kMin)) {
        return launch_reduce<IntReducer<kOp, T>, T>(x, y, outer, n, inner, s, ws, ws_bytes);
      } else {
        return cudaErrorInvalidValue;
      }
    });
  });
}

cudaError_t arg_reduce(bool is_max, bool last, DT dt, const void* x, int64_t* y, int64_t outer, int64_t n,
                       int64_t inner, cudaStream_t s) {
  if (bad_shape(outer, n, inner)) return cudaErrorInvalidValue;
  if (outer == 0 || inner == 0) return cudaSuccess;
  return dispatch_dt(dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    if constexpr (kIsF32ish<T> || std::is_same_v<T, int64_t> || std::is_same_v<T, int32_t>) {
      if (last) {
        return is_max ? launch_reduce<ArgReducer<true, T, true>, T>(x, y, outer, n, inner, s)
                      : launch_reduce<ArgReducer<false, T, true>, T>(x, y, outer, n, inner, s);
      }
      return is_max ? launch_reduce<ArgReducer<true, T>, T>(x, y, outer, n, inner, s)
                    : launch_reduce<ArgReducer<false, T>, T>(x, y, outer, n, inner, s);
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

namespace {

// Counts the NaN and Inf among n elements (one atomic per block).
template <class T>
__global__ void count_nonfinite_kernel(const T* __restrict__ x, int64_t n, unsigned long long* __restrict__ count) {
  unsigned c = 0;
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    const float v = to_f(x[i]);
    c += isfinite(v) ? 0u : 1u;
  }
  c = __reduce_add_sync(0xffffffffu, c);
  if ((threadIdx.x & 31) == 0 && c != 0) atomicAdd(count, static_cast<unsigned long long>(c));
}

__global__ void count_nonfinite_f64_kernel(const double* __restrict__ x, int64_t n, unsigned long long* __restrict__ count) {
  unsigned c = 0;
  for (int64_t i = global_tid(); i < n; i += global_threads()) c += isfinite(x[i]) ? 0u : 1u;
  c = __reduce_add_sync(0xffffffffu, c);
  if ((threadIdx.x & 31) == 0 && c != 0) atomicAdd(count, static_cast<unsigned long long>(c));
}

}  // namespace

cudaError_t count_nonfinite(DT dt, const void* x, int64_t n, unsigned long long* count, cudaStream_t s) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (dt == DT::kF64) {
    count_nonfinite_f64_kernel<<<grid_for(n), kBlock, 0, s>>>(static_cast<const double*>(x), n, count);
    return cudaGetLastError();
  }
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    count_nonfinite_kernel<T><<<grid_for(n), kBlock, 0, s>>>(static_cast<const T*>(x), n, count);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
