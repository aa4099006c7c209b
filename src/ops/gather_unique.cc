// Op family gather, part 3: Unique. Without `axis` the flattened elements are deduplicated;
// with `axis` whole slices along it are, ordered lexicographically as numpy.unique(axis=) does.
#include <algorithm>
#include <numeric>

#include "ops/gather_util.h"

namespace kiln {
namespace {

Status unique_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& x = c.input_type(0);
  Dim groups;  // the number of distinct values is data-dependent
  Dim inverse_len;
  if (!c.node().has_attr("axis")) {
    c.set_output_tensor(0, dt, Shape{groups});
    if (x.has_rank()) inverse_len = x.shape->numel();
  } else if (x.has_rank()) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", 0), int64_t(x.shape->rank())));
    Shape y = *x.shape;
    inverse_len = y[size_t(axis)];
    y[size_t(axis)] = groups;
    c.set_output_tensor(0, dt, std::move(y));
  } else {
    c.set_output_tensor(0, dt, std::nullopt);
  }
  c.set_output_tensor(1, DType::kInt64, Shape{groups});
  c.set_output_tensor(2, DType::kInt64, Shape{inverse_len});
  c.set_output_tensor(3, DType::kInt64, Shape{groups});
  return Status::ok();
}

// The input seen as `n` slices of `outer * inner` elements: slice k's element j is at
// ((j / inner) * n + k) * inner + j % inner.
struct Slices {
  int64_t outer, n, inner;
  int64_t at(int64_t k, int64_t j) const { return ((j / inner) * n + k) * inner + j % inner; }
  int64_t size() const { return outer * inner; }
};

// Groups of equal slices: each group's members in increasing index order, groups ordered by
// value (sorted) or by first occurrence.
template <typename T>
std::vector<std::vector<int64_t>> group_slices(const T* p, const Slices& s, bool sorted) {
  auto cmp = [&](int64_t a, int64_t b) -> int {
    for (int64_t j = 0; j < s.size(); ++j) {
      const T& x = p[s.at(a, j)];
      const T& y = p[s.at(b, j)];
      if constexpr (std::is_same_v<T, std::string>) {
        if (x != y) return x < y ? -1 : 1;
      } else {
        auto cx = compute_t<T>(x), cy = compute_t<T>(y);
        if (cx != cy) return cx < cy ? -1 : 1;
      }
    }
    return 0;
  };
  std::vector<int64_t> order(size_t(s.n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
  std::vector<std::vector<int64_t>> groups;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i == 0 || cmp(order[i - 1], order[i]) != 0) groups.emplace_back();
    groups.back().push_back(order[i]);
  }
  if (!sorted) {
    std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a[0] < b[0]; });
  }
  return groups;
}

Status write_int64_output(KernelCtx& c, size_t i, const std::vector<int64_t>& v) {
  if (!c.has_output(i)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(Tensor* t, c.alloc_output(i, DType::kInt64, {int64_t(v.size())}));
  std::copy(v.begin(), v.end(), t->data<int64_t>());
  return Status::ok();
}

Status unique_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  bool sorted = c.node().attr_int("sorted", 1) != 0;
  bool has_axis = c.node().has_attr("axis");
  std::vector<int64_t> dims = has_axis ? x.dims() : std::vector<int64_t>{x.numel()};
  int64_t axis = 0;
  if (has_axis) {
    KILN_ASSIGN_OR_RETURN(axis, normalize_dim_axis(c, c.node().attr_int("axis", 0), int64_t(x.rank())));
  }
  Slices s{dims_product(dims, 0, size_t(axis)), dims[size_t(axis)], dims_product(dims, size_t(axis) + 1, dims.size())};

  std::vector<std::vector<int64_t>> groups = visit_dtype(x.dtype(), [&]<typename T>() {
    return group_slices<T>(x.data<T>(), s, sorted);
  });
  auto g = int64_t(groups.size());
  std::vector<int64_t> first(static_cast<size_t>(g)), counts(static_cast<size_t>(g));
  std::vector<int64_t> inverse(static_cast<size_t>(s.n));
  for (size_t i = 0; i < groups.size(); ++i) {
    first[i] = groups[i][0];
    counts[i] = int64_t(groups[i].size());
    for (int64_t k : groups[i]) inverse[size_t(k)] = int64_t(i);
  }

  std::vector<int64_t> y_dims = dims;
  y_dims[size_t(axis)] = g;
  KILN_ASSIGN_OR_RETURN(Tensor* y, c.alloc_output(0, x.dtype(), y_dims));
  Slices ys{s.outer, g, s.inner};
  visit_storage(x.dtype(), [&]<typename S>() {
    const S* src = storage<S>(x);
    S* dst = storage<S>(*y);
    for (int64_t k = 0; k < g; ++k) {
      for (int64_t j = 0; j < s.size(); ++j) dst[ys.at(k, j)] = src[s.at(first[size_t(k)], j)];
    }
  });
  KILN_RETURN_IF_ERROR(write_int64_output(c, 1, first));
  KILN_RETURN_IF_ERROR(write_int64_output(c, 2, inverse));
  return write_int64_output(c, 3, counts);
}

}  // namespace

void register_gather_unique_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kUnique, {.inputs = {1, 1}, .outputs = {1, 4}, .attrs = {{"axis", K::kInt}, {"sorted", K::kInt}},
                          .infer = unique_infer, .cpu = unique_cpu});
}

}  // namespace kiln
