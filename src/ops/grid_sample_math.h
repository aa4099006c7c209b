// GridSample's per-point math, shared by the CPU kernel (image_grid.cc) and the CUDA kernel
// (backends/cuda/kernels/resample.cu): a normalized grid coordinate to the pixel taps and weights
// along one spatial dim, with PyTorch's padding modes. Plain C++ that nvcc compiles for the device
// too (KILN_HD), so both backends read the same pixels with the same weights.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define KILN_HD __host__ __device__ inline
#else
#define KILN_HD inline
#endif

namespace kiln::grid {

enum Mode : int { kNearest = 0, kLinear = 1, kCubic = 2 };
enum Padding : int { kZeros = 0, kBorder = 1, kReflection = 2 };

KILN_HD double clampd(double x, double lo, double hi) { return x < lo ? lo : (x > hi ? hi : x); }
KILN_HD int64_t clampi(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Reflects x into [lo, hi] by the nearer border, repeatedly (PyTorch reflect_coordinates).
KILN_HD double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    const double d = lo - x;
    const int64_t n = int64_t(d / range);
    const double rem = d - double(n) * range;
    return n % 2 == 0 ? lo + rem : hi - rem;
  }
  if (x > hi) {
    const double d = x - hi;
    const int64_t n = int64_t(d / range);
    const double rem = d - double(n) * range;
    return n % 2 == 0 ? hi - rem : lo + rem;
  }
  return x;
}

// One spatial dimension: its size and the coordinate range inside the image.
struct SpatialDim {
  int64_t size;
  double lo, hi;  // [-0.5, size-0.5], or [0, size-1] with align_corners
};

KILN_HD SpatialDim spatial_dim(int64_t size, bool align_corners) {
  return align_corners ? SpatialDim{size, 0.0, double(size - 1)} : SpatialDim{size, -0.5, double(size) - 0.5};
}

// Maps an integer tap to a pixel index under the padding mode; -1 means "reads zero".
KILN_HD int64_t pad_index(int64_t i, const SpatialDim& d, int padding) {
  if (padding == kZeros) return i >= 0 && i < d.size ? i : -1;
  if (padding == kBorder) return clampi(i, 0, d.size - 1);
  return clampi(int64_t(reflect(double(i), d.lo, d.hi)), 0, d.size - 1);
}

// The taps of one point along one spatial dim: up to 4 pixel indices (-1 = zero) and weights.
struct DimTaps {
  int n = 0;
  int64_t index[4];
  double weight[4];
};

// The taps around pixel-space coordinate `coord` (cubic: Keys with A = -0.75, as PyTorch).
KILN_HD DimTaps taps_for(double coord, const SpatialDim& d, int mode, int padding) {
  DimTaps t;
  if (mode == kNearest) coord = nearbyint(coord);  // ties to even, as PyTorch
  // Points outside the image move inside for border/reflection padding before interpolation.
  if (coord < d.lo || coord > d.hi) {
    if (padding == kBorder) coord = clampd(coord, 0.0, double(d.size - 1));
    else if (padding == kReflection) coord = reflect(coord, d.lo, d.hi);
  }
  // Far-away points only ever read padding; bounding them keeps the integer casts defined.
  coord = clampd(coord, -double(d.size) - 8, 2 * double(d.size) + 8);
  if (mode == kNearest) {
    t.n = 1;
    t.index[0] = pad_index(int64_t(coord), d, padding);
    t.weight[0] = 1;
    return t;
  }
  const double f = floor(coord), frac = coord - f;
  const int64_t i0 = int64_t(f);
  if (mode == kLinear) {
    t.n = 2;
    t.index[0] = pad_index(i0, d, padding);
    t.index[1] = pad_index(i0 + 1, d, padding);
    t.weight[0] = 1 - frac;
    t.weight[1] = frac;
    return t;
  }
  const double A = -0.75;
  const double n0 = frac, n1 = 1 - frac, f0 = frac + 1, f1 = 2 - frac;
  t.n = 4;
  t.weight[0] = ((A * f0 - 5 * A) * f0 + 8 * A) * f0 - 4 * A;
  t.weight[1] = ((A + 2) * n0 - (A + 3)) * n0 * n0 + 1;
  t.weight[2] = ((A + 2) * n1 - (A + 3)) * n1 * n1 + 1;
  t.weight[3] = ((A * f1 - 5 * A) * f1 + 8 * A) * f1 - 4 * A;
  for (int k = 0; k < 4; ++k) t.index[k] = pad_index(i0 - 1 + k, d, padding);
  return t;
}

// A normalized grid value v in [-1, 1] to pixel space along a dim of `len` pixels, in C (the
// grid's compute type: float for 16/32-bit grids, double for f64).
template <typename C>
KILN_HD C denormalize(C v, C len, bool align_corners) {
  return align_corners ? (v + C(1)) / C(2) * (len - C(1)) : ((v + C(1)) * len - C(1)) / C(2);
}

}  // namespace kiln::grid
