// The graph passes, one per file (DESIGN.md rule 1): each file opens with what the pass does, a
// Before/After IR example and its preconditions. Each returns whether it changed the graph.
// pipeline.cc orders them; pass_manager.h runs them.
#pragma once

#include "ir/graph.h"

namespace kiln {

class DerivedConstants;  // derived_constants.h: weights made once across a dynamic engine's shape plans

Expected<bool> eliminate_dead_code(Graph& g);            // dce.cc             "dce"
Expected<bool> eliminate_common_subexpressions(Graph& g);  // cse.cc           "cse"
Expected<bool> canonicalize(Graph& g);                   // canonicalize.cc    "canonicalize"
Expected<bool> inline_if(Graph& g);                      // inline_if.cc       "inline-if"
Expected<bool> propagate_layout(Graph& g);               // propagate_layout.cc "propagate-layout"
Expected<bool> fold_batchnorm(Graph& g, DerivedConstants* memo = nullptr);  // fold_batchnorm.cc "fold-batchnorm"
Expected<bool> einsum_as_matmul(Graph& g);               // einsum_as_matmul.cc "einsum-as-matmul"
Expected<bool> conv_as_planar(Graph& g);                   // conv_as_planar.cc    "conv-as-planar"
Expected<bool> fuse_gelu(Graph& g);                      // fuse_gelu.cc       "fuse-gelu"
Expected<bool> fuse_layernorm(Graph& g);                 // fuse_layernorm.cc  "fuse-layernorm"
Expected<bool> fuse_groupnorm(Graph& g);                 // fuse_groupnorm.cc  "fuse-groupnorm"
Expected<bool> fuse_softmax(Graph& g);                   // fuse_softmax.cc    "fuse-softmax"
Expected<bool> fuse_attention(Graph& g);                 // fuse_attention.cc  "fuse-attention"
Expected<bool> narrow_masks(Graph& g);                   // narrow_masks.cc    "narrow-masks"
Expected<bool> fuse_matmul_add(Graph& g);                // fuse_matmul_add.cc "fuse-matmul-add"
Expected<bool> merge_sibling_matmuls(Graph& g, DerivedConstants* memo = nullptr);  // merge_sibling_matmuls.cc
Expected<bool> fuse_qdq_matmul(Graph& g);                // fuse_qdq_matmul.cc "fuse-qdq-matmul"
Expected<bool> fuse_elementwise(Graph& g);               // fuse_elementwise.cc "fuse-elementwise"
// fold_constants.h: "fold-constants"

}  // namespace kiln
