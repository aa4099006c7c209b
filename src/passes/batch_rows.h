// Whether a graph computes each row of its batch on its own: then a batch of B rows can run as M
// micro-batches of B/M rows, each through the same graph built for B/M, and their outputs
// concatenated along axis 0 equal the whole batch's. A tensor-parallel engine does so to overlap one
// micro-batch's all-reduces with the other's products (api/tensor_parallel.cc).
//
// The analysis follows the batch axis from the inputs that carry it (their axis 0) through every
// node: elementwise ops and products keep it, reshapes may merge it with inner axes (the batch stays
// the outermost factor), transposes move it; anything that reads across it (a reduction,
// normalization, softmax, slice, gather or concat along it, a product contracting over it, a reshape
// that splits it, a constant whose rows differ broadcast along it, a subgraph) answers no and names
// the node. Every output must carry the batch on axis 0. Conservative: an op it does not know
// answers no.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "support/status.h"

namespace kiln {

// `batched[i]`: graph input i carries the batch on its axis 0 (of static size B >= 2, the same for
// each); the others are the same for every row. Static shapes. ok, or an error naming the first
// node (or output) that mixes the rows and why.
// `axes`, when given: each value's name -> the axis carrying the batch, or -1.
Status check_rows_independent(const Graph& g, const std::vector<bool>& batched,
                              std::map<std::string, int64_t>* axes = nullptr);

// The same graph bound for a micro-batch of 1/m the rows, checked value by value (by name) against
// the whole batch's `axes`: the batch axis is 1/m as large, every other axis the same. A shape the
// analysis could not see through (a reshape to a literal batch size) fails here, naming the value.
Status check_micro_shapes(const Graph& whole, const Graph& micro, const std::map<std::string, int64_t>& axes, int64_t m);

}  // namespace kiln
