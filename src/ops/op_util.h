// Helpers shared by op families: axis handling, broadcasting (symbolic and concrete), common
// inference rules, and strided index iteration for the CPU kernels.
#pragma once

#include <string>
#include <vector>

#include "ops/op_registry.h"

namespace kiln {

// Data-movement kernels (Gather, Slice, Concat, Scatter without reduction...) only copy elements,
// so they dispatch on the storage width rather than on every dtype: one instantiation per width.
// Calls f.template operator()<S>() with S one of uint8_t, uint16_t, uint32_t, uint64_t, std::string.
template <typename F>
decltype(auto) visit_storage(DType dt, F&& f) {
  if (dt == DType::kString) return f.template operator()<std::string>();
  switch (dtype_size(dt)) {
    case 1: return f.template operator()<uint8_t>();
    case 2: return f.template operator()<uint16_t>();
    case 4: return f.template operator()<uint32_t>();
    default: return f.template operator()<uint64_t>();
  }
}

// Maps axis in [-rank, rank) to [0, rank); errors (naming the node) outside that range.
Expected<int64_t> normalize_axis(const InferCtx& c, int64_t axis, int64_t rank);
Expected<int64_t> normalize_axis(const KernelCtx& c, int64_t axis, int64_t rank);
// The same for an axis that indexes a dim of the input (so a scalar, which has none, is an error;
// normalize_axis lets axis 0 through at rank 0 for ops that accept scalars).
Expected<int64_t> normalize_dim_axis(const InferCtx& c, int64_t axis, int64_t rank);
Expected<int64_t> normalize_dim_axis(const KernelCtx& c, int64_t axis, int64_t rank);

// Numpy-style multidirectional broadcast of symbolic shapes; an error names the node and shapes.
Expected<Shape> broadcast_shapes(const InferCtx& c, const std::vector<Shape>& shapes);
// The same on concrete dims.
Expected<std::vector<int64_t>> broadcast_dims(const KernelCtx& c, const std::vector<std::vector<int64_t>>& dims);

// Inference rules used by many ops.
Status infer_same_as_input0(InferCtx& c);              // output 0 = type of input 0
Status infer_broadcast_same_dtype(InferCtx& c);        // inputs share a dtype; output broadcast
Status infer_broadcast_bool_output(InferCtx& c);       // comparisons: bool, broadcast
// Requires inputs [first, last) to have the same dtype (when known); errors name the node.
Status check_same_dtype(InferCtx& c, size_t first, size_t last);

// Row-major strides of dims.
std::vector<int64_t> strides_of(const std::vector<int64_t>& dims);
// Strides of `in` when broadcast to `out` (0 on broadcast dims); in is right-aligned to out.
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in, const std::vector<int64_t>& out);

// Iterates the multi-index of `dims` in row-major order, tracking one offset per stride set.
// for (BroadcastIter it(out_dims, {sa, sb}); !it.done(); it.next()) out[i++] = a[it.offset(0)] + b[it.offset(1)];
class StridedIter {
 public:
  StridedIter(const std::vector<int64_t>& dims, std::vector<std::vector<int64_t>> strides);
  bool done() const { return done_; }
  int64_t offset(size_t k) const { return offsets_[k]; }
  void next();

 private:
  std::vector<int64_t> dims_, index_;
  std::vector<std::vector<int64_t>> strides_;
  std::vector<int64_t> offsets_;
  bool done_ = false;
};

// Reads an optional 1-D int64 input as a vector (empty if absent).
std::vector<int64_t> optional_ints(const KernelCtx& c, size_t i);

}  // namespace kiln
