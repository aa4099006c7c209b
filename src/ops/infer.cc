#include "ops/infer.h"

#include "ops/op_registry.h"

namespace kiln {

Status check_node_schema(const Node& n) {
  const OpDef& d = op_def(n.op);
  if (!d.infer) {
    return KILN_ERROR(kUnsupported, "{}: op {} is not implemented by kiln yet", n.describe(), op_name(n.op));
  }
  // Trailing omitted inputs do not count.
  size_t ni = n.inputs.size();
  while (ni > 0 && !n.inputs[ni - 1]) --ni;
  if (int(ni) < d.inputs.min || (d.inputs.max != kVariadic && int(ni) > d.inputs.max)) {
    return KILN_ERROR(kInvalidModel, "{}: has {} inputs, expected {}{}", n.describe(), ni, d.inputs.min,
                      d.inputs.max == d.inputs.min ? "" :
                      d.inputs.max == kVariadic ? " or more" : fmt::format(" to {}", d.inputs.max));
  }
  for (int i = 0; i < d.inputs.min && i < int(n.inputs.size()); ++i) {
    if (!n.inputs[size_t(i)]) return KILN_ERROR(kInvalidModel, "{}: required input {} is missing", n.describe(), i);
  }
  size_t no = n.outputs.size();
  if (int(no) < d.outputs.min || (d.outputs.max != kVariadic && int(no) > d.outputs.max)) {
    return KILN_ERROR(kInvalidModel, "{}: has {} outputs, expected {}{}", n.describe(), no, d.outputs.min,
                      d.outputs.max == d.outputs.min ? "" :
                      d.outputs.max == kVariadic ? " or more" : fmt::format(" to {}", d.outputs.max));
  }
  for (const AttrSpec& s : d.attrs) {
    const Attribute* a = n.attr(s.name);
    if (!a) {
      if (s.required) return KILN_ERROR(kInvalidModel, "{}: required attribute '{}' is missing", n.describe(), s.name);
      continue;
    }
    bool ok = a->kind == s.kind ||
              (s.kind == Attribute::Kind::kFloat && a->kind == Attribute::Kind::kInt);  // 1 for 1.0
    if (!ok) {
      return KILN_ERROR(kInvalidModel, "{}: attribute '{}' must be {}, got {}", n.describe(), s.name,
                        attr_kind_name(s.kind), attr_kind_name(a->kind));
    }
  }
  return Status::ok();
}

Expected<Type> merge_types(const Type& declared, const Type& inferred, const std::string& what) {
  if (!declared.is_known()) return inferred;
  if (!inferred.is_known()) return declared;
  auto mismatch = [&]() {
    return KILN_ERROR(kInvalidModel, "{}: inferred type {} contradicts the declared type {}", what,
                      inferred.to_string(), declared.to_string());
  };
  if (declared.kind != inferred.kind) {
    // An optional may be declared where a plain value flows (and the reverse in old exporters).
    if (declared.kind == Type::Kind::kOptional || inferred.kind == Type::Kind::kOptional) return declared;
    return mismatch();
  }
  switch (inferred.kind) {
    case Type::Kind::kUnknown: return declared;
    case Type::Kind::kSequence:
    case Type::Kind::kOptional: {
      KILN_ASSIGN_OR_RETURN(Type e, merge_types(*declared.elem, *inferred.elem, what));
      return inferred.kind == Type::Kind::kSequence ? Type::sequence(std::move(e)) : Type::optional(std::move(e));
    }
    case Type::Kind::kTensor: break;
  }
  if (declared.dtype != inferred.dtype) return mismatch();
  if (!declared.shape) return inferred;
  if (!inferred.shape) return declared;
  if (declared.shape->rank() != inferred.shape->rank()) return mismatch();
  Shape s = *inferred.shape;
  for (size_t i = 0; i < s.rank(); ++i) {
    const Dim& d = declared.shape->dims[i];
    Dim& x = s.dims[i];
    if (d.is_static() && x.is_static() && d.value() != x.value()) return mismatch();
    if (d.is_static() && !x.is_static()) x = d;        // the model knows more
    else if (x.is_unknown() && d.is_symbolic()) x = d;  // keep the model's name for it
  }
  return Type::tensor(inferred.dtype, std::move(s));
}

namespace {

Expected<std::vector<Type>> infer_subgraph(const Graph& cg, const std::vector<Type>& in_types);

Status infer_nodes(Graph& g) {
  GraphInferFn sub = [](const Graph& sg, const std::vector<Type>& t) { return infer_subgraph(sg, t); };
  for (auto& np : g.nodes) {
    Node& n = *np;
    KILN_RETURN_IF_ERROR(check_node_schema(n));
    std::vector<Type> declared;
    for (Value* o : n.outputs) declared.push_back(o ? o->type : Type());
    for (Value* o : n.outputs) if (o) o->type = Type();
    InferCtx ctx(n, sub);
    KILN_RETURN_IF_ERROR(op_def(n.op).infer(ctx));
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      Value* o = n.outputs[i];
      if (!o) continue;
      auto merged = merge_types(declared[i], o->type, fmt::format("{} output '{}'", n.describe(), o->name));
      if (!merged) return merged.status();
      o->type = std::move(*merged);
    }
  }
  return Status::ok();
}

Expected<std::vector<Type>> infer_subgraph(const Graph& cg, const std::vector<Type>& in_types) {
  Graph& g = const_cast<Graph&>(cg);  // inference annotates the body's values in place
  for (size_t i = 0; i < g.inputs.size() && i < in_types.size(); ++i) {
    auto m = merge_types(g.inputs[i]->type, in_types[i], fmt::format("subgraph '{}' input '{}'", g.name, g.inputs[i]->name));
    // A loop-carried value may change shape between iterations: keep what the body declares.
    g.inputs[i]->type = m ? *m : g.inputs[i]->type;
  }
  KILN_RETURN_IF_ERROR(infer_nodes(g));
  std::vector<Type> out;
  for (Value* v : g.outputs) out.push_back(v->type);
  return out;
}

}  // namespace

Status infer_types(Graph& g) {
  KILN_RETURN_IF_ERROR(infer_nodes(g));
  return Status::ok();
}

}  // namespace kiln
