// inline-if: an If whose condition is known at build time is replaced by the branch it takes, its
// nodes moved into the enclosing graph. Exporters write Ifs on conditions computed from shapes
// (`if x.size(1) > max_len`, `if x.dim() == 4`) that fold-constants makes constant; a backend then
// sees the branch's nodes like any others (the GPU lowers them instead of running the If on the
// host), and the passes after this one fuse across the former branch boundary.
//
//   Before:  %c = const dense<bool[]> [1]
//            %y = If(%c) {then_branch = graph t() { %a = Abs(%x) : f32[2]  return %a },
//                         else_branch = graph e() { return %x }} : f32[2]
//   After:   %a = Abs(%x) : f32[2]
//            (readers of %y read %a)
//
// Branch constants become constants of the graph; values the branch reads from enclosing scopes
// stay as they are. An If output that is a graph output keeps its name (an Identity when the
// branch returns a value that cannot take it). Left alone: conditions not known at build time, and
// branches holding subgraphs of their own (their outer-scope reads would need rewriting too).
// Runs after fold-constants (which makes the conditions constant) and folds what it inlined.
#include <map>

#include "passes/fold_constants.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

// The branch an If with a constant condition takes, or null.
const Graph* taken_branch(const Graph& g, const Node& n) {
  if (n.op != OpKind::kIf || !n.has_input(0)) return nullptr;
  const Tensor* c = constant_of(g, n.inputs[0]);
  if (!c || c->numel() != 1) return nullptr;
  const Graph* b = n.attr_graph(c->as_double(0) != 0 ? "then_branch" : "else_branch");
  if (!b || b->outputs.size() != n.outputs.size()) return nullptr;
  for (const auto& bn : b->nodes) {
    if (has_subgraph(*bn)) return nullptr;
  }
  return b;
}

// Moves branch b's nodes into g (after everything; the caller sorts) and makes If node n's readers
// read the branch's results.
void inline_branch(Graph& g, UseMap& uses, Node& n, const Graph& b) {
  std::map<const Value*, Value*> moved;
  for (const auto& v : b.values) {
    if (v->constant && !v->producer) moved[v.get()] = g.add_constant(g.unique_name(v->name), *v->constant);
  }
  auto map = [&](Value* v) -> Value* {
    auto it = moved.find(v);
    return it == moved.end() ? v : it->second;
  };
  for (const auto& bn : b.nodes) {
    std::vector<Value*> ins;
    for (Value* v : bn->inputs) ins.push_back(v ? map(v) : nullptr);
    Node* c = g.add_node(bn->op, std::move(ins), int(bn->outputs.size()), bn->name);
    c->attrs = bn->attrs;
    for (size_t i = 0; i < bn->outputs.size(); ++i) {
      if (!bn->outputs[i]) {
        c->outputs[i] = nullptr;  // an omitted optional output
        continue;
      }
      g.rename_value(c->outputs[i], g.unique_name(bn->outputs[i]->name));
      c->outputs[i]->type = bn->outputs[i]->type;
      moved[bn->outputs[i]] = c->outputs[i];
    }
    uses.add_node(c);
  }
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    Value* out = n.outputs[i];
    if (!out || uses.unused(out)) continue;
    Value* r = map(b.outputs[i]);
    if (!uses.can_forward(out, r)) {
      // A graph output whose name the branch's value cannot take: an Identity carries it.
      Node* id = g.add_node(OpKind::kIdentity, {r}, 1, g.unique_name(out->name + "_branch"));
      id->outputs[0]->type = out->type;
      uses.add_node(id);
      r = id->outputs[0];
    }
    uses.forward(out, r);
  }
}

}  // namespace

Expected<bool> inline_if(Graph& g) {
  bool changed = false;
  UseMap uses(g);
  std::vector<Node*> ifs;
  for (const auto& n : g.nodes) {
    if (taken_branch(g, *n)) ifs.push_back(n.get());
  }
  for (Node* n : ifs) {
    inline_branch(g, uses, *n, *taken_branch(g, *n));
    changed = true;
  }
  if (!changed) return false;
  erase_unused(uses, ifs);
  KILN_RETURN_IF_ERROR(g.topo_sort());
  // The inlined nodes may compute from constants (a branch's shape arithmetic).
  KILN_RETURN_IF_ERROR(fold_constants(g).status());
  return true;
}

}  // namespace kiln
