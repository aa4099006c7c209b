// einsum-as-matmul: a two-operand Einsum that is a (batched) matrix product becomes Transpose ->
// Reshape -> MatMul -> Reshape -> Transpose, so it runs as one GEMM wherever MatMul does (cuBLASLt
// on the GPU) and the views around it are free or one copy.
//
//   Before:  %s = Einsum(%q, %k) {equation = "bhid,bhjd->bhij"} : f32[2,4,8,16]
//   After:   %k_t = Transpose(%k) {perm = [0, 1, 3, 2]} : f32[2,4,16,8]
//            %q_r = Reshape(%q, [8,8,16]); %k_r = Reshape(%k_t, [8,16,8])
//            %p = MatMul(%q_r, %k_r) : f32[8,8,8]
//            %s = Reshape(%p, [2,4,8,8]) : f32[2,4,8,8]
//
// Each letter is a batch index (in both operands and the output), a contracted one (both operands,
// not the output), or a free one of one operand (and the output). The operands are permuted to
// [batch, free, contracted] and [batch, contracted, free], flattened to 3-D, multiplied, and the
// product reshaped and permuted to the output's order. Preconditions, all checked: an explicit
// "->" equation without "...", two float operands of static shape, no letter repeated within an
// operand and none summed away from one operand alone; other Einsums are left alone.
#include <algorithm>
#include <numeric>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

struct Spec {
  std::string a, b, out;
};

std::optional<Spec> parse(std::string eq) {
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  const size_t arrow = eq.find("->"), comma = eq.find(',');
  if (arrow == std::string::npos || comma == std::string::npos || comma > arrow || eq.find("...") != std::string::npos) {
    return std::nullopt;
  }
  Spec s{eq.substr(0, comma), eq.substr(comma + 1, arrow - comma - 1), eq.substr(arrow + 2)};
  for (const std::string* t : {&s.a, &s.b, &s.out}) {
    for (char c : *t) {
      if (!std::isalpha(static_cast<unsigned char>(c)) || std::count(t->begin(), t->end(), c) != 1) return std::nullopt;
    }
  }
  return s;
}

std::vector<int64_t> dims_of(const Value* v) { return *v->type.shape->static_dims(); }

int64_t prod(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{1}, std::multiplies<>()); }

}  // namespace

Expected<bool> einsum_as_matmul(Graph& g) {
  UseMap uses(g);
  std::vector<Node*> todo;
  for (const auto& np : g.nodes) {
    if (np->op == OpKind::kEinsum) todo.push_back(np.get());
  }
  bool changed = false;
  for (Node* n : todo) {
    if (n->inputs.size() != 2 || !n->inputs[0] || !n->inputs[1]) continue;
    auto spec = parse(n->attr_string("equation", ""));
    if (!spec) continue;
    Value *a = n->inputs[0], *b = n->inputs[1], *y = n->outputs[0];
    bool ok = true;
    for (const Value* v : std::initializer_list<const Value*>{a, b, y}) {
      ok = ok && v->type.is_tensor() && v->type.has_rank() && v->type.shape->is_static() && dtype_is_float(v->type.dtype);
    }
    if (!ok || a->type.shape->rank() != spec->a.size() || b->type.shape->rank() != spec->b.size() ||
        y->type.shape->rank() != spec->out.size()) {
      continue;
    }
    const std::vector<int64_t> ad = dims_of(a), bd = dims_of(b);
    const std::string base = n->name.empty() ? "einsum" : n->name;
    std::string batch, free_a, free_b, contract;
    for (char c : spec->out) {
      const bool in_a = spec->a.find(c) != std::string::npos, in_b = spec->b.find(c) != std::string::npos;
      if (in_a && in_b) batch += c;
      else if (in_a) free_a += c;
      else if (in_b) free_b += c;
      else ok = false;  // an output letter of no operand
    }
    for (char c : spec->a) {
      if (spec->out.find(c) != std::string::npos) continue;
      if (spec->b.find(c) == std::string::npos) ok = false;  // summed within A alone
      else contract += c;
    }
    for (char c : spec->b) {
      if (spec->out.find(c) == std::string::npos && spec->a.find(c) == std::string::npos) ok = false;
    }
    if (!ok) continue;
    auto size = [&](char c) {
      const size_t i = spec->a.find(c);
      return i != std::string::npos ? ad[i] : bd[spec->b.find(c)];
    };
    bool dims_agree = true;
    for (char c : batch + contract) dims_agree = dims_agree && ad[spec->a.find(c)] == bd[spec->b.find(c)];
    if (!dims_agree) continue;  // broadcasting a size-1 batch dim: left alone
    // Permute an operand to the given letter order (a Transpose only when it moves something).
    auto permuted = [&](Value* v, const std::string& have, const std::string& want, const std::string& tag) {
      std::vector<int64_t> perm, dims;
      for (char c : want) {
        perm.push_back(int64_t(have.find(c)));
        dims.push_back(size(c));
      }
      std::vector<int64_t> id(perm.size());
      std::iota(id.begin(), id.end(), 0);
      if (perm == id) return v;
      Node* t = g.add_node(OpKind::kTranspose, {v}, 1, g.unique_name(base + "_" + tag + "_t"));
      t->attrs["perm"] = Attribute::of_ints(perm);
      t->outputs[0]->type = Type::tensor(v->type.dtype, Shape::of(dims));
      t->outputs[0]->name = g.unique_name(v->name + "_t");
      uses.add_node(t);
      return t->outputs[0];
    };
    auto reshaped = [&](Value* v, const std::vector<int64_t>& dims, const std::string& tag) {
      Node* r = g.add_node(OpKind::kReshape, {v, add_i64_constant(g, base + "_" + tag + "_shape", dims)}, 1,
                           g.unique_name(base + "_" + tag + "_r"));
      r->outputs[0]->type = Type::tensor(v->type.dtype, Shape::of(dims));
      r->outputs[0]->name = g.unique_name(v->name + "_r");
      uses.add_node(r);
      return r->outputs[0];
    };
    auto sizes = [&](const std::string& s) {
      std::vector<int64_t> v;
      for (char c : s) v.push_back(size(c));
      return v;
    };
    const int64_t nb = prod(sizes(batch)), m = prod(sizes(free_a)), kk = prod(sizes(contract)), nn = prod(sizes(free_b));
    Value* a3 = reshaped(permuted(a, spec->a, batch + free_a + contract, "a"), {nb, m, kk}, "a");
    Value* b3 = reshaped(permuted(b, spec->b, batch + contract + free_b, "b"), {nb, kk, nn}, "b");
    Node* mm = g.add_node(OpKind::kMatMul, {a3, b3}, 1, n->name.empty() ? g.unique_name(base) : n->name);
    mm->index = n->index;
    mm->outputs[0]->type = Type::tensor(y->type.dtype, Shape::of({nb, m, nn}));
    mm->outputs[0]->name = g.unique_name(y->name + "_mm");
    uses.add_node(mm);
    const std::string prod_order = batch + free_a + free_b;
    Value* full = reshaped(mm->outputs[0], sizes(prod_order), "y");
    // The original node becomes the final Transpose (or Identity), keeping its output's name.
    std::vector<int64_t> perm;
    for (char c : spec->out) perm.push_back(int64_t(prod_order.find(c)));
    uses.remove_node(n);
    n->attrs.clear();
    n->inputs = {full};
    std::vector<int64_t> id(perm.size());
    std::iota(id.begin(), id.end(), 0);
    if (perm == id) {
      n->op = OpKind::kIdentity;
    } else {
      n->op = OpKind::kTranspose;
      n->attrs["perm"] = Attribute::of_ints(perm);
    }
    n->name = g.unique_name(base + "_out");
    uses.add_node(n);
    changed = true;
  }
  if (changed) KILN_RETURN_IF_ERROR(g.topo_sort());
  return changed;
}

}  // namespace kiln
