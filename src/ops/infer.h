// Shape and type inference over a graph: checks every node against its OpDef (arity, attributes),
// runs the op's inference, and reconciles the result with types the model declared (value_info,
// graph outputs). Any disagreement is an error naming the node and both types.
#pragma once

#include "ir/graph.h"

namespace kiln {

Status infer_types(Graph& g);

// Checks a node's arity and attribute kinds against its OpDef.
Status check_node_schema(const Node& n);

// Reconciles a declared type with an inferred one; errors when they contradict.
Expected<Type> merge_types(const Type& declared, const Type& inferred, const std::string& what);

}  // namespace kiln
