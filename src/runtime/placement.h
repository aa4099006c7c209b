// Placement: which backend runs each node of an optimized graph, and why. One phase above the
// backends: the placer offers each node, in order, to the device backend (StepBackend in
// backends/backend.h: it lowers the node into its plan's steps or declines with a reason); a node
// whose inputs are all known is evaluated once at build time instead; a node the device declines
// becomes a host step (the CPU backend's kernel inside the device plan) if the CPU backend
// supports it, else the build fails naming it. The placements are the build report's table.
//
//   KILN_ASSIGN_OR_RETURN(std::vector<NodePlacement> rows, place_nodes(graph, cuda_lowering, *cpu));
//
// The placer never looks inside a backend: fusion inside the device backend shows as nodes that
// backend reports covered by an earlier or later node's steps.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln {

class Backend;      // backends/backend.h
class StepBackend;

enum class Placement : uint8_t {
  kDevice,  // steps of the device backend (its own, or fused into another node's)
  kHost,    // a host step: the CPU backend's kernel, because the device backend declined the node
  kFolded,  // evaluated once at build time
  kAlias,   // no work: the output is the input's buffer
  kPass,    // removed or fused by a graph pass before placement
  kLast = kPass,
};
// The report's first column: the device backend's name ("cuda") for kDevice, "cpu" for kHost,
// "folded", "alias", "pass".
std::string placement_name(Placement p, std::string_view device = "cuda");

// Where one ONNX node ended up and why.
struct NodePlacement {
  std::string node;  // Node::describe()
  Placement placement = Placement::kDevice;
  std::string impl;  // "cublasLt fp16 bias+gelu", "cudnn conv NHWC algo 1 +bias+relu", "kernel softmax"
  std::string why;   // for host steps: why the device backend declined; for fused nodes: into what
};

// Places every top-level node of g on `device`, or as a host step when `host` (the CPU backend)
// supports it (see the header comment). Errors: a node no backend can run (naming it and both
// backends' reasons), or a device backend's own failure.
Expected<std::vector<NodePlacement>> place_nodes(const Graph& g, StepBackend& device, const Backend& host);

// Rows for the nodes graph passes removed (Graph::absorbed) and the kernel each fused node ended in,
// so every ONNX node of the model has a line in the report.
void add_provenance(const Graph& g, std::vector<NodePlacement>& rows);

// The node (its describe()) whose steps do the work of a node the device backend fused into it, as
// place_nodes records it (before or after add_provenance); nullopt for any other row.
std::optional<std::string> fused_into(const NodePlacement& p);

}  // namespace kiln
