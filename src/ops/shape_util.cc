#include "ops/shape_util.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace kiln {

namespace {

int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t k = begin; k < end; ++k) n *= dims[k];
  return n;
}

// Rows are the multi-indices over all axes but the last; the loops below work a row at a time so
// the innermost loop is a plain strided walk.
constexpr int64_t kGrainElems = 1 << 14;

}  // namespace

void copy_strided(const Tensor& src, int64_t src_base, const std::vector<int64_t>& src_strides, Tensor& dst,
                  int64_t dst_base, const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& dims) {
  if (std::find(dims.begin(), dims.end(), 0) != dims.end()) return;
  // Dims of 1 dropped, and neighbours contiguous on both sides merged, innermost first: a Concat's
  // or Split's part is then a few long runs (memcpy) rather than many rows of the last dim.
  std::vector<int64_t> cd, css, cds;
  for (size_t k = dims.size(); k-- > 0;) {
    if (dims[k] == 1) continue;
    if (!cd.empty() && src_strides[k] == css.back() * cd.back() && dst_strides[k] == cds.back() * cd.back()) {
      cd.back() *= dims[k];
      continue;
    }
    cd.push_back(dims[k]);
    css.push_back(src_strides[k]);
    cds.push_back(dst_strides[k]);
  }
  std::reverse(cd.begin(), cd.end());
  std::reverse(css.begin(), css.end());
  std::reverse(cds.begin(), cds.end());
  visit_storage(src.dtype(), [&]<typename U>() {
    const U* s = static_cast<const U*>(src.raw());
    U* d = static_cast<U*>(dst.raw());
    if (cd.empty()) {
      d[dst_base] = s[src_base];
      return;
    }
    const size_t last = cd.size() - 1;
    const int64_t n = cd[last], ss = css[last], ds = cds[last];
    parallel_for(product(cd, 0, last), std::max<int64_t>(1, kGrainElems / n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t so = src_base, dof = dst_base, rest = r;
        for (size_t k = last; k-- > 0;) {
          int64_t i = rest % cd[k];
          rest /= cd[k];
          so += i * css[k];
          dof += i * cds[k];
        }
        if constexpr (std::is_trivially_copyable_v<U>) {
          if (ss == 1 && ds == 1) {
            std::memcpy(d + dof, s + so, size_t(n) * sizeof(U));
            continue;
          }
        }
        for (int64_t j = 0; j < n; ++j) d[dof + j * ds] = s[so + j * ss];
      }
    });
  });
}

void gather_axes(const Tensor& src, Tensor& dst, const std::vector<std::vector<int64_t>>& maps) {
  visit_storage(src.dtype(), [&]<typename U>() {
    const U* s = static_cast<const U*>(src.raw());
    U* d = static_cast<U*>(dst.raw());
    if (maps.empty()) {
      d[0] = s[0];
      return;
    }
    for (const auto& m : maps) if (m.empty()) return;
    const std::vector<int64_t> strides = strides_of(src.dims());
    const size_t last = maps.size() - 1;
    const std::vector<int64_t>& inner = maps[last];
    const int64_t n = int64_t(inner.size());
    int64_t rows = 1;
    for (size_t k = 0; k < last; ++k) rows *= int64_t(maps[k].size());
    parallel_for(rows, std::max<int64_t>(1, kGrainElems / n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t so = 0, rest = r;
        bool pad = false;
        for (size_t k = last; k-- > 0;) {
          int64_t size = int64_t(maps[k].size());
          int64_t m = maps[k][size_t(rest % size)];
          rest /= size;
          if (m < 0) pad = true;
          so += m * strides[k];
        }
        if (pad) continue;
        U* row = d + r * n;
        for (int64_t j = 0; j < n; ++j) {
          if (inner[size_t(j)] >= 0) row[j] = s[so + inner[size_t(j)] * strides[last]];
        }
      }
    });
  });
}

void fill_with(Tensor& dst, const Tensor& value) {
  visit_storage(dst.dtype(), [&]<typename U>() {
    const U v = static_cast<const U*>(value.raw())[0];
    U* d = static_cast<U*>(dst.raw());
    std::fill(d, d + dst.numel(), v);
  });
}

Expected<Tensor> transpose_tensor(const Tensor& src, const std::vector<int64_t>& perm) {
  std::vector<int64_t> dims, src_strides;
  const std::vector<int64_t> own = strides_of(src.dims());
  for (int64_t p : perm) {
    dims.push_back(src.dim(size_t(p)));
    src_strides.push_back(own[size_t(p)]);
  }
  KILN_ASSIGN_OR_RETURN(Tensor dst, Tensor::create(src.dtype(), dims));
  copy_strided(src, 0, src_strides, dst, 0, strides_of(dims), dims);
  return dst;
}

AxisPlan make_axis_plan(const std::vector<int64_t>& dims, const std::vector<bool>& reduced) {
  const std::vector<int64_t> strides = strides_of(dims);
  std::vector<int64_t> kept_dims, kept_strides, red_dims, red_strides;
  for (size_t k = 0; k < dims.size(); ++k) {
    (reduced[k] ? red_dims : kept_dims).push_back(dims[k]);
    (reduced[k] ? red_strides : kept_strides).push_back(strides[k]);
  }
  AxisPlan plan;
  for (StridedIter it(kept_dims, {kept_strides}); !it.done(); it.next()) plan.outer.push_back(it.offset(0));
  for (StridedIter it(red_dims, {red_strides}); !it.done(); it.next()) plan.inner.push_back(it.offset(0));
  return plan;
}

namespace {
template <typename Ctx>
Expected<std::vector<bool>> axes_mask_impl(const Ctx& c, const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<bool> mask(size_t(rank), false);
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) return c.error("axis {} is out of range for rank {}", a, rank);
    int64_t k = a < 0 ? a + rank : a;
    if (mask[size_t(k)]) return c.error("axis {} is repeated in the axes list", a);
    mask[size_t(k)] = true;
  }
  return mask;
}
}  // namespace

Expected<std::vector<bool>> axes_mask(const InferCtx& c, const std::vector<int64_t>& axes, int64_t rank) {
  return axes_mask_impl(c, axes, rank);
}
Expected<std::vector<bool>> axes_mask(const KernelCtx& c, const std::vector<int64_t>& axes, int64_t rank) {
  return axes_mask_impl(c, axes, rank);
}

std::optional<std::vector<int64_t>> static_ints(const InferCtx& c, size_t i) {
  std::optional<std::vector<Dim>> d = c.input_as_dims(i);
  if (!d) return std::nullopt;
  std::vector<int64_t> v;
  for (const Dim& x : *d) {
    if (!x.is_static()) return std::nullopt;
    v.push_back(x.value());
  }
  return v;
}

std::optional<std::vector<int64_t>> static_dims(const InferCtx& c, size_t i) {
  const Type& t = c.input_type(i);
  if (!t.has_rank()) return std::nullopt;
  return t.shape->static_dims();
}

Status check_rank(const InferCtx& c, size_t i, size_t r) {
  const Type& t = c.input_type(i);
  if (t.has_rank() && t.shape->rank() != r) {
    return c.error("input {} must have rank {}, got shape {}", i, r, t.shape->to_string());
  }
  return Status::ok();
}

}  // namespace kiln
