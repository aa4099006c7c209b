#include "passes/pass_manager.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <unordered_map>
#include <unordered_set>

#include "ir/text.h"
#include "ir/verifier.h"

namespace kiln {

namespace {

// The top-level nodes before a pass, to find the ones it removed. A node is the same node after
// the pass when its address, name and index are (a new node may reuse a freed address).
struct NodeId {
  std::string name;
  int index;
  OpKind op;
  // Node::describe() of the node as it was (formatted only for the nodes a pass removed).
  std::string describe() const { return fmt::format("node '{}' ({}, #{})", name, op_name(op), index); }
};
using NodeIds = std::unordered_map<const Node*, NodeId>;

NodeIds node_ids(const Graph& g) {
  NodeIds ids;
  ids.reserve(g.nodes.size());
  for (const auto& n : g.nodes) ids.emplace(n.get(), NodeId{n->name, n->index, n->op});
  return ids;
}

// Provenance after pass `pass` ran (Absorbed): records the removals it did not record itself,
// names the pass in those it did, and moves every `into` off the nodes it removed onto where
// their work went in turn (or null).
void track_removals(Graph& g, const NodeIds& before, size_t first_new, const std::string& pass) {
  std::unordered_set<const Node*> alive;  // every node now in the graph
  for (const auto& n : g.nodes) alive.insert(n.get());
  std::unordered_map<std::string, size_t> noted;  // describe() -> record, for this pass's records
  for (size_t i = first_new; i < g.absorbed.size(); ++i) {
    if (g.absorbed[i].pass.empty()) g.absorbed[i].pass = pass;
    noted[g.absorbed[i].node] = i;
  }
  std::unordered_map<const Node*, const Node*> moved;  // removed node -> where its work went
  for (const auto& [n, id] : before) {
    bool same = alive.count(n) && n->name == id.name && n->index == id.index;
    if (same) continue;
    const std::string what = id.describe();
    auto it = noted.find(what);
    if (it == noted.end()) {
      g.absorbed.push_back({what, nullptr, pass});
      moved[n] = nullptr;
    } else {
      moved[n] = g.absorbed[it->second].into;
    }
  }
  for (size_t i = 0; i < g.absorbed.size(); ++i) {
    Absorbed& a = g.absorbed[i];
    // Records from earlier passes point at nodes that were live then: follow this pass's
    // removals. This pass's records point at nodes it chose: only a node it also removed moves.
    auto gone = [&](const Node* n) { return i < first_new ? moved.count(n) > 0 : !alive.count(n); };
    for (int hops = 0; a.into && gone(a.into) && hops < 64; ++hops) {
      auto it = moved.find(a.into);
      a.into = it == moved.end() ? nullptr : it->second;
    }
    if (a.into && !alive.count(a.into)) a.into = nullptr;
  }
}

std::string pass_names(const std::vector<Pass>& passes) {
  std::string s;
  for (const Pass& p : passes) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

bool default_verify() {
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

}  // namespace

Status check_pass_options(const std::vector<Pass>& passes, const PassOptions& opt) {
  auto known = [&](const std::string& n) {
    return std::any_of(passes.begin(), passes.end(), [&](const Pass& p) { return p.name == n; });
  };
  for (const std::string& d : opt.disabled) {
    if (!known(d)) return KILN_ERROR(kInvalidArgument, "unknown pass '{}' to disable (passes: {})", d, pass_names(passes));
  }
  if (!opt.dump_ir_after.empty() && opt.dump_ir_after != "all" && !known(opt.dump_ir_after)) {
    return KILN_ERROR(kInvalidArgument, "unknown pass '{}' to dump IR after (passes: {}, or all)", opt.dump_ir_after,
                      pass_names(passes));
  }
  return Status::ok();
}

Expected<PassReport> run_passes(Graph& g, const std::vector<Pass>& passes, const PassOptions& opt) {
  KILN_RETURN_IF_ERROR(check_pass_options(passes, opt));
  const bool verify = opt.verify.value_or(default_verify());
  std::ostream& dump = opt.dump_to ? *opt.dump_to : std::cerr;
  if (verify) KILN_RETURN_IF_ERROR(verify_graph(g).with_context("the graph given to the pass pipeline is invalid"));
  PassReport report;
  for (const Pass& p : passes) {
    PassRecord r;
    r.name = p.name;
    r.nodes_before = r.nodes_after = g.nodes.size();
    if (std::find(opt.disabled.begin(), opt.disabled.end(), p.name) != opt.disabled.end()) {
      r.skipped = true;
      report.passes.push_back(r);
      continue;
    }
    const NodeIds before = opt.track_provenance ? node_ids(g) : NodeIds{};
    const size_t first_new = g.absorbed.size();
    auto t0 = std::chrono::steady_clock::now();
    Expected<bool> changed = p.run(g);
    r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!changed) return changed.status().with_context(fmt::format("pass '{}'", p.name));
    if (opt.track_provenance) {
      track_removals(g, before, first_new, p.name);
    } else {
      g.absorbed.clear();  // the passes' own records point at nodes later passes may free
    }
    r.changed = *changed;
    r.nodes_after = g.nodes.size();
    report.total_ms += r.ms;
    report.passes.push_back(r);
    if (verify) {
      if (Status s = verify_graph(g); !s) {
        return KILN_ERROR(kInternal, "pass '{}' left an invalid graph: {}", p.name, s.message());
      }
    }
    if (opt.dump_ir_after == "all" || opt.dump_ir_after == p.name) {
      // Weights elided: a dump is for reading the graph's structure.
      PrintOptions po;
      po.elide_large_tensors = true;
      dump << "// IR after " << p.name << (r.changed ? "" : " (unchanged)") << "\n" << print_graph(g, po) << std::flush;
    }
  }
  return report;
}

std::string PassReport::to_text() const {
  size_t w = 4;
  for (const PassRecord& r : passes) w = std::max(w, r.name.size());
  std::string s = fmt::format("{:<{}}  {:>9}  {:>7}  {:>7}  {}\n", "pass", w, "ms", "nodes", "after", "changed");
  for (const PassRecord& r : passes) {
    if (r.skipped) {
      s += fmt::format("{:<{}}  {:>9}  {:>7}  {:>7}  {}\n", r.name, w, "-", r.nodes_before, "-", "disabled");
      continue;
    }
    s += fmt::format("{:<{}}  {:>9.3f}  {:>7}  {:>7}  {}\n", r.name, w, r.ms, r.nodes_before, r.nodes_after,
                     r.changed ? "yes" : "no");
  }
  s += fmt::format("{:<{}}  {:>9.3f}\n", "total", w, total_ms);
  return s;
}

}  // namespace kiln
