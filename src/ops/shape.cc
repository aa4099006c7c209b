// Op family: shape. This file: ops that only relabel dims or read them (Reshape, Flatten, Squeeze,
// Unsqueeze, Shape, Size, Identity); their kernels share the input buffer instead of copying.
// Ops that move elements (Transpose, Expand, DepthToSpace, SpaceToDepth) are in shape_layout.cc.
//
// Inference matters most here: Shape publishes the input's symbolic dims as its dims_value, and the
// relabeling ops pass a dims_value through, so Reshape(x, Concat(Shape(x)[0], 12, 64)) gets the
// output shape [N,12,64] without knowing N.
#include <algorithm>

#include "ops/shape_util.h"

namespace kiln {

void register_shape_layout_ops(OpRegistry& r);

namespace {

// Relabeling keeps the element order, so an integer tensor's symbolic values carry over.
void pass_dims_value(InferCtx& c) {
  if (const std::vector<Dim>* v = c.input_dims_value(0)) c.set_output_dims_value(0, *v);
}

Dim product(const std::vector<Dim>& dims, size_t begin, size_t end) {
  Dim n(int64_t{1});
  for (size_t k = begin; k < end; ++k) n = n * dims[k];
  return n;
}

// ---- Reshape --------------------------------------------------------------------------------

// The dim a -1 stands for: numel(input) / product(the other output dims). Symbolic factors found on
// both sides cancel first, so [N,128,768] -> [N,128,12,-1] gives 64 rather than an opaque quotient.
Dim infer_minus_one(std::vector<Dim> num, std::vector<Dim> den) {
  for (auto it = den.begin(); it != den.end();) {
    auto m = std::find_if(num.begin(), num.end(), [&](const Dim& d) { return !d.is_static() && d.same_as(*it); });
    if (!it->is_static() && m != num.end()) {
      num.erase(m);
      it = den.erase(it);
    } else {
      ++it;
    }
  }
  Dim n = product(num, 0, num.size()), d = product(den, 0, den.size());
  if (d.is_static() && d.value() == 0) return Dim();
  return floor_div(n, d);
}

Status infer_reshape(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& in = c.input_type(0);
  const bool allowzero = c.node().attr_int("allowzero", 0) != 0;
  std::optional<std::vector<Dim>> target = c.input_as_dims(1);
  if (!target) {
    // Values unknown: the rank is still the shape input's length when that is known.
    const Type& st = c.input_type(1);
    std::optional<Shape> s;
    if (st.has_rank() && st.shape->rank() == 1 && (*st.shape)[0].is_static()) {
      s = Shape(std::vector<Dim>(size_t((*st.shape)[0].value())));
    }
    c.set_output_tensor(0, dt, std::move(s));
    return Status::ok();
  }
  std::vector<Dim> out;
  std::optional<size_t> minus_one;
  bool has_zero = false;
  for (size_t k = 0; k < target->size(); ++k) {
    const Dim& d = (*target)[k];
    if (d.is_static() && d.value() == -1) {
      if (minus_one) return c.error("shape {} has more than one -1", Shape(*target).to_string());
      minus_one = k;
      out.emplace_back();
    } else if (d.is_static() && d.value() < -1) {
      return c.error("shape {} has a negative dim {}", Shape(*target).to_string(), d.value());
    } else if (d.is_static() && d.value() == 0 && !allowzero) {
      if (in.has_rank() && k >= in.shape->rank()) {
        return c.error("shape {} copies dim {} (0) but the input {} has rank {}", Shape(*target).to_string(), k,
                       in.to_string(), in.shape->rank());
      }
      out.push_back(in.has_rank() ? (*in.shape)[k] : Dim());
    } else {
      has_zero |= d.is_static() && d.value() == 0;
      out.push_back(d);
    }
  }
  if (allowzero && has_zero && minus_one) {
    return c.error("shape {} has both 0 and -1, which allowzero makes ambiguous", Shape(*target).to_string());
  }
  if (minus_one && in.has_rank()) {
    std::vector<Dim> others = out;
    others.erase(others.begin() + std::ptrdiff_t(*minus_one));
    out[*minus_one] = infer_minus_one(in.shape->dims, others);
  }
  int64_t static_n = 1;
  for (const Dim& d : out) {
    if (d.is_static() && __builtin_mul_overflow(static_n, d.value(), &static_n)) {
      return c.error("shape {} has more elements than fit in 64 bits", Shape(out).to_string());
    }
  }
  Dim in_n = in.has_rank() ? in.shape->numel() : Dim(), out_n = Shape(out).numel();
  if (in_n.is_static() && out_n.is_static() && in_n.value() != out_n.value()) {
    return c.error("cannot reshape {} ({} elements) to {} ({} elements)", in.to_string(), in_n.value(),
                   Shape(out).to_string(), out_n.value());
  }
  c.set_output_tensor(0, dt, Shape(std::move(out)));
  pass_dims_value(c);
  return Status::ok();
}

Status reshape_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const std::vector<int64_t> target = c.tensor(1).to_int_vector();
  const bool allowzero = c.node().attr_int("allowzero", 0) != 0;
  std::vector<int64_t> out;
  std::optional<size_t> minus_one;
  int64_t known = 1;  // product of the output dims other than -1
  for (size_t k = 0; k < target.size(); ++k) {
    int64_t d = target[k];
    if (d == 0 && !allowzero) {
      if (k >= x.rank()) return c.error("shape {} copies dim {} of input {}", dims_to_string(target), k, x.summary());
      d = x.dim(k);
    }
    if (d == -1) {
      if (minus_one) return c.error("shape {} has more than one -1", dims_to_string(target));
      minus_one = k;
    } else if (d < 0) {
      return c.error("shape {} has a negative dim {}", dims_to_string(target), d);
    } else if (__builtin_mul_overflow(known, d, &known)) {
      return c.error("shape {} has too many elements", dims_to_string(target));
    }
    out.push_back(d);
  }
  if (minus_one) {
    if (known == 0 || x.numel() % known != 0) {
      return c.error("cannot infer the -1 in shape {} for input {}", dims_to_string(target), x.summary());
    }
    out[*minus_one] = x.numel() / known;
  } else if (known != x.numel()) {
    return c.error("cannot reshape input {} to {}", x.summary(), dims_to_string(out));
  }
  c.set_output(0, x.reshaped(out));
  return Status::ok();
}

// ---- Flatten --------------------------------------------------------------------------------

Status infer_flatten(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& in = c.input_type(0);
  if (!in.has_rank()) {
    c.set_output_tensor(0, dt, Shape(std::vector<Dim>(2)));
    return Status::ok();
  }
  const int64_t rank = int64_t(in.shape->rank());
  int64_t axis = c.node().attr_int("axis", 1);
  if (axis < -rank || axis > rank) return c.error("axis {} is out of range [-{}, {}]", axis, rank, rank);
  if (axis < 0) axis += rank;
  const std::vector<Dim>& d = in.shape->dims;
  c.set_output_tensor(0, dt, Shape({product(d, 0, size_t(axis)), product(d, size_t(axis), d.size())}));
  pass_dims_value(c);
  return Status::ok();
}

Status flatten_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const int64_t rank = int64_t(x.rank());
  int64_t axis = c.node().attr_int("axis", 1);
  if (axis < -rank || axis > rank) return c.error("axis {} is out of range [-{}, {}]", axis, rank, rank);
  if (axis < 0) axis += rank;
  int64_t outer = 1;
  for (int64_t k = 0; k < axis; ++k) outer *= x.dim(size_t(k));
  c.set_output(0, x.reshaped({outer, outer == 0 ? 0 : x.numel() / outer}));
  return Status::ok();
}

// ---- Squeeze / Unsqueeze ----------------------------------------------------------------------

Status infer_squeeze(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& in = c.input_type(0);
  std::optional<std::vector<int64_t>> axes = c.has_input(1) ? static_ints(c, 1) : std::vector<int64_t>{};
  if (!in.has_rank() || !axes) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const std::vector<Dim>& d = in.shape->dims;
  std::vector<bool> mask(d.size(), false);
  if (axes->empty()) {
    // Every 1 goes; a symbolic dim might be 1 at run time, so the rank is unknown then.
    for (size_t k = 0; k < d.size(); ++k) {
      if (!d[k].is_static()) {
        c.set_output_tensor(0, dt, std::nullopt);
        return Status::ok();
      }
      mask[k] = d[k].value() == 1;
    }
  } else {
    KILN_ASSIGN_OR_RETURN(mask, axes_mask(c, *axes, int64_t(d.size())));
  }
  std::vector<Dim> out;
  for (size_t k = 0; k < d.size(); ++k) {
    if (!mask[k]) out.push_back(d[k]);
    else if (d[k].is_static() && d[k].value() != 1) {
      return c.error("cannot squeeze axis {} of shape {}: its size is not 1", k, in.shape->to_string());
    }
  }
  c.set_output_tensor(0, dt, Shape(std::move(out)));
  pass_dims_value(c);
  return Status::ok();
}

Status squeeze_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const std::vector<int64_t> axes = optional_ints(c, 1);
  std::vector<bool> mask(x.rank(), false);
  if (axes.empty()) {
    for (size_t k = 0; k < x.rank(); ++k) mask[k] = x.dim(k) == 1;
  } else {
    KILN_ASSIGN_OR_RETURN(mask, axes_mask(c, axes, int64_t(x.rank())));
  }
  std::vector<int64_t> out;
  for (size_t k = 0; k < x.rank(); ++k) {
    if (!mask[k]) out.push_back(x.dim(k));
    else if (x.dim(k) != 1) return c.error("cannot squeeze axis {} of input {}: its size is not 1", k, x.summary());
  }
  c.set_output(0, x.reshaped(out));
  return Status::ok();
}

// Output dims of Unsqueeze: axes index the output, whose rank is rank(input) + len(axes).
template <typename Ctx, typename D>
Expected<std::vector<D>> unsqueezed(const Ctx& c, const std::vector<D>& in, const std::vector<int64_t>& axes) {
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, axes_mask(c, axes, int64_t(in.size() + axes.size())));
  std::vector<D> out;
  size_t next = 0;
  for (bool ones : mask) out.push_back(ones ? D(int64_t{1}) : in[next++]);
  return out;
}

Status infer_unsqueeze(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& in = c.input_type(0);
  std::optional<std::vector<int64_t>> axes = static_ints(c, 1);
  if (!in.has_rank() || !axes) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, unsqueezed(c, in.shape->dims, *axes));
  c.set_output_tensor(0, dt, Shape(std::move(out)));
  pass_dims_value(c);
  return Status::ok();
}

Status unsqueeze_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out, unsqueezed(c, x.dims(), c.tensor(1).to_int_vector()));
  c.set_output(0, x.reshaped(out));
  return Status::ok();
}

// ---- Shape, Size, Identity ------------------------------------------------------------------

// [start, end) of Shape's slice, clamped to [0, rank].
std::pair<int64_t, int64_t> shape_range(const Node& n, int64_t rank) {
  auto clamp = [rank](int64_t a) { return std::clamp<int64_t>(a < 0 ? a + rank : a, 0, rank); };
  int64_t start = clamp(n.attr_int("start", 0));
  int64_t end = n.has_attr("end") ? clamp(n.attr_int("end", rank)) : rank;
  return {start, std::max(start, end)};
}

Status infer_shape(InferCtx& c) {
  const Type& in = c.input_type(0);
  if (!in.is_tensor()) return c.error("input must be a tensor, got {}", in.to_string());
  if (!in.has_rank()) {
    c.set_output_tensor(0, DType::kInt64, Shape({Dim()}));
    return Status::ok();
  }
  auto [start, end] = shape_range(c.node(), int64_t(in.shape->rank()));
  std::vector<Dim> dims(in.shape->dims.begin() + start, in.shape->dims.begin() + end);
  c.set_output_tensor(0, DType::kInt64, Shape({Dim(end - start)}));
  c.set_output_dims_value(0, std::move(dims));
  return Status::ok();
}

Status shape_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  auto [start, end] = shape_range(c.node(), int64_t(x.rank()));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kInt64, {end - start}));
  std::copy(x.dims().begin() + start, x.dims().begin() + end, y->data<int64_t>());
  return Status::ok();
}

Status infer_size(InferCtx& c) {
  const Type& in = c.input_type(0);
  if (!in.is_tensor()) return c.error("input must be a tensor, got {}", in.to_string());
  c.set_output_tensor(0, DType::kInt64, Shape());
  if (in.has_rank()) c.set_output_dims_value(0, {in.shape->numel()});
  return Status::ok();
}

Status size_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kInt64, {}));
  *y->data<int64_t>() = c.tensor(0).numel();
  return Status::ok();
}

// Identity passes any Data through: tensors, sequences and optionals alike.
Status infer_identity(InferCtx& c) {
  c.set_output(0, c.input_type(0));
  pass_dims_value(c);
  return Status::ok();
}

Status identity_cpu(KernelCtx& c) {
  c.set_output(0, c.input(0));
  return Status::ok();
}

}  // namespace

void register_shape_ops(OpRegistry& r) {
  r.def(OpKind::kReshape, {.inputs = {2, 2},
                           .attrs = {{"allowzero", Attribute::Kind::kInt}},
                           .infer = infer_reshape,
                           .cpu = reshape_cpu});
  r.def(OpKind::kFlatten,
        {.inputs = {1, 1}, .attrs = {{"axis", Attribute::Kind::kInt}}, .infer = infer_flatten, .cpu = flatten_cpu});
  r.def(OpKind::kSqueeze, {.inputs = {1, 2}, .infer = infer_squeeze, .cpu = squeeze_cpu});
  r.def(OpKind::kUnsqueeze, {.inputs = {2, 2}, .infer = infer_unsqueeze, .cpu = unsqueeze_cpu});
  r.def(OpKind::kShape, {.inputs = {1, 1},
                         .attrs = {{"start", Attribute::Kind::kInt}, {"end", Attribute::Kind::kInt}},
                         .infer = infer_shape,
                         .cpu = shape_cpu});
  r.def(OpKind::kSize, {.inputs = {1, 1}, .infer = infer_size, .cpu = size_cpu});
  r.def(OpKind::kIdentity, {.inputs = {1, 1}, .infer = infer_identity, .cpu = identity_cpu});
  register_shape_layout_ops(r);
}

}  // namespace kiln
