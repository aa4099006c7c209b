// The IR verifier: checks the invariants every pass may assume and must keep (DESIGN.md rule 2:
// the pass manager runs it after every pass in debug builds).
//
//   KILN_RETURN_IF_ERROR(verify_graph(*model.graph));
//
// Checked, recursively through subgraphs (If/Loop/Scan bodies):
//  - SSA: every value has one definition (graph input, constant or one node output) and a
//    non-empty name that no other value in the graph or an enclosing graph uses;
//  - every node input is defined before use: a graph input, a constant, an output of an earlier
//    node, or a value of an enclosing graph defined before the node holding the subgraph;
//  - producer/producer_output agree with the producing node's outputs; owner pointers, and the
//    parent/parent_node of subgraphs, point where they should; graph outputs are defined;
//  - nodes match their op's schema (op_def): input/output counts, leading required inputs and
//    outputs present, required attributes present, attributes of the declared kind. Ops not yet
//    declared (OpDef::infer == nullptr) are only checked structurally.
// Errors are kInvalidModel and name the node with Node::describe().
#pragma once

#include "ir/graph.h"
#include "ops/op_registry.h"
#include "support/status.h"

namespace kiln {

Status verify_graph(const Graph& g);
// Against the schemas of `registry` instead of op_registry() (tests declare their own).
Status verify_graph(const Graph& g, const OpRegistry& registry);

}  // namespace kiln
