// fuse-layernorm: LayerNorm and RMSNorm over the last axis, decomposed into a dozen elementwise
// ops and reductions by exporters (torch.onnx before opset 17, TF/Keras, LLaMA's and T5's
// RMSNorm), become one LayerNormalization or RMSNormalization node: one pass over each row
// instead of two reductions and six full-size temporaries.
//
//   Before:  %m = ReduceMean(%x, %axes) : f32[N,1]              (%axes = const dense<i64[1]> [-1])
//            %d = Sub(%x, %m) : f32[N,8]
//            %p = Pow(%d, %two) : f32[N,8]
//            %v = ReduceMean(%p, %axes) : f32[N,1]
//            %a = Add(%v, %eps) : f32[N,1]                      (%eps = const dense<f32[]> [1e-05])
//            %s = Sqrt(%a) : f32[N,1]
//            %n = Div(%d, %s) : f32[N,8]
//            %w = Mul(%n, %gamma) : f32[N,8]                    (%gamma, %beta: const f32[8])
//            %y = Add(%w, %beta) : f32[N,8] @ln
//   After:   %y = LayerNormalization(%x, %gamma, %beta) {axis = -1, epsilon = 1e-05} : f32[N,8] @ln
//
//   RMSNorm:  %r = ReduceMean(Pow(%x, 2), [-1]); %n = Mul(%x, Reciprocal(Sqrt(Add(%r, %eps))));
//             %y = Mul(%scale, %n)   ->   %y = RMSNormalization(%x, %scale) {axis = -1, epsilon = ..}
//
// Accepted forms: the square is Pow(d, 2) or Mul(d, d); the normalization is Div(d, Sqrt(v + eps))
// or Mul(d, r) with r = Reciprocal(Sqrt(v + eps)), Div(1, Sqrt(v + eps)) or Pow(v + eps, -0.5),
// and r may be multiplied by gamma first (TF: d * (r * gamma)); then an optional Mul by gamma and,
// for LayerNorm, an optional Add of beta; every Mul and Add in either operand order. With no
// gamma the new node gets a constant scale of ones. The last node of the chain becomes the new
// one, keeping its name, position and output value.
//
// Preconditions, all checked: x is a float tensor (f16, bf16, f32, f64) whose last dim is static;
// both ReduceMeans take a constant axes input holding the last axis (-1 or rank-1) and keep dims
// (the importer turns the `axes` attribute of opsets < 18 into that input, so both forms match);
// eps is a one-element float constant; gamma and beta are constants of x's dtype with C elements,
// last dim C; the result has x's type; every intermediate has exactly one reader and is not a
// graph output, except d = x - mean, read by the square and the normalization only. When d has
// other readers the chain is still an RMSNorm of d, and becomes one. Run after fold-constants
// (constant axes, eps, gamma) and canonicalize (fp32 exports of LLaMA wrap the RMSNorm in no-op
// Casts).
#include <set>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

struct Norm {
  bool rms = false;
  Value* x = nullptr;
  Value* variance = nullptr;  // ReduceMean(square) before the epsilon Add
  double eps = 0;
  Value* gamma = nullptr;
  Value* beta = nullptr;
  Node* last = nullptr;       // the node that becomes the normalization
  std::vector<Node*> absorbed;
};

// Add(variance, eps) in either order; records both.
Node* match_add_eps(const UseMap& u, const Value* v, Norm& n) {
  Node* add = sole_producer(u, v, OpKind::kAdd);
  Value* var = other_operand(add, [&](const Value* c) { return scalar_of(u.graph(), c).has_value(); });
  if (!var) return nullptr;
  n.variance = var;
  n.eps = *scalar_of(u.graph(), add->inputs[0] == var ? add->inputs[1] : add->inputs[0]);
  n.absorbed.push_back(add);
  return add;
}

// Sqrt(variance + eps): what d is divided by.
bool match_std(const UseMap& u, const Value* v, Norm& n) {
  Node* sq = sole_producer(u, v, OpKind::kSqrt);
  if (!sq || !match_add_eps(u, sq->inputs[0], n)) return false;
  n.absorbed.push_back(sq);
  return true;
}

// 1 / sqrt(variance + eps): Reciprocal(Sqrt(..)), Div(1, Sqrt(..)) or Pow(.., -0.5).
bool match_rstd(const UseMap& u, const Value* v, Norm& n) {
  const Graph& g = u.graph();
  const size_t mark = n.absorbed.size();
  bool ok = false;
  if (Node* rec = sole_producer(u, v, OpKind::kReciprocal)) {
    ok = match_std(u, rec->inputs[0], n) && (n.absorbed.push_back(rec), true);
  } else if (Node* div = sole_producer(u, v, OpKind::kDiv)) {
    ok = div->inputs.size() == 2 && scalar_near(g, div->inputs[0], 1.0) && match_std(u, div->inputs[1], n) &&
         (n.absorbed.push_back(div), true);
  } else if (Node* pw = sole_producer(u, v, OpKind::kPow)) {
    ok = pw->inputs.size() == 2 && scalar_near(g, pw->inputs[1], -0.5) && match_add_eps(u, pw->inputs[0], n) &&
         (n.absorbed.push_back(pw), true);
  }
  if (!ok) n.absorbed.resize(mark);
  return ok;
}

// A constant of x's dtype with c elements along the last dim: a per-channel gamma or beta.
bool is_channel_param(const Graph& g, const Value* v, DType dt, int64_t c) {
  const Tensor* t = constant_of(g, v);
  return t && t->dtype() == dt && t->numel() == c && t->rank() >= 1 && t->dims().back() == c;
}

// The node squaring `base` for the variance (Pow(base, 2) or Mul(base, base)), when the variance
// is ReduceMean of it over the last axis.
Node* match_variance(const UseMap& u, const Value* var, const Value* base, size_t rank, Norm& n) {
  Node* mean = sole_producer(u, var, OpKind::kReduceMean);
  if (!mean || kept_reduce_axis(u.graph(), *mean, rank) != int64_t(rank) - 1) return nullptr;
  Node* sq = sole_producer(u, mean->inputs[0], OpKind::kPow);
  if (sq) {
    if (sq->inputs.size() != 2 || sq->inputs[0] != base || !scalar_near(u.graph(), sq->inputs[1], 2.0)) return nullptr;
  } else {
    sq = sole_producer(u, mean->inputs[0], OpKind::kMul);
    if (!sq || sq->inputs.size() != 2 || sq->inputs[0] != base || sq->inputs[1] != base) return nullptr;
  }
  n.absorbed.insert(n.absorbed.end(), {sq, mean});
  return sq;
}

// d = Sub(x, ReduceMean(x, [-1])) read by the square and the normalization `norm` only.
bool match_center(const UseMap& u, const Value* d, const Node* square, const Node* norm, size_t rank, Norm& n) {
  Node* sub = d->producer;
  if (!sub || sub->op != OpKind::kSub || sub->owner != &u.graph() || u.is_output(d)) return false;
  for (const Use& use : u.uses(d)) {
    if (use.node != square && use.node != norm) return false;
  }
  Node* mean = sole_producer(u, sub->inputs[1], OpKind::kReduceMean);
  if (!mean || mean->inputs[0] != sub->inputs[0] || kept_reduce_axis(u.graph(), *mean, rank) != int64_t(rank) - 1) {
    return false;
  }
  n.x = sub->inputs[0];
  n.absorbed.insert(n.absorbed.end(), {mean, sub});
  return true;
}

// The normalization rooted at `norm` (Div(d, std) or Mul(d, rstd)), then its gamma and beta.
std::optional<Norm> match_norm(const UseMap& u, Node& norm) {
  const Graph& g = u.graph();
  if (norm.inputs.size() != 2 || !norm.has_output(0)) return std::nullopt;
  for (size_t side = 0; side < (norm.op == OpKind::kMul ? 2 : 1); ++side) {
    Value* d = norm.inputs[side];
    Value* stat = norm.inputs[1 - side];
    if (!d->type.has_rank() || d->type.shape->dims.empty() || !is_float(d->type.dtype)) continue;
    const size_t rank = d->type.shape->dims.size();
    const Dim& last = d->type.shape->dims.back();
    if (!last.is_static()) continue;
    const int64_t c = last.value();
    Norm n;
    if (norm.op == OpKind::kDiv) {
      if (!match_std(u, stat, n)) continue;
    } else if (!match_rstd(u, stat, n)) {
      // TF: d * (rstd * gamma)
      Node* mul = sole_producer(u, stat, OpKind::kMul);
      Value* rstd = other_operand(mul, [&](const Value* v) { return is_channel_param(g, v, d->type.dtype, c); });
      if (!rstd || !match_rstd(u, rstd, n)) continue;
      n.gamma = mul->inputs[0] == rstd ? mul->inputs[1] : mul->inputs[0];
      n.absorbed.push_back(mul);
    }
    Node* square = match_variance(u, n.variance, d, rank, n);
    if (!square) continue;
    n.rms = !match_center(u, d, square, &norm, rank, n);
    if (n.rms) n.x = d;
    // Then gamma (unless taken above) and, for LayerNorm, beta.
    n.last = &norm;
    auto channel = [&](const Value* v) { return is_channel_param(g, v, d->type.dtype, c); };
    if (Node* mul = n.gamma ? nullptr : sole_reader(u, norm.outputs[0], OpKind::kMul)) {
      if (Value* other = other_operand(mul, [&](const Value* v) { return v == n.last->outputs[0]; });
          other && channel(other) && mul->has_output(0)) {
        n.gamma = other;
        n.absorbed.push_back(n.last);
        n.last = mul;
      }
    }
    if (Node* add = n.rms ? nullptr : sole_reader(u, n.last->outputs[0], OpKind::kAdd)) {
      if (Value* other = other_operand(add, [&](const Value* v) { return v == n.last->outputs[0]; });
          other && channel(other) && add->has_output(0)) {
        n.beta = other;
        n.absorbed.push_back(n.last);
        n.last = add;
      }
    }
    if (!(n.last->outputs[0]->type == n.x->type)) continue;
    return n;
  }
  return std::nullopt;
}

// A constant of ones [c] in dtype dt, for a normalization without gamma.
Value* ones(Graph& g, const std::string& base, DType dt, int64_t c) {
  Tensor t = Tensor::create(dt, {c}).value();
  visit_dtype(dt, [&]<typename T>() {
    if constexpr (is_float_v<T>) {
      for (int64_t i = 0; i < c; ++i) t.data<T>()[i] = T(1.0f);
    }
  });
  return g.add_constant(g.unique_name(base), std::move(t));
}

}  // namespace

Expected<bool> fuse_layernorm(Graph& g) {
  UseMap uses(g);
  std::vector<Node*> dead;
  std::vector<Value*> rewired;  // the former inputs of the nodes that became norms
  std::set<const Node*> taken;  // absorbed by an earlier match, removed at the end
  for (const auto& np : g.nodes) {
    Node* root = np.get();
    if ((root->op != OpKind::kDiv && root->op != OpKind::kMul) || taken.count(root)) continue;
    std::optional<Norm> n = match_norm(uses, *root);
    if (!n) continue;
    taken.insert(n->absorbed.begin(), n->absorbed.end());
    Node& last = *n->last;
    Value* scale = n->gamma;
    if (!scale) {
      scale = ones(g, last.outputs[0]->name + "_scale", n->x->type.dtype, n->x->type.shape->dims.back().value());
    }
    rewired.insert(rewired.end(), last.inputs.begin(), last.inputs.end());
    for (size_t i = 0; i < last.inputs.size(); ++i) uses.set_input(&last, i, nullptr);
    last.inputs.assign(n->beta ? 3 : 2, nullptr);
    uses.set_input(&last, 0, n->x);
    uses.set_input(&last, 1, scale);
    if (n->beta) uses.set_input(&last, 2, n->beta);
    last.op = n->rms ? OpKind::kRMSNormalization : OpKind::kLayerNormalization;
    last.attrs.clear();
    last.attrs["axis"] = Attribute::of_int(-1);
    last.attrs["epsilon"] = Attribute::of_float(float(n->eps));
    for (Node* a : n->absorbed) g.note_absorbed(*a, last);
    dead.insert(dead.end(), n->absorbed.begin(), n->absorbed.end());
  }
  if (dead.empty()) return false;
  erase_unused_constants(uses, rewired);  // first: erase_unused frees some of these values
  erase_unused(uses, dead);
  return true;
}

}  // namespace kiln
