// fuse-softmax: softmax written out as Exp, ReduceSum and Div (with or without subtracting the
// row maximum first, as hand-written attention and some TF exports do) becomes one Softmax node:
// one kernel reading each row once instead of four or five full-size passes, and a Softmax the
// CUDA attention matcher can recognise.
//
//   Before:  %m = ReduceMax(%x, %axes) : f32[N,8,1]            (%axes = const dense<i64[1]> [-1])
//            %t = Sub(%x, %m) : f32[N,8,5]
//            %e = Exp(%t) : f32[N,8,5]
//            %s = ReduceSum(%e, %axes) : f32[N,8,1]
//            %y = Div(%e, %s) : f32[N,8,5] @probs
//   After:   %y = Softmax(%x) {axis = -1} : f32[N,8,5] @probs
//
// Without the maximum: Div(Exp(x), ReduceSum(Exp(x))) -> Softmax(x) too (Softmax subtracts the
// maximum itself, so where the original overflowed to inf/NaN the fused one gives the limit).
// The Div becomes the Softmax, keeping its name, position and output value.
//
// Preconditions, all checked: x is a float tensor (f16, bf16, f32, f64) of known rank; both
// reductions take a constant axes input holding the last axis (-1 or rank-1) and keep dims: the
// backends' Softmax kernels work on the innermost axis (the CUDA one rejects others), so a
// softmax over another axis stays decomposed, on the GPU, rather than fall back to the CPU. e is
// read by the Div and the ReduceSum only; every other intermediate has exactly one reader; none
// is a graph output; the result has x's type. Run after fold-constants (constant axes).
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

bool reduces_last(const Graph& g, const Node& reduce, size_t rank) {
  return kept_reduce_axis(g, reduce, rank) == int64_t(rank) - 1;
}

// Div(e, ReduceSum(e)) with e = Exp(x - ReduceMax(x)) or Exp(x): x and the nodes absorbed.
Value* match_softmax(const UseMap& u, const Node& div, std::vector<Node*>& absorbed) {
  const Graph& g = u.graph();
  if (div.inputs.size() != 2 || !div.has_output(0) || !div.has_input(0)) return nullptr;
  Value* e = div.inputs[0];
  Node* sum = sole_producer(u, div.inputs[1], OpKind::kReduceSum);
  Node* exp = e->producer;
  if (!sum || sum->inputs[0] != e || !exp || exp->op != OpKind::kExp || exp->owner != &g) return nullptr;
  // e: read exactly by the Div and the ReduceSum.
  const auto& uses = u.uses(e);
  if (uses.size() != 2 || u.is_output(e)) return nullptr;
  for (const Use& use : uses) {
    if (use.node != &div && use.node != sum) return nullptr;
  }
  Value* x = exp->inputs[0];
  if (!x || !x->type.has_rank() || x->type.shape->dims.empty() || !is_float(x->type.dtype)) return nullptr;
  const size_t rank = x->type.shape->dims.size();
  if (!reduces_last(g, *sum, rank)) return nullptr;
  absorbed = {sum, exp};
  // x - ReduceMax(x, same axis): Softmax's own stabilization.
  if (Node* sub = sole_producer(u, x, OpKind::kSub)) {
    Node* max = sole_producer(u, sub->inputs[1], OpKind::kReduceMax);
    if (max && max->inputs[0] == sub->inputs[0] && reduces_last(g, *max, rank) && sub->inputs[0]->type.has_rank()) {
      absorbed.insert(absorbed.begin(), {max, sub});
      x = sub->inputs[0];
    }
  }
  return x;
}

}  // namespace

Expected<bool> fuse_softmax(Graph& g) {
  UseMap uses(g);
  std::vector<Node*> dead;
  for (const auto& np : g.nodes) {
    Node& div = *np;
    if (div.op != OpKind::kDiv) continue;
    std::vector<Node*> absorbed;
    Value* x = match_softmax(uses, div, absorbed);
    if (!x || !(div.outputs[0]->type == x->type)) continue;
    uses.set_input(&div, 1, nullptr);
    div.inputs.pop_back();
    uses.set_input(&div, 0, x);
    div.op = OpKind::kSoftmax;
    div.attrs.clear();
    div.attrs["axis"] = Attribute::of_int(-1);
    for (Node* a : absorbed) g.note_absorbed(*a, div);
    dead.insert(dead.end(), absorbed.begin(), absorbed.end());
  }
  if (dead.empty()) return false;
  erase_unused(uses, dead);
  return true;
}

}  // namespace kiln
