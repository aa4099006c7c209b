// The cut of a graph at the nodes that open shapes (staged_split.h).
#include "api/staged_split.h"

#include <algorithm>
#include <map>
#include <set>

#include "runtime/engine_file.h"
#include "runtime/plan.h"

namespace kiln {

namespace {

bool open_shape(const Value* v) {
  return v && !v->constant && v->type.is_tensor() && !(v->type.shape && v->type.shape->is_static());
}

enum Stage { kBefore = 0, kHost = 1, kAfter = 2 };

// A copy of g with only the nodes whose stage is `keep`: `ins` become its inputs (a value produced
// by a node left out is now fed by the caller), `outs` its outputs; values nothing left reads are
// dropped (weights of other stages included).
Expected<std::unique_ptr<Graph>> extract(const Graph& g, const std::vector<Stage>& stage, Stage keep,
                                         const std::vector<const Value*>& ins, const std::vector<const Value*>& outs) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> c, clone_graph(g));
  if (c->nodes.size() != g.nodes.size()) return KILN_ERROR(kInternal, "staged split: the graph's copy lost nodes");
  auto find = [&](const Value* v) -> Expected<Value*> {
    Value* x = c->lookup(v->name);
    if (!x || x->owner != c.get()) return KILN_ERROR(kInternal, "staged split: value '{}' is missing from the copy", v->name);
    return x;
  };
  c->inputs.clear();
  for (const Value* v : ins) {
    KILN_ASSIGN_OR_RETURN(Value * x, find(v));
    x->producer = nullptr;
    x->producer_output = 0;
    c->inputs.push_back(x);
  }
  c->outputs.clear();
  for (const Value* v : outs) {
    KILN_ASSIGN_OR_RETURN(Value * x, find(v));
    c->outputs.push_back(x);
  }
  std::vector<std::unique_ptr<Node>> kept;
  for (size_t i = 0; i < c->nodes.size(); ++i) {
    if (stage[i] == keep) kept.push_back(std::move(c->nodes[i]));
  }
  c->nodes = std::move(kept);
  std::set<const Value*> live(c->inputs.begin(), c->inputs.end());
  live.insert(c->outputs.begin(), c->outputs.end());
  std::vector<const Value*> reads;
  for (const auto& n : c->nodes) {
    for (const Value* o : n->outputs) live.insert(o);
    values_read(*c, *n, reads);
  }
  live.insert(reads.begin(), reads.end());
  std::set<const Value*> dead;
  for (const auto& v : c->values) {
    if (!live.count(v.get())) dead.insert(v.get());
  }
  c->erase_values(dead);
  c->absorbed.clear();  // the passes' provenance names nodes of every stage
  return c;
}

// Appends v to `list` once.
void add_once(std::vector<const Value*>& list, std::set<const Value*>& seen, const Value* v) {
  if (seen.insert(v).second) list.push_back(v);
}

}  // namespace

bool has_open_shapes(const Graph& g) {
  for (const auto& v : g.values) {
    if (open_shape(v.get())) return true;
  }
  return false;
}

Expected<StagedSplit> split_at_open_shapes(const Graph& g) {
  for (const Value* v : g.inputs) {
    if (open_shape(v)) {
      return KILN_ERROR(kUnsupported, "input '{}' has shape {}: a staged engine needs fixed input shapes", v->name,
                        v->type.to_string());
    }
  }
  // In order: a node reading a value of the host nodes or after is after; else one with an open
  // output opens a shape (host); else it comes before.
  std::vector<Stage> stage(g.nodes.size(), kBefore);
  std::set<const Value*> opened;  // produced by host or after nodes
  std::vector<std::vector<const Value*>> reads(g.nodes.size());
  StagedSplit out;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = *g.nodes[i];
    values_read(g, n, reads[i]);
    bool depends = false;
    for (const Value* v : reads[i]) depends = depends || opened.count(v);
    bool opens = false;
    for (const Value* v : n.outputs) opens = opens || open_shape(v);
    stage[i] = depends ? kAfter : opens ? kHost : kBefore;
    if (stage[i] == kHost) out.host_nodes.push_back(n.describe());
    if (stage[i] != kBefore) {
      for (const Value* v : n.outputs) {
        if (v) opened.insert(v);
      }
    }
  }
  if (out.host_nodes.empty()) return KILN_ERROR(kInternal, "staged split: no node opens a shape");

  std::map<const Value*, Stage> made_in;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const Value* v : g.nodes[i]->outputs) {
      if (v) made_in[v] = stage[i];
    }
  }
  auto stage_of = [&](const Value* v) { return made_in.count(v) ? made_in.at(v) : kBefore; };
  // The nodes after the cut run only when the caller reads something they make (else the passes
  // left them as dead code): what only they read is then nobody's output.
  bool after_kept = false;
  for (const Value* v : g.outputs) after_kept = after_kept || (v && !v->constant && v->producer && stage_of(v) == kAfter);
  // Per stage: the non-constant values its nodes read from elsewhere (its inputs), and the values
  // it makes that a later stage or the caller reads (its outputs), in the graph's order.
  std::vector<const Value*> ins[3], outs[3];
  std::set<const Value*> in_seen[3], out_seen[3];
  for (const Value* v : g.inputs) {  // the graph's inputs first, in their order
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      if (stage[i] == kAfter && !after_kept) continue;
      if (std::find(reads[i].begin(), reads[i].end(), v) != reads[i].end()) add_once(ins[stage[i]], in_seen[stage[i]], v);
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (stage[i] == kAfter && !after_kept) continue;
    for (const Value* v : reads[i]) {
      if (v->constant || !v->producer) continue;  // weights stay with every stage that reads them
      const Stage from = stage_of(v);
      if (from == stage[i]) continue;
      add_once(ins[stage[i]], in_seen[stage[i]], v);
      add_once(outs[from], out_seen[from], v);
    }
  }
  for (const Value* v : g.outputs) {
    if (v && !v->constant && v->producer) add_once(outs[stage_of(v)], out_seen[stage_of(v)], v);
  }
  for (const Value* v : ins[kAfter]) {
    if (!v->type.is_tensor()) {
      return KILN_ERROR(kUnsupported, "value '{}' ({}) crosses into the nodes after a data-dependent shape: only tensors "
                        "can", v->name, v->type.to_string());
    }
  }
  bool any[3] = {false, false, false};
  for (Stage s : stage) any[s] = true;
  if (any[kBefore] && !outs[kBefore].empty()) {
    KILN_ASSIGN_OR_RETURN(out.before, extract(g, stage, kBefore, ins[kBefore], outs[kBefore]));
  }
  KILN_ASSIGN_OR_RETURN(out.host, extract(g, stage, kHost, ins[kHost], outs[kHost]));
  if (after_kept) {
    KILN_ASSIGN_OR_RETURN(out.after, extract(g, stage, kAfter, ins[kAfter], outs[kAfter]));
  }
  return out;
}

}  // namespace kiln
