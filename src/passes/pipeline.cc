#include "passes/pipeline.h"

#include <algorithm>

#include "passes/fold_constants.h"
#include "passes/passes.h"
#include "passes/tensor_parallel.h"

namespace kiln {

std::vector<Pass> default_pipeline(DerivedConstants* memo) {
  return {
      // Exporters repeat Shape -> Gather -> Unsqueeze chains and small constants once per use;
      // merging them first means fold-constants evaluates each once and later patterns see one
      // producer instead of several look-alikes.
      {"cse", "merge duplicated nodes and small constants", eliminate_common_subexpressions},
      // QDQ models (onnxruntime quantize_static, ModelOpt, kiln quantize): a MatMul between a
      // fake-quantized activation and a dequantized int8/fp8 weight -> one QuantizedMatMul that
      // backends run on the quantized values. Before fold-constants, which would turn the weight's
      // DequantizeLinear into a float weight.
      {"fuse-qdq-matmul", "QuantizeLinear/DequantizeLinear around a MatMul with a quantized weight -> QuantizedMatMul",
       fuse_qdq_matmul},
      // Shapes computed at run time (Shape, Gather, Concat on static dims) become constants,
      // Reshape targets and Expand shapes become static, and inference re-runs: canonicalize
      // needs those static shapes and constant targets.
      {"fold-constants", "evaluate what is known at build time",
       [](Graph& g) { return fold_constants(g); }},
      // An If on a condition fold-constants made constant (exporters branch on shapes) -> the
      // branch's nodes, which the fusions below and the GPU then see like any others.
      {"inline-if", "If with a condition known at build time -> the nodes of the branch it takes", inline_if},
      // Drops Identity, inference Dropout, no-op Cast/Reshape/Expand/Transpose and cancelling
      // pairs, so the fusions below find their producer and consumer directly connected.
      // Einsums without a diagonal -> ReduceSum/Transpose/Reshape/MatMul, which every backend runs
      // (products as a GEMM) and the attention pattern below can match. Needs the static shapes
      // fold-constants leaves; before canonicalize, which drops the no-op views it may add.
      {"einsum-as-matmul", "Einsum of one or two operands -> ReduceSum, MatMul and views",
       einsum_as_matmul},
      {"canonicalize", "remove no-op and self-cancelling nodes", canonicalize},
      // NHWC exports (tf2onnx) wrap each Conv in layout Transposes with the activations and
      // residual adds between them in NHWC: moving each Transpose down through those elementwise
      // ops until it cancels or merges with another removes the pairs. After canonicalize, so
      // that Identity/Dropout no longer break the chains; before the fusions, which then see
      // Conv -> Relu -> Add directly.
      {"propagate-layout", "move layout Transposes through elementwise ops until they cancel or merge",
       propagate_layout},
      // Exported erf/tanh GELU (5-9 elementwise nodes) -> one Gelu; matches its scalar constants,
      // so after fold-constants.
      {"fuse-gelu", "decomposed erf/tanh GELU -> Gelu", fuse_gelu},
      // One row pass instead of two reductions and six temporaries; after canonicalize, which
      // drops the no-op Casts fp32 exports of LLaMA's RMSNorm carry between its nodes.
      {"fuse-layernorm", "decomposed LayerNorm/RMSNorm over the last axis -> LayerNormalization/RMSNormalization",
       fuse_layernorm},
      // Reshape -> InstanceNormalization -> Reshape [-> Mul -> Add] (GroupNorm before opset 18)
      // -> GroupNormalization: one norm kernel, no layout round trip. Needs constant reshape targets
      // and parameters (after fold-constants); before fuse-elementwise, which would take the Mul/Add.
      {"fuse-groupnorm", "GroupNorm exported through InstanceNormalization -> GroupNormalization", fuse_groupnorm},
      // Exp / ReduceSum(Exp) -> Softmax, one kernel that the CUDA attention matcher also recognises.
      {"fuse-softmax", "decomposed softmax over the last axis -> Softmax", fuse_softmax},
      // MatMul(Q, K^T) [* c] [+ mask] -> Softmax -> MatMul(., V) -> one Attention node: the GPU
      // runs it as one flash-attention kernel reading Q/K/V through their views. Needs the Softmax
      // above; before fuse-elementwise, which would otherwise be free to take the scale and mask.
      {"fuse-attention", "decomposed scaled-dot-product attention -> Attention", fuse_attention},
      // A padding mask broadcast to [B,1,S,S] through constants that do not vary along the
      // queries becomes [B,1,1,S]: one row per batch, which the attention kernel stages in shared
      // memory. Needs the Attention nodes above and folded constants; before fuse-elementwise,
      // which would hide the chain in a FusedElementwise body.
      {"narrow-masks", "attention masks constant along the queries -> one row per key", narrow_masks},
      // Needs Conv -> BatchNormalization adjacent (canonicalize) and constant weights (folded).
      // Before fuse-matmul-add, which would hide a MatMul that a BatchNormalization follows.
      {"fold-batchnorm", "fold inference BatchNormalization into the Conv/Gemm/MatMul before it",
       [memo](Graph& g) { return fold_batchnorm(g, memo); }},
      // 1-D convolutions as 2-D ones over a height of 1 (between free views): one convolution path
      // per backend. After fold-batchnorm, which folds into the 1-D form as into any Conv.
      {"conv-as-planar", "1-D Conv -> Unsqueeze + 2-D Conv over a height of 1 + Squeeze", conv_as_planar},
      // Q/K/V projections reading one input -> one wide MatMul + Split: fewer, fuller GEMMs.
      // Before fuse-matmul-add, which would turn 2-D members into Gemms first.
      {"merge-sibling-matmuls", "MatMuls sharing their input and K -> one MatMul over concatenated weights + Split",
       [memo](Graph& g) { return merge_sibling_matmuls(g, memo); }},
      // 2-D MatMul + bias Add -> Gemm: one library call with the bias as its C input.
      {"fuse-matmul-add", "2-D MatMul with a constant weight + bias Add -> Gemm", fuse_matmul_add},
      // Connected elementwise nodes (masks, embedding sums, activations off the GEMM/conv paths)
      // -> one FusedElementwise node, a generated kernel on the GPU. After every pattern fusion
      // above, which need the decomposed forms; it leaves compute-fed chains to the lowerings'
      // library epilogues.
      {"fuse-elementwise", "connected elementwise nodes -> one FusedElementwise (one generated kernel)",
       fuse_elementwise},
      // Last: sweeps what the passes above left unread (bypassed chains, old weights).
      {"dce", "remove nodes and constants that no graph output needs", eliminate_dead_code},
  };
}

std::vector<Pass> tensor_parallel_pipeline(int ranks, int rank, TensorParallelReport* report) {
  std::vector<Pass> p = default_pipeline();
  auto at = std::find_if(p.begin(), p.end(), [](const Pass& x) { return x.name == "propagate-layout"; });
  p.insert(at + 1, Pass{"tensor-parallel", "split weights over the ranks, with the collectives that join them",
                        [=](Graph& g) { return shard_tensor_parallel(g, ranks, rank, report); }});
  return p;
}

}  // namespace kiln
