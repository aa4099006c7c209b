// einsum-as-matmul: an Einsum of one or two operands without repeated letters becomes views, sums
// and at most one (batched) matrix product: Transpose -> Reshape -> MatMul -> Reshape -> Transpose,
// so it runs as one GEMM wherever MatMul does (cuBLASLt on the GPU) and the views around it are
// free or one copy.
//
//   Before:  %s = Einsum(%q, %k) {equation = "bhid,bhjd->bhij"} : f32[2,4,8,16]
//   After:   %k_t = Transpose(%k) {perm = [0, 1, 3, 2]} : f32[2,4,16,8]
//            %q_r = Reshape(%q, [8,8,16]); %k_r = Reshape(%k_t, [8,16,8])
//            %p = MatMul(%q_r, %k_r) : f32[8,8,8]
//            %s = Reshape(%p, [2,4,8,8]) : f32[2,4,8,8]
//
// Each letter is a batch index (in both operands and the output), a contracted one (both operands,
// not the output), a free one of one operand (and the output), or one summed within one operand
// alone, which a ReduceSum removes first. The operands are permuted to [batch, free, contracted]
// and [batch, contracted, free], flattened to 3-D, multiplied, and the product reshaped and
// permuted to the output's order; one operand is summed and permuted. The implicit form ("ij,jk",
// no "->") has the letters that occur once, in alphabetical order, as its output. Preconditions,
// all checked: no "...", float operands of static shape, no letter repeated within an operand
// (a diagonal), equal sizes for a shared letter; other Einsums are left alone.
#include <algorithm>
#include <map>
#include <numeric>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

struct Spec {
  std::vector<std::string> in;
  std::string out;
};

std::optional<Spec> parse(std::string eq, size_t operands) {
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  if (eq.find("...") != std::string::npos) return std::nullopt;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  Spec s;
  for (size_t at = 0;;) {
    const size_t comma = lhs.find(',', at);
    s.in.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (s.in.size() != operands) return std::nullopt;
  if (arrow != std::string::npos) {
    s.out = eq.substr(arrow + 2);
  } else {  // implicit: the letters that occur once, sorted
    for (char c = 'A'; c <= 'z'; ++c) {
      size_t count = 0;
      for (const std::string& t : s.in) count += size_t(std::count(t.begin(), t.end(), c));
      if (count == 1 && std::isalpha(static_cast<unsigned char>(c))) s.out += c;
    }
  }
  std::vector<const std::string*> terms;
  for (const std::string& t : s.in) terms.push_back(&t);
  terms.push_back(&s.out);
  for (const std::string* t : terms) {
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
    const size_t k = n->inputs.size();
    if (k < 1 || k > 2 || !n->inputs[0] || (k == 2 && !n->inputs[1])) continue;
    auto spec = parse(n->attr_string("equation", ""), k);
    if (!spec) continue;
    Value* y = n->outputs[0];
    bool ok = true;
    std::vector<const Value*> vals(n->inputs.begin(), n->inputs.end());
    vals.push_back(y);
    for (const Value* v : vals) {
      ok = ok && v->type.is_tensor() && v->type.has_rank() && v->type.shape->is_static() && dtype_is_float(v->type.dtype);
    }
    for (size_t i = 0; ok && i < k; ++i) ok = n->inputs[i]->type.shape->rank() == spec->in[i].size();
    if (!ok || y->type.shape->rank() != spec->out.size()) continue;
    // Every letter's size; a letter whose sizes disagree (a broadcast size-1 dim) leaves the node alone.
    std::map<char, int64_t> size_of;
    for (size_t i = 0; i < k; ++i) {
      const std::vector<int64_t> d = dims_of(n->inputs[i]);
      for (size_t j = 0; j < d.size(); ++j) {
        auto [it, fresh] = size_of.emplace(spec->in[i][j], d[j]);
        ok = ok && (fresh || it->second == d[j]);
      }
    }
    for (char c : spec->out) ok = ok && size_of.count(c) != 0;
    if (!ok) continue;
    const std::string base = n->name.empty() ? "einsum" : n->name;
    auto sizes = [&](const std::string& s) {
      std::vector<int64_t> v;
      for (char c : s) v.push_back(size_of[c]);
      return v;
    };
    auto typed = [&](Node* m, DType dt, const std::string& letters, const std::string& name) {
      m->outputs[0]->type = Type::tensor(dt, Shape::of(sizes(letters)));
      m->outputs[0]->name = g.unique_name(name);
      uses.add_node(m);
      return m->outputs[0];
    };
    // Permute an operand to the given letter order (a Transpose only when it moves something).
    auto permuted = [&](Value* v, const std::string& have, const std::string& want, const std::string& tag) {
      std::vector<int64_t> perm;
      for (char c : want) perm.push_back(int64_t(have.find(c)));
      std::vector<int64_t> id(perm.size());
      std::iota(id.begin(), id.end(), 0);
      if (perm == id) return v;
      Node* t = g.add_node(OpKind::kTranspose, {v}, 1, g.unique_name(base + "_" + tag + "_t"));
      t->attrs["perm"] = Attribute::of_ints(perm);
      return typed(t, v->type.dtype, want, v->name + "_t");
    };
    auto reshaped = [&](Value* v, const std::vector<int64_t>& dims, const std::string& tag) {
      Node* r = g.add_node(OpKind::kReshape, {v, add_i64_constant(g, base + "_" + tag + "_shape", dims)}, 1,
                           g.unique_name(base + "_" + tag + "_r"));
      r->outputs[0]->type = Type::tensor(v->type.dtype, Shape::of(dims));
      r->outputs[0]->name = g.unique_name(v->name + "_r");
      uses.add_node(r);
      return r->outputs[0];
    };
    // Letters of one operand that neither the output nor the other operand has are summed first.
    auto summed = [&](Value* v, std::string& have, const std::string& other, const std::string& tag) {
      std::vector<int64_t> axes;
      std::string keep;
      for (size_t j = 0; j < have.size(); ++j) {
        if (spec->out.find(have[j]) == std::string::npos && other.find(have[j]) == std::string::npos) {
          axes.push_back(int64_t(j));
        } else {
          keep += have[j];
        }
      }
      if (axes.empty()) return v;
      Node* r = g.add_node(OpKind::kReduceSum, {v, add_i64_constant(g, base + "_" + tag + "_axes", axes)}, 1,
                           g.unique_name(base + "_" + tag + "_sum"));
      r->attrs["keepdims"] = Attribute::of_int(0);
      have = keep;
      return typed(r, v->type.dtype, keep, v->name + "_sum");
    };
    std::string sa = spec->in[0], sb = k == 2 ? spec->in[1] : std::string();
    Value* a = summed(n->inputs[0], sa, sb, "a");
    Value* full = a;
    std::string prod_order = sa;
    if (k == 2) {
      Value* b = summed(n->inputs[1], sb, sa, "b");
      std::string batch, free_a, free_b, contract;
      for (char c : spec->out) {
        const bool in_a = sa.find(c) != std::string::npos, in_b = sb.find(c) != std::string::npos;
        if (in_a && in_b) batch += c;
        else if (in_a) free_a += c;
        else free_b += c;
      }
      for (char c : sa) {
        if (spec->out.find(c) == std::string::npos) contract += c;  // in b too: summed() removed the rest
      }
      const int64_t nb = prod(sizes(batch)), m = prod(sizes(free_a)), kk = prod(sizes(contract)), nn = prod(sizes(free_b));
      Value* a3 = reshaped(permuted(a, sa, batch + free_a + contract, "a"), {nb, m, kk}, "a");
      Value* b3 = reshaped(permuted(b, sb, batch + contract + free_b, "b"), {nb, kk, nn}, "b");
      Node* mm = g.add_node(OpKind::kMatMul, {a3, b3}, 1, n->name.empty() ? g.unique_name(base) : n->name);
      mm->index = n->index;
      mm->outputs[0]->type = Type::tensor(y->type.dtype, Shape::of({nb, m, nn}));
      mm->outputs[0]->name = g.unique_name(y->name + "_mm");
      uses.add_node(mm);
      prod_order = batch + free_a + free_b;
      full = reshaped(mm->outputs[0], sizes(prod_order), "y");
    }
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
