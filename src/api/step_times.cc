// Compiled with KILN_HAVE_CUDA only (the CUDA backend's profile is what it reads).
#ifdef KILN_HAVE_CUDA
#include "api/step_times.h"

#include <algorithm>
#include <map>
#include <set>

#include "runtime/node_cost.h"
#include "runtime/placement.h"

namespace kiln {

std::vector<StepTime> step_times(std::vector<cuda::Session::ProfiledStep> steps, const Graph& g,
                                 const cuda::BuildReport& report) {
  const size_t float_bytes = steps.empty() ? 4 : steps.front().float_bytes;
  // Steps, report rows and fused targets meet by position: rows [0, N) of the report are g's nodes
  // in order (place_nodes), named as they were at build; a loaded engine's graph numbers its nodes
  // anew, so their describe() strings need not match the steps' any more.
  const size_t N = g.nodes.size();
  const size_t rows = std::min(N, report.nodes.size());
  std::map<std::string, size_t> row_of;
  for (size_t i = 0; i < rows; ++i) row_of.emplace(report.nodes[i].node, i);
  // Each node with steps runs with the nodes the lowering fused into it: their work is one group's.
  std::vector<std::vector<const Node*>> group(N);
  for (size_t i = 0; i < N; ++i) group[i].push_back(g.nodes[i].get());
  for (size_t i = 0; i < rows; ++i) {
    const std::optional<std::string> into = fused_into(report.nodes[i]);
    auto it = into ? row_of.find(*into) : row_of.end();
    if (it != row_of.end() && it->second != i) group[it->second].push_back(g.nodes[i].get());
  }
  const ValueReaders readers = value_readers(g);
  std::vector<StepTime> out;
  std::set<size_t> counted;
  for (cuda::Session::ProfiledStep& s : steps) {
    StepTime t;
    t.step = std::move(s.label);
    t.ms = s.ms;
    t.node = std::move(s.node);
    if (s.node_index >= 0 && size_t(s.node_index) < N) {
      const size_t i = size_t(s.node_index);
      t.op = std::string(op_name(g.nodes[i]->op));
      if (counted.insert(i).second) {
        const NodeCost c = group_cost(group[i], readers, float_bytes);
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
