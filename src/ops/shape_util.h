// Helpers shared by the shape, slice and reduce families: dtype-agnostic data movement (copies do
// not care what the bytes mean, so one routine serves every dtype, strings included), per-axis
// iteration plans for reductions, and small inference helpers for value-dependent shapes.
#pragma once

#include <optional>
#include <vector>

#include "ops/op_util.h"

namespace kiln {

// Affine copy: for every multi-index i over `dims` (row-major),
//   dst[dst_base + sum_k i_k*dst_strides[k]] = src[src_base + sum_k i_k*src_strides[k]].
// Transpose, Expand, Concat, Split, DepthToSpace... are all this with different strides.
void copy_strided(const Tensor& src, int64_t src_base, const std::vector<int64_t>& src_strides, Tensor& dst,
                  int64_t dst_base, const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& dims);

// Per-axis gather into a contiguous dst whose dims are the maps' sizes: dst at multi-index i takes
// src[sum_k maps[k][i_k] * strides_of(src)[k]]; a -1 entry on any axis leaves dst as it is
// (padding). Slice, Tile and every Pad mode are this with different maps.
void gather_axes(const Tensor& src, Tensor& dst, const std::vector<std::vector<int64_t>>& maps);

// Sets every element of dst to element 0 of `value` (same dtype).
void fill_with(Tensor& dst, const Tensor& value);

// dst = src with axes permuted: dst.dims[k] = src.dims[perm[k]].
Expected<Tensor> transpose_tensor(const Tensor& src, const std::vector<int64_t>& perm);

// How a tensor splits into independent lines for reductions and per-axis ops: every output element
// (or line) starts at outer[o] in the input and covers the input offsets outer[o] + inner[j].
struct AxisPlan {
  std::vector<int64_t> outer;  // one per kept multi-index, row-major over the kept axes
  std::vector<int64_t> inner;  // one per reduced multi-index, row-major over the reduced axes
};
AxisPlan make_axis_plan(const std::vector<int64_t>& dims, const std::vector<bool>& reduced);

// Normalizes a list of axes against rank, rejecting out-of-range and repeated axes; returns a
// per-axis mask.
Expected<std::vector<bool>> axes_mask(const InferCtx& c, const std::vector<int64_t>& axes, int64_t rank);
Expected<std::vector<bool>> axes_mask(const KernelCtx& c, const std::vector<int64_t>& axes, int64_t rank);

// Input i as int64 values when it is fully known at inference time (constant, or dims_value with
// only static dims); nullopt otherwise.
std::optional<std::vector<int64_t>> static_ints(const InferCtx& c, size_t i);

// The input's dims when its shape is static, else nullopt.
std::optional<std::vector<int64_t>> static_dims(const InferCtx& c, size_t i);

// Requires input i to be a tensor of rank r (when the rank is known).
Status check_rank(const InferCtx& c, size_t i, size_t r);

}  // namespace kiln
