// cse: merges nodes that compute the same thing, and identical small constants, so that the
// duplicated Shape -> Gather -> Unsqueeze chains exporters emit per use collapse into one.
//
//   Before:  %s1 = Shape(%x) : i64[2]
//            %s2 = Shape(%x) : i64[2]
//            %c1 = const dense<i64[1]> [0]
//            %c2 = const dense<i64[1]> [0]
//            %g1 = Gather(%s1, %c1) : i64[1]
//            %g2 = Gather(%s2, %c2) : i64[1]
//            %y = Concat(%g1, %g2) {axis = 0} : i64[2]
//   After:   %s1 = Shape(%x) : i64[2]
//            %c1 = const dense<i64[1]> [0]
//            %g1 = Gather(%s1, %c1) : i64[1]
//            %y = Concat(%g1, %g1) {axis = 0} : i64[2]
//
// Two nodes are the same when they have the same op, the same inputs (the same Values, after the
// merges made so far: one walk in topological order merges whole chains) and equal attributes.
// Never merged: random ops and Dropout (each draw differs), nodes with subgraphs (bodies are not
// compared). Constants merge when dtype, dims and bytes agree and they hold at most
// kMaxConstantElements elements (comparing weights would cost more than it saves). The first of
// the duplicates survives, keeping its name; a duplicate whose output is a graph output is kept
// when the survivor cannot take over that name (see UseMap::can_forward).
#include <map>
#include <set>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

constexpr int64_t kMaxConstantElements = 4096;

bool mergeable(const Node& n) { return !is_random_op(n.op) && n.op != OpKind::kDropout && !has_subgraph(n); }

// Forwards every output of dup to the matching output of keep, if all of them can be.
bool merge_into(UseMap& uses, Node& dup, Node& keep) {
  if (dup.outputs.size() != keep.outputs.size()) return false;
  for (size_t i = 0; i < dup.outputs.size(); ++i) {
    if (!dup.outputs[i]) continue;
    if (!keep.outputs[i] || !(keep.outputs[i]->type == dup.outputs[i]->type)) return false;
    if (!uses.can_forward(dup.outputs[i], keep.outputs[i])) return false;
  }
  for (size_t i = 0; i < dup.outputs.size(); ++i) {
    if (dup.outputs[i]) uses.forward(dup.outputs[i], keep.outputs[i]);
  }
  uses.graph().note_absorbed(dup, keep);
  return true;
}

bool merge_constants(Graph& g, UseMap& uses) {
  std::set<const Value*> merged;
  std::map<std::pair<DType, std::vector<int64_t>>, std::vector<Value*>> seen;
  for (const auto& vp : g.values) {
    Value* v = vp.get();
    const Tensor* t = constant_of(g, v);
    if (!t || t->numel() > kMaxConstantElements || t->dtype() == DType::kString) continue;
    auto& same_shape = seen[{t->dtype(), t->dims()}];
    Value* keep = nullptr;
    for (Value* c : same_shape) {
      if (c->type == v->type && same_tensor(*c->constant, *t)) { keep = c; break; }
    }
    if (keep && uses.can_forward(v, keep)) {
      uses.forward(v, keep);
      merged.insert(v);
    } else if (!keep) {
      same_shape.push_back(v);
    }
  }
  g.erase_values(merged);
  return !merged.empty();
}

}  // namespace

Expected<bool> eliminate_common_subexpressions(Graph& g) {
  UseMap uses(g);
  bool changed = merge_constants(g, uses);
  std::map<std::pair<OpKind, std::vector<const Value*>>, std::vector<Node*>> seen;
  std::vector<Node*> merged;
  for (const auto& np : g.nodes) {
    Node& n = *np;
    if (!mergeable(n)) continue;
    auto& candidates = seen[{n.op, std::vector<const Value*>(n.inputs.begin(), n.inputs.end())}];
    bool done = false;
    for (Node* keep : candidates) {
      if (same_attrs(*keep, n) && merge_into(uses, n, *keep)) {
        merged.push_back(&n);
        done = true;
        break;
      }
    }
    if (!done) candidates.push_back(&n);
  }
  changed = erase_unused(uses, merged) > 0 || changed;
  return changed;
}

}  // namespace kiln
