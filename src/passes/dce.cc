// dce: removes nodes none of whose outputs reach a graph output, then constants nothing reads.
//
//   Before:  graph main(%x: f32[4]) {
//              %c = const dense<f32[4]> [1.0]
//              %a = Relu(%x) : f32[4]
//              %b = Add(%x, %c) : f32[4]        # read by nobody
//              return %a
//            }
//   After:   graph main(%x: f32[4]) {
//              %a = Relu(%x) : f32[4]
//              return %a
//            }
//
// Liveness runs backwards from the graph outputs; a live node makes everything it reads live,
// including values its subgraphs read from this graph. Nodes with side effects (none among the
// standard ONNX ops; see has_side_effects) are always live. Random ops are removed when unread:
// nothing observes their draws. Unused graph inputs stay (they are the model's interface). Nodes
// inside subgraphs are not swept (a body's dead nodes cost only when the body runs).
#include <set>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

// Marks every value read by n or by any node in its subgraphs.
void mark_reads(const Node& n, std::set<const Value*>& live) {
  for (const Value* v : n.inputs) {
    if (v) live.insert(v);
  }
  for (const auto& [k, a] : n.attrs) {
    if (a.g) for (const auto& sn : a.g->nodes) mark_reads(*sn, live);
    for (const auto& sg : a.graphs) for (const auto& sn : sg->nodes) mark_reads(*sn, live);
    // Subgraph outputs may be outer values read directly (`return %y`).
    if (a.g) live.insert(a.g->outputs.begin(), a.g->outputs.end());
    for (const auto& sg : a.graphs) live.insert(sg->outputs.begin(), sg->outputs.end());
  }
}

}  // namespace

Expected<bool> eliminate_dead_code(Graph& g) {
  std::set<const Value*> live(g.outputs.begin(), g.outputs.end());
  std::set<const Node*> dead;
  for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) {
    const Node& n = **it;
    bool needed = has_side_effects(n);
    for (const Value* o : n.outputs) needed = needed || (o && live.count(o));
    if (needed) mark_reads(n, live);
    else dead.insert(&n);
  }
  std::set<const Value*> dead_values;
  for (const auto& v : g.values) {
    if (v->producer ? dead.count(v->producer) > 0 : constant_of(g, v.get()) && !live.count(v.get())) {
      dead_values.insert(v.get());
    }
  }
  if (dead.empty() && dead_values.empty()) return false;
  std::erase_if(g.nodes, [&](const std::unique_ptr<Node>& n) { return dead.count(n.get()) > 0; });
  g.erase_values(dead_values);
  return true;
}

}  // namespace kiln
