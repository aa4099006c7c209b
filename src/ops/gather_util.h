// Helpers shared by the gather family's files (gather.cc, gather_scatter.cc, gather_unique.cc):
// storage-width dispatch for data-movement kernels, index reading with range checks, and the
// scatter reductions.
#pragma once

#include <string>
#include <vector>

#include "ops/op_util.h"

namespace kiln {

template <typename S>
const S* storage(const Tensor& t) { return static_cast<const S*>(t.raw()); }
template <typename S>
S* storage(Tensor& t) { return static_cast<S*>(t.raw()); }

// Product of dims[begin, end).
int64_t dims_product(const std::vector<int64_t>& dims, size_t begin, size_t end);

// Errors unless dtype is int32 or int64 (the index types of Gather/Scatter*).
Status check_index_dtype(const InferCtx& c, size_t input);

// Reads an index tensor, mapping negatives into [0, n); an index outside [-n, n) is an error
// naming its value and `what` (e.g. "axis 1 of size 3").
Expected<std::vector<int64_t>> read_indices(const KernelCtx& c, const Tensor& t, int64_t n,
                                            const std::string& what);
// One index, same rules.
Expected<int64_t> check_index(const KernelCtx& c, int64_t idx, int64_t n, const std::string& what);

// The `reduction` attribute of ScatterElements / ScatterND.
enum class Reduction { kNone, kAdd, kMul, kMax, kMin };
Expected<Reduction> parse_reduction(const InferCtx& c);
Expected<Reduction> parse_reduction(const KernelCtx& c);

// dst = dst (op) src, in compute_t<T>; bool add/mul act as or/and (numpy semantics).
template <typename T>
void reduce_into(T& dst, const T& src, Reduction r) {
  if constexpr (!is_numeric_v<T> && !std::is_same_v<T, bool>) {
    dst = src;  // strings: only kNone is accepted (checked by the kernel)
  } else {
    using C = compute_t<T>;
    C a = C(dst), b = C(src);
    switch (r) {
      case Reduction::kNone: dst = src; return;
      case Reduction::kAdd: dst = static_cast<T>(a + b); return;
      case Reduction::kMul: dst = static_cast<T>(a * b); return;
      case Reduction::kMax: dst = static_cast<T>(a < b ? b : a); return;
      case Reduction::kMin: dst = static_cast<T>(b < a ? b : a); return;
    }
  }
}

void register_gather_scatter_ops(OpRegistry& r);
void register_gather_unique_ops(OpRegistry& r);

}  // namespace kiln
