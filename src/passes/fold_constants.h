// fold-constants: evaluates, at build time, every node whose inputs are all known (initializers,
// Constants, earlier folds) or that reads only a static shape (Shape, Size), and replaces its
// outputs with constants. Then re-runs shape inference, since shapes that depended on folded
// values (Reshape targets, Range lengths, Expand shapes) become static, which can make more
// Shape nodes foldable; repeats until nothing changes.
//
//   Before:  %s = Shape(%x : f32[1,128,768]) ; %d = Gather(%s, 1) ; %r = Reshape(%x, Concat(%d, -1))
//   After:   %r = Reshape(%x, const [128, -1])
//
// Outputs larger than max_elements are left alone (folding would trade a cheap op for a large
// weight), and so is a Gather of one index repeated whose result (over 64K elements) is more than
// four times its inputs: one table row repeated over the batch and sequence. Random ops and nodes
// with subgraphs are never folded.
#pragma once

#include <functional>
#include <optional>

#include "ir/graph.h"

namespace kiln {

// Evaluates n on the host if it is foldable; `constant_of` says which values are known.
// Returns false (outs untouched) when n is not foldable.
Expected<bool> fold_node(const Node& n, const std::function<const Tensor*(const Value*)>& constant_of,
                         int64_t max_elements, std::vector<std::optional<Tensor>>* outs);

Expected<bool> fold_constants(Graph& g, int64_t max_elements = int64_t(1) << 24);

}  // namespace kiln
