// CumSum along one axis, GatherElements, GatherND, ScatterND, ScatterElements (with reductions),
// Trilu, TopK, ReverseSequence and Det: small index kernels that models use
// on position ids and masks (RoBERTa's CumSum over the attention mask, GatherElements in
// detection and sequence heads).
#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

// One thread per line of x viewed as [outer, n, inner]; each walks its line in order.
template <class T, class A>
__global__ void cumsum_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner,
                              bool exclusive, bool reverse) {
  const int64_t lines = outer * inner;
  for (int64_t l = global_tid(); l < lines; l += global_threads()) {
    const int64_t o = l / inner, in = l - o * inner;
    const int64_t base = o * n * inner + in;
    A acc = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t j = reverse ? n - 1 - k : k;
      const int64_t at = base + j * inner;
      const A v = static_cast<A>(widen(x[at]));
      if (exclusive) {
        y[at] = convert<T>(acc);
        acc += v;
      } else {
        acc += v;
        y[at] = convert<T>(acc);
      }
    }
  }
}

template <class U, class T, class I>
__global__ void gather_elements_kernel(const T* __restrict__ data, const I* __restrict__ idx, T* __restrict__ y,
                                       int64_t axis_dim, int64_t n_axis, int64_t inner, int64_t total, int* bad_count) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    // y and idx are [outer, n_axis, inner]; data is [outer, axis_dim, inner].
    const U in = static_cast<U>(i) % static_cast<U>(inner);
    const U o = static_cast<U>(i) / static_cast<U>(inner) / static_cast<U>(n_axis);
    int64_t id = static_cast<int64_t>(idx[i]);
    if (id < 0) id += axis_dim;
    if (id < 0 || id >= axis_dim) {
      if (bad_count != nullptr) atomicAdd(bad_count, 1);
      id = id < 0 ? 0 : axis_dim - 1;
    }
    y[i] = data[(static_cast<int64_t>(o) * axis_dim + id) * inner + static_cast<int64_t>(in)];
  }
}

template <class U, class T>
__global__ void trilu_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols, int64_t k, bool upper,
                             int64_t total) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const U q = static_cast<U>(i) / static_cast<U>(cols);
    const int64_t j = static_cast<int64_t>(static_cast<U>(i) - q * static_cast<U>(cols));
    const int64_t r = static_cast<int64_t>(q % static_cast<U>(rows));
    const bool keep = upper ? j - r >= k : j - r <= k;
    y[i] = keep ? x[i] : T{};
  }
}

template <class I>
__device__ __forceinline__ int64_t nd_offset(const I* tup, const IndexTuple& t, int* bad, bool* ok) {
  int64_t off = 0;
  for (int j = 0; j < t.k; ++j) {
    int64_t v = static_cast<int64_t>(tup[j]);
    if (v < 0) v += t.dims[j];
    if (v < 0 || v >= t.dims[j]) {
      *ok = false;
      v = v < 0 ? 0 : t.dims[j] - 1;
    }
    off += v * t.strides[j];
  }
  if (!*ok && bad != nullptr) atomicAdd(bad, 1);
  return off;
}

// GatherND: y[b, i, r] = data[b, idx[b, i, :], r] (y viewed as [nb, ni, nr]).
template <class T, class I>
__global__ void gather_nd_kernel(const T* __restrict__ data, const I* __restrict__ idx, T* __restrict__ y, int64_t ni,
                                 int64_t nr, IndexTuple t, int64_t batch_stride, int64_t total, int* bad) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const int64_t r = i % nr, q = i / nr, b = q / ni;
    bool ok = true;
    // Each index tuple is checked once: by the thread of its first element.
    const int64_t off = nd_offset(idx + q * t.k, t, r == 0 ? bad : nullptr, &ok);
    y[i] = data[b * batch_stride + off + r];
  }
}

// ScatterND (no reduction): y (already a copy of data)[idx[q, :], r] = upd[q, r].
template <class T, class I>
__global__ void scatter_nd_kernel(const I* __restrict__ idx, const T* __restrict__ upd, T* __restrict__ y, int64_t nr,
                                  IndexTuple t, int64_t total, int* bad) {
  for (int64_t u = global_tid(); u < total; u += global_threads()) {
    const int64_t r = u % nr, q = u / nr;
    bool ok = true;
    const int64_t off = nd_offset(idx + q * t.k, t, r == 0 ? bad : nullptr, &ok);
    if (ok) y[off + r] = upd[u];
  }
}

// ScatterElements (no reduction): y (a copy of data, [outer, axis_dim, inner])[o, idx[u], i] = upd[u]
// with idx and upd [outer, n_axis, inner].
template <class T, class I>
__global__ void scatter_elements_kernel(const I* __restrict__ idx, const T* __restrict__ upd, T* __restrict__ y,
                                        int64_t axis_dim, int64_t n_axis, int64_t inner, int64_t total, bool wrap,
                                        int* bad) {
  for (int64_t u = global_tid(); u < total; u += global_threads()) {
    const int64_t in = u % inner, o = u / inner / n_axis;
    int64_t id = static_cast<int64_t>(idx[u]);
    if (id < 0 && wrap) id += axis_dim;
    if (id < 0 || id >= axis_dim) {
      if (bad != nullptr) atomicAdd(bad, 1);
      continue;
    }
    y[(o * axis_dim + id) * inner + in] = upd[u];
  }
}

// Scatter with a reduction (1 add, 2 mul, 3 max, 4 min), deterministic and in the reference's
// order: ScatterND gives a thread each element position r of the nr-element slices (every tuple's
// offset is a multiple of nr, so no two threads touch one element) and walks the updates in order;
// ScatterElements gives a thread each line (outer, inner) and walks its n_axis updates in order.
template <class T>
__device__ __forceinline__ T combine(T a, T b, int red) {
  const auto wa = widen(a), wb = widen(b);
  const decltype(wa) r = red == 1 ? wa + wb : red == 2 ? wa * wb : red == 3 ? (wa < wb ? wb : wa) : (wb < wa ? wb : wa);
  return narrow<T>(r);
}

template <class T, class I>
__global__ void scatter_nd_reduce_kernel(const I* __restrict__ idx, const T* __restrict__ upd, T* __restrict__ y,
                                         int64_t nr, IndexTuple t, int64_t nq, int red, int* bad) {
  for (int64_t r = global_tid(); r < nr; r += global_threads()) {
    for (int64_t q = 0; q < nq; ++q) {
      bool ok = true;
      const int64_t off = nd_offset(idx + q * t.k, t, r == 0 ? bad : nullptr, &ok);
      if (ok) y[off + r] = combine(y[off + r], upd[q * nr + r], red);
    }
  }
}

template <class T, class I>
__global__ void scatter_elements_reduce_kernel(const I* __restrict__ idx, const T* __restrict__ upd, T* __restrict__ y,
                                               int64_t axis_dim, int64_t n_axis, int64_t inner, int64_t lines, int red,
                                               bool wrap, int* bad) {
  for (int64_t l = global_tid(); l < lines; l += global_threads()) {
    const int64_t in = l % inner, o = l / inner;
    for (int64_t j = 0; j < n_axis; ++j) {
      const int64_t u = (o * n_axis + j) * inner + in;
      int64_t id = static_cast<int64_t>(idx[u]);
      if (id < 0 && wrap) id += axis_dim;
      if (id < 0 || id >= axis_dim) {
        if (bad != nullptr) atomicAdd(bad, 1);
        continue;
      }
      T& dst = y[(o * axis_dim + id) * inner + in];
      dst = combine(dst, upd[u], red);
    }
  }
}

// ReverseSequence over x viewed as [d0, d1, inner] with the batch and time axes 0 and 1 (either
// way round): the first lens[b] steps of batch row b reversed, the rest copied.
template <class T, class L>
__global__ void reverse_sequence_kernel(const T* __restrict__ x, const L* __restrict__ lens, T* __restrict__ y,
                                        int64_t d1, int64_t inner, bool batch_first, int64_t total) {
  const int64_t steps = batch_first ? d1 : total / (d1 * inner);
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    const int64_t in = i % inner, q = i / inner, i1 = q % d1, i0 = q / d1;
    const int64_t b = batch_first ? i0 : i1, t = batch_first ? i1 : i0;
    int64_t len = static_cast<int64_t>(lens[b]);
    len = len < 0 ? 0 : (len > steps ? steps : len);
    const int64_t src_t = t < len ? len - 1 - t : t;
    const int64_t j0 = batch_first ? i0 : src_t, j1 = batch_first ? src_t : i1;
    y[i] = x[(j0 * d1 + j1) * inner + in];
  }
}

// Det: a thread per matrix, LU with partial pivoting in f64 in its slice of `work`.
template <class T>
__global__ void det_kernel(const T* __restrict__ x, T* __restrict__ y, double* __restrict__ work, int64_t n,
                           int64_t batch) {
  for (int64_t b = global_tid(); b < batch; b += global_threads()) {
    double* a = work + b * n * n;
    for (int64_t i = 0; i < n * n; ++i) a[i] = static_cast<double>(widen(x[b * n * n + i]));
    double det = 1.0;
    for (int64_t c = 0; c < n && det != 0.0; ++c) {
      int64_t p = c;
      for (int64_t r = c + 1; r < n; ++r) {
        if (fabs(a[r * n + c]) > fabs(a[p * n + c])) p = r;
      }
      if (a[p * n + c] == 0.0) {
        det = 0.0;
        break;
      }
      if (p != c) {
        for (int64_t j = 0; j < n; ++j) {
          const double t = a[c * n + j];
          a[c * n + j] = a[p * n + j];
          a[p * n + j] = t;
        }
        det = -det;
      }
      const double piv = a[c * n + c];
      det *= piv;
      for (int64_t r = c + 1; r < n; ++r) {
        const double f = a[r * n + c] / piv;
        for (int64_t j = c + 1; j < n; ++j) a[r * n + j] -= f * a[c * n + j];
      }
    }
    y[b] = narrow<T>(det);
  }
}

// TopK: one block per line of x viewed as [outer, n, inner]; the line's (key, index) pairs are
// bitonic-sorted in shared memory, best first, and the first k written. "Better" is larger (or
// smaller) first, NaN ranks above every number, ties keep the lower index: the CPU reference's order.
constexpr int kTopKMax = 4096;

template <class K>
__device__ __forceinline__ bool topk_better(K a, int ia, K b, int ib, bool largest) {
  if (ib < 0) return ia >= 0;  // padding is worse than everything
  if (ia < 0) return false;
  const bool an = a != a, bn = b != b;  // NaN (floats only; ints never differ from themselves)
  if (an != bn) return largest ? an : bn;
  if (!an && a != b) return largest ? a > b : a < b;
  return ia < ib;
}

template <class T, class K>
__global__ void topk_kernel(const T* __restrict__ x, T* __restrict__ vals, int64_t* __restrict__ idx, int64_t n,
                            int64_t inner, int64_t k, int n2, bool largest) {
  extern __shared__ unsigned char smem[];
  K* key = reinterpret_cast<K*>(smem);
  int* ix = reinterpret_cast<int*>(key + n2);
  const int64_t line = blockIdx.x, o = line / inner, in = line % inner;
  const T* xl = x + o * n * inner + in;
  for (int i = threadIdx.x; i < n2; i += blockDim.x) {
    if (i < n) {
      key[i] = static_cast<K>(widen(xl[int64_t(i) * inner]));
      ix[i] = i;
    } else {
      key[i] = K{};
      ix[i] = -1;
    }
  }
  __syncthreads();
  for (int size = 2; size <= n2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n2; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool up = (i & size) == 0;  // this run is sorted best-first
          const bool jb = topk_better(key[j], ix[j], key[i], ix[i], largest);
          if (jb == up) {
            const K tk = key[i];
            key[i] = key[j];
            key[j] = tk;
            const int ti = ix[i];
            ix[i] = ix[j];
            ix[j] = ti;
          }
        }
      }
      __syncthreads();
    }
  }
  T* vl = vals + o * k * inner + in;
  int64_t* il = idx ? idx + o * k * inner + in : nullptr;
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
    vl[j * inner] = xl[int64_t(ix[j]) * inner];
    if (il) il[j * inner] = ix[j];
  }
}

}  // namespace

bool topk_supported(int64_t n) { return n >= 1 && n <= kTopKMax; }

cudaError_t topk(DT dt, const void* x, void* values, int64_t* indices, int64_t outer, int64_t n, int64_t inner, int64_t k,
                 bool largest, cudaStream_t s) {
  if (outer < 0 || inner < 0 || k < 0 || k > n || !topk_supported(n)) return cudaErrorInvalidValue;
  const int64_t lines = outer * inner;
  if (lines == 0 || k == 0) return cudaSuccess;
  if (lines > 0x7fffffff) return cudaErrorInvalidValue;
  int n2 = 1;
  while (n2 < n) n2 <<= 1;
  const int threads = n2 < 512 ? (n2 < 32 ? 32 : n2) : 512;
  auto go = [&](auto tag, auto key) {
    using T = typename decltype(tag)::type;
    using K = decltype(key);
    const size_t smem = size_t(n2) * (sizeof(K) + sizeof(int));
    topk_kernel<T, K><<<static_cast<unsigned>(lines), threads, smem, s>>>(static_cast<const T*>(x), static_cast<T*>(values),
                                                                        indices, n, inner, k, n2, largest);
    return cudaGetLastError();
  };
  switch (dt) {
    case DT::kF32: return go(Tag<float>{}, 0.f);
    case DT::kF16: return go(Tag<__half>{}, 0.f);
    case DT::kBF16: return go(Tag<__nv_bfloat16>{}, 0.f);
    case DT::kI64: return go(Tag<int64_t>{}, int64_t{});
    case DT::kI32: return go(Tag<int32_t>{}, int64_t{});
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t gather_nd(int elem_bytes, const void* data, const void* idx, DT idx_dt, void* y, int64_t nb, int64_t ni,
                      int64_t nr, const IndexTuple& t, int64_t batch_stride, int* bad, cudaStream_t s) {
  if (nb < 0 || ni < 0 || nr < 0 || t.k < 0 || t.k > kMaxRank || (idx_dt != DT::kI64 && idx_dt != DT::kI32)) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = nb * ni * nr;
  if (total == 0) return cudaSuccess;
  return dispatch_bytes(elem_bytes, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (idx_dt == DT::kI64) {
      gather_nd_kernel<T, int64_t><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(data), static_cast<const int64_t*>(idx),
                                                                      static_cast<T*>(y), ni, nr, t, batch_stride, total, bad);
    } else {
      gather_nd_kernel<T, int32_t><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(data), static_cast<const int32_t*>(idx),
                                                                      static_cast<T*>(y), ni, nr, t, batch_stride, total, bad);
    }
    return cudaGetLastError();
  });
}

cudaError_t scatter(DT dt, const void* data, int64_t data_numel, const void* idx, DT idx_dt, const void* upd,
                    int64_t upd_numel, void* y, bool elements, int64_t nr_or_axis, const IndexTuple& t, int64_t n_axis,
                    int64_t inner, int reduction, bool wrap_negative, int* bad, cudaStream_t s) {
  if (data_numel < 0 || upd_numel < 0 || (idx_dt != DT::kI64 && idx_dt != DT::kI32) || reduction < 0 || reduction > 4) {
    return cudaErrorInvalidValue;
  }
  const int elem_bytes = dt_size(dt);
  if (data_numel > 0 && data != y) {
    const cudaError_t e = cudaMemcpyAsync(y, data, size_t(data_numel) * size_t(elem_bytes), cudaMemcpyDeviceToDevice, s);
    if (e != cudaSuccess) return e;
  }
  if (upd_numel == 0) return cudaSuccess;
  if (reduction != 0) {
    if (dt != DT::kF32 && dt != DT::kF16 && dt != DT::kBF16 && dt != DT::kF64 && dt != DT::kI32 && dt != DT::kI64) {
      return cudaErrorInvalidValue;
    }
    return dispatch_dt(dt, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || kIsHalfLike<T> ||
                    std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
        auto go = [&](auto ix) {
          using I = decltype(ix);
          const I* ip = static_cast<const I*>(idx);
          if (elements) {
            if (n_axis < 1 || inner < 1) return;
            const int64_t lines = upd_numel / n_axis;
            scatter_elements_reduce_kernel<T, I><<<grid_for(lines), kBlock, 0, s>>>(
                ip, static_cast<const T*>(upd), static_cast<T*>(y), nr_or_axis, n_axis, inner, lines, reduction,
                wrap_negative, bad);
          } else {
            if (nr_or_axis < 1) return;
            scatter_nd_reduce_kernel<T, I><<<grid_for(nr_or_axis), kBlock, 0, s>>>(
                ip, static_cast<const T*>(upd), static_cast<T*>(y), nr_or_axis, t, upd_numel / nr_or_axis, reduction, bad);
          }
        };
        if (idx_dt == DT::kI64) go(int64_t{});
        else go(int32_t{});
        return cudaGetLastError();
      } else {
        return cudaErrorInvalidValue;
      }
    });
  }
  return dispatch_bytes(elem_bytes, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto go = [&](auto ix) {
      using I = decltype(ix);
      const I* ip = static_cast<const I*>(idx);
      if (elements) {
        if (n_axis < 1 || inner < 1) return;
        scatter_elements_kernel<T, I><<<grid_for(upd_numel), kBlock, 0, s>>>(ip, static_cast<const T*>(upd), static_cast<T*>(y),
                                                                             nr_or_axis, n_axis, inner, upd_numel,
                                                                             wrap_negative, bad);
      } else {
        if (nr_or_axis < 1) return;
        scatter_nd_kernel<T, I><<<grid_for(upd_numel), kBlock, 0, s>>>(ip, static_cast<const T*>(upd), static_cast<T*>(y),
                                                                       nr_or_axis, t, upd_numel, bad);
      }
    };
    if (idx_dt == DT::kI64) go(int64_t{});
    else go(int32_t{});
    return cudaGetLastError();
  });
}

cudaError_t trilu(int elem_bytes, const void* x, void* y, int64_t batch, int64_t rows, int64_t cols, int64_t k, bool upper,
                  cudaStream_t s) {
  if (batch < 0 || rows < 0 || cols < 0) return cudaErrorInvalidValue;
  const int64_t total = batch * rows * cols;
  if (total == 0) return cudaSuccess;
  return dispatch_bytes(elem_bytes, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (fits_u32(total)) {
      trilu_kernel<uint32_t, T><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, k,
                                                                   upper, total);
    } else {
      trilu_kernel<uint64_t, T><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), rows, cols, k,
                                                                   upper, total);
    }
    return cudaGetLastError();
  });
}

cudaError_t cumsum(DT dt, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse,
                   cudaStream_t s) {
  if (outer < 0 || n < 0 || inner < 0) return cudaErrorInvalidValue;
  if (outer * n * inner == 0) return cudaSuccess;
  const unsigned grid = grid_for(outer * inner, 128);
  auto go = [&](auto tag, auto acc) {
    using T = typename decltype(tag)::type;
    cumsum_kernel<T, decltype(acc)><<<grid, 128, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), outer, n, inner,
                                                         exclusive, reverse);
  };
  switch (dt) {
    case DT::kF32: go(Tag<float>{}, 0.f); break;
    case DT::kF16: go(Tag<__half>{}, 0.f); break;
    case DT::kBF16: go(Tag<__nv_bfloat16>{}, 0.f); break;
    case DT::kI64: go(Tag<int64_t>{}, int64_t{}); break;
    case DT::kI32: go(Tag<int32_t>{}, int64_t{}); break;
    case DT::kF64: go(Tag<double>{}, 0.0); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t gather_elements(int elem_bytes, const void* data, int64_t outer, int64_t axis_dim, int64_t inner, const void* idx,
                            DT idx_dt, int64_t n_axis, void* y, int* bad_count, cudaStream_t s) {
  if (outer < 0 || axis_dim < 0 || inner < 0 || n_axis < 0 || (idx_dt != DT::kI64 && idx_dt != DT::kI32)) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = outer * n_axis * inner;
  if (total == 0) return cudaSuccess;
  if (axis_dim == 0) return cudaErrorInvalidValue;  // every index is out of range
  return dispatch_bytes(elem_bytes, [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto go = [&](auto u, auto i) {
      using U = decltype(u);
      using I = decltype(i);
      gather_elements_kernel<U, T, I><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(data), static_cast<const I*>(idx),
                                                                        static_cast<T*>(y), axis_dim, n_axis, inner, total,
                                                                        bad_count);
    };
    if (fits_u32(total)) {
      if (idx_dt == DT::kI64) go(uint32_t{}, int64_t{}); else go(uint32_t{}, int32_t{});
    } else {
      if (idx_dt == DT::kI64) go(uint64_t{}, int64_t{}); else go(uint64_t{}, int32_t{});
    }
    return cudaGetLastError();
  });
}

cudaError_t reverse_sequence(int elem_bytes, const void* x, const void* lens, DT lens_dt, void* y, int64_t d0, int64_t d1,
                             int64_t inner, bool batch_first, cudaStream_t s) {
  if (d0 < 0 || d1 < 0 || inner < 0 || (lens_dt != DT::kI64 && lens_dt != DT::kI32)) return cudaErrorInvalidValue;
  const int64_t total = d0 * d1 * inner;
  if (total == 0) return cudaSuccess;
  return dispatch_bytes(elem_bytes, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (lens_dt == DT::kI64) {
      reverse_sequence_kernel<T, int64_t><<<grid_for(total), kBlock, 0, s>>>(
          static_cast<const T*>(x), static_cast<const int64_t*>(lens), static_cast<T*>(y), d1, inner, batch_first, total);
    } else {
      reverse_sequence_kernel<T, int32_t><<<grid_for(total), kBlock, 0, s>>>(
          static_cast<const T*>(x), static_cast<const int32_t*>(lens), static_cast<T*>(y), d1, inner, batch_first, total);
    }
    return cudaGetLastError();
  });
}

cudaError_t det(DT dt, const void* x, void* y, double* work, int64_t batch, int64_t n, cudaStream_t s) {
  if (batch < 0 || n < 0) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  if (dt != DT::kF32 && dt != DT::kF16 && dt != DT::kBF16 && dt != DT::kF64) return cudaErrorInvalidValue;
  return dispatch_dt(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || kIsHalfLike<T>) {
      det_kernel<T><<<grid_for(batch, 64), 64, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), work, n, batch);
      return cudaGetLastError();
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace kiln::cuda::k
