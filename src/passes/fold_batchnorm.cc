// fold-batchnorm: folds an inference BatchNormalization into the Conv, Gemm or 2-D MatMul that
// feeds it, by scaling the constant weights per output channel and adjusting the bias. The
// normalization then costs nothing at run time.
//
//   BN(y) = s * y + t   with   s = scale / sqrt(var + epsilon),  t = B - mean * s
//
//   Before:  %w = const dense<f32[8,3,3,3]> ...
//            %y = Conv(%x, %w, %b) {...} : f32[N,8,H,W] @conv1
//            %z = BatchNormalization(%y, %scale, %B, %mean, %var) {epsilon = 1e-05} : f32[N,8,H,W] @bn1
//   After:   %w_bn = const dense<f32[8,3,3,3]> ...                # w[oc] * s[oc]
//            %b_bn = const dense<f32[8]> ...                      # b * s + t
//            %y = Conv(%x, %w_bn, %b_bn) {...} : f32[N,8,H,W] @conv1   (%y takes %z's place)
//
//   Gemm(A, B, C) -> BN: B's output columns scaled by s, C' = s * beta * C + t (beta becomes 1).
//   MatMul(A[M,K], W[K,N]) -> BN: becomes Gemm(A, W * s, t), named as the MatMul was.
//
// Preconditions, all checked (a node that fails one is left alone): float32 throughout; the
// weights, Conv bias or Gemm C, and all four BatchNormalization inputs are constants of one value
// per channel; BatchNormalization is in inference form (training_mode 0, only its first output
// read); it is the only reader of the producer's output, which is not a graph output (the
// unnormalized value is needed nowhere else). Gemm's C must broadcast per column ([N], [1,N] or a
// single value). Run after canonicalize (so Identity between the two is gone) and fold-constants.
// With a DerivedConstants memo (a dynamic engine's shape plans), each scaled weight is made once.
#include <cmath>
#include <set>

#include "passes/derived_constants.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

const Tensor* f32_constant(const Graph& g, const Value* v) {
  const Tensor* t = constant_of(g, v);
  return t && t->dtype() == DType::kFloat32 ? t : nullptr;
}

// The per-channel affine form of an inference BatchNormalization, or false.
bool bn_affine(const UseMap& u, const Node& bn, int64_t channels, std::vector<double>* s, std::vector<double>* t) {
  if (bn.attr_int("training_mode", 0) != 0) return false;
  for (size_t i = 1; i < bn.outputs.size(); ++i) {
    if (bn.outputs[i] && !u.unused(bn.outputs[i])) return false;
  }
  const Tensor* p[4];
  for (int i = 0; i < 4; ++i) {
    p[i] = f32_constant(u.graph(), bn.inputs[size_t(i) + 1]);
    if (!p[i] || p[i]->numel() != channels) return false;
  }
  const double eps = bn.attr_float("epsilon", 1e-5f);
  s->resize(size_t(channels));
  t->resize(size_t(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const double scale = p[0]->data<float>()[c], shift = p[1]->data<float>()[c];
    const double mean = p[2]->data<float>()[c], var = p[3]->data<float>()[c];
    (*s)[size_t(c)] = scale / std::sqrt(var + eps);
    (*t)[size_t(c)] = shift - mean * (*s)[size_t(c)];
  }
  return true;
}

// Weights scaled along `axis` (the output-channel axis) of a [.., C, ..] tensor by `s`, which
// `bn`'s parameters give (the memo's recipe: the weight, the four parameters and epsilon).
Expected<Value*> scaled(Graph& g, const Value* w, size_t axis, const std::vector<double>& s, const Node& bn,
                        DerivedConstants* memo) {
  const Tensor& t = *w->constant;
  auto make = [&]() -> Expected<Tensor> {
    int64_t inner = 1;
    for (size_t i = axis + 1; i < t.rank(); ++i) inner *= t.dim(i);
    const int64_t channels = t.dim(axis);
    KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::create(DType::kFloat32, t.dims()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      out.data<float>()[i] = float(t.data<float>()[i] * s[size_t((i / inner) % channels)]);
    }
    return out;
  };
  Expected<Tensor> made = memo ? memo->get(fmt::format("bn-scale axis={} eps={}", axis, bn.attr_float("epsilon", 1e-5f)),
                                           {&t, &*bn.inputs[1]->constant, &*bn.inputs[2]->constant,
                                            &*bn.inputs[3]->constant, &*bn.inputs[4]->constant},
                                           make)
                               : make();
  if (!made) return made.status();
  return g.add_constant(g.unique_name(w->name + "_bn"), std::move(*made));
}

// Rewires the producer's inputs (weight at 1, bias at 2), forwards the BN output and removes the
// BN node and the constants nothing reads any more.
void finish(UseMap& u, Node& n, Node& bn, Value* w, Value* bias) {
  std::set<const Value*> old;
  for (Value* v : n.inputs) {
    if (v) old.insert(v);
  }
  if (n.inputs.size() < 3) n.inputs.resize(3, nullptr);
  u.set_input(&n, 1, w);
  u.set_input(&n, 2, bias);
  u.forward(bn.outputs[0], n.outputs[0]);
  u.graph().note_absorbed(bn, n);
  erase_unused(u, {&bn});
  std::set<const Value*> dead;
  for (const Value* v : old) {
    if (v->owner == &u.graph() && constant_of(u.graph(), v) && u.unused(v)) dead.insert(v);
  }
  u.graph().erase_values(dead);
}

Expected<bool> fold_conv(UseMap& u, Node& n, Node& bn, DerivedConstants* memo) {
  Graph& g = u.graph();
  const Tensor* w = f32_constant(g, n.inputs[1]);
  if (!w || w->rank() < 3) return false;
  const int64_t oc = w->dim(0);
  const Tensor* b = n.has_input(2) ? f32_constant(g, n.inputs[2]) : nullptr;
  if (n.has_input(2) && (!b || b->numel() != oc)) return false;
  std::vector<double> s, t;
  if (!bn_affine(u, bn, oc, &s, &t)) return false;
  std::vector<double> bias(static_cast<size_t>(oc));
  for (int64_t c = 0; c < oc; ++c) bias[size_t(c)] = (b ? b->data<float>()[c] * s[size_t(c)] : 0.0) + t[size_t(c)];
  KILN_ASSIGN_OR_RETURN(Value * w2, scaled(g, n.inputs[1], 0, s, bn, memo));
  Value* b2 = add_f32_constant(g, (b ? n.inputs[2]->name : n.inputs[1]->name) + "_bn_bias", {oc}, bias);
  finish(u, n, bn, w2, b2);
  return true;
}

// Gemm(A, B, C) or a 2-D MatMul(A, W): the output's columns are the channels.
Expected<bool> fold_gemm(UseMap& u, Node& n, Node& bn, DerivedConstants* memo) {
  Graph& g = u.graph();
  const bool gemm = n.op == OpKind::kGemm;
  if (!gemm && (!n.inputs[0]->type.has_rank() || n.inputs[0]->type.shape->dims.size() != 2)) return false;
  const Tensor* w = f32_constant(g, n.inputs[1]);
  if (!w || w->rank() != 2) return false;
  const bool trans_b = gemm && n.attr_int("transB", 0) != 0;
  const int64_t cols = trans_b ? w->dim(0) : w->dim(1);
  const Tensor* c = gemm && n.has_input(2) ? f32_constant(g, n.inputs[2]) : nullptr;
  if (gemm && n.has_input(2)) {
    bool per_column = c && (c->numel() == 1 || (c->numel() == cols && c->dims().back() == cols));
    if (!per_column) return false;
  }
  std::vector<double> s, t;
  if (!bn_affine(u, bn, cols, &s, &t)) return false;
  const double beta = gemm ? n.attr_float("beta", 1.0f) : 1.0;
  std::vector<double> bias(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    double cj = c ? c->data<float>()[c->numel() == 1 ? 0 : j] : 0.0;
    bias[size_t(j)] = s[size_t(j)] * beta * cj + t[size_t(j)];
  }
  KILN_ASSIGN_OR_RETURN(Value * w2, scaled(g, n.inputs[1], trans_b ? 0 : 1, s, bn, memo));
  Value* b2 = add_f32_constant(g, n.inputs[1]->name + "_bn_bias", {cols}, bias);
  if (!gemm) n.op = OpKind::kGemm;
  n.attrs.erase("beta");
  finish(u, n, bn, w2, b2);
  return true;
}

}  // namespace

Expected<bool> fold_batchnorm(Graph& g, DerivedConstants* memo) {
  UseMap uses(g);
  std::vector<Node*> bns;
  for (const auto& np : g.nodes) {
    if (np->op == OpKind::kBatchNormalization) bns.push_back(np.get());
  }
  bool changed = false;
  for (Node* bn : bns) {
    Value* x = bn->inputs[0];
    Node* n = x ? x->producer : nullptr;
    // Only reader and not a graph output: the unnormalized value is needed nowhere else.
    if (!n || x != n->outputs[0] || uses.num_uses(x) != 1 || uses.is_output(x)) continue;
    if (!x->type.is_tensor() || x->type.dtype != DType::kFloat32) continue;
    if (!uses.can_forward(bn->outputs[0], x)) continue;
    bool folded = false;
    if (n->op == OpKind::kConv) {
      KILN_ASSIGN_OR_RETURN(folded, fold_conv(uses, *n, *bn, memo));
    } else if (n->op == OpKind::kGemm || n->op == OpKind::kMatMul) {
      KILN_ASSIGN_OR_RETURN(folded, fold_gemm(uses, *n, *bn, memo));
    }
    changed = folded || changed;
  }
  return changed;
}

}  // namespace kiln
