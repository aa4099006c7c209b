// narrow-masks: an attention mask that is the same for every query is computed once per key, not
// once per (query, key). Exporters build a padding mask by broadcasting: transformers 5 (BERT)
// combines a [1,1,S,1] "query in range" constant, all true, with the [B,1,1,S] padding row, which
// makes the mask [B,1,S,S]. Shrinking every constant input that is uniform along the query axis to
// size 1 there makes the whole chain [B,1,1,S]: S times fewer elements computed and stored, and
// the CUDA attention kernel stages one mask row per tile in shared memory instead of every lane
// loading its own values from global memory.
//
//   Before:  %r = const dense<bool[1,1,3,1]> [true, true, true]
//            %a = And(%r, %pad) : bool[2,1,3,3]                     (%pad: bool[2,1,1,3])
//            %m = Where(%a, %zero, %neg) : f32[2,1,3,3]
//            %o = Attention(%q, %k, %v, %m) : f32[2,4,3,8]
//   After:   %r_narrow = const dense<bool[1,1,1,1]> [true]
//            %a = And(%r_narrow, %pad) : bool[2,1,1,3]
//            %m = Where(%a, %zero, %neg) : f32[2,1,1,3]
//            %o = Attention(%q, %k, %v, %m) : f32[2,4,3,8]
//
// Preconditions, all checked: the mask (Attention input 3) is read only as an Attention mask and
// is not a graph output; its query axis (second to last) is static; it comes from broadcasting
// elementwise nodes (arithmetic, comparisons, logic, Where, Cast) each read only by the next node
// of the chain, down to values that already have size 1 on that axis (or do not reach it) and to
// constants whose slices along it are all equal. Attention broadcasts its mask over the queries
// (ONNX), so its result is unchanged; a constant read elsewhere keeps its full copy.
#include <cstring>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

bool broadcasting_elementwise(OpKind op) {
  switch (op) {
    case OpKind::kAdd: case OpKind::kSub: case OpKind::kMul: case OpKind::kDiv: case OpKind::kPow:
    case OpKind::kAnd: case OpKind::kOr: case OpKind::kXor: case OpKind::kNot: case OpKind::kEqual:
    case OpKind::kLess: case OpKind::kLessOrEqual: case OpKind::kGreater: case OpKind::kGreaterOrEqual:
    case OpKind::kWhere: case OpKind::kCast: case OpKind::kNeg: case OpKind::kAbs: case OpKind::kMax:
    case OpKind::kMin:
      return true;
    default:
      return false;
  }
}

// A constant input to narrow: node->inputs[input] becomes its slice 0 along `axis`.
struct ConstCut {
  Node* node;
  size_t input;
  size_t axis;
};

// The narrowing found for one mask.
struct Plan {
  std::vector<ConstCut> cuts;
  std::vector<Node*> chain;  // producers before consumers; their outputs get size 1 on the axis
};

// Whether every slice of t along `axis` equals slice 0 (bytes; numeric and bool dtypes only).
bool uniform_along(const Tensor& t, size_t axis) {
  if (t.dtype() == DType::kString || axis >= t.dims().size()) return false;
  size_t outer = 1, inner = dtype_size(t.dtype());
  for (size_t i = 0; i < axis; ++i) outer *= size_t(t.dims()[i]);
  for (size_t i = axis + 1; i < t.dims().size(); ++i) inner *= size_t(t.dims()[i]);
  const size_t n = size_t(t.dims()[axis]);
  if (n == 0) return false;
  const auto* p = static_cast<const unsigned char*>(t.raw());
  for (size_t o = 0; o < outer; ++o) {
    const unsigned char* first = p + o * n * inner;
    for (size_t k = 1; k < n; ++k) {
      if (std::memcmp(first, first + k * inner, inner) != 0) return false;
    }
  }
  return true;
}

Expected<Tensor> slice0(const Tensor& t, size_t axis) {
  std::vector<int64_t> dims = t.dims();
  const size_t n = size_t(dims[axis]);
  dims[axis] = 1;
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::create(t.dtype(), dims));
  size_t outer = 1, inner = dtype_size(t.dtype());
  for (size_t i = 0; i < axis; ++i) outer *= size_t(dims[i]);
  for (size_t i = axis + 1; i < dims.size(); ++i) inner *= size_t(dims[i]);
  const auto* src = static_cast<const unsigned char*>(t.raw());
  auto* dst = static_cast<unsigned char*>(out.raw());
  for (size_t o = 0; o < outer; ++o) std::memcpy(dst + o * inner, src + o * n * inner, inner);
  return out;
}

// v, as read by `reader` (input `input`), is the same along the axis `from_end` dims from its last
// (1: last dim): true when it has size 1 there or no such dim, or is a constant uniform along it
// (a cut), or comes from a chain of such nodes read only by `reader`.
bool invariant(const UseMap& u, Value* v, size_t from_end, Node* reader, size_t input, Plan& plan) {
  if (!v || !v->type.has_rank()) return false;
  const auto& dims = v->type.shape->dims;
  if (dims.size() < from_end) return true;
  const size_t axis = dims.size() - from_end;
  if (dims[axis].is_static() && dims[axis].value() == 1) return true;
  if (const Tensor* c = constant_of(u.graph(), v)) {
    if (!uniform_along(*c, axis)) return false;
    plan.cuts.push_back({reader, input, axis});
    return true;
  }
  Node* p = v->producer;
  if (!p || p->owner != &u.graph() || !broadcasting_elementwise(p->op) || p->outputs.size() != 1 ||
      u.num_uses(v) != 1 || u.is_output(v) || !dims[axis].is_static()) {
    return false;
  }
  for (size_t i = 0; i < p->inputs.size(); ++i) {
    if (!invariant(u, p->inputs[i], from_end, p, i, plan)) return false;
  }
  plan.chain.push_back(p);
  return true;
}

// The narrowing of an Attention mask m, when m qualifies (see the header).
std::optional<Plan> plan_for(const UseMap& u, Value* m) {
  if (!m || !m->type.has_rank() || m->type.shape->dims.size() < 2 || u.is_output(m)) return std::nullopt;
  const Dim& q = m->type.shape->dims[m->type.shape->dims.size() - 2];
  if (!q.is_static() || q.value() <= 1) return std::nullopt;
  for (const Use& use : u.uses(m)) {
    if (use.body || !use.node || use.node->op != OpKind::kAttention || use.input != 3) return std::nullopt;
  }
  Node* p = m->producer;
  if (!p || p->owner != &u.graph() || !broadcasting_elementwise(p->op) || p->outputs.size() != 1) return std::nullopt;
  Plan plan;
  for (size_t i = 0; i < p->inputs.size(); ++i) {
    if (!invariant(u, p->inputs[i], 2, p, i, plan)) return std::nullopt;
  }
  plan.chain.push_back(p);
  return plan;
}

}  // namespace

Expected<bool> narrow_masks(Graph& g) {
  UseMap uses(g);
  std::vector<Value*> masks;
  for (const auto& n : g.nodes) {
    if (n->op != OpKind::kAttention || !n->has_input(3)) continue;
    Value* m = n->inputs[3];
    if (std::find(masks.begin(), masks.end(), m) == masks.end()) masks.push_back(m);
  }
  bool changed = false;
  std::vector<Value*> old_consts;
  for (Value* m : masks) {
    std::optional<Plan> plan = plan_for(uses, m);
    if (!plan) continue;
    for (const ConstCut& c : plan->cuts) {
      Value* old = c.node->inputs[c.input];
      KILN_ASSIGN_OR_RETURN(Tensor t, slice0(*constant_of(g, old), c.axis));
      Value* nv = g.add_constant(g.unique_name(old->name + "_narrow"), std::move(t));
      uses.set_input(c.node, c.input, nv);
      old_consts.push_back(old);
    }
    for (Node* n : plan->chain) {
      auto& dims = n->outputs[0]->type.shape->dims;
      dims[dims.size() - 2] = Dim(1);
    }
    changed = true;
  }
  if (changed) erase_unused_constants(uses, old_consts);
  return changed;
}

}  // namespace kiln
