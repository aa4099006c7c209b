// fuse-matmul-add: a 2-D MatMul with a constant weight followed by the Add of a per-column
// constant bias becomes one Gemm, which backends run as a single library call with the bias as
// its C input (cuBLASLt's bias epilogue; one pass over the output on the CPU).
//
//   Before:  %w = const dense<f32[4,3]> ...
//            %b = const dense<f32[3]> ...
//            %m = MatMul(%a, %w) : f32[M,3] @fc
//            %y = Add(%m, %b) : f32[M,3] @fc_bias
//   After:   %m = Gemm(%a, %w, %b) : f32[M,3] @fc          (%m takes %y's place)
//
// Preconditions, all checked: A is 2-D (Gemm is 2-D only; 3-D MatMuls are left to the backends,
// which fuse them as GEMM epilogues); W is a 2-D constant; the bias is a constant of shape [N] or
// [1,N] (Add(b, m) too); float dtypes (f16, bf16, f32, f64) with the MatMul's; the MatMul output is
// read only by the Add and is not a graph output. Run after fold-batchnorm, which folds
// MatMul -> BatchNormalization and would no longer see the MatMul.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

size_t rank_or_zero(const Value* v) { return v->type.has_rank() ? v->type.shape->dims.size() : 0; }

}  // namespace

Expected<bool> fuse_matmul_add(Graph& g) {
  UseMap uses(g);
  std::vector<Node*> adds;
  for (const auto& np : g.nodes) {
    Node& mm = *np;
    if (mm.op != OpKind::kMatMul || !mm.has_output(0)) continue;
    Value* m = mm.outputs[0];
    const Tensor* w = constant_of(g, mm.inputs[1]);
    if (!w || w->rank() != 2 || rank_or_zero(mm.inputs[0]) != 2 || !m->type.is_tensor() || !is_float(m->type.dtype)) {
      continue;
    }
    if (uses.num_uses(m) != 1 || uses.is_output(m)) continue;
    if (!uses.uses(m)[0].node) continue;  // returned by a subgraph
    Node& add = *uses.uses(m)[0].node;
    if (add.op != OpKind::kAdd || add.owner != &g || !add.has_output(0)) continue;
    Value* bias = column_bias(g, add, m, w->dim(1));
    if (!bias || !(add.outputs[0]->type == m->type) || !uses.can_forward(add.outputs[0], m)) continue;
    mm.op = OpKind::kGemm;
    mm.inputs.push_back(nullptr);
    uses.set_input(&mm, 2, bias);
    uses.forward(add.outputs[0], m);
    g.note_absorbed(add, mm);
    adds.push_back(&add);
  }
  return erase_unused(uses, adds) > 0;
}

}  // namespace kiln
