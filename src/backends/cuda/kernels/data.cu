// Data movement: strided N-d copy (Transpose, Slice, Expand, Concat, Split) and Gather. Both only
// move bytes, so they dispatch on the element width, and both widen the element (e.g. 8 halves
// into one 16-byte word) whenever the innermost run and the pointers allow it.
#include <algorithm>

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda::k {

namespace {

template <class U, class T>
__global__ void copy_nd_kernel(const T* __restrict__ src, T* __restrict__ dst, Indexer<2> ix, int64_t n) {
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    int64_t off[2];
    ix.offsets<U>(i, off);
    dst[off[1]] = src[off[0]];
  }
}

// A transpose whose stride-1 dims differ between src (dim j) and dst (the last dim, c): a plain
// element loop would read or write with a large stride, so each block moves 32x32 tiles through
// shared memory, reading along j and writing along c. `batch` indexes every other dim. (64-wide
// tiles for 2-byte elements measured slower on H100.)
constexpr int kTile = 32;
constexpr int kTileRows = 8;

template <class T>
__global__ void transpose_kernel(const T* __restrict__ src, T* __restrict__ dst, Indexer<2> batch, int64_t n_batch,
                                 int64_t nj, int64_t nc, int64_t src_c, int64_t dst_j) {
  // Padding each row to an odd number of 4-byte words makes the column reads hit 32 banks.
  constexpr int kPad = sizeof(T) >= 4 ? 1 : 4 / static_cast<int>(sizeof(T));
  __shared__ T tile[kTile][kTile + kPad];
  const int64_t tiles_j = (nj + kTile - 1) / kTile, tiles_c = (nc + kTile - 1) / kTile;
  const int64_t n_tiles = n_batch * tiles_j * tiles_c;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
    const int64_t tc = t % tiles_c, rest = t / tiles_c;
    const int64_t tj = rest % tiles_j, b = rest / tiles_j;
    int64_t off[2];
    batch.offsets<uint64_t>(b, off);
    const int64_t j0 = tj * kTile, c0 = tc * kTile;
    for (int r = ty; r < kTile; r += kTileRows) {
      const int64_t j = j0 + tx, c = c0 + r;
      if (j < nj && c < nc) tile[r][tx] = src[off[0] + j + c * src_c];
    }
    __syncthreads();
    for (int r = ty; r < kTile; r += kTileRows) {
      const int64_t j = j0 + r, c = c0 + tx;
      if (j < nj && c < nc) dst[off[1] + j * dst_j + c] = tile[tx][r];
    }
    __syncthreads();  // the next tile overwrites `tile`
  }
}

// Looks for the transpose shape above; fills the batch indexer over the remaining dims.
bool as_transpose(const Indexer<2>& ix, int* j_out, Indexer<2>* batch, int64_t* n_batch) {
  const int c = ix.rank - 1;
  if (c < 1 || ix.strides[1][c] != 1 || ix.strides[0][c] == 1) return false;
  int j = -1;
  for (int d = 0; d < c; ++d)
    if (ix.strides[0][d] == 1) j = d;
  if (j < 0 || ix.dims[j] < kTile / 2 || ix.dims[c] < kTile / 2) return false;  // mostly-empty tiles
  int64_t dims[kMaxRank], s0[kMaxRank], s1[kMaxRank];
  int r = 0;
  for (int d = 0; d < c; ++d) {
    if (d == j) continue;
    dims[r] = ix.dims[d];
    s0[r] = ix.strides[0][d];
    s1[r] = ix.strides[1][d];
    ++r;
  }
  const int64_t* const ops[2] = {s0, s1};
  *j_out = j;
  return make_indexer(r, dims, ops, batch, n_batch);
}

// Largest k (a power of two, k * elem_bytes <= 16) such that the innermost dim is contiguous in
// both operands, a multiple of k, every other stride is a multiple of k and both pointers are
// aligned to k elements; the copy then moves k-element words.
int widen_factor(const Indexer<2>& ix, int elem_bytes, const void* a, const void* b) {
  const int last = ix.rank - 1;
  if (ix.strides[0][last] != 1 || ix.strides[1][last] != 1) return 1;
  for (int k = 16 / elem_bytes; k > 1; k /= 2) {
    const int64_t bytes = int64_t{k} * elem_bytes;
    bool ok = ix.dims[last] % k == 0 && aligned_to(a, bytes) && aligned_to(b, bytes);
    for (int d = 0; d < last && ok; ++d) ok = ix.strides[0][d] % k == 0 && ix.strides[1][d] % k == 0;
    if (ok) return k;
  }
  return 1;
}

// U: uint32_t when the output count fits, for cheaper division.
template <class U, class T, class I>
__global__ void gather_kernel(const T* __restrict__ data, int64_t axis_dim, int64_t inner, const I* __restrict__ idx,
                              int64_t n_idx, T* __restrict__ y, int64_t n, int* bad_count) {
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    const U t = static_cast<U>(i) / static_cast<U>(inner);
    const int64_t in = static_cast<int64_t>(static_cast<U>(i) - t * static_cast<U>(inner));
    const int64_t o = static_cast<int64_t>(t / static_cast<U>(n_idx));
    const int64_t j = static_cast<int64_t>(t) - o * n_idx;
    int64_t id = static_cast<int64_t>(idx[j]);
    if (id < 0) id += axis_dim;
    const bool bad = id < 0 || id >= axis_dim;
    // Count each bad index once: only the thread of its first output element reports it.
    if (bad && bad_count != nullptr && o == 0 && in == 0) atomicAdd(bad_count, 1);
    if (axis_dim == 0) {
      y[i] = T{};  // nothing to clamp into
      continue;
    }
    id = id < 0 ? 0 : (id >= axis_dim ? axis_dim - 1 : id);
    y[i] = data[(o * axis_dim + id) * inner + in];
  }
}

// Block row blockIdx.y moves part blockIdx.y; x grid-strides over its rows * width words.
struct ConcatArgs {
  const void* src[kMaxConcatParts];
  int64_t width[kMaxConcatParts], col[kMaxConcatParts];
};

template <class W>
__global__ void concat_rows_kernel(ConcatArgs a, W* __restrict__ dst, int64_t rows, int64_t row_width) {
  const int p = blockIdx.y;
  const W* __restrict__ src = static_cast<const W*>(a.src[p]);
  const int64_t w = a.width[p], col = a.col[p], n = rows * w;
  for (int64_t i = global_tid(); i < n; i += global_threads()) {
    const int64_t r = i / w;
    dst[r * row_width + col + (i - r * w)] = src[i];
  }
}

}  // namespace

cudaError_t copy_nd(int elem_bytes, const void* src, const NdStrides& src_strides, void* dst,
                    const NdStrides& dst_strides, cudaStream_t s) {
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8) return cudaErrorInvalidValue;
  if (src_strides.rank != dst_strides.rank || src_strides.rank < 0 || src_strides.rank > kMaxRank)
    return cudaErrorInvalidValue;
  for (int d = 0; d < src_strides.rank; ++d)
    if (src_strides.dims[d] != dst_strides.dims[d]) return cudaErrorInvalidValue;
  // The index space in the destination's order (dims by descending dst stride): a copy's element
  // order is free, and walking dst row-major keeps the writes contiguous, so a layout change such as
  // NCHW -> NHWC becomes [N, HW, C] with dst's stride-1 dim last, which as_transpose below takes
  // through shared-memory tiles (in logical NCHW order it wrote with a stride of C: 12x slower).
  int order[kMaxRank];
  for (int d = 0; d < src_strides.rank; ++d) order[d] = d;
  for (int a = 1; a < src_strides.rank; ++a) {  // stable insertion sort; ranks are tiny
    for (int b = a; b > 0 && dst_strides.strides[order[b - 1]] < dst_strides.strides[order[b]]; --b) {
      const int t = order[b];
      order[b] = order[b - 1];
      order[b - 1] = t;
    }
  }
  int64_t dims[kMaxRank], s0[kMaxRank], s1[kMaxRank];
  for (int d = 0; d < src_strides.rank; ++d) {
    dims[d] = src_strides.dims[order[d]];
    s0[d] = src_strides.strides[order[d]];
    s1[d] = dst_strides.strides[order[d]];
  }
  const int64_t* const ops[2] = {s0, s1};
  Indexer<2> ix;
  int64_t n = 0;
  if (!make_indexer(src_strides.rank, dims, ops, &ix, &n)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;

  // Contiguous on both sides: a memcpy node (capturable, runs at copy bandwidth).
  if (ix.rank == 1 && ix.strides[0][0] == 1 && ix.strides[1][0] == 1) {
    const cudaError_t e = cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * elem_bytes, cudaMemcpyDeviceToDevice, s);
    return e != cudaSuccess ? e : cudaGetLastError();
  }

  int j = 0;
  Indexer<2> batch;
  int64_t n_batch = 0;
  if (as_transpose(ix, &j, &batch, &n_batch)) {
    const int c = ix.rank - 1;
    const int64_t tiles = n_batch * ((ix.dims[j] + kTile - 1) / kTile) * ((ix.dims[c] + kTile - 1) / kTile);
    const unsigned grid = static_cast<unsigned>(tiles < kMaxGrid * 4 ? tiles : kMaxGrid * 4);
    return dispatch_bytes(elem_bytes, [&](auto tag) {
      using T = typename decltype(tag)::type;
      transpose_kernel<<<grid, dim3(kTile, kTileRows), 0, s>>>(static_cast<const T*>(src), static_cast<T*>(dst), batch,
                                                                n_batch, ix.dims[j], ix.dims[c], ix.strides[0][c],
                                                                ix.strides[1][j]);
      return cudaGetLastError();
    });
  }

  const int k = widen_factor(ix, elem_bytes, src, dst);
  if (k > 1) {
    ix.dims[ix.rank - 1] /= k;
    for (int d = 0; d < ix.rank - 1; ++d) {
      ix.strides[0][d] /= k;
      ix.strides[1][d] /= k;
    }
    n /= k;
  }
  return dispatch_bytes(elem_bytes * k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* st = static_cast<const T*>(src);
    auto* dt = static_cast<T*>(dst);
    if (fits_u32(n))
      copy_nd_kernel<uint32_t><<<grid_for(n), kBlock, 0, s>>>(st, dt, ix, n);
    else
      copy_nd_kernel<uint64_t><<<grid_for(n), kBlock, 0, s>>>(st, dt, ix, n);
    return cudaGetLastError();
  });
}

cudaError_t concat_rows(int elem_bytes, const ConcatPart* parts, int n_parts, void* dst, int64_t rows,
                        int64_t row_width, cudaStream_t s) {
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8) return cudaErrorInvalidValue;
  if (n_parts < 0 || rows < 0 || row_width < 0) return cudaErrorInvalidValue;
  for (int i = 0; i < n_parts; ++i) {
    if (parts[i].width < 0 || parts[i].col < 0 || parts[i].col + parts[i].width > row_width)
      return cudaErrorInvalidValue;
  }
  // The widest word (up to 16 bytes) that divides every width, column and row and aligns every pointer.
  int word = 16;
  for (; word > elem_bytes; word /= 2) {
    const int k = word / elem_bytes;
    bool ok = row_width % k == 0 && aligned_to(dst, word);
    for (int i = 0; ok && i < n_parts; ++i)
      ok = parts[i].width % k == 0 && parts[i].col % k == 0 && aligned_to(parts[i].src, word);
    if (ok) break;
  }
  const int k = word / elem_bytes;
  return dispatch_bytes(word, [&](auto tag) {
    using W = typename decltype(tag)::type;
    for (int at = 0; at < n_parts; at += kMaxConcatParts) {
      ConcatArgs a;
      const int m = n_parts - at < kMaxConcatParts ? n_parts - at : kMaxConcatParts;
      int64_t most = 0;
      for (int i = 0; i < m; ++i) {
        a.src[i] = parts[at + i].src;
        a.width[i] = parts[at + i].width / k;
        a.col[i] = parts[at + i].col / k;
        most = std::max(most, rows * a.width[i]);
      }
      if (most == 0) continue;
      // Fewer x blocks per part as the parts grow in number: the whole grid stays near one fill.
      const unsigned gx = std::max<unsigned>(1, grid_for(most) / static_cast<unsigned>(m > 8 ? m / 8 : 1));
      concat_rows_kernel<W><<<dim3(gx, static_cast<unsigned>(m)), kBlock, 0, s>>>(a, static_cast<W*>(dst), rows,
                                                                                    row_width / k);
      if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  });
}

cudaError_t gather(int elem_bytes, const void* data, int64_t outer, int64_t axis_dim, int64_t inner, const void* idx,
                   DT idx_dt, int64_t n_idx, void* y, int* bad_count, cudaStream_t s) {
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8) return cudaErrorInvalidValue;
  if (outer < 0 || axis_dim < 0 || inner < 0 || n_idx < 0) return cudaErrorInvalidValue;
  if (idx_dt != DT::kI64 && idx_dt != DT::kI32) return cudaErrorInvalidValue;
  if (outer == 0 || inner == 0 || n_idx == 0) return cudaSuccess;
  // Rows of `inner` elements move as wider words (an embedding row of f16 as 16-byte words).
  int k = 16 / elem_bytes;
  for (; k > 1; k /= 2) {
    const int64_t bytes = int64_t{k} * elem_bytes;
    if (inner % k == 0 && aligned_to(data, bytes) && aligned_to(y, bytes)) break;
  }
  const int64_t w_inner = inner / k;
  const int64_t n = outer * n_idx * w_inner;
  return dispatch_bytes(elem_bytes * k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* d = static_cast<const T*>(data);
    auto* yt = static_cast<T*>(y);
    const unsigned grid = grid_for(n);
    const auto* i64 = static_cast<const int64_t*>(idx);
    const auto* i32 = static_cast<const int32_t*>(idx);
    if (fits_u32(n) && idx_dt == DT::kI64)
      gather_kernel<uint32_t><<<grid, kBlock, 0, s>>>(d, axis_dim, w_inner, i64, n_idx, yt, n, bad_count);
    else if (fits_u32(n))
      gather_kernel<uint32_t><<<grid, kBlock, 0, s>>>(d, axis_dim, w_inner, i32, n_idx, yt, n, bad_count);
    else if (idx_dt == DT::kI64)
      gather_kernel<uint64_t><<<grid, kBlock, 0, s>>>(d, axis_dim, w_inner, i64, n_idx, yt, n, bad_count);
    else
      gather_kernel<uint64_t><<<grid, kBlock, 0, s>>>(d, axis_dim, w_inner, i32, n_idx, yt, n, bad_count);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
