// Composing strided copies: when copy B reads only what copy A wrote, B can read A's source
// directly, and A (a Transpose, a layout conversion, a Slice...) need not run. A backend whose
// data movement is strided copies (the CUDA backend's copy_nd steps) collapses a chain such as
// ShuffleNet's channel shuffle (NHWC -> NCHW, Transpose, Slice, NCHW -> NHWC) into one copy per
// output.
//
//   StridedCopy a{{4, 6}, {1, 4}, {6, 1}, 0, 0};   // a transpose of a [6, 4] source into [4, 6]
//   StridedCopy b{{6, 4}, {1, 6}, {4, 1}, 0, 0};   // and back
//   auto c = compose_copies(a, b, 8);               // c: {dims {6, 4}, src {4, 1}}: a plain copy
//
// Offsets and strides count elements. A's destination strides must lay its dims out densely (a
// permutation of a contiguous layout, as every copy into a fresh buffer does); B's reads are then
// taken apart digit by digit in A's destination layout. Where a B dim's walk would carry from one
// of A's dims into the next, it is split in two (when the sizes divide), so a reshape that merges
// dims A permuted stays exact. The result has at most max_rank dims, or there is none.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kiln {

struct StridedCopy {
  std::vector<int64_t> dims;      // the index space
  std::vector<int64_t> src, dst;  // strides per dim, in elements
  int64_t src_off = 0, dst_off = 0;
};

// The copy that does B's work reading A's source, or nullopt when it is not one strided copy (A's
// destination not dense, a B read outside what A wrote, a walk that carries between A's dims, a
// negative stride, more than max_rank dims).
std::optional<StridedCopy> compose_copies(const StridedCopy& a, const StridedCopy& b, int max_rank);

}  // namespace kiln
