// Compiled with KILN_HAVE_CUDA only (the CUDA backend's profile is what it reads).
#ifdef KILN_HAVE_CUDA
#include "api/step_times.h"

#include <map>
#include <set>

#include "runtime/node_cost.h"
#include "runtime/placement.h"

namespace kiln {

std::vector<StepTime> step_times(std::vector<cuda::Session::ProfiledStep> steps, const Graph& g,
                                 const cuda::BuildReport& report) {
  const size_t float_bytes = steps.empty() ? 4 : steps.front().float_bytes;
  std::map<std::string, const Node*> by_name;
  for (const auto& n : g.nodes) by_name.emplace(n->describe(), n.get());
  // Each node with steps runs with the nodes the lowering fused into it: their work is one group's.
  std::map<std::string, std::vector<const Node*>> group;
  for (const auto& [name, n] : by_name) group[name].push_back(n);
  for (const NodePlacement& p : report.nodes) {
    const std::optional<std::string> into = fused_into(p);
    auto it = by_name.find(p.node);
    if (into && it != by_name.end() && by_name.count(*into)) group[*into].push_back(it->second);
  }
  std::vector<StepTime> out;
  std::set<std::string> counted;
  for (cuda::Session::ProfiledStep& s : steps) {
    StepTime t;
    t.step = std::move(s.label);
    t.ms = s.ms;
    t.node = std::move(s.node);
    if (auto it = by_name.find(t.node); it != by_name.end()) {
      t.op = std::string(op_name(it->second->op));
      if (counted.insert(t.node).second) {
        const NodeCost c = group_cost(group[t.node], g, float_bytes);
        t.flops = c.flops;
        t.bytes = c.bytes;
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace kiln
#endif  // KILN_HAVE_CUDA
