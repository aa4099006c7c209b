#include "ops/op_util.h"

#include <algorithm>

#include "ops/elementwise_util.h"  // broadcast_input_shapes

namespace kiln {

namespace {
template <typename Ctx>
Expected<int64_t> normalize_axis_impl(const Ctx& c, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1) || (rank == 0 && axis != 0 && axis != -1)) {
    return c.error("axis {} is out of range for rank {}", axis, rank);
  }
  return axis < 0 ? axis + rank : axis;
}
}  // namespace

Expected<int64_t> normalize_axis(const InferCtx& c, int64_t axis, int64_t rank) {
  return normalize_axis_impl(c, axis, rank);
}
Expected<int64_t> normalize_axis(const KernelCtx& c, int64_t axis, int64_t rank) {
  return normalize_axis_impl(c, axis, rank);
}
Expected<int64_t> normalize_dim_axis(const InferCtx& c, int64_t axis, int64_t rank) {
  if (rank == 0) return c.error("axis {} of a scalar: the input needs rank >= 1", axis);
  return normalize_axis_impl(c, axis, rank);
}
Expected<int64_t> normalize_dim_axis(const KernelCtx& c, int64_t axis, int64_t rank) {
  if (rank == 0) return c.error("axis {} of a scalar: the input needs rank >= 1", axis);
  return normalize_axis_impl(c, axis, rank);
}

Expected<Shape> broadcast_shapes(const InferCtx& c, const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.rank());
  Shape out;
  out.dims.resize(rank, Dim(int64_t{1}));
  for (size_t k = 0; k < rank; ++k) {
    Dim d(int64_t{1});
    bool have = false;
    for (const Shape& s : shapes) {
      if (k + s.rank() < rank) continue;
      const Dim& x = s.dims[k + s.rank() - rank];
      if (x.is_static() && x.value() == 1) continue;
      if (!have) { d = x; have = true; continue; }
      if (d.same_as(x)) continue;
      if (d.is_static() && x.is_static()) {
        std::string all;
        for (const Shape& t : shapes) all += (all.empty() ? "" : " and ") + t.to_string();
        return c.error("shapes {} cannot be broadcast (dimension {} is {} vs {})", all, k,
                       d.to_string(), x.to_string());
      }
      // One is symbolic: at run time they must agree (or the symbolic one is 1). Prefer the static.
      if (x.is_static()) d = x;
      else if (!d.is_static()) d = Dim();
    }
    out.dims[k] = d;
  }
  return out;
}

Expected<std::vector<int64_t>> broadcast_dims(const KernelCtx& c, const std::vector<std::vector<int64_t>>& all) {
  size_t rank = 0;
  for (const auto& s : all) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    int64_t d = 1;
    for (const auto& s : all) {
      if (k + s.size() < rank) continue;
      int64_t x = s[k + s.size() - rank];
      if (x == 1) continue;
      if (d == 1) d = x;
      else if (d != x) {
        std::string msg;
        for (const auto& t : all) msg += (msg.empty() ? "" : " and ") + dims_to_string(t);
        return c.error("shapes {} cannot be broadcast", msg);
      }
    }
    out[k] = d;
  }
  return out;
}

Status check_same_dtype(InferCtx& c, size_t first, size_t last) {
  std::optional<DType> dt;
  size_t first_i = first;
  for (size_t i = first; i < last && i < c.num_inputs(); ++i) {
    if (!c.has_input(i) || !c.input_type(i).is_tensor()) continue;
    DType d = c.input_type(i).dtype;
    if (!dt) { dt = d; first_i = i; continue; }
    if (*dt != d) {
      return c.error("inputs {} and {} must have the same element type, got {} and {}", first_i, i,
                     dtype_name(*dt), dtype_name(d));
    }
  }
  return Status::ok();
}

Status infer_same_as_input0(InferCtx& c) {
  c.set_output(0, c.input_type(0));
  return Status::ok();
}

Status infer_broadcast_same_dtype(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, c.num_inputs()));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(std::optional<Shape> s, broadcast_input_shapes(c));
  c.set_output_tensor(0, dt, std::move(s));
  return Status::ok();
}

Status infer_broadcast_bool_output(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, c.num_inputs()));
  KILN_ASSIGN_OR_RETURN(std::optional<Shape> s, broadcast_input_shapes(c));
  c.set_output_tensor(0, DType::kBool, std::move(s));
  return Status::ok();
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<int64_t> s(out.size(), 0);
  std::vector<int64_t> own = strides_of(in);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) s[off + i] = in[i] == 1 ? 0 : own[i];
  return s;
}

StridedIter::StridedIter(const std::vector<int64_t>& dims, std::vector<std::vector<int64_t>> strides)
    : dims_(dims), index_(dims.size(), 0), strides_(std::move(strides)), offsets_(strides_.size(), 0) {
  for (int64_t d : dims_) if (d == 0) done_ = true;
}

void StridedIter::next() {
  for (size_t k = dims_.size(); k-- > 0;) {
    if (++index_[k] < dims_[k]) {
      for (size_t j = 0; j < strides_.size(); ++j) offsets_[j] += strides_[j][k];
      return;
    }
    index_[k] = 0;
    for (size_t j = 0; j < strides_.size(); ++j) offsets_[j] -= strides_[j][k] * (dims_[k] - 1);
  }
  done_ = true;
}

std::vector<int64_t> optional_ints(const KernelCtx& c, size_t i) {
  if (!c.has_input(i)) return {};
  return c.tensor(i).to_int_vector();
}

}  // namespace kiln
