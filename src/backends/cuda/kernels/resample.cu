// Pad, Resize and GridSample: kernels where every output element reads the input at positions
// computed from its own index (a padded border, an interpolated grid) or its grid point. Pad and
// Resize: one thread per output element, the index decomposed once, in 32 bits when the output
// allows; GridSample: one thread per grid point, over its channels.
#include <type_traits>

#include "backends/cuda/kernels/common.cuh"
#include "ops/grid_sample_math.h"

namespace kiln::cuda::k {

namespace {

struct PadGeom {
  int rank = 0;
  int64_t out[kMaxRank] = {};    // output dims
  int64_t in[kMaxRank] = {};     // input dims
  int64_t begin[kMaxRank] = {};  // leading pad per dim (negative: crop)
};

// The input coordinate for output coordinate o of a dim of n values, or -1 (the constant).
__device__ __forceinline__ int64_t pad_source(int64_t i, int64_t n, int mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case 1: {  // reflect (mirror without repeating the edge); the lowering keeps pads < n
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      int64_t m = i % period;
      if (m < 0) m += period;
      return m < n ? m : period - m;
    }
    case 2: return i < 0 ? 0 : n - 1;  // edge
    case 3: {                            // wrap
      int64_t m = i % n;
      return m < 0 ? m + n : m;
    }
    default: return -1;  // constant
  }
}

template <class U, class T>
__global__ void pad_kernel(const T* __restrict__ x, T* __restrict__ y, PadGeom g, int mode, T value, int64_t total) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    U rest = static_cast<U>(i);
    int64_t src = 0, stride = 1;
    bool inside = true;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t o = static_cast<int64_t>(rest % static_cast<U>(g.out[d]));
      rest /= static_cast<U>(g.out[d]);
      const int64_t s = pad_source(o - g.begin[d], g.in[d], mode);
      if (s < 0) inside = false;
      src += s * stride;
      stride *= g.in[d];
    }
    y[i] = inside ? x[src] : value;
  }
}

// Resize of the 1..3 dims `sp` of x viewed as [outer, sp..., inner] (inner: the channels of an NHWC
// tensor, 1 for NCHW) from per-axis tap tables the host planned (ops/resize_taps.h): output
// coordinate o of axis d reads taps [table_at[d] + o * n[d], + n[d]). The interpolation is
// separable, so an output element is the weighted sum over the product of its axes' taps.
struct ResizeGeom {
  int sp = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int n[3] = {1, 1, 1};             // taps per output coordinate
  int64_t table_at[3] = {0, 0, 0};  // each axis's first entry in the table
  int64_t inner = 1;
};

// Nearest: one tap per axis, copied (any element type; uint4 moves 16-byte pixels of NHWC).
template <class U, int SP, class T>
__global__ void resize_nearest_kernel(const T* __restrict__ x, T* __restrict__ y, ResizeGeom g,
                                      const ResizeTap* __restrict__ taps, T extrapolation, int64_t total) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    U rest = static_cast<U>(i);
    const U c = rest % static_cast<U>(g.inner);
    rest /= static_cast<U>(g.inner);
    int64_t src = 0, stride = g.inner;
    bool outside = false;
#pragma unroll
    for (int d = SP - 1; d >= 0; --d) {
      const U o = rest % static_cast<U>(g.out[d]);
      rest /= static_cast<U>(g.out[d]);
      const int32_t t = taps[g.table_at[d] + static_cast<int64_t>(o)].index;
      outside = outside || t < 0;
      src += static_cast<int64_t>(t) * stride;
      stride *= g.in[d];
    }
    y[i] = outside ? extrapolation : x[static_cast<int64_t>(rest) * stride + src + static_cast<int64_t>(c)];
  }
}

// Linear (N = 2), cubic (N = 4) or any tap count (N = 0: antialiased kernels, mixed counts), in f32.
template <class U, int SP, int N, class T>
__global__ void resize_interp_kernel(const T* __restrict__ x, T* __restrict__ y, ResizeGeom g,
                                     const ResizeTap* __restrict__ taps, float extrapolation, int64_t total) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    U rest = static_cast<U>(i);
    const U c = rest % static_cast<U>(g.inner);
    rest /= static_cast<U>(g.inner);
    const ResizeTap* tp[SP];
    int64_t stride[SP];
    int64_t plane = g.inner;
    bool outside = false;
#pragma unroll
    for (int d = SP - 1; d >= 0; --d) {
      const U o = rest % static_cast<U>(g.out[d]);
      rest /= static_cast<U>(g.out[d]);
      tp[d] = taps + g.table_at[d] + static_cast<int64_t>(o) * (N > 0 ? N : g.n[d]);
      outside = outside || tp[d][0].index < 0;
      stride[d] = plane;
      plane *= g.in[d];
    }
    if (outside) {
      y[i] = from_f<T>(extrapolation);
      continue;
    }
    const T* xp = x + static_cast<int64_t>(rest) * plane + static_cast<int64_t>(c);
    float acc = 0.f;
    if constexpr (N > 0) {
      constexpr int kCorners = SP == 1 ? N : (SP == 2 ? N * N : N * N * N);
#pragma unroll
      for (int corner = 0; corner < kCorners; ++corner) {
        int rem = corner;
        float wt = 1.f;
        int64_t src = 0;
#pragma unroll
        for (int d = SP - 1; d >= 0; --d) {
          const ResizeTap t = tp[d][rem % N];
          rem /= N;
          wt *= t.weight;
          src += static_cast<int64_t>(t.index) * stride[d];
        }
        if (wt != 0.f) acc += wt * to_f(xp[src]);  // as the CPU: a zero-weight Inf tap adds nothing
      }
    } else {
      int k[SP] = {};
      for (;;) {
        float wt = 1.f;
        int64_t src = 0;
#pragma unroll
        for (int d = 0; d < SP; ++d) {
          wt *= tp[d][k[d]].weight;
          src += static_cast<int64_t>(tp[d][k[d]].index) * stride[d];
        }
        if (wt != 0.f) acc += wt * to_f(xp[src]);
        int d = SP - 1;
        while (d >= 0 && ++k[d] == g.n[d]) k[d--] = 0;
        if (d < 0) break;
      }
    }
    y[i] = from_f<T>(acc);
  }
}

// GridSample: a thread per output point finds its taps once (ops/grid_sample_math.h, the CPU's
// math) and walks the channels; adjacent threads write adjacent points of a channel's plane.
struct GridGeom {
  int r = 0, mode = 0, padding = 0;
  bool align = false;
  int64_t c = 0, points = 0, image = 1;
  int64_t size[3] = {1, 1, 1}, stride[3] = {0, 0, 0};
};

template <class T, class G>
__global__ void grid_sample_kernel(const T* __restrict__ x, const G* __restrict__ gr, T* __restrict__ y, GridGeom g,
                                   int64_t total) {
  for (int64_t np = global_tid(); np < total; np += global_threads()) {
    const int64_t n = np / g.points, p = np % g.points;
    grid::DimTaps taps[3];
    for (int i = 0; i < g.r; ++i) {
      const grid::SpatialDim d = grid::spatial_dim(g.size[i], g.align);
      const float coord = grid::denormalize(to_f(gr[np * g.r + (g.r - 1 - i)]), static_cast<float>(g.size[i]), g.align);
      taps[i] = grid::taps_for(static_cast<double>(coord), d, g.mode, g.padding);
    }
    for (int64_t ch = 0; ch < g.c; ++ch) {
      const T* img = x + (n * g.c + ch) * g.image;
      float acc = 0.f;
      int k[3] = {0, 0, 0};
      for (;;) {
        float w = 1.f;
        int64_t off = 0;
        for (int i = 0; i < g.r && off >= 0; ++i) {
          const int64_t idx = taps[i].index[k[i]];
          w *= static_cast<float>(taps[i].weight[k[i]]);
          off = idx < 0 ? -1 : off + idx * g.stride[i];
        }
        if (off >= 0 && w != 0.f) acc += w * to_f(img[off]);
        int i = g.r - 1;
        while (i >= 0 && ++k[i] == taps[i].n) k[i--] = 0;
        if (i < 0) break;
      }
      y[(n * g.c + ch) * g.points + p] = from_f<T>(acc);
    }
  }
}

// The same by rows: a block per output row (every dim but the last), its source row found once and
// the row's elements walked by the block's threads (coalesced; no per-element index division).
template <class T>
__global__ void pad_rows_kernel(const T* __restrict__ x, T* __restrict__ y, PadGeom g, int mode, T value, int64_t rows) {
  const int last = g.rank - 1;
  const int64_t w_out = g.out[last], w_in = g.in[last], b = g.begin[last];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    int64_t rest = r, src = 0, stride = w_in;
    bool inside = true;
    for (int d = last - 1; d >= 0; --d) {
      const int64_t o = rest % g.out[d];
      rest /= g.out[d];
      const int64_t s = pad_source(o - g.begin[d], g.in[d], mode);
      if (s < 0) inside = false;
      src += s * stride;
      stride *= g.in[d];
    }
    T* yr = y + r * w_out;
    for (int64_t w = threadIdx.x; w < w_out; w += blockDim.x) {
      const int64_t s = pad_source(w - b, w_in, mode);
      yr[w] = inside && s >= 0 ? x[src + s] : value;
    }
  }
}

}  // namespace

cudaError_t pad_nd(int elem_bytes, const void* x, void* y, int rank, const int64_t* in_dims, const int64_t* out_dims,
                   const int64_t* begin, int mode, uint64_t value_bits, cudaStream_t s) {
  if (rank < 1 || rank > kMaxRank || mode < 0 || mode > 3) return cudaErrorInvalidValue;
  PadGeom g;
  g.rank = rank;
  int64_t total = 1;
  for (int d = 0; d < rank; ++d) {
    if (in_dims[d] < 0 || out_dims[d] < 0) return cudaErrorInvalidValue;
    if (in_dims[d] == 0 && out_dims[d] > 0 && mode != 0) return cudaErrorInvalidValue;  // nothing to reflect
    g.in[d] = in_dims[d];
    g.out[d] = out_dims[d];
    g.begin[d] = begin[d];
    total *= out_dims[d];
  }
  if (total == 0) return cudaSuccess;
  return dispatch_bytes(elem_bytes, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (sizeof(T) > 8) {
      return cudaErrorInvalidValue;
    } else {
      T v;
      memcpy(&v, &value_bits, sizeof(T));
      const int64_t w_out = g.out[rank - 1];
      if (w_out >= 64) {  // rows long enough to keep a block's threads busy
        const int64_t rows = total / w_out;
        const unsigned grid = static_cast<unsigned>(rows < kMaxGrid * 16 ? rows : kMaxGrid * 16);
        pad_rows_kernel<T><<<grid, w_out >= 256 ? 256 : 128, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), g, mode,
                                                                       v, rows);
      } else if (fits_u32(total)) {
        pad_kernel<uint32_t, T><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), g, mode, v,
                                                                  total);
      } else {
        pad_kernel<uint64_t, T><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), g, mode, v,
                                                                  total);
      }
      return cudaGetLastError();
    }
  });
}

cudaError_t resize(DT dt, const void* x, void* y, int64_t outer, int sp, const int64_t* in_dims, const int64_t* out_dims,
                   int64_t inner, const int* taps_per_axis, const ResizeTap* taps, bool interpolate,
                   double extrapolation, uint64_t extrapolation_bits, cudaStream_t s) {
  if (sp < 1 || sp > 3 || outer < 0 || inner < 1) return cudaErrorInvalidValue;
  ResizeGeom g;
  g.sp = sp;
  g.inner = inner;
  int64_t total = outer * inner, entries = 0;
  bool same_n = true;
  for (int d = 0; d < sp; ++d) {
    if (in_dims[d] < 1 || out_dims[d] < 0 || taps_per_axis[d] < 1 || taps_per_axis[d] > 64) {
      return cudaErrorInvalidValue;
    }
    if (!interpolate && taps_per_axis[d] != 1) return cudaErrorInvalidValue;
    g.in[d] = in_dims[d];
    g.out[d] = out_dims[d];
    g.n[d] = taps_per_axis[d];
    g.table_at[d] = entries;
    entries += out_dims[d] * taps_per_axis[d];
    total *= out_dims[d];
    same_n = same_n && taps_per_axis[d] == taps_per_axis[0];
  }
  if (total == 0) return cudaSuccess;
  auto by_sp = [&](auto go) {
    if (sp == 1) go(std::integral_constant<int, 1>{});
    else if (sp == 2) go(std::integral_constant<int, 2>{});
    else go(std::integral_constant<int, 3>{});
    return cudaGetLastError();
  };
  if (!interpolate) {
    // Nearest in NHWC copies whole pixels: 16 bytes at a time when a pixel's channels allow and the
    // extrapolation value is zero (all-zero bytes in every dtype; another value is one element).
    const int64_t pixel_bytes = inner * dt_size(dt);
    int eb = dt_size(dt);
    ResizeGeom gv = g;
    int64_t tv = total;
    if (pixel_bytes % 16 == 0 && aligned_to(x, 16) && aligned_to(y, 16) && extrapolation_bits == 0) {
      eb = 16;
      gv.inner = pixel_bytes / 16;
      tv = total / inner * gv.inner;
    }
    return dispatch_bytes(eb, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T v{};
      if constexpr (sizeof(T) <= 8) memcpy(&v, &extrapolation_bits, sizeof(T));
      const auto* xt = static_cast<const T*>(x);
      auto* yt = static_cast<T*>(y);
      return by_sp([&](auto spc) {
        if (fits_u32(tv)) {
          resize_nearest_kernel<uint32_t, decltype(spc)::value, T><<<grid_for(tv), kBlock, 0, s>>>(xt, yt, gv, taps, v, tv);
        } else {
          resize_nearest_kernel<uint64_t, decltype(spc)::value, T><<<grid_for(tv), kBlock, 0, s>>>(xt, yt, gv, taps, v, tv);
        }
      });
    });
  }
  const int n = same_n ? taps_per_axis[0] : 0;
  const float ev = static_cast<float>(extrapolation);
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* xt = static_cast<const T*>(x);
    auto* yt = static_cast<T*>(y);
    return by_sp([&](auto spc) {
      constexpr int SP = decltype(spc)::value;
      if (n == 2 && fits_u32(total)) {  // linear: the common case, 32-bit index math
        resize_interp_kernel<uint32_t, SP, 2, T><<<grid_for(total), kBlock, 0, s>>>(xt, yt, g, taps, ev, total);
      } else if (n == 2) {
        resize_interp_kernel<uint64_t, SP, 2, T><<<grid_for(total), kBlock, 0, s>>>(xt, yt, g, taps, ev, total);
      } else if (n == 4) {
        resize_interp_kernel<uint64_t, SP, 4, T><<<grid_for(total), kBlock, 0, s>>>(xt, yt, g, taps, ev, total);
      } else {
        resize_interp_kernel<uint64_t, SP, 0, T><<<grid_for(total), kBlock, 0, s>>>(xt, yt, g, taps, ev, total);
      }
    });
  });
}

cudaError_t grid_sample(DT dt, DT grid_dt, const void* x, const void* grid, void* y, int64_t n, int64_t c, int r,
                        const int64_t* in_sp, int64_t points, int mode, int padding, bool align_corners,
                        cudaStream_t s) {
  if (r < 1 || r > 3 || n < 0 || c < 0 || points < 0 || mode < 0 || mode > 2 || padding < 0 || padding > 2) {
    return cudaErrorInvalidValue;
  }
  GridGeom g;
  g.r = r;
  g.mode = mode;
  g.padding = padding;
  g.align = align_corners;
  g.c = c;
  g.points = points;
  for (int i = r - 1; i >= 0; --i) {
    if (in_sp[i] < 1) return cudaErrorInvalidValue;
    g.size[i] = in_sp[i];
    g.stride[i] = g.image;
    g.image *= in_sp[i];
  }
  const int64_t total = n * points;
  if (total == 0 || c == 0) return cudaSuccess;
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return dispatch_f32ish(grid_dt, [&](auto gtag) {
      using G = typename decltype(gtag)::type;
      grid_sample_kernel<T, G><<<grid_for(total), kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<const G*>(grid),
                                                                 static_cast<T*>(y), g, total);
      return cudaGetLastError();
    });
  });
}

}  // namespace kiln::cuda::k
