// Op family gather, part 2: ScatterElements, ScatterND (with reductions) and TensorScatter
// (the KV-cache update).
#include <algorithm>

#include "ops/gather_util.h"

namespace kiln {
namespace {

// Output = data, then for each update group k (in order, so with reduction "none" the last
// duplicate wins, as in the reference): out[targets[k] + s] (op)= updates[k * slice + s].
Status apply_scatter(KernelCtx& c, const Tensor& data, const Tensor& updates,
                     const std::vector<int64_t>& targets, int64_t slice, Reduction red) {
  if (data.dtype() != updates.dtype()) {
    return c.error("updates must have the data's type {}, got {}", dtype_name(data.dtype()), dtype_name(updates.dtype()));
  }
  if (data.dtype() == DType::kString && red != Reduction::kNone) {
    return c.error("reduction needs numeric data, got string");
  }
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, data.dtype(), data.dims()));
  visit_dtype(data.dtype(), [&]<typename T>() {
    const T* src = data.data<T>();
    const T* upd = updates.data<T>();
    T* dst = out->data<T>();
    std::copy(src, src + data.numel(), dst);
    for (size_t k = 0; k < targets.size(); ++k) {
      for (int64_t s = 0; s < slice; ++s) reduce_into(dst[targets[k] + s], upd[int64_t(k) * slice + s], red);
    }
  });
  return Status::ok();
}

Status check_scatter_types(InferCtx& c, size_t updates_input) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType ut, c.tensor_dtype(updates_input));
  if (dt != ut) return c.error("updates must have the data's type {}, got {}", dtype_name(dt), dtype_name(ut));
  KILN_ASSIGN_OR_RETURN(Reduction red, parse_reduction(c));
  if (dt == DType::kString && red != Reduction::kNone) return c.error("reduction needs numeric data, got string");
  c.set_output(0, c.input_type(0));
  return Status::ok();
}

// ---- ScatterElements ---------------------------------------------------------------------------

Status scatter_elements_infer(InferCtx& c) {
  KILN_RETURN_IF_ERROR(c.tensor_dtype(1).status());
  KILN_RETURN_IF_ERROR(check_index_dtype(c, 1));
  const Type& data = c.input_type(0);
  const Type& ind = c.input_type(1);
  const Type& upd = c.input_type(2);
  if (data.has_rank() && ind.has_rank() && data.shape->rank() != ind.shape->rank()) {
    return c.error("data {} and indices {} must have the same rank", data.shape->to_string(), ind.shape->to_string());
  }
  if (ind.has_rank() && upd.has_rank()) {
    bool same = ind.shape->rank() == upd.shape->rank();
    for (size_t i = 0; same && i < ind.shape->rank(); ++i) same = (*ind.shape)[i].compatible((*upd.shape)[i]);
    if (!same) return c.error("indices {} and updates {} must have the same shape", ind.shape->to_string(), upd.shape->to_string());
  }
  if (data.has_rank()) {
    KILN_RETURN_IF_ERROR(normalize_axis(c, c.node().attr_int("axis", 0), int64_t(data.shape->rank())).status());
  }
  return check_scatter_types(c, 2);
}

Status scatter_elements_cpu(KernelCtx& c) {
  const Tensor& data = c.tensor(0);
  const Tensor& ind = c.tensor(1);
  const Tensor& upd = c.tensor(2);
  KILN_ASSIGN_OR_RETURN(Reduction red, parse_reduction(c));
  if (ind.dims() != upd.dims() || ind.rank() != data.rank()) {
    return c.error("indices {} and updates {} must have the same shape, of data {}'s rank", ind.summary(),
                   upd.summary(), data.summary());
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", 0), int64_t(data.rank())));
  for (size_t i = 0; i < data.rank(); ++i) {
    if (int64_t(i) != axis && ind.dim(i) > data.dim(i)) {
      return c.error("indices {} exceed data {} on dimension {}", ind.summary(), data.summary(), i);
    }
  }
  int64_t n = data.dim(size_t(axis));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> idx,
                        read_indices(c, ind, n, fmt::format("axis {} of size {}", axis, n)));
  std::vector<int64_t> ds = strides_of(data.dims());
  int64_t axis_stride = ds[size_t(axis)];
  ds[size_t(axis)] = 0;
  std::vector<int64_t> targets;
  targets.reserve(idx.size());
  size_t k = 0;
  for (StridedIter it(ind.dims(), {ds}); !it.done(); it.next(), ++k) {
    targets.push_back(it.offset(0) + idx[k] * axis_stride);
  }
  return apply_scatter(c, data, upd, targets, 1, red);
}

// ---- ScatterND ---------------------------------------------------------------------------------

Status scatter_nd_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType it, c.tensor_dtype(1));
  if (it != DType::kInt64) return c.error("indices must be int64, got {}", dtype_name(it));
  const Type& data = c.input_type(0);
  const Type& ind = c.input_type(1);
  const Type& upd = c.input_type(2);
  if (data.has_rank() && ind.has_rank() && upd.has_rank() && ind.shape->rank() >= 1 &&
      ind.shape->dims.back().is_static()) {
    int64_t k = ind.shape->dims.back().value();
    size_t q = ind.shape->rank(), r = data.shape->rank();
    if (k < 1 || k > int64_t(r)) {
      return c.error("indices' last dimension {} must be in [1, {}] (data {})", k, r, data.shape->to_string());
    }
    size_t want = q - 1 + r - size_t(k);
    bool ok = upd.shape->rank() == want;
    for (size_t i = 0; ok && i < q - 1; ++i) ok = (*upd.shape)[i].compatible((*ind.shape)[i]);
    for (size_t i = q - 1; ok && i < want; ++i) ok = (*upd.shape)[i].compatible((*data.shape)[i - (q - 1) + size_t(k)]);
    if (!ok) {
      return c.error("updates {} must be indices.shape[:-1] + data.shape[{}:] for indices {} and data {}",
                     upd.shape->to_string(), k, ind.shape->to_string(), data.shape->to_string());
    }
  }
  return check_scatter_types(c, 2);
}

Status scatter_nd_cpu(KernelCtx& c) {
  const Tensor& data = c.tensor(0);
  const Tensor& ind = c.tensor(1);
  const Tensor& upd = c.tensor(2);
  KILN_ASSIGN_OR_RETURN(Reduction red, parse_reduction(c));
  const std::vector<int64_t>& dd = data.dims();
  const std::vector<int64_t>& id = ind.dims();
  if (id.empty() || id.back() < 1 || id.back() > int64_t(dd.size())) {
    return c.error("indices {} need a last dimension in [1, {}]", ind.summary(), dd.size());
  }
  auto k = size_t(id.back());
  std::vector<int64_t> want(id.begin(), id.end() - 1);
  want.insert(want.end(), dd.begin() + int64_t(k), dd.end());
  if (upd.dims() != want) {
    return c.error("updates {} must have shape {} (indices {}, data {})", upd.summary(), dims_to_string(want),
                   ind.summary(), data.summary());
  }
  std::vector<int64_t> raw = ind.to_int_vector();
  std::vector<int64_t> ds = strides_of(dd);
  int64_t tuples = dims_product(id, 0, id.size() - 1);
  std::vector<int64_t> targets(size_t(tuples), 0);
  for (int64_t t = 0; t < tuples; ++t) {
    for (size_t j = 0; j < k; ++j) {
      KILN_ASSIGN_OR_RETURN(int64_t v, check_index(c, raw[size_t(t) * k + j], dd[j],
                                                   fmt::format("axis {} of size {}", j, dd[j])));
      targets[size_t(t)] += v * ds[j];
    }
  }
  return apply_scatter(c, data, upd, targets, dims_product(dd, k, dd.size()), red);
}

// ---- TensorScatter -----------------------------------------------------------------------------

Status tensor_scatter_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType ut, c.tensor_dtype(1));
  if (dt != ut) return c.error("update must have past_cache's type {}, got {}", dtype_name(dt), dtype_name(ut));
  std::string mode = c.node().attr_string("mode", "linear");
  if (mode != "linear" && mode != "circular") return c.error("mode must be linear or circular, got '{}'", mode);
  const Type& past = c.input_type(0);
  if (past.has_rank()) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", -2), int64_t(past.shape->rank())));
    if (axis == 0) return c.error("axis must not be the batch dimension 0");
  }
  c.set_output(0, past);
  return Status::ok();
}

Status tensor_scatter_cpu(KernelCtx& c) {
  const Tensor& past = c.tensor(0);
  const Tensor& upd = c.tensor(1);
  bool circular = c.node().attr_string("mode", "linear") == "circular";
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", -2), int64_t(past.rank())));
  if (axis == 0) return c.error("axis must not be the batch dimension 0");
  const std::vector<int64_t>& pd = past.dims();
  bool ok = upd.rank() == past.rank() && upd.dtype() == past.dtype();
  for (size_t i = 0; ok && i < pd.size(); ++i) ok = int64_t(i) == axis ? upd.dim(i) <= pd[i] : upd.dim(i) == pd[i];
  if (!ok) return c.error("update {} must match past_cache {} except for a shorter axis {}", upd.summary(), past.summary(), axis);
  int64_t batch = pd[0];
  std::vector<int64_t> write(size_t(batch), 0);
  if (c.has_input(2)) {
    write = c.tensor(2).to_int_vector();
    if (int64_t(write.size()) != batch) return c.error("write_indices must have {} entries, got {}", batch, write.size());
  }
  int64_t max_seq = pd[size_t(axis)], seq = upd.dim(size_t(axis));
  int64_t prefix = dims_product(pd, 0, size_t(axis));
  int64_t per_batch = prefix / std::max<int64_t>(batch, 1);
  int64_t inner = dims_product(pd, size_t(axis) + 1, pd.size());
  for (int64_t w : write) {
    if (!circular && (w < 0 || w + seq > max_seq)) {
      return c.error("write index {} + sequence length {} exceeds max sequence length {}", w, seq, max_seq);
    }
  }
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, past.dtype(), pd));
  visit_storage(past.dtype(), [&]<typename S>() {
    const S* src = storage<S>(past);
    const S* u = storage<S>(upd);
    S* dst = storage<S>(*out);
    std::copy(src, src + past.numel(), dst);
    for (int64_t p = 0; p < prefix; ++p) {
      int64_t w = write[size_t(p / per_batch)];
      for (int64_t s = 0; s < seq; ++s) {
        int64_t cs = circular ? ((w + s) % max_seq + max_seq) % max_seq : w + s;
        const S* from = u + (p * seq + s) * inner;
        std::copy(from, from + inner, dst + (p * max_seq + cs) * inner);
      }
    }
  });
  return Status::ok();
}

}  // namespace

void register_gather_scatter_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kScatterElements, {.inputs = {3, 3}, .attrs = {{"axis", K::kInt}, {"reduction", K::kString}},
                                   .infer = scatter_elements_infer, .cpu = scatter_elements_cpu});
  r.def(OpKind::kScatterND, {.inputs = {3, 3}, .attrs = {{"reduction", K::kString}},
                             .infer = scatter_nd_infer, .cpu = scatter_nd_cpu});
  r.def(OpKind::kTensorScatter, {.inputs = {2, 3}, .attrs = {{"axis", K::kInt}, {"mode", K::kString}},
                                 .infer = tensor_scatter_infer, .cpu = tensor_scatter_cpu});
}

}  // namespace kiln
