// Where a graph's shapes stop being known before it runs. With every input's shape fixed, a node
// whose output shape comes from the values it reads (NonZero, Unique, NonMaxSuppression, Compress,
// TopK with a computed k, a Reshape or Range or ConstantOfShape of computed values, a Loop's scan
// outputs...) leaves that output's shape open, and so every node after it. The GPU engine lowers
// static shapes only; rather than run the whole model on the CPU, a staged engine
// (api/gpu_staged.cc) cuts the graph there into three graphs:
//
//   before  the nodes that read no open value: static shapes, one GPU plan
//   host    the nodes that open a shape (each reads only values of `before` or the graph's inputs),
//           run on the CPU reference kernels, which size their outputs as they compute them
//   after   everything reading an open value: its inputs' exact shapes are known once `host` ran,
//           so it is planned per exact shape as a dynamic engine's shape plans are (and cut again
//           if it opens shapes of its own)
//
// Each stage graph is a copy of the original's nodes and values (weights shared), with the values
// that cross between stages as its inputs and outputs, under their original names.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "support/status.h"

namespace kiln {

struct StagedSplit {
  std::unique_ptr<Graph> before;  // null when no node before the cut makes a value the rest or the caller reads
  std::unique_ptr<Graph> host;    // never null: at least one node opens a shape
  std::unique_ptr<Graph> after;   // null when the caller reads nothing the nodes after the cut make
  std::vector<std::string> host_nodes;  // Node::describe() of each host node, for reports
};

// Whether a non-constant tensor value of g has a shape not fully known (unknown rank or a dim that
// is not a number).
bool has_open_shapes(const Graph& g);

// The cut described above. g's inputs must have static shapes (kUnsupported otherwise: a graph with
// ranged inputs is a dynamic engine's); a value crossing into `after` that is not a tensor (a
// sequence, an optional) is kUnsupported too, as `after` is planned per tensor shape.
Expected<StagedSplit> split_at_open_shapes(const Graph& g);

}  // namespace kiln
