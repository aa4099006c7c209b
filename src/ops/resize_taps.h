// Resize planning shared by the CPU kernel (image_resize.cc) and the GPU lowering
// (backends/cuda/lower_resample.cc): the attributes, each resized axis's sizes/scale/roi, and per
// output coordinate the input taps and their weights. Both backends interpolate from the same
// taps, so every mode, coordinate transform, antialiasing and exclude_outside mean one thing.
#pragma once

#include <cmath>
#include <vector>

#include "ops/image_util.h"

namespace kiln {

enum class ResizeMode { kNearest, kLinear, kCubic };
enum class CoordMode { kHalfPixel, kHalfPixelSymmetric, kPytorchHalfPixel, kAlignCorners, kAsymmetric, kTfCropAndResize,
                       kTfHalfPixelForNn };
enum class NearestMode { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };
enum class AspectPolicy { kStretch, kNotLarger, kNotSmaller };

inline constexpr NamedValue<ResizeMode> kResizeModes[] = {
    {"nearest", ResizeMode::kNearest}, {"linear", ResizeMode::kLinear}, {"cubic", ResizeMode::kCubic}};
inline constexpr NamedValue<CoordMode> kResizeCoordModes[] = {
    {"half_pixel", CoordMode::kHalfPixel},
    {"half_pixel_symmetric", CoordMode::kHalfPixelSymmetric},
    {"pytorch_half_pixel", CoordMode::kPytorchHalfPixel},
    {"align_corners", CoordMode::kAlignCorners},
    {"asymmetric", CoordMode::kAsymmetric},
    {"tf_crop_and_resize", CoordMode::kTfCropAndResize},
    // Resize-11/12 only (dropped in opset 13); kept so older models run unchanged
    {"tf_half_pixel_for_nn", CoordMode::kTfHalfPixelForNn}};
inline constexpr NamedValue<NearestMode> kResizeNearestModes[] = {
    {"round_prefer_floor", NearestMode::kRoundPreferFloor},
    {"round_prefer_ceil", NearestMode::kRoundPreferCeil},
    {"floor", NearestMode::kFloor},
    {"ceil", NearestMode::kCeil}};
inline constexpr NamedValue<AspectPolicy> kResizeAspectPolicies[] = {
    {"stretch", AspectPolicy::kStretch}, {"not_larger", AspectPolicy::kNotLarger}, {"not_smaller", AspectPolicy::kNotSmaller}};

struct ResizeAttrs {
  ResizeMode mode;
  CoordMode coord;
  NearestMode nearest;
  AspectPolicy aspect;
  double cubic_a;
  bool exclude_outside, antialias;
  double extrapolation;
  std::vector<int64_t> axes;  // the resized axes, normalized, in attribute order (all when absent)
};

// The attributes of c.node() for an input of `rank` (Ctx: anything with node(), error() and what
// normalize_axis needs: InferCtx, KernelCtx, the GPU lowering's context).
template <typename Ctx>
Expected<ResizeAttrs> parse_resize_attrs(const Ctx& c, int64_t rank) {
  const Node& n = c.node();
  ResizeAttrs a;
  KILN_ASSIGN_OR_RETURN(a.mode, parse_enum_attr(c, "mode", "nearest", kResizeModes));
  KILN_ASSIGN_OR_RETURN(a.coord, parse_enum_attr(c, "coordinate_transformation_mode", "half_pixel", kResizeCoordModes));
  KILN_ASSIGN_OR_RETURN(a.nearest, parse_enum_attr(c, "nearest_mode", "round_prefer_floor", kResizeNearestModes));
  KILN_ASSIGN_OR_RETURN(a.aspect, parse_enum_attr(c, "keep_aspect_ratio_policy", "stretch", kResizeAspectPolicies));
  a.cubic_a = n.attr_float("cubic_coeff_a", -0.75f);
  a.exclude_outside = n.attr_int("exclude_outside", 0) != 0;
  a.antialias = n.attr_int("antialias", 0) != 0;
  a.extrapolation = n.attr_float("extrapolation_value", 0.0f);
  if (!n.has_attr("axes")) {
    for (int64_t i = 0; i < rank; ++i) a.axes.push_back(i);
    return a;
  }
  std::vector<bool> seen(size_t(rank), false);
  for (int64_t ax : n.attr_ints("axes")) {
    if (ax < -rank || ax >= rank) return c.error("axis {} is out of range for rank {}", ax, rank);
    const int64_t k = ax < 0 ? ax + rank : ax;
    if (seen[size_t(k)]) return c.error("axes lists axis {} twice", ax);
    seen[size_t(k)] = true;
    a.axes.push_back(k);
  }
  return a;
}

// How one axis is resized: sizes, the scale used by the coordinate transform, and the roi.
struct AxisResize {
  int64_t in = 1, out = 1;
  double scale = 1;
  double roi_start = 0, roi_end = 1;
  bool identity() const { return in == out && scale == 1 && roi_start == 0 && roi_end == 1; }
};

// Each axis's plan for an input of dims `in` from the roi, scales and sizes inputs (null or empty
// when absent; exactly one of scales and sizes must have values).
template <typename Ctx>
Expected<std::vector<AxisResize>> plan_resize(const Ctx& c, const ResizeAttrs& a, const std::vector<int64_t>& in,
                                              const Tensor* roi, const Tensor* scales, const Tensor* sizes) {
  std::vector<AxisResize> plan(in.size());
  for (size_t i = 0; i < in.size(); ++i) plan[i].in = plan[i].out = in[i];
  const size_t na = a.axes.size();
  if (sizes && sizes->numel() > 0) {
    if (size_t(sizes->numel()) != na) return c.error("sizes has {} values, expected {}", sizes->numel(), na);
    for (size_t i = 0; i < na; ++i) {
      AxisResize& p = plan[size_t(a.axes[i])];
      p.out = sizes->as_int(int64_t(i));
      if (p.out < 0) return c.error("sizes[{}] is negative ({})", i, p.out);
      p.scale = p.in == 0 ? 1.0 : double(p.out) / double(p.in);
    }
    if (a.aspect != AspectPolicy::kStretch && na > 0) {
      // One scale for every resized axis: the smallest (not_larger) or largest (not_smaller).
      double s = plan[size_t(a.axes[0])].scale;
      for (int64_t ax : a.axes) {
        s = a.aspect == AspectPolicy::kNotLarger ? std::min(s, plan[size_t(ax)].scale)
                                                 : std::max(s, plan[size_t(ax)].scale);
      }
      for (int64_t ax : a.axes) {
        AxisResize& p = plan[size_t(ax)];
        p.scale = s;
        p.out = int64_t(s * double(p.in) + 0.5);  // round half up
      }
    }
  } else {
    if (!scales || scales->numel() == 0) return c.error("one of scales and sizes must be given");
    if (size_t(scales->numel()) != na) return c.error("scales has {} values, expected {}", scales->numel(), na);
    for (size_t i = 0; i < na; ++i) {
      AxisResize& p = plan[size_t(a.axes[i])];
      p.scale = scales->as_double(int64_t(i));
      if (!(p.scale > 0) || !std::isfinite(p.scale)) return c.error("scales[{}] must be positive, got {}", i, p.scale);
      const double out = std::floor(p.scale * double(p.in));
      if (out > 1e15) return c.error("scales[{}] = {} makes an output dimension too large", i, p.scale);
      p.out = int64_t(out);
    }
  }
  // roi only matters for tf_crop_and_resize (the spec ignores it otherwise).
  if (a.coord == CoordMode::kTfCropAndResize && roi && roi->numel() > 0) {
    if (size_t(roi->numel()) != 2 * na) return c.error("roi has {} values, expected {}", roi->numel(), 2 * na);
    for (size_t i = 0; i < na; ++i) {
      plan[size_t(a.axes[i])].roi_start = roi->as_double(int64_t(i));
      plan[size_t(a.axes[i])].roi_end = roi->as_double(int64_t(na + i));
    }
  }
  return plan;
}

// For each output position along one axis: n input taps (indices clamped into range, which is the
// reference's edge padding) and their weights, or a flag to write extrapolation_value instead.
struct AxisTaps {
  int64_t n = 1;
  std::vector<int64_t> index;        // [out * n]
  std::vector<double> weight;        // [out * n]
  std::vector<uint8_t> extrapolate;  // [out]
};

AxisTaps plan_taps(const AxisResize& p, const ResizeAttrs& a);

}  // namespace kiln
