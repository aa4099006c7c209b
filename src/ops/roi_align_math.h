// RoiAlign's per-bin math, shared by the CPU kernel (nn_pool_roi.cc) and the CUDA kernel
// (backends/cuda/kernels/roi.cu): the bilinear samples of one output bin, as the ONNX reference
// (and onnxruntime) place them. Plain C++ that nvcc compiles for the device too (KILN_HD).
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/grid_sample_math.h"  // KILN_HD

namespace kiln::roi {

// One bilinear sample: the four neighbours' offsets in the plane and their weights (all zero when
// the point is more than one pixel outside the plane).
struct Bilinear {
  int64_t off[4] = {0, 0, 0, 0};
  double w[4] = {0, 0, 0, 0};
};

KILN_HD Bilinear bilinear_at(double y, double x, int64_t height, int64_t width) {
  Bilinear b;
  if (!(y >= -1.0 && y <= double(height) && x >= -1.0 && x <= double(width))) return b;  // NaN too
  y = y < 0 ? 0.0 : y;
  x = x < 0 ? 0.0 : x;
  int64_t y0 = int64_t(y), x0 = int64_t(x), y1 = y0 + 1, x1 = x0 + 1;
  if (y0 >= height - 1) y = double(y1 = y0 = height - 1);
  if (x0 >= width - 1) x = double(x1 = x0 = width - 1);
  const double ly = y - double(y0), lx = x - double(x0), hy = 1 - ly, hx = 1 - lx;
  b.off[0] = y0 * width + x0;
  b.off[1] = y0 * width + x1;
  b.off[2] = y1 * width + x0;
  b.off[3] = y1 * width + x1;
  b.w[0] = hy * hx;
  b.w[1] = hy * lx;
  b.w[2] = ly * hx;
  b.w[3] = ly * lx;
  return b;
}

struct Align {
  double spatial_scale = 1;
  int64_t sampling_ratio = 0;  // samples per bin side; 0: adaptive (ceil of the bin size)
  bool half_pixel = true;      // coordinate_transformation_mode half_pixel (else output_half_pixel)
  bool is_max = false;         // mode max (else avg)
  int64_t out_h = 1, out_w = 1, height = 1, width = 1;
};

// The most samples per bin side a roi may ask for (sampling_ratio, or the adaptive grid of a roi
// far larger than the map): more is a malformed roi, which would take hours, not an answer.
constexpr int64_t kMaxSamplesPerSide = 4096;

// Whether the roi [x1, y1, x2, y2] can be aligned: finite coordinates, and a sample grid per bin of
// at most kMaxSamplesPerSide a side. Both backends refuse (as an error) a roi that is not.
KILN_HD bool roi_ok(const Align& a, const double* roi) {
  for (int k = 0; k < 4; ++k) {
    if (!(roi[k] * a.spatial_scale >= -1e15 && roi[k] * a.spatial_scale <= 1e15)) return false;  // NaN, Inf, absurd
  }
  if (a.sampling_ratio > kMaxSamplesPerSide) return false;
  if (a.sampling_ratio > 0) return true;
  const double rh = (roi[3] - roi[1]) * a.spatial_scale, rw = (roi[2] - roi[0]) * a.spatial_scale;
  return rh / double(a.out_h) <= double(kMaxSamplesPerSide) && rw / double(a.out_w) <= double(kMaxSamplesPerSide);
}

// Output bin (bh, bw) of the roi [x1, y1, x2, y2] (roi_ok) (input coordinates before spatial_scale) over one
// plane, whose element at offset o is load(o): the mean (or max) of a grid of bilinear samples.
template <class Load>
KILN_HD double align_bin(const Align& a, const double* roi, int64_t bh, int64_t bw, Load load) {
  const double offset = a.half_pixel ? 0.5 : 0.0;
  const double x0 = roi[0] * a.spatial_scale - offset, y0 = roi[1] * a.spatial_scale - offset;
  double rw = roi[2] * a.spatial_scale - offset - x0, rh = roi[3] * a.spatial_scale - offset - y0;
  if (!a.half_pixel) {  // malformed rois are forced to 1x1
    rw = rw < 1.0 ? 1.0 : rw;
    rh = rh < 1.0 ? 1.0 : rh;
  }
  const double bin_h = rh / double(a.out_h), bin_w = rw / double(a.out_w);
  const int64_t gh = a.sampling_ratio > 0 ? a.sampling_ratio : int64_t(ceil(rh / double(a.out_h)));
  const int64_t gw = a.sampling_ratio > 0 ? a.sampling_ratio : int64_t(ceil(rw / double(a.out_w)));
  const double count = double(gh * gw > 1 ? gh * gw : 1);
  double acc = 0;
  bool first = true;
  for (int64_t iy = 0; iy < gh; ++iy) {
    const double yy = y0 + double(bh) * bin_h + (double(iy) + 0.5) * bin_h / double(gh);
    for (int64_t ix = 0; ix < gw; ++ix) {
      const double xx = x0 + double(bw) * bin_w + (double(ix) + 0.5) * bin_w / double(gw);
      const Bilinear b = bilinear_at(yy, xx, a.height, a.width);
      if (!a.is_max) {
        for (int k = 0; k < 4; ++k) acc += b.w[k] * load(b.off[k]);
        continue;
      }
      double v = b.w[0] * load(b.off[0]);
      for (int k = 1; k < 4; ++k) {
        const double u = b.w[k] * load(b.off[k]);
        v = u > v ? u : v;
      }
      acc = first || v > acc ? v : acc;
      first = false;
    }
  }
  return a.is_max ? acc : acc / count;
}

}  // namespace kiln::roi
