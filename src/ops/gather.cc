// Op family: gather. Gather, GatherElements, GatherND, OneHot, NonZero, Compress here; the
// scatters live in gather_scatter.cc and Unique in gather_unique.cc.
#include <algorithm>

#include "ops/gather_util.h"

namespace kiln {

// ---- shared helpers (declared in gather_util.h) ----------------------------------------------

int64_t dims_product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) p *= dims[i];
  return p;
}

Status check_index_dtype(const InferCtx& c, size_t input) {
  const Type& t = c.input_type(input);
  if (t.is_tensor() && t.dtype != DType::kInt32 && t.dtype != DType::kInt64) {
    return c.error("input {} (indices) must be int32 or int64, got {}", input, dtype_name(t.dtype));
  }
  return Status::ok();
}

Expected<int64_t> check_index(const KernelCtx& c, int64_t idx, int64_t n, const std::string& what) {
  if (idx < -n || idx >= n) {
    return c.error("index {} is out of range [{}, {}) for {}", idx, -n, n, what);
  }
  return idx < 0 ? idx + n : idx;
}

Expected<std::vector<int64_t>> read_indices(const KernelCtx& c, const Tensor& t, int64_t n,
                                            const std::string& what) {
  std::vector<int64_t> v = t.to_int_vector();
  for (int64_t& x : v) {
    KILN_ASSIGN_OR_RETURN(x, check_index(c, x, n, what));
  }
  return v;
}

namespace {

template <typename Ctx>
Expected<Reduction> parse_reduction_impl(const Ctx& c) {
  std::string s = c.node().attr_string("reduction", "none");
  if (s == "none") return Reduction::kNone;
  if (s == "add") return Reduction::kAdd;
  if (s == "mul") return Reduction::kMul;
  if (s == "max") return Reduction::kMax;
  if (s == "min") return Reduction::kMin;
  return c.error("reduction must be one of none, add, mul, max, min; got '{}'", s);
}

}  // namespace

Expected<Reduction> parse_reduction(const InferCtx& c) { return parse_reduction_impl(c); }
Expected<Reduction> parse_reduction(const KernelCtx& c) { return parse_reduction_impl(c); }

namespace {

std::string describe_axis(int64_t axis, int64_t n) { return fmt::format("axis {} of size {}", axis, n); }

// ---- Gather ------------------------------------------------------------------------------------

// Shape -> Gather(indices const) -> ...: gathers the symbolic element values too, so a later
// Reshape sees [N, 768] rather than an unknown shape.
void propagate_gather_dims_value(InferCtx& c, int64_t axis, int64_t data_rank) {
  if (axis != 0 || data_rank != 1) return;
  const std::vector<Dim>* values = c.input_dims_value(0);
  std::optional<std::vector<Dim>> data = values ? std::optional(*values) : c.input_as_dims(0);
  std::optional<std::vector<Dim>> idx = c.input_as_dims(1);
  const Type& it = c.input_type(1);
  if (!data || !idx || !it.has_rank() || it.shape->rank() > 1) return;
  std::vector<Dim> out;
  auto n = int64_t(data->size());
  for (const Dim& d : *idx) {
    if (!d.is_static() || d.value() < -n || d.value() >= n) return;
    out.push_back((*data)[size_t(d.value() < 0 ? d.value() + n : d.value())]);
  }
  c.set_output_dims_value(0, std::move(out));
}

Status gather_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(c.tensor_dtype(1).status());
  KILN_RETURN_IF_ERROR(check_index_dtype(c, 1));
  const Type& data = c.input_type(0);
  const Type& ind = c.input_type(1);
  if (!data.has_rank() || !ind.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  auto r = int64_t(data.shape->rank());
  if (r == 0) return c.error("data must have rank >= 1, got a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", 0), r));
  // A constant index outside a static axis length is a model error we can report now.
  const Dim& n = (*data.shape)[size_t(axis)];
  if (const Tensor* t = c.input_constant(1); t && n.is_static()) {
    for (int64_t i = 0; i < t->numel(); ++i) {
      int64_t v = t->as_int(i);
      if (v < -n.value() || v >= n.value()) {
        return c.error("index {} is out of range [{}, {}) for {}", v, -n.value(), n.value(),
                       describe_axis(axis, n.value()));
      }
    }
  }
  Shape out;
  for (int64_t i = 0; i < axis; ++i) out.dims.push_back((*data.shape)[size_t(i)]);
  for (const Dim& d : ind.shape->dims) out.dims.push_back(d);
  for (int64_t i = axis + 1; i < r; ++i) out.dims.push_back((*data.shape)[size_t(i)]);
  c.set_output_tensor(0, dt, std::move(out));
  propagate_gather_dims_value(c, axis, r);
  return Status::ok();
}

Status gather_cpu(KernelCtx& c) {
  const Tensor& data = c.tensor(0);
  const Tensor& ind = c.tensor(1);
  if (data.rank() == 0) return c.error("data must have rank >= 1, got a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", 0), int64_t(data.rank())));
  const std::vector<int64_t>& dd = data.dims();
  int64_t n = dd[size_t(axis)];
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> idx, read_indices(c, ind, n, describe_axis(axis, n)));
  std::vector<int64_t> out_dims(dd.begin(), dd.begin() + axis);
  out_dims.insert(out_dims.end(), ind.dims().begin(), ind.dims().end());
  out_dims.insert(out_dims.end(), dd.begin() + axis + 1, dd.end());
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, data.dtype(), out_dims));
  int64_t outer = dims_product(dd, 0, size_t(axis));
  int64_t inner = dims_product(dd, size_t(axis) + 1, dd.size());
  visit_storage(data.dtype(), [&]<typename S>() {
    const S* src = storage<S>(data);
    S* dst = storage<S>(*out);
    for (int64_t o = 0; o < outer; ++o) {
      for (size_t j = 0; j < idx.size(); ++j) {
        const S* from = src + (o * n + idx[j]) * inner;
        std::copy(from, from + inner, dst + (o * int64_t(idx.size()) + int64_t(j)) * inner);
      }
    }
  });
  return Status::ok();
}

// ---- GatherElements ----------------------------------------------------------------------------

Status gather_elements_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(c.tensor_dtype(1).status());
  KILN_RETURN_IF_ERROR(check_index_dtype(c, 1));
  const Type& data = c.input_type(0);
  const Type& ind = c.input_type(1);
  if (data.has_rank() && ind.has_rank()) {
    if (data.shape->rank() != ind.shape->rank()) {
      return c.error("data {} and indices {} must have the same rank", data.shape->to_string(),
                     ind.shape->to_string());
    }
    if (data.shape->rank() == 0) return c.error("data must have rank >= 1, got a scalar");
    KILN_RETURN_IF_ERROR(normalize_axis(c, c.node().attr_int("axis", 0), int64_t(data.shape->rank())).status());
  }
  c.set_output_tensor(0, dt, ind.has_rank() ? ind.shape : std::nullopt);
  return Status::ok();
}

Status gather_elements_cpu(KernelCtx& c) {
  const Tensor& data = c.tensor(0);
  const Tensor& ind = c.tensor(1);
  if (data.rank() != ind.rank() || data.rank() == 0) {
    return c.error("data {} and indices {} must have the same rank >= 1", data.summary(), ind.summary());
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", 0), int64_t(data.rank())));
  for (size_t i = 0; i < data.rank(); ++i) {
    if (int64_t(i) != axis && ind.dim(i) > data.dim(i)) {
      return c.error("indices {} exceed data {} on dimension {}", ind.summary(), data.summary(), i);
    }
  }
  int64_t n = data.dim(size_t(axis));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> idx, read_indices(c, ind, n, describe_axis(axis, n)));
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, data.dtype(), ind.dims()));
  // Walk the indices' positions with the data strides, the axis stride replaced by the index.
  std::vector<int64_t> ds = strides_of(data.dims());
  int64_t axis_stride = ds[size_t(axis)];
  ds[size_t(axis)] = 0;
  visit_storage(data.dtype(), [&]<typename S>() {
    const S* src = storage<S>(data);
    S* dst = storage<S>(*out);
    int64_t k = 0;
    for (StridedIter it(ind.dims(), {ds}); !it.done(); it.next(), ++k) {
      dst[k] = src[it.offset(0) + idx[size_t(k)] * axis_stride];
    }
  });
  return Status::ok();
}

// ---- GatherND ----------------------------------------------------------------------------------

Status gather_nd_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType it, c.tensor_dtype(1));
  if (it != DType::kInt64) return c.error("indices must be int64, got {}", dtype_name(it));
  const Type& data = c.input_type(0);
  const Type& ind = c.input_type(1);
  int64_t b = c.node().attr_int("batch_dims", 0);
  if (!data.has_rank() || !ind.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  auto r = int64_t(data.shape->rank()), q = int64_t(ind.shape->rank());
  if (q < 1 || r < 1 || b < 0 || b >= std::min(q, r)) {
    return c.error("batch_dims {} must be in [0, min(rank(data), rank(indices))) for data {} and indices {}",
                   b, data.shape->to_string(), ind.shape->to_string());
  }
  const Dim& last = ind.shape->dims.back();
  if (!last.is_static()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  int64_t k = last.value();
  if (k < 1 || k > r - b) {
    return c.error("indices' last dimension {} must be in [1, {}] for data {} and batch_dims {}", k,
                   r - b, data.shape->to_string(), b);
  }
  Shape out;
  out.dims.assign(ind.shape->dims.begin(), ind.shape->dims.end() - 1);
  out.dims.insert(out.dims.end(), data.shape->dims.begin() + b + k, data.shape->dims.end());
  c.set_output_tensor(0, dt, std::move(out));
  return Status::ok();
}

Status gather_nd_cpu(KernelCtx& c) {
  const Tensor& data = c.tensor(0);
  const Tensor& ind = c.tensor(1);
  const std::vector<int64_t>& dd = data.dims();
  const std::vector<int64_t>& id = ind.dims();
  auto b = size_t(c.node().attr_int("batch_dims", 0));
  if (id.empty() || b >= std::min(id.size(), dd.size())) {
    return c.error("batch_dims {} is invalid for data {} and indices {}", b, data.summary(), ind.summary());
  }
  for (size_t i = 0; i < b; ++i) {
    if (dd[i] != id[i]) return c.error("batch dimension {} differs: data {} vs indices {}", i, data.summary(), ind.summary());
  }
  int64_t k = id.back();
  if (k < 1 || k > int64_t(dd.size() - b)) {
    return c.error("indices' last dimension {} must be in [1, {}]", k, dd.size() - b);
  }
  std::vector<int64_t> out_dims(id.begin(), id.end() - 1);
  out_dims.insert(out_dims.end(), dd.begin() + int64_t(b) + k, dd.end());
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, data.dtype(), out_dims));
  int64_t batches = dims_product(dd, 0, b);
  int64_t per_batch = dims_product(id, b, id.size() - 1);        // index tuples per batch
  int64_t slice = dims_product(dd, b + size_t(k), dd.size());    // elements copied per tuple
  int64_t batch_stride = dims_product(dd, b, dd.size());
  std::vector<int64_t> ds = strides_of(dd);
  std::vector<int64_t> raw = ind.to_int_vector();
  std::vector<int64_t> offsets(size_t(batches * per_batch));
  for (int64_t t = 0; t < batches * per_batch; ++t) {
    int64_t off = (t / per_batch) * batch_stride;
    for (int64_t j = 0; j < k; ++j) {
      size_t axis = b + size_t(j);
      KILN_ASSIGN_OR_RETURN(int64_t v, check_index(c, raw[size_t(t * k + j)], dd[axis],
                                                   describe_axis(int64_t(axis), dd[axis])));
      off += v * ds[axis];
    }
    offsets[size_t(t)] = off;
  }
  visit_storage(data.dtype(), [&]<typename S>() {
    const S* src = storage<S>(data);
    S* dst = storage<S>(*out);
    for (size_t t = 0; t < offsets.size(); ++t) {
      std::copy(src + offsets[t], src + offsets[t] + slice, dst + int64_t(t) * slice);
    }
  });
  return Status::ok();
}

// ---- OneHot ------------------------------------------------------------------------------------

Status one_hot_infer(InferCtx& c) {
  KILN_RETURN_IF_ERROR(c.tensor_dtype(0).status());
  KILN_RETURN_IF_ERROR(c.tensor_dtype(1).status());
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(2));
  const Type& ind = c.input_type(0);
  if (!ind.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  auto r = int64_t(ind.shape->rank());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", -1), r + 1));
  Dim depth;
  if (auto d = c.input_as_dims(1); d && d->size() == 1) depth = (*d)[0];
  Shape out = *ind.shape;
  out.dims.insert(out.dims.begin() + axis, depth);
  c.set_output_tensor(0, dt, std::move(out));
  return Status::ok();
}

Status one_hot_cpu(KernelCtx& c) {
  const Tensor& ind = c.tensor(0);
  const Tensor& depth_t = c.tensor(1);
  const Tensor& values = c.tensor(2);
  if (depth_t.numel() != 1) return c.error("depth must have one element, got {}", depth_t.summary());
  if (values.numel() != 2) return c.error("values must be [off_value, on_value], got {}", values.summary());
  auto depth = int64_t(depth_t.as_double(0));
  if (depth < 0) return c.error("depth must be non-negative, got {}", depth);
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", -1), int64_t(ind.rank()) + 1));
  std::vector<int64_t> out_dims = ind.dims();
  out_dims.insert(out_dims.begin() + axis, depth);
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, values.dtype(), out_dims));
  int64_t outer = dims_product(ind.dims(), 0, size_t(axis));
  int64_t inner = dims_product(ind.dims(), size_t(axis), ind.rank());
  visit_storage(values.dtype(), [&]<typename S>() {
    const S* v = storage<S>(values);
    S* dst = storage<S>(*out);
    std::fill(dst, dst + out->numel(), v[0]);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        int64_t x = ind.as_int(o * inner + i);
        if (x < 0) x += depth;
        // Out-of-range indices give an all-off row (spec), not an error.
        if (x >= 0 && x < depth) dst[(o * depth + x) * inner + i] = v[1];
      }
    }
  });
  return Status::ok();
}

// ---- NonZero -----------------------------------------------------------------------------------

Status non_zero_infer(InferCtx& c) {
  KILN_RETURN_IF_ERROR(c.tensor_dtype(0).status());
  const Type& x = c.input_type(0);
  if (!x.has_rank()) {
    c.set_output_tensor(0, DType::kInt64, Shape{Dim(), Dim()});
    return Status::ok();
  }
  // A scalar is treated as a 1-element vector, as numpy's nonzero does.
  int64_t rank = std::max<int64_t>(int64_t(x.shape->rank()), 1);
  c.set_output_tensor(0, DType::kInt64, Shape{Dim(rank), Dim()});
  return Status::ok();
}

Status non_zero_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  std::vector<int64_t> dims = x.rank() == 0 ? std::vector<int64_t>{1} : x.dims();
  std::vector<int64_t> hits;
  visit_dtype(x.dtype(), [&]<typename T>() {
    const T* p = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      bool nz;
      if constexpr (std::is_same_v<T, std::string>) nz = !p[i].empty();
      else nz = compute_t<T>(p[i]) != compute_t<T>(0);
      if (nz) hits.push_back(i);
    }
  });
  auto nnz = int64_t(hits.size());
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, DType::kInt64, {int64_t(dims.size()), nnz}));
  int64_t* o = out->data<int64_t>();
  std::vector<int64_t> st = strides_of(dims);
  for (int64_t j = 0; j < nnz; ++j) {
    for (size_t d = 0; d < dims.size(); ++d) o[int64_t(d) * nnz + j] = (hits[size_t(j)] / st[d]) % dims[d];
  }
  return Status::ok();
}

// ---- Compress ----------------------------------------------------------------------------------

Status compress_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType ct, c.tensor_dtype(1));
  if (ct != DType::kBool) return c.error("condition must be bool, got {}", dtype_name(ct));
  const Type& x = c.input_type(0);
  // The selected count is data-dependent unless the condition is a constant.
  Dim count;
  if (const Tensor* cond = c.input_constant(1)) {
    int64_t n = 0;
    for (int64_t i = 0; i < cond->numel(); ++i) n += cond->data<bool>()[i] ? 1 : 0;
    count = Dim(n);
  }
  if (!c.node().has_attr("axis")) {
    c.set_output_tensor(0, dt, Shape{count});
    return Status::ok();
  }
  if (!x.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", 0), int64_t(x.shape->rank())));
  Shape out = *x.shape;
  out.dims[size_t(axis)] = count;
  c.set_output_tensor(0, dt, std::move(out));
  return Status::ok();
}

Status compress_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& cond = c.tensor(1);
  if (cond.rank() != 1) return c.error("condition must be 1-D, got {}", cond.summary());
  bool has_axis = c.node().has_attr("axis");
  std::vector<int64_t> dims = has_axis ? x.dims() : std::vector<int64_t>{x.numel()};
  int64_t axis = 0;
  if (has_axis) {
    KILN_ASSIGN_OR_RETURN(axis, normalize_axis(c, c.node().attr_int("axis", 0), int64_t(x.rank())));
  }
  int64_t n = dims[size_t(axis)];
  // As numpy.compress: a shorter condition selects nothing past its end; a longer one may not
  // select anything past the axis.
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < cond.numel(); ++i) {
    if (!cond.data<bool>()[i]) continue;
    if (i >= n) return c.error("condition {} selects index {} beyond axis size {}", cond.summary(), i, n);
    keep.push_back(i);
  }
  std::vector<int64_t> out_dims = dims;
  out_dims[size_t(axis)] = int64_t(keep.size());
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, x.dtype(), out_dims));
  int64_t outer = dims_product(dims, 0, size_t(axis));
  int64_t inner = dims_product(dims, size_t(axis) + 1, dims.size());
  visit_storage(x.dtype(), [&]<typename S>() {
    const S* src = storage<S>(x);
    S* dst = storage<S>(*out);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k : keep) {
        const S* from = src + (o * n + k) * inner;
        dst = std::copy(from, from + inner, dst);
      }
    }
  });
  return Status::ok();
}

}  // namespace

void register_gather_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kGather, {.inputs = {2, 2}, .attrs = {{"axis", K::kInt}}, .infer = gather_infer, .cpu = gather_cpu});
  r.def(OpKind::kGatherElements, {.inputs = {2, 2}, .attrs = {{"axis", K::kInt}},
                                  .infer = gather_elements_infer, .cpu = gather_elements_cpu});
  r.def(OpKind::kGatherND, {.inputs = {2, 2}, .attrs = {{"batch_dims", K::kInt}},
                            .infer = gather_nd_infer, .cpu = gather_nd_cpu});
  r.def(OpKind::kOneHot, {.inputs = {3, 3}, .attrs = {{"axis", K::kInt}}, .infer = one_hot_infer, .cpu = one_hot_cpu});
  r.def(OpKind::kNonZero, {.inputs = {1, 1}, .infer = non_zero_infer, .cpu = non_zero_cpu});
  r.def(OpKind::kCompress, {.inputs = {2, 2}, .attrs = {{"axis", K::kInt}}, .infer = compress_infer, .cpu = compress_cpu});
  register_gather_scatter_ops(r);
  register_gather_unique_ops(r);
}

}  // namespace kiln
