// Pad and Resize: kernels where every output element reads the input at positions computed from its
// own index (a padded border, an interpolated grid). One thread per output element; the index is
// decomposed once per element, in 32 bits when the output allows.
#include <type_traits>

#include "backends/cuda/kernels/common.cuh"

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
// tensor, 1 for NCHW). Coordinates are computed in double, as the CPU reference does, so a nearest
// pick never rounds the other way; they depend on one axis each, so a first launch writes per-axis
// tables (source index pair and weight per output coordinate) and the main kernel only looks up.
struct ResizeGeom {
  int sp = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  double scale[3] = {1, 1, 1};  // output / input, as the coordinate transform uses it
  int64_t inner = 1;
  int64_t table_at[3] = {0, 0, 0};  // each axis's first entry in the tables
};

// The input coordinate (before rounding or interpolation) of output coordinate o. The "resized
// length" of align_corners and pytorch_half_pixel is scale * in (fractional when scales were given).
__device__ __forceinline__ double resize_coord(int64_t o, int64_t in, int64_t out, double s, int ctm) {
  const double od = static_cast<double>(o), ind = static_cast<double>(in), len = s * ind;
  switch (ctm) {
    case 0: return (od + 0.5) / s - 0.5;                                 // half_pixel
    case 1: return len == 1 ? -0.5 : (od + 0.5) / s - 0.5;               // pytorch_half_pixel
    case 2: return od / s;                                               // asymmetric
    case 3: return len == 1 ? 0.0 : od * (ind - 1) / (len - 1);          // align_corners
    case 4: return ind / 2 * (1 - static_cast<double>(out) / len) + (od + 0.5) / s - 0.5;  // half_pixel_symmetric
    default: return (od + 0.5) / s;                                      // tf_half_pixel_for_nn
  }
}

__device__ __forceinline__ int64_t nearest_index(double x, int64_t n, int nearest) {
  const double f = floor(x);
  int64_t i;
  if (x == f) i = static_cast<int64_t>(f);
  else if (nearest == 0) i = static_cast<int64_t>(x - f <= 0.5 ? f : f + 1);  // round_prefer_floor
  else if (nearest == 1) i = static_cast<int64_t>(x - f < 0.5 ? f : f + 1);   // round_prefer_ceil
  else if (nearest == 2) i = static_cast<int64_t>(f);                         // floor
  else i = static_cast<int64_t>(f + 1);                                       // ceil
  return i < 0 ? 0 : (i >= n ? n - 1 : i);
}

struct Tap {
  int32_t lo, hi;
  float w;  // weight of hi (linear); 0 for nearest, whose pick is lo
};

__global__ void resize_table_kernel(ResizeGeom g, bool linear, int ctm, int nearest, Tap* __restrict__ taps, int64_t n) {
  for (int64_t t = global_tid(); t < n; t += global_threads()) {
    int d = 0;
    while (d + 1 < g.sp && t >= g.table_at[d + 1]) ++d;
    const int64_t o = t - g.table_at[d];
    double c = resize_coord(o, g.in[d], g.out[d], g.scale[d], ctm);
    if (!linear) {
      const int32_t i = static_cast<int32_t>(nearest_index(c, g.in[d], nearest));
      taps[t] = Tap{i, i, 0.f};
      continue;
    }
    // Clamping the coordinate into [0, in - 1] first gives what the reference's clamped taps give.
    const double maxc = static_cast<double>(g.in[d] - 1);
    c = c < 0 ? 0 : (c > maxc ? maxc : c);
    const double f = floor(c);
    const int32_t lo = static_cast<int32_t>(f);
    taps[t] = Tap{lo, lo + 1 < g.in[d] ? lo + 1 : lo, static_cast<float>(c - f)};
  }
}

template <class U, int SP, bool kLinear, class T>
__global__ void resize_kernel(const T* __restrict__ x, T* __restrict__ y, ResizeGeom g, const Tap* __restrict__ taps,
                              int64_t total) {
  for (int64_t i = global_tid(); i < total; i += global_threads()) {
    U rest = static_cast<U>(i);
    const U c = rest % static_cast<U>(g.inner);
    rest /= static_cast<U>(g.inner);
    Tap tp[SP];
#pragma unroll
    for (int d = SP - 1; d >= 0; --d) {
      const U o = rest % static_cast<U>(g.out[d]);
      rest /= static_cast<U>(g.out[d]);
      tp[d] = taps[g.table_at[d] + static_cast<int64_t>(o)];
    }
    int64_t plane = 1;
#pragma unroll
    for (int d = 0; d < SP; ++d) plane *= g.in[d];
    const T* xp = x + static_cast<int64_t>(rest) * plane * g.inner + static_cast<int64_t>(c);
    if constexpr (!kLinear) {
      int64_t src = 0;
#pragma unroll
      for (int d = 0; d < SP; ++d) src = src * g.in[d] + tp[d].lo;
      y[i] = xp[src * g.inner];
    } else {
      float acc = 0.f;
#pragma unroll
      for (int corner = 0; corner < (1 << SP); ++corner) {
        float wt = 1.f;
        int64_t src = 0;
#pragma unroll
        for (int d = 0; d < SP; ++d) {
          const bool up = (corner >> (SP - 1 - d)) & 1;
          wt *= up ? tp[d].w : 1.f - tp[d].w;
          src = src * g.in[d] + (up ? tp[d].hi : tp[d].lo);
        }
        acc += wt * to_f(xp[src * g.inner]);
      }
      y[i] = from_f<T>(acc);
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

size_t resize_scratch_bytes(int sp, const int64_t* out_dims) {
  int64_t n = 0;
  for (int d = 0; d < sp && d < 3; ++d) n += out_dims[d];
  return size_t(n) * sizeof(Tap);
}

cudaError_t resize(DT dt, const void* x, void* y, int64_t outer, int sp, const int64_t* in_dims, const int64_t* out_dims,
                   int64_t inner, const double* scales, bool linear, int ctm, int nearest, void* scratch,
                   cudaStream_t s) {
  if (sp < 1 || sp > 3 || outer < 0 || inner < 1 || ctm < 0 || ctm > 5 || nearest < 0 || nearest > 3) {
    return cudaErrorInvalidValue;
  }
  ResizeGeom g;
  g.sp = sp;
  g.inner = inner;
  int64_t total = outer * inner, entries = 0;
  for (int d = 0; d < sp; ++d) {
    if (in_dims[d] < 1 || in_dims[d] > 0x7fffffff || out_dims[d] < 0 || !(scales[d] > 0)) return cudaErrorInvalidValue;
    g.in[d] = in_dims[d];
    g.out[d] = out_dims[d];
    g.scale[d] = scales[d];
    g.table_at[d] = entries;
    entries += out_dims[d];
    total *= out_dims[d];
  }
  if (total == 0) return cudaSuccess;
  auto* taps = static_cast<Tap*>(scratch);
  resize_table_kernel<<<grid_for(entries), kBlock, 0, s>>>(g, linear, ctm, nearest, taps, entries);
  // Nearest in NHWC copies whole pixels: 16 bytes at a time when a pixel's channels allow.
  const int64_t pixel_bytes = inner * dt_size(dt);
  if (!linear && pixel_bytes % 16 == 0 && aligned_to(x, 16) && aligned_to(y, 16)) {
    ResizeGeom gv = g;
    gv.inner = pixel_bytes / 16;
    const int64_t tv = total / inner * gv.inner;
    auto go = [&](auto u, auto spc) {
      using U = decltype(u);
      resize_kernel<U, decltype(spc)::value, false, uint4>
          <<<grid_for(tv), kBlock, 0, s>>>(static_cast<const uint4*>(x), static_cast<uint4*>(y), gv, taps, tv);
    };
    auto by_sp = [&](auto u) {
      if (sp == 1) go(u, std::integral_constant<int, 1>{});
      else if (sp == 2) go(u, std::integral_constant<int, 2>{});
      else go(u, std::integral_constant<int, 3>{});
    };
    if (fits_u32(tv)) by_sp(uint32_t{});
    else by_sp(uint64_t{});
    return cudaGetLastError();
  }
  return dispatch_f32ish(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* xt = static_cast<const T*>(x);
    auto* yt = static_cast<T*>(y);
    auto go = [&](auto u, auto spc, auto lin) {
      using U = decltype(u);
      resize_kernel<U, decltype(spc)::value, decltype(lin)::value, T>
          <<<grid_for(total), kBlock, 0, s>>>(xt, yt, g, taps, total);
    };
    auto by_sp = [&](auto u, auto lin) {
      if (sp == 1) go(u, std::integral_constant<int, 1>{}, lin);
      else if (sp == 2) go(u, std::integral_constant<int, 2>{}, lin);
      else go(u, std::integral_constant<int, 3>{}, lin);
    };
    auto by_lin = [&](auto u) {
      if (linear) by_sp(u, std::true_type{});
      else by_sp(u, std::false_type{});
    };
    if (fits_u32(total)) by_lin(uint32_t{});
    else by_lin(uint64_t{});
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda::k
