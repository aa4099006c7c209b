// Value inputs: graph inputs whose values, not only their shapes, decide the computation (TensorRT
// calls them shape tensors). A Reshape's target, Slice bounds, reduction axes, TopK's k, Pad's pads,
// Resize's scales, an If's condition: a compiler that sizes buffers and picks kernels at build time
// needs them as constants. When such a value is fed by the caller, a GPU engine reads it on the
// host before the run (a host synchronisation) and keeps a plan per distinct value, each lowered
// from the graph with the value bound as a constant (bind_value_inputs), so its arithmetic folds.
//
//   for (size_t i : value_inputs(g)) ...   // indices into g.inputs
#pragma once

#include <utility>
#include <vector>

#include "ir/graph.h"

namespace kiln {

// The most elements a value input may have: a plan is kept per distinct value, so only small
// parameters qualify (a data tensor that reaches a parameter through arithmetic stays data).
constexpr int64_t kMaxValueInputElements = 64;

// Whether node input `slot` is read for its value as a parameter of the node (its shape, axes,
// bounds, counts or condition) rather than as data the node computes on.
bool is_parameter_input(const Node& n, size_t slot);

// Indices into g.inputs of the tensor inputs whose values reach a parameter input of some node (of
// g or its subgraphs) through any chain of nodes other than Shape and Size (which read only shapes),
// that have a static shape of at most kMaxValueInputElements elements and are not graph outputs.
// Float inputs qualify only when a parameter input reads them directly (Resize's scales): through
// arithmetic, a float is data (a condition computed from it would make a plan per call).
std::vector<size_t> value_inputs(const Graph& g);

// Makes every reader of the inputs given (index into g.inputs, value) read a constant holding the
// value instead; the inputs stay in g.inputs (a caller still passes them) with nothing reading them.
// The value's dtype and shape must match the input's declared type.
Status bind_value_inputs(Graph& g, const std::vector<std::pair<size_t, Tensor>>& values);

}  // namespace kiln
