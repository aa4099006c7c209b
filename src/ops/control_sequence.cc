// Sequence and optional ops of the control family: SequenceConstruct/Empty/At/Insert/Erase/Length,
// SplitToSequence, ConcatFromSequence, SequenceMap, Optional, OptionalHasElement,
// OptionalGetElement. At run time a sequence is Data::Kind::kSequence, an empty optional is
// Data::Kind::kNone and a present optional is just its element.
#include "ops/control_util.h"

namespace kiln {

namespace {

constexpr auto kIntAttr = Attribute::Kind::kInt;

// The element type of a sequence built from tensors of the given types (unknown ones ignored).
Expected<Type> join_elements(const InferCtx& c, const std::vector<Type>& elems) {
  Type acc;
  for (const Type& t : elems) {
    if (!t.is_known()) continue;
    if (!t.is_tensor()) return c.error("sequence elements must be tensors, got {}", t.to_string());
    if (acc.is_known() && acc.dtype != t.dtype) {
      return c.error("sequence elements must share a dtype, got {} and {}", acc.to_string(), t.to_string());
    }
    acc = join_types(acc, t);
  }
  return acc;
}

// Input i as a sequence (the executor guarantees a value; its kind is checked here).
Expected<const Data*> sequence_input(const KernelCtx& c, size_t i) {
  const Data& d = c.input(i);
  if (!d.is_sequence()) return c.error("input {} must be a sequence, got {}", i, d.summary());
  return &d;
}

// Reads the optional position input i and maps it into [0, n) (or [0, n] with `allow_end`);
// `dflt` when the input is absent. Negative positions count from the back.
Expected<int64_t> read_position(const KernelCtx& c, size_t i, int64_t n, bool allow_end, int64_t dflt) {
  if (!c.has_input(i)) return dflt;
  const Tensor& p = c.tensor(i);
  if (p.numel() != 1) return c.error("position must be a scalar, got {}", p.summary());
  int64_t pos = p.as_int(0);
  int64_t hi = allow_end ? n : n - 1;
  if (pos < -n || pos > hi) return c.error("position {} is out of range [{}, {}] for a sequence of {}", pos, -n, hi, n);
  return pos < 0 ? pos + n : pos;
}

Status infer_sequence_check_position(InferCtx& c, size_t i) {
  if (!c.has_input(i) || !c.input_type(i).is_known()) return Status::ok();
  const Type& t = c.input_type(i);
  if (!t.is_tensor() || (t.dtype != DType::kInt32 && t.dtype != DType::kInt64)) {
    return c.error("position must be an int32 or int64 scalar, got {}", t.to_string());
  }
  return Status::ok();
}

// ---- SequenceConstruct / SequenceEmpty / SequenceLength -------------------------------------

Status infer_sequence_construct(InferCtx& c) {
  std::vector<Type> elems;
  for (size_t i = 0; i < c.num_inputs(); ++i) elems.push_back(c.input_type(i));
  KILN_ASSIGN_OR_RETURN(Type e, join_elements(c, elems));
  c.set_output(0, Type::sequence(std::move(e)));
  return Status::ok();
}

Status sequence_construct_cpu(KernelCtx& c) {
  std::vector<Tensor> items;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (c.tensor(i).dtype() != c.tensor(0).dtype()) {
      return c.error("inputs must share a dtype, got {} and {}", c.tensor(0).summary(), c.tensor(i).summary());
    }
    items.push_back(c.tensor(i));
  }
  c.set_output(0, Data::make_sequence(std::move(items), c.tensor(0).dtype()));
  return Status::ok();
}

Expected<DType> sequence_empty_dtype(const Node& n) {
  int64_t code = n.attr_int("dtype", 1);  // FLOAT
  std::optional<DType> dt = dtype_from_onnx(int32_t(code));
  if (!dt) return KILN_ERROR(kUnsupported, "{}: dtype {} is not a tensor element type kiln supports", n.describe(), code);
  return *dt;
}

Status infer_sequence_empty(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, sequence_empty_dtype(c.node()));
  c.set_output(0, Type::sequence(Type::tensor(dt)));
  return Status::ok();
}

Status sequence_empty_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, sequence_empty_dtype(c.node()));
  c.set_output(0, Data::make_sequence({}, dt));
  return Status::ok();
}

Status infer_sequence_length(InferCtx& c) {
  KILN_RETURN_IF_ERROR(sequence_elem_type(c, 0).status());
  c.set_output(0, Type::tensor(DType::kInt64, Shape{}));
  return Status::ok();
}

Status sequence_length_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(const Data* s, sequence_input(c, 0));
  c.set_output(0, Data(Tensor::scalar<int64_t>(int64_t(s->sequence.size()))));
  return Status::ok();
}

// ---- SequenceAt / SequenceInsert / SequenceErase --------------------------------------------

Status infer_sequence_at(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(Type e, sequence_elem_type(c, 0));
  KILN_RETURN_IF_ERROR(infer_sequence_check_position(c, 1));
  c.set_output(0, std::move(e));
  return Status::ok();
}

Status sequence_at_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(const Data* s, sequence_input(c, 0));
  int64_t n = int64_t(s->sequence.size());
  KILN_ASSIGN_OR_RETURN(int64_t pos, read_position(c, 1, n, false, 0));
  c.set_output(0, Data(s->sequence[size_t(pos)]));
  return Status::ok();
}

Status infer_sequence_insert(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(Type e, sequence_elem_type(c, 0));
  KILN_RETURN_IF_ERROR(infer_sequence_check_position(c, 2));
  KILN_ASSIGN_OR_RETURN(Type joined, join_elements(c, {e, c.input_type(1)}));
  c.set_output(0, Type::sequence(std::move(joined)));
  return Status::ok();
}

Status sequence_insert_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(const Data* s, sequence_input(c, 0));
  const Tensor& t = c.tensor(1);
  if (t.dtype() != s->sequence_dtype) {
    return c.error("cannot insert {} into a sequence of {}", t.summary(), dtype_name(s->sequence_dtype));
  }
  int64_t n = int64_t(s->sequence.size());
  KILN_ASSIGN_OR_RETURN(int64_t pos, read_position(c, 2, n, true, n));
  std::vector<Tensor> items = s->sequence;
  items.insert(items.begin() + pos, t);
  c.set_output(0, Data::make_sequence(std::move(items), s->sequence_dtype));
  return Status::ok();
}

Status infer_sequence_erase(InferCtx& c) {
  KILN_RETURN_IF_ERROR(sequence_elem_type(c, 0).status());
  KILN_RETURN_IF_ERROR(infer_sequence_check_position(c, 1));
  c.set_output(0, c.input_type(0));
  return Status::ok();
}

Status sequence_erase_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(const Data* s, sequence_input(c, 0));
  int64_t n = int64_t(s->sequence.size());
  if (n == 0) return c.error("cannot erase from an empty sequence");
  KILN_ASSIGN_OR_RETURN(int64_t pos, read_position(c, 1, n, false, n - 1));
  std::vector<Tensor> items = s->sequence;
  items.erase(items.begin() + pos);
  c.set_output(0, Data::make_sequence(std::move(items), s->sequence_dtype));
  return Status::ok();
}

// ---- SplitToSequence / ConcatFromSequence ---------------------------------------------------

Status infer_split_to_sequence(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& in = c.input_type(0);
  if (!in.has_rank()) { c.set_output(0, Type::sequence(Type::tensor(dt))); return Status::ok(); }
  Shape s = *in.shape;
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", 0), int64_t(s.rank())));
  if (c.has_input(1)) {
    s[size_t(axis)] = Dim();  // chunk lengths may differ
  } else if (c.node().attr_int("keepdims", 1) != 0) {
    s[size_t(axis)] = Dim(int64_t{1});
  } else {
    s.dims.erase(s.dims.begin() + axis);
  }
  c.set_output(0, Type::sequence(Type::tensor(dt, std::move(s))));
  return Status::ok();
}

// The chunk lengths SplitToSequence cuts a dim of size `len` into.
Expected<std::vector<int64_t>> split_lengths(const KernelCtx& c, int64_t len) {
  std::vector<int64_t> out;
  if (!c.has_input(1)) return std::vector<int64_t>(size_t(len), 1);
  const Tensor& split = c.tensor(1);
  if (split.rank() == 0) {
    int64_t chunk = split.as_int(0);
    if (chunk <= 0) return c.error("split must be positive, got {}", chunk);
    for (int64_t start = 0; start < len; start += chunk) out.push_back(std::min(chunk, len - start));
    return out;
  }
  if (split.rank() != 1) return c.error("split must be a scalar or 1-D, got {}", split.summary());
  int64_t sum = 0;
  for (int64_t i = 0; i < split.numel(); ++i) {
    int64_t v = split.as_int(i);
    if (v < 0) return c.error("split lengths must not be negative, got {}", v);
    out.push_back(v);
    sum += v;
  }
  if (sum != len) return c.error("split lengths sum to {} but the split dimension is {}", sum, len);
  return out;
}

Status split_to_sequence_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() == 0) return c.error("cannot split a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", 0), int64_t(x.rank())));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> lengths, split_lengths(c, x.dim(size_t(axis))));
  bool drop_axis = !c.has_input(1) && c.node().attr_int("keepdims", 1) == 0;
  std::vector<Tensor> items;
  int64_t start = 0;
  for (int64_t len : lengths) {
    KILN_ASSIGN_OR_RETURN(Tensor part, slice_axis(x, size_t(axis), start, len));
    if (drop_axis) {
      std::vector<int64_t> d = part.dims();
      d.erase(d.begin() + axis);
      part = part.reshaped(d);
    }
    items.push_back(std::move(part));
    start += len;
  }
  c.set_output(0, Data::make_sequence(std::move(items), x.dtype()));
  return Status::ok();
}

Status infer_concat_from_sequence(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(Type e, sequence_elem_type(c, 0));
  if (!e.is_tensor()) { c.set_output(0, Type()); return Status::ok(); }
  if (!e.shape) { c.set_output(0, Type::tensor(e.dtype)); return Status::ok(); }
  bool new_axis = c.node().attr_int("new_axis", 0) != 0;
  int64_t rank = int64_t(e.shape->rank());
  KILN_ASSIGN_OR_RETURN(int64_t axis, new_axis ? normalize_axis(c, c.node().attr_int("axis", 0), rank + 1)
                                                : normalize_dim_axis(c, c.node().attr_int("axis", 0), rank));
  // The element count (stack) or the summed lengths (concat) is known only at run time.
  if (new_axis) {
    c.set_output(0, with_inserted_dim(e, size_t(axis), Dim()));
  } else {
    Shape s = *e.shape;
    s[size_t(axis)] = Dim();
    c.set_output(0, Type::tensor(e.dtype, std::move(s)));
  }
  return Status::ok();
}

Status concat_from_sequence_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(const Data* s, sequence_input(c, 0));
  if (s->sequence.empty()) return c.error("cannot concatenate an empty sequence");
  bool new_axis = c.node().attr_int("new_axis", 0) != 0;
  int64_t rank = int64_t(s->sequence[0].rank());
  KILN_ASSIGN_OR_RETURN(int64_t axis, new_axis ? normalize_axis(c, c.node().attr_int("axis", 0), rank + 1)
                                                : normalize_dim_axis(c, c.node().attr_int("axis", 0), rank));
  KILN_ASSIGN_OR_RETURN(Tensor out, new_axis ? stack_axis(c, s->sequence, size_t(axis))
                                             : concat_axis(c, s->sequence, size_t(axis)));
  c.set_output(0, Data(std::move(out)));
  return Status::ok();
}

// ---- SequenceMap ----------------------------------------------------------------------------

Status infer_sequence_map(InferCtx& c) {
  const Graph& body = *c.node().attr_graph("body");
  if (body.inputs.size() != c.num_inputs() || body.outputs.size() != c.num_outputs()) {
    return c.error("body has {} inputs and {} outputs, expected {} and {} (as the node)", body.inputs.size(),
                   body.outputs.size(), c.num_inputs(), c.num_outputs());
  }
  std::vector<Type> in;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Type& t = c.input_type(i);
    if (i == 0 && t.is_known() && t.kind != Type::Kind::kSequence) {
      return c.error("input 0 must be a sequence, got {}", t.to_string());
    }
    in.push_back(t.kind == Type::Kind::kSequence ? *t.elem : t);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Type> out, c.infer_graph(body, in));
  for (size_t k = 0; k < out.size(); ++k) c.set_output(k, Type::sequence(out[k]));
  return Status::ok();
}

Status sequence_map_cpu(KernelCtx& c) {
  const Graph& body = *c.node().attr_graph("body");
  KILN_ASSIGN_OR_RETURN(const Data* first, sequence_input(c, 0));
  size_t n = first->sequence.size();
  for (size_t i = 1; i < c.num_inputs(); ++i) {
    const Data& d = c.input(i);
    if (d.is_sequence() && d.sequence.size() != n) {
      return c.error("input {} is a sequence of {} but input 0 has {}", i, d.sequence.size(), n);
    }
  }
  std::vector<std::vector<Tensor>> results(c.num_outputs());
  for (size_t e = 0; e < n; ++e) {
    std::vector<Data> in;
    for (size_t i = 0; i < c.num_inputs(); ++i) {
      const Data& d = c.input(i);
      in.push_back(d.is_sequence() ? Data(d.sequence[e]) : d);
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Data> out, c.run_graph(body, std::move(in)));
    if (out.size() != c.num_outputs()) return c.error("body returned {} values, expected {}", out.size(), c.num_outputs());
    for (size_t k = 0; k < out.size(); ++k) {
      if (!out[k].is_tensor()) return c.error("body output {} must be a tensor, got {}", k, out[k].summary());
      results[k].push_back(std::move(out[k].tensor));
    }
  }
  for (size_t k = 0; k < results.size(); ++k) {
    // The declared element dtype, so an empty result is still typed.
    DType dt = body.outputs[k]->type.is_tensor() ? body.outputs[k]->type.dtype : DType::kFloat32;
    if (!results[k].empty()) dt = results[k][0].dtype();
    c.set_output(k, Data::make_sequence(std::move(results[k]), dt));
  }
  return Status::ok();
}

// ---- Optional / OptionalHasElement / OptionalGetElement --------------------------------------

Status infer_optional(InferCtx& c) {
  if (c.has_input(0)) {
    c.set_output(0, Type::optional(c.input_type(0)));
    return Status::ok();
  }
  const Attribute* a = c.node().attr("type");
  if (!a || a->types.empty()) return c.error("an Optional without an input needs the 'type' attribute");
  c.set_output(0, Type::optional(a->types[0]));
  return Status::ok();
}

Status optional_cpu(KernelCtx& c) {
  c.set_output(0, c.has_input(0) ? c.input(0) : Data());
  return Status::ok();
}

Status infer_optional_has_element(InferCtx& c) {
  c.set_output(0, Type::tensor(DType::kBool, Shape{}));
  return Status::ok();
}

Status optional_has_element_cpu(KernelCtx& c) {
  c.set_output(0, Data(Tensor::scalar<bool>(c.has_input(0) && !c.input(0).is_none())));
  return Status::ok();
}

Status infer_optional_get_element(InferCtx& c) {
  const Type& t = c.input_type(0);
  c.set_output(0, t.kind == Type::Kind::kOptional ? *t.elem : t);
  return Status::ok();
}

Status optional_get_element_cpu(KernelCtx& c) {
  if (c.input(0).is_none()) return c.error("the optional input is empty");
  c.set_output(0, c.input(0));
  return Status::ok();
}

}  // namespace

void register_control_sequence_ops(OpRegistry& r) {
  r.def(OpKind::kSequenceConstruct, {.inputs = {1, kVariadic}, .infer = infer_sequence_construct,
                                     .cpu = sequence_construct_cpu});
  r.def(OpKind::kSequenceEmpty, {.inputs = {0, 0}, .attrs = {{"dtype", kIntAttr}}, .infer = infer_sequence_empty,
                                 .cpu = sequence_empty_cpu});
  r.def(OpKind::kSequenceLength, {.inputs = {1, 1}, .infer = infer_sequence_length, .cpu = sequence_length_cpu});
  r.def(OpKind::kSequenceAt, {.inputs = {2, 2}, .infer = infer_sequence_at, .cpu = sequence_at_cpu});
  r.def(OpKind::kSequenceInsert, {.inputs = {2, 3}, .infer = infer_sequence_insert, .cpu = sequence_insert_cpu});
  r.def(OpKind::kSequenceErase, {.inputs = {1, 2}, .infer = infer_sequence_erase, .cpu = sequence_erase_cpu});
  r.def(OpKind::kSplitToSequence, {.inputs = {1, 2}, .attrs = {{"axis", kIntAttr}, {"keepdims", kIntAttr}},
                                   .infer = infer_split_to_sequence, .cpu = split_to_sequence_cpu});
  r.def(OpKind::kConcatFromSequence, {.inputs = {1, 1}, .attrs = {{"axis", kIntAttr, true}, {"new_axis", kIntAttr}},
                                      .infer = infer_concat_from_sequence, .cpu = concat_from_sequence_cpu});
  r.def(OpKind::kSequenceMap, {.inputs = {1, kVariadic}, .outputs = {1, kVariadic},
                               .attrs = {{"body", Attribute::Kind::kGraph, true}}, .infer = infer_sequence_map,
                               .cpu = sequence_map_cpu});
  r.def(OpKind::kOptional, {.inputs = {0, 1}, .attrs = {{"type", Attribute::Kind::kType}}, .infer = infer_optional,
                            .cpu = optional_cpu});
  r.def(OpKind::kOptionalHasElement, {.inputs = {0, 1}, .infer = infer_optional_has_element,
                                      .cpu = optional_has_element_cpu});
  r.def(OpKind::kOptionalGetElement, {.inputs = {1, 1}, .infer = infer_optional_get_element,
                                      .cpu = optional_get_element_cpu});
}

}  // namespace kiln
