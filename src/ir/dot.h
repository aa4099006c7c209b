// Graphviz export of a Graph, for looking at a model or a pass's result:
//
//   std::ofstream f("model.dot");
//   KILN_RETURN_IF_ERROR(write_dot(*model.graph, f));   // then: dot -Tsvg model.dot -o model.svg
//
// Nodes are boxes labeled with the op and node name; graph inputs are ellipses, constants notes,
// graph outputs double ellipses. Edges carry the value's name and type. Subgraphs (If/Loop/Scan
// bodies) are clusters; a dashed edge ties each cluster to the node that holds it, and reads of
// enclosing values cross into the cluster.
#pragma once

#include <ostream>

#include "ir/graph.h"
#include "support/status.h"

namespace kiln {

// kIo if the stream fails.
Status write_dot(const Graph& g, std::ostream& os);

}  // namespace kiln
