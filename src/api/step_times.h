// StepTime rows of a CUDA profile (Session::profile): each step's node and op, and the estimated
// work (runtime/node_cost.h's group_cost) of its node with the nodes the lowering fused into it, on
// the node's first step (its later steps carry the node with no work, so that a sum over steps counts each
// node once).
#pragma once

#include <vector>

#include "backends/cuda/engine.h"
#include "ir/graph.h"
#include "kiln/engine.h"

namespace kiln {

std::vector<StepTime> step_times(std::vector<cuda::Session::ProfiledStep> steps, const Graph& g,
                                 const cuda::BuildReport& report);

}  // namespace kiln
