// Resize taps (resize_taps.h): per output coordinate of one axis, the input positions and weights
// the ONNX reference (onnx/reference/ops/op_resize.py) interpolates from.
#include "ops/resize_taps.h"

#include <algorithm>

namespace kiln {

namespace {

// The source coordinate of output index y along one axis. Like the reference, the "resized
// length" in align_corners / pytorch_half_pixel is scale * in, which is fractional when scales
// (not sizes) were given.
double source_coord(const AxisResize& p, CoordMode m, int64_t y) {
  const double in = double(p.in), out = p.scale * in, s = p.scale, yd = double(y);
  switch (m) {
    case CoordMode::kHalfPixel: return (yd + 0.5) / s - 0.5;
    case CoordMode::kHalfPixelSymmetric: {
      double offset = in / 2 * (1 - double(p.out) / out);
      return offset + (yd + 0.5) / s - 0.5;
    }
    case CoordMode::kPytorchHalfPixel: return out == 1 ? -0.5 : (yd + 0.5) / s - 0.5;
    case CoordMode::kAlignCorners: return out == 1 ? 0 : yd * (in - 1) / (out - 1);
    case CoordMode::kAsymmetric: return yd / s;
    case CoordMode::kTfHalfPixelForNn: return (yd + 0.5) / s;
    case CoordMode::kTfCropAndResize: {
      double span = (p.roi_end - p.roi_start) * (in - 1);
      return p.roi_start * (in - 1) + (out == 1 ? span / 2 : yd * span / (out - 1));
    }
  }
  return 0;
}

int64_t nearest_index(double x, NearestMode m) {
  double f = std::floor(x);
  if (x == f) return int64_t(f);
  switch (m) {
    case NearestMode::kRoundPreferFloor: return int64_t(x - f <= 0.5 ? f : f + 1);
    case NearestMode::kRoundPreferCeil: return int64_t(x - f < 0.5 ? f : f + 1);
    case NearestMode::kFloor: return int64_t(f);
    case NearestMode::kCeil: return int64_t(f + 1);
  }
  return int64_t(f);
}

// Interpolation kernels as functions of the distance between a tap and the source coordinate.
double linear_weight(double d) { return std::max(0.0, 1 - std::abs(d)); }
double cubic_weight(double d, double A) {
  d = std::abs(d);
  if (d <= 1) return ((A + 2) * d - (A + 3)) * d * d + 1;
  if (d < 2) return ((A * d - 5 * A) * d + 8 * A) * d - 4 * A;
  return 0;
}

}  // namespace

AxisTaps plan_taps(const AxisResize& p, const ResizeAttrs& a) {
  AxisTaps t;
  const bool nearest = a.mode == ResizeMode::kNearest;
  // Linear has support 1, cubic 2. Antialiasing stretches the kernel by 1/scale when
  // downsampling, so more taps fall inside it.
  const double support = a.mode == ResizeMode::kCubic ? 2 : 1;
  const double ks = a.antialias && !nearest ? std::min(p.scale, 1.0) : 1.0;
  const int64_t start = int64_t(std::floor(-support / ks)) + 1;
  t.n = nearest ? 1 : 2 - 2 * start;
  t.index.resize(size_t(p.out * t.n));
  t.weight.resize(size_t(p.out * t.n));
  t.extrapolate.resize(size_t(p.out));
  const double in = double(p.in);
  for (int64_t y = 0; y < p.out; ++y) {
    double x = source_coord(p, a.coord, y);
    t.extrapolate[size_t(y)] = a.coord == CoordMode::kTfCropAndResize && (x < 0 || x > in - 1);
    // Far outside, every tap is clamped to an edge anyway; bounding x keeps the casts defined.
    x = std::clamp(x, -in - double(t.n) - 2, 2 * in + double(t.n) + 2);
    int64_t* idx = &t.index[size_t(y * t.n)];
    double* w = &t.weight[size_t(y * t.n)];
    if (nearest) {
      idx[0] = std::clamp<int64_t>(nearest_index(x, a.nearest), 0, p.in - 1);
      w[0] = 1;
      continue;
    }
    const int64_t x0 = int64_t(std::floor(x));
    double sum = 0;
    for (int64_t k = 0; k < t.n; ++k) {
      idx[k] = x0 + start + k;
      double d = (double(idx[k]) - x) * ks;
      w[k] = a.mode == ResizeMode::kCubic ? cubic_weight(d, a.cubic_a) : linear_weight(d);
      if (a.exclude_outside && (idx[k] < 0 || idx[k] >= p.in)) w[k] = 0;
      sum += w[k];
    }
    // Antialiased kernels and exclude_outside renormalize the weights to sum to 1.
    if ((a.antialias || a.exclude_outside) && sum != 0) {
      for (int64_t k = 0; k < t.n; ++k) w[k] /= sum;
    }
    for (int64_t k = 0; k < t.n; ++k) idx[k] = std::clamp<int64_t>(idx[k], 0, p.in - 1);
  }
  return t;
}

}  // namespace kiln
