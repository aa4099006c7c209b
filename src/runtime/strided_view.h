// Strided views: which chains of data-movement ops (Transpose, Reshape, Squeeze, Unsqueeze,
// Flatten, Gather of one constant index) are only a different way of addressing the same bytes.
// A kernel that reads its operand through strides can then consume the chain's source directly
// and the chain never runs (the fused attention reads ViT's Q, K, V out of the packed QKV
// projection this way).
//
// Each logical dim is a list of (size, stride) atoms, outermost first, so that reshapes which
// merge dims that are not contiguous in memory (ViT's [S, B, H*D] -> [S, B*H, D]) stay exact and
// can be split again later.
//
//   StridedView v = StridedView::contiguous({197, 256, 2304});
//   v.reshape({197, 256, 3, 768}); v.transpose({2, 0, 1, 3}); v.select(0, 1);   // K's slice
//   auto s = v.strides();   // one stride per dim, or nullopt when a dim is not one stride
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace kiln {

class StridedView {
 public:
  static StridedView contiguous(const std::vector<int64_t>& dims);

  std::vector<int64_t> dims() const;
  int64_t offset() const { return offset_; }  // elements from the source's start

  // Each returns false (and leaves the view unspecified) when the op is not a view here.
  bool transpose(const std::vector<int64_t>& perm);
  bool reshape(const std::vector<int64_t>& new_dims);  // also Squeeze, Unsqueeze, Flatten
  // Index `index` along `axis`; the dim is dropped (keep_dim: kept with size 1).
  bool select(int axis, int64_t index, bool keep_dim = false);

  // Elements [start, start + length) along `axis` (Split, Slice with step 1); the dim must be
  // one stride.
  bool narrow(int axis, int64_t start, int64_t length);

  // One stride per dim (0 for size-1 dims), when every dim's atoms merge into one stride.
  std::optional<std::vector<int64_t>> strides() const;

 private:
  using Atom = std::pair<int64_t, int64_t>;  // size, stride
  std::vector<std::vector<Atom>> dims_;
  int64_t offset_ = 0;
};

}  // namespace kiln
