// Rewrites an imported node from its model's opset to kiln's canonical (newest) form, e.g.
//   ReduceSum-11(x) {axes=[1]}   ->  ReduceSum(x, const [1])
//   Softmax-11(x) {axis=1}       ->  Reshape(Softmax(Flatten(x, 1), -1), Shape(x))
// Rules are a table keyed by op and the opset range they apply to (normalize.cc).
#pragma once

#include "ir/graph.h"

namespace kiln {

// Renames deprecated ops to their replacement before lookup (Upsample -> Resize, Scatter ->
// ScatterElements); returns the op_type unchanged otherwise.
std::string canonical_op_type(const std::string& domain, const std::string& op_type);

// Applies the rules for `original_op` at `opset` to node n (already converted, inputs resolved).
Status normalize_node(Graph& g, Node& n, const std::string& original_op, int64_t opset);

}  // namespace kiln
