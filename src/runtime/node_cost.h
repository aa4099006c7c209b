// The work of one IR node at its static shapes, for the profiler's roofline (`kiln bench
// --profile`): the arithmetic it does and the bytes it reads and writes. An estimate of the
// node's own algorithm, not of a kernel's: matrix products and convolutions count their
// multiply-adds as 2 operations each, attention its two products (past keys included), RNNs their
// per-step products, a fused elementwise body one operation per node per element, normalizations and
// reductions a few per input element, and every other node one per output element. Bytes are the
// node's distinct inputs (weights included; a gather or slice reads its output's worth of data) and
// outputs, floats counted at the build's storage size. Dims not known statically count 0; values a
// subgraph (If, Loop) reads from the enclosing scope are not counted.
//
//   NodeCost c = node_cost(matmul, 2);   // [64,768] x [768,3072] in fp16: c.flops = 2*64*768*3072
#pragma once

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace kiln {

struct NodeCost {
  double flops = 0;
  double bytes = 0;
  NodeCost& operator+=(const NodeCost& o) {
    flops += o.flops;
    bytes += o.bytes;
    return *this;
  }
};

// float_bytes: the bytes a float (f32/f16/bf16) value takes in the build (4, or 2 for fp16/bf16).
NodeCost node_cost(const Node& n, size_t float_bytes);

// The bytes of v (0 when its dims are not static), floats at float_bytes.
double value_bytes(const Value* v, size_t float_bytes);
// The bytes node n reads of its input i (value_bytes, or less for a gather's data).
double read_bytes(const Node& n, size_t i, size_t float_bytes);

// Who reads each value of a graph's top level: its nodes, and null for the graph's own outputs.
// Built once per graph for group_cost.
using ValueReaders = std::unordered_map<const Value*, std::vector<const Node*>>;
ValueReaders value_readers(const Graph& g);

// The work of nodes that run as one kernel (a root and the nodes fused into it): their FLOPs, and
// the bytes that cross the group's edge: values read from outside it (weights included) and
// values it produces that a node outside it, or the graph's output, reads.
NodeCost group_cost(const std::vector<const Node*>& group, const ValueReaders& readers, size_t float_bytes);

}  // namespace kiln
