// fuse-attention: scaled-dot-product attention written out as MatMul, scale, mask Add, Softmax
// and MatMul (PyTorch's eager attention in BERT, GPT-2 and ViT; TF/Keras exports) becomes one
// ONNX Attention node (4-D form): one fused kernel on the GPU instead of an S x S score tensor
// written and read three times, and a node any backend can recognise by name.
//
//   Before:  %s = MatMul(%q, %kt) : f32[B,12,S,S]             (%q [B,12,S,64], %kt [B,12,64,S])
//            %c = Div(%s, %eight) : f32[B,12,S,S]              (%eight = const dense<f32[]> [8])
//            %a = Add(%c, %mask) : f32[B,12,S,S]               (%mask f32[B,1,1,S], any producer)
//            %p = Softmax(%a) {axis = -1} : f32[B,12,S,S]
//            %o = MatMul(%p, %v) : f32[B,12,S,64] @ctx
//   After:   %k = Transpose(...) : f32[B,12,S,64]              (K as Attention takes it, below)
//            %o = Attention(%q, %k, %v, %mask) {scale = 0.125} : f32[B,12,S,64] @ctx
//
// Accepted: a softmax run in f32 between Cast(to f32) and Cast(back) in half-precision models;
// any number of scalar Mul/Div by constants between the score MatMul and the mask Add
// (the mask is added after the scaling, as every exporter does; the scale is their product),
// scalar Muls applied to Q or K^T right before the score MatMul (the scale split over both), a
// mask Add in either operand order, two mask Adds in a row (their sum, computed once, is the mask),
// or none. Causal masks come as additive constants (GPT-2's
// [1,1,S,S] of 0 / -1e4 after fold-constants) and stay masks, or as Where(cond, scores, fill)
// with a constant bool cond and a fill <= -1e4 (HF GPT-2 before transformers 4.36: the causal
// `bias` buffer sliced, finfo.min), which becomes the constant mask where(cond, 0, fill), added to
// the chain's own mask when there is one; a cond that masks a whole row is left alone (Where
// gives such a row uniform weights, a mask would not). K: Attention wants [B,H,Sk,D]
// where the graph has K^T [B,H,D,Sk]; when K^T is a Transpose read only by the score MatMul its
// perm is changed to give K directly (BERT: [0,2,3,1] -> [0,2,1,3]), otherwise a Transpose of
// K^T is added. The P.V MatMul becomes the Attention node, keeping its name and output value.
//
// Shifted-window attention (Swin, torchvision and transformers): scores [B,H,S,S] (+ a bias) ->
// Reshape [B/W,W,H,S,S] -> Add(constant per-window mask) -> Reshape [B,H,S,S] -> Softmax. Seen as
// [B/W, W*H, S, S], both masks are one constant [1, W*H, S, S] broadcast over B/W: Q, K and V are
// reshaped to [B/W, W*H, S, D], one Attention node takes the summed mask, and the P.V MatMul becomes
// the Reshape back to [B,H,S,Dv]. Needs static dims, f32 masks that do not vary along B/W.
//
// 3-D attention (torch.bmm exports, nn.MultiheadAttention: [B*H,S,D]) becomes the same node over
// one batch: Unsqueeze(axis 0) of Q, K and V, Attention, and the P.V MatMul turned into the
// Squeeze back to 3-D (keeping its name and output value).
//
// Preconditions, all checked: Q [B,H,Sq,D], K^T [B,H,D,Sk], V [B,H,Sk,Dv] and the scores
// [B,H,Sq,Sk] are all rank 4 (or all rank 3, [B*H,..]) with provably equal batch, head and
// sequence dims (no MatMul broadcasting); all float of one dtype; Softmax over the last axis; the mask has the scores'
// dtype, rank <= 4, and broadcasts into the scores without enlarging them, its last dim equal to
// Sk (ONNX Attention reads a shorter last dim as padding, not as a broadcast); every intermediate
// (scores, scaled scores, probabilities) has exactly one reader and is not a graph output. Run
// after fuse-softmax (decomposed softmax) and fold-constants (scalar constants, folded masks).
//
// P.V written transposed, O^T = MatMul(V^T, Transpose(P)) (latent diffusion's VAE and UNet
// attention blocks: torch.bmm(v, w.permute(0, 2, 1)) over [B, C, HW]): the same attention with
// V = Transpose(V^T), its output transposed back. The MatMul becomes that Transpose, keeping its
// name and output value, when the rest of the chain matches; otherwise the graph is left as it is.
//
// PyTorch's scaled_dot_product_attention as torch.onnx writes it (transformers' default "sdpa"
// attention): Q and K^T each scaled by sqrt(scale), a boolean mask as Where(mask, 0, -inf) added,
// and the probabilities guarded by Where(IsNaN(p), 0, p) before the P.V MatMul; the guard is
// absorbed too.
//
// One difference, at the edge: a row whose every key an additive mask sets to -inf is NaN in the
// decomposed graph without that guard (0 / 0) and zeros in ONNX Attention (the spec; the CPU and
// GPU kernels both follow it). Masks of finite large negatives (HF's finfo.min, -1e4) are not
// affected.
#include <algorithm>
#include <map>
#include <optional>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

// Mul(x, c), Mul(c, x) or Div(x, c) by a scalar constant, as the only reader of its output:
// returns x and multiplies `scale` by c (or 1/c).
Value* through_scalar(const UseMap& u, const Value* v, double& scale, std::vector<Node*>& absorbed) {
  Node* n = sole_producer(u, v, OpKind::kMul);
  if (!n) n = sole_producer(u, v, OpKind::kDiv);
  if (!n || n->inputs.size() != 2 || !n->inputs[0] || !n->inputs[1]) return nullptr;
  const Graph& g = u.graph();
  for (size_t side = 0; side < 2; ++side) {
    auto c = scalar_of(g, n->inputs[1 - side]);
    if (!c || !(n->inputs[side]->type == n->outputs[0]->type)) continue;
    if (n->op == OpKind::kMul) {
      scale *= *c;
    } else if (side == 0 && *c != 0) {
      scale /= *c;
    } else {
      continue;
    }
    absorbed.push_back(n);
    return n->inputs[side];
  }
  return nullptr;
}

// The dims of a rank-`r` value, else null.
const std::vector<Dim>* dims_of_rank(const Value* v, size_t r) {
  return v && v->type.has_rank() && v->type.shape->dims.size() == r ? &v->type.shape->dims : nullptr;
}

struct Sdpa {
  Value *q = nullptr, *kt = nullptr, *v = nullptr, *mask = nullptr;
  double scale = 1.0;
  std::vector<Node*> absorbed;  // Softmax, mask Add, scalar ops, the Where, the score MatMul
  const Node* where = nullptr;  // Where(cond, scores, fill) or Where(cond, fill, scores): a constant mask
  bool keep_if = true;          // the cond value that keeps a score
  double fill = 0;
  // Shifted windows (Swin): the scores viewed as [B/W, W, H, Sq, Sk] take a constant f32 mask per
  // window, then go back to [B, H, Sq, Sk]. windows = W, 0 without.
  int64_t windows = 0;
  const Value* window_mask = nullptr;
  // Two additive masks added one after the other (the dynamo exporter's T5: the position bias, then
  // the padding mask): mask + mask2 becomes the Attention's one mask.
  Value* mask2 = nullptr;
};

// ... -> Reshape [B/W, W, H, Sq, Sk] -> Add(constant [1|.., W|1, H|1, Sq|1, Sk]) -> Reshape [B, H, Sq, Sk]
// ending at the 4-D scores s: returns the scores before the first Reshape and records the window
// count and mask (Swin's shifted windows: torchvision and transformers both write it so).
const Value* through_window_mask(const UseMap& u, const Value* s, Sdpa& m) {
  Node* back = sole_producer(u, s, OpKind::kReshape);
  Node* add = back ? sole_producer(u, back->inputs[0], OpKind::kAdd) : nullptr;
  if (!add || add->inputs.size() != 2 || !add->inputs[0] || !add->inputs[1]) return nullptr;
  auto sd = s->type.shape ? s->type.shape->static_dims() : std::nullopt;
  if (!sd || sd->size() != 4) return nullptr;
  for (size_t side = 0; side < 2; ++side) {
    Node* split = sole_producer(u, add->inputs[side], OpKind::kReshape);
    const Value* mask = add->inputs[1 - side];
    const Tensor* mt = constant_of(u.graph(), mask);
    if (!split || !mt || !(split->inputs[0]->type == s->type) || mt->dtype() != DType::kFloat32 ||
        s->type.dtype != DType::kFloat32) {
      continue;
    }
    auto fd = add->inputs[side]->type.shape ? add->inputs[side]->type.shape->static_dims() : std::nullopt;
    const std::vector<int64_t>& d = *sd;
    if (!fd || fd->size() != 5 || (*fd)[1] < 1 || (*fd)[0] * (*fd)[1] != d[0] || (*fd)[2] != d[1] ||
        (*fd)[3] != d[2] || (*fd)[4] != d[3] || !(add->outputs[0]->type == add->inputs[side]->type)) {
      continue;
    }
    // The mask may vary along windows, heads and positions, never along B/W; keys not broadcast.
    const std::vector<int64_t> md = mt->dims();
    if (md.size() > 5 || md.empty() || md.back() != d[3]) continue;
    bool fits = true;
    for (size_t i = 0; i < md.size(); ++i) {
      const int64_t full = (*fd)[5 - md.size() + i];
      fits = fits && (md[i] == 1 || md[i] == full) && !(5 - md.size() + i == 0 && md[i] != 1);
    }
    if (!fits) continue;
    m.windows = (*fd)[1];
    m.window_mask = mask;
    m.absorbed.push_back(back);
    m.absorbed.push_back(add);
    m.absorbed.push_back(split);
    return split->inputs[0];
  }
  return nullptr;
}

// Where(cond, scores, fill) (or with the two swapped) on the scores with a constant bool cond that
// leaves every row at least one key, and a scalar fill of at most -1e4 (HF GPT-2's causal mask
// with finfo.min or -1e4): returns the scores and records the Where; the additive mask
// where(cond, 0, fill) then gives the same softmax (masked keys' exp underflow to 0 either way).
Value* through_where(const UseMap& u, const Value* v, Sdpa& m) {
  Node* w = m.where ? nullptr : sole_producer(u, v, OpKind::kWhere);
  if (!w || w->inputs.size() != 3 || !w->inputs[0] || !w->inputs[1] || !w->inputs[2]) return nullptr;
  const Graph& g = u.graph();
  const Tensor* cond = constant_of(g, w->inputs[0]);
  if (!cond || cond->dtype() != DType::kBool || cond->rank() == 0 || cond->rank() > 4) return nullptr;
  for (size_t side = 1; side <= 2; ++side) {
    auto fill = scalar_of(g, w->inputs[3 - side]);
    Value* x = w->inputs[side];
    if (!fill || *fill > -1e4 || !(x->type == w->outputs[0]->type) || x->type.dtype != DType::kFloat32) continue;
    const bool keep_if = side == 1;
    const int64_t row = cond->dims().back();
    const bool* c = cond->data<bool>();
    for (int64_t r = 0; row > 0 && r < cond->numel() / row; ++r) {
      bool any = false;
      for (int64_t j = 0; j < row && !any; ++j) any = c[r * row + j] == keep_if;
      if (!any) return nullptr;  // a fully masked row: Where gives uniform weights, a mask would not
    }
    m.where = w;
    m.keep_if = keep_if;
    m.fill = *fill;
    m.absorbed.push_back(w);
    return x;
  }
  return nullptr;
}

// Scalar Mul/Div and at most one masking Where between the score MatMul and `t`. A scalar applied
// after the Where would scale its fill too (a small or negative factor unmasks the keys), so a
// Where is taken only below every scalar op (HF GPT-2: MatMul -> Div -> Where).
const Value* through_scores(const UseMap& u, const Value* t, double& scale, Sdpa& m) {
  bool scaled_after = false;  // a scalar op seen before (above) any Where
  while (true) {
    if (Value* x = through_scalar(u, t, scale, m.absorbed)) {
      scaled_after = scaled_after || !m.where;
      t = x;
    } else if (Value* y = scaled_after ? nullptr : through_where(u, t, m)) {
      t = y;
    } else {
      return t;
    }
  }
}

// The attention ending in pv = MatMul(Softmax(...), V), or nullopt.
std::optional<Sdpa> match(const UseMap& u, const Node& pv) {
  if (pv.inputs.size() != 2 || !pv.inputs[0] || !pv.inputs[1] || !pv.has_output(0)) return std::nullopt;
  Sdpa m;
  // Half-precision exports (HF: softmax(..., dtype=float32).to(dtype)) run the softmax in f32
  // between two Casts; Attention computes its softmax in f32 anyway.
  const Value* p = pv.inputs[0];
  // PyTorch's SDPA exports (both exporters) guard the probabilities: Where(IsNaN(p), 0, p) zeroes
  // the rows a -inf mask left without keys (0 / 0); Attention gives such rows zeros itself. p is
  // then read twice, by the IsNaN and the Where.
  size_t p_reads = 1;
  if (Node* w = sole_producer(u, p, OpKind::kWhere); w && w->inputs.size() == 3 && w->inputs[0] && w->inputs[1] && w->inputs[2]) {
    Node* isnan = sole_producer(u, w->inputs[0], OpKind::kIsNaN);
    const Value* guarded = w->inputs[2];
    const auto zero = scalar_of(u.graph(), w->inputs[1]);
    if (isnan && isnan->inputs.size() == 1 && isnan->inputs[0] == guarded && zero && *zero == 0 &&
        guarded->type == p->type && u.num_uses(guarded) == 2 && !u.is_output(guarded)) {
      m.absorbed.push_back(w);
      m.absorbed.push_back(isnan);
      p = guarded;
      p_reads = 2;
    }
  }
  // The producer of x if it is `op` and x has `reads` readers (checked above when 2) and is no output.
  auto producer = [&u](const Value* x, OpKind op, size_t reads) -> Node* {
    if (reads == 1) return sole_producer(u, x, op);
    return x->producer && x->producer->op == op && x->producer->owner == &u.graph() ? x->producer : nullptr;
  };
  Node* down = producer(p, OpKind::kCast, p_reads);
  Node* sm = producer(down ? down->inputs[0] : p, OpKind::kSoftmax, down ? 1 : p_reads);
  if (!sm || !sm->inputs[0]->type.has_rank()) return std::nullopt;
  const size_t r = sm->inputs[0]->type.shape->dims.size();  // 4: [B,H,S,S]; 3: [B*H,S,S] (bmm exports)
  const int64_t axis = sm->attr_int("axis", -1);
  if ((r != 3 && r != 4) || (axis != -1 && axis != int64_t(r) - 1)) return std::nullopt;
  m.absorbed.push_back(sm);
  const Value* s = sm->inputs[0];
  if (down) {
    Node* up = sole_producer(u, s, OpKind::kCast);
    const DType half = p->type.dtype;
    if (!up || (half != DType::kFloat16 && half != DType::kBFloat16) || s->type.dtype != DType::kFloat32 ||
        up->inputs[0]->type.dtype != half) {
      return std::nullopt;
    }
    m.absorbed.push_back(down);
    m.absorbed.push_back(up);
    s = up->inputs[0];
  }
  if (r == 4) {
    if (const Value* w = through_window_mask(u, s, m)) s = w;
  }
  const Type scores = s->type;
  if (Node* add = sole_producer(u, s, OpKind::kAdd); add && add->inputs.size() == 2) {
    // The operand reached from a MatMul (through scalars) is the scores; the other, the mask.
    for (size_t side = 0; side < 2 && !m.mask; ++side) {
      Sdpa trial;
      double sc = 1.0;
      const Value* t = through_scores(u, add->inputs[side], sc, trial);
      if (!sole_producer(u, t, OpKind::kMatMul) || !(t->type == scores)) continue;
      m.mask = add->inputs[1 - side];
      m.scale = sc;
      m.absorbed.push_back(add);
      m.absorbed.insert(m.absorbed.end(), trial.absorbed.begin(), trial.absorbed.end());
      m.where = trial.where, m.keep_if = trial.keep_if, m.fill = trial.fill;
      s = t;
    }
    for (size_t side = 0; side < 2 && !m.mask; ++side) {  // Add(Add(scores, m1), m2), either order
      Node* inner = sole_producer(u, add->inputs[side], OpKind::kAdd);
      for (size_t is = 0; inner && inner->inputs.size() == 2 && is < 2 && !m.mask; ++is) {
        Sdpa trial;
        double sc = 1.0;
        const Value* t = through_scores(u, inner->inputs[is], sc, trial);
        if (trial.where || !sole_producer(u, t, OpKind::kMatMul) || !(t->type == scores)) continue;
        m.mask = inner->inputs[1 - is];
        m.mask2 = add->inputs[1 - side];
        m.scale = sc;
        m.absorbed.push_back(add);
        m.absorbed.push_back(inner);
        m.absorbed.insert(m.absorbed.end(), trial.absorbed.begin(), trial.absorbed.end());
        s = t;
      }
    }
    if (!m.mask) return std::nullopt;
  } else {
    s = through_scores(u, s, m.scale, m);
  }
  Node* qk = sole_producer(u, s, OpKind::kMatMul);
  if (!qk || qk->inputs.size() != 2 || !(s->type == scores)) return std::nullopt;
  m.absorbed.push_back(qk);
  m.q = qk->inputs[0];
  m.kt = qk->inputs[1];
  while (Value* x = through_scalar(u, m.q, m.scale, m.absorbed)) m.q = x;
  while (Value* x = through_scalar(u, m.kt, m.scale, m.absorbed)) m.kt = x;
  m.v = pv.inputs[1];
  // Shapes: Q [L..,Sq,D], K^T [L..,D,Sk], V [L..,Sk,Dv], scores [L..,Sq,Sk], out [L..,Sq,Dv] with
  // the same leading dims L (B,H or B*H).
  const auto *q = dims_of_rank(m.q, r), *kt = dims_of_rank(m.kt, r), *v = dims_of_rank(m.v, r),
             *sc = dims_of_rank(s, r), *o = dims_of_rank(pv.outputs[0], r);
  if (!q || !kt || !v || !sc || !o) return std::nullopt;
  auto same = [](const Dim& a, const Dim& b) { return a.same_as(b); };
  const size_t a = r - 2, b = r - 1;  // the matrix axes
  for (const auto* d : {kt, v, sc, o}) {
    for (size_t i = 0; i < a; ++i) {
      if (!same((*q)[i], (*d)[i])) return std::nullopt;
    }
  }
  if (!same((*q)[b], (*kt)[a]) || !same((*kt)[b], (*v)[a]) || !same((*sc)[a], (*q)[a]) || !same((*sc)[b], (*kt)[b]) ||
      !same((*o)[a], (*q)[a]) || !same((*o)[b], (*v)[b])) {
    return std::nullopt;
  }
  const DType dt = m.q->type.dtype;
  if (!is_float(dt)) return std::nullopt;
  for (const Value* x : std::initializer_list<const Value*>{m.kt, m.v, s, pv.outputs[0]}) {
    if (x->type.dtype != dt) return std::nullopt;
  }
  if (m.where) {  // the constant mask it becomes: f32, its dims the cond's, last one Sk
    const Type& ct = m.where->inputs[0]->type;
    if (dt != DType::kFloat32 || !ct.has_rank() || !same(ct.shape->dims.back(), (*kt)[b])) return std::nullopt;
  }
  for (const Value* mv : {static_cast<const Value*>(m.mask), static_cast<const Value*>(m.mask2)}) {
    if (!mv) continue;
    const Type& mt = mv->type;
    if (mt.dtype != dt || !mt.has_rank() || mt.shape->dims.empty() || mt.shape->dims.size() > r ||
        !same(mt.shape->dims.back(), (*kt)[b])) {
      return std::nullopt;
    }
  }
  if (m.mask2 && m.windows) return std::nullopt;
  if (m.windows) {  // both masks fold into one constant per (window, head): neither may vary along B
    const Tensor* inner = m.mask ? constant_of(u.graph(), m.mask) : nullptr;
    if (m.where || (m.mask && (!inner || (inner->rank() == 4 && inner->dim(0) != 1)))) return std::nullopt;
  }
  return m;
}

// The axes [0, 1, ..., r-1] with the last two swapped.
std::vector<int64_t> swapped_axes(size_t r) {
  std::vector<int64_t> swap(r);
  for (size_t i = 0; i < r; ++i) swap[i] = int64_t(i);
  std::swap(swap[r - 2], swap[r - 1]);
  return swap;
}

Type with_last_two_swapped(Type t) {
  const size_t r = t.shape->dims.size();
  std::swap(t.shape->dims[r - 2], t.shape->dims[r - 1]);
  return t;
}

// ot = MatMul(V^T, Transpose(P)) whose P ends a chain `match` takes: rewritten as
// Transpose(MatMul(P, Transpose(V^T))), ot's node the outer Transpose; returns the new P.V MatMul
// and adds P's Transpose, now unread, to `dead` and to `p_transposes` (the MatMul's).
Node* untranspose_pv(Graph& g, UseMap& u, Node& ot, std::vector<Node*>& dead, std::map<Node*, Node*>& p_transposes) {
  if (ot.inputs.size() != 2 || !ot.inputs[0] || !ot.inputs[1] || !ot.has_output(0)) return nullptr;
  Node* tp = sole_producer(u, ot.inputs[1], OpKind::kTranspose);
  Value* vt = ot.inputs[0];
  if (!tp || !tp->inputs[0] || !vt->type.has_rank() || !ot.outputs[0]->type.has_rank()) return nullptr;
  const size_t r = vt->type.shape->dims.size();
  if ((r != 3 && r != 4) || tp->attr_ints("perm") != swapped_axes(r) || ot.outputs[0]->type.shape->dims.size() != r) {
    return nullptr;
  }
  // The chain as it would read once rewritten, checked on stand-ins before anything changes.
  Value v_in, o_out;
  v_in.type = with_last_two_swapped(vt->type);
  o_out.type = with_last_two_swapped(ot.outputs[0]->type);
  Node trial;
  trial.op = OpKind::kMatMul;
  trial.inputs = {tp->inputs[0], &v_in};
  trial.outputs = {&o_out};
  if (!match(u, trial)) return nullptr;
  const std::string base = ot.name.empty() ? ot.outputs[0]->name : ot.name;
  Node* v = g.add_node(OpKind::kTranspose, {vt}, 1, g.unique_name(base + "_values"));
  v->attrs["perm"] = Attribute::of_ints(swapped_axes(r));
  v->outputs[0]->type = v_in.type;
  u.add_node(v);
  Node* pv = g.add_node(OpKind::kMatMul, {tp->inputs[0], v->outputs[0]}, 1, g.unique_name(base + "_pv"));
  pv->outputs[0]->type = o_out.type;
  u.set_input(tp, 0, nullptr);  // P's one reader is the new MatMul, as `match` requires
  u.add_node(pv);
  u.set_input(&ot, 0, pv->outputs[0]);
  u.set_input(&ot, 1, nullptr);
  ot.inputs.resize(1);
  ot.op = OpKind::kTranspose;
  ot.attrs.clear();
  ot.attrs["perm"] = Attribute::of_ints(swapped_axes(r));
  dead.push_back(tp);
  p_transposes[pv] = tp;
  return pv;
}

// a + b for two additive masks that both broadcast into the scores (so where neither dim is 1 they
// agree): a new Add node, its dims the two broadcast right-aligned.
Value* add_masks(Graph& g, UseMap& u, Value* a, Value* b, const std::string& name) {
  const std::vector<Dim>& da = a->type.shape->dims;
  const std::vector<Dim>& db = b->type.shape->dims;
  const size_t r = std::max(da.size(), db.size());
  std::vector<Dim> out(r);
  for (size_t i = 0; i < r; ++i) {
    const Dim x = i + da.size() >= r ? da[i + da.size() - r] : Dim(1);
    const Dim y = i + db.size() >= r ? db[i + db.size() - r] : Dim(1);
    out[i] = x.is_static() && x.value() == 1 ? y : x;
  }
  Node* add = g.add_node(OpKind::kAdd, {a, b}, 1, g.unique_name(name));
  add->outputs[0]->type = b->type;
  add->outputs[0]->type.shape = Shape(out);
  u.add_node(add);
  return add->outputs[0];
}

// The additive mask a matched Where stands for, where(cond, 0, fill) (a constant, f32), plus the
// chain's own mask when it has one (an Add node: both broadcast into the scores).
Expected<Value*> where_mask(Graph& g, UseMap& u, const Sdpa& m, const std::string& name) {
  const Tensor& cond = *constant_of(g, m.where->inputs[0]);
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(DType::kFloat32, cond.dims()));
  const bool* c = cond.data<bool>();
  float* o = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) o[i] = c[i] == m.keep_if ? 0.0f : float(m.fill);
  Value* mask = g.add_constant(g.unique_name(name + "_mask"), std::move(t));
  if (!m.mask) return mask;
  return add_masks(g, u, mask, m.mask, name + "_mask_add");
}

// The one mask of a windowed attention seen as [B/W, W*H, Sq, Sk]: [1, W*H, Sq, Sk] with entry
// (w*H + h, i, j) = window_mask[.., w, h, i, j] + mask[.., h, i, j] (broadcast dims read at 0).
Expected<Value*> window_heads_mask(Graph& g, const Sdpa& m, int64_t heads, int64_t sq, int64_t sk, const std::string& name) {
  const Tensor* wm = constant_of(g, m.window_mask);
  const Tensor* bm = m.mask ? constant_of(g, m.mask) : nullptr;
  const int64_t w = m.windows;
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(DType::kFloat32, {1, w * heads, sq, sk}));
  // Element (idx over full dims `full`) of a tensor broadcast right-aligned into them.
  auto at = [](const Tensor& x, const std::vector<int64_t>& full, const std::vector<int64_t>& idx) {
    const std::vector<int64_t> xd = x.dims();
    int64_t off = 0;
    for (size_t i = 0; i < xd.size(); ++i) {
      const size_t fi = full.size() - xd.size() + i;
      off = off * xd[i] + (xd[i] == 1 ? 0 : idx[fi]);
    }
    return x.as_double(off);
  };
  const std::vector<int64_t> full5 = {1, w, heads, sq, sk}, full4 = {1, heads, sq, sk};
  int64_t o = 0;
  for (int64_t wi = 0; wi < w; ++wi) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = 0; j < sk; ++j, ++o) {
          double v = at(*wm, full5, {0, wi, h, i, j});
          if (bm) v += at(*bm, full4, {0, h, i, j});
          t.data<float>()[o] = float(v);
        }
      }
    }
  }
  return g.add_constant(g.unique_name(name + "_window_mask"), std::move(t));
}

// x [B, H, S, D] viewed as [B/W, W*H, S, D] (or back): a Reshape by a constant shape.
Value* reshape_to(Graph& g, UseMap& u, Value* x, const std::vector<int64_t>& dims, const std::string& name) {
  Value* sv = add_i64_constant(g, name + "_shape", dims);
  Node* r = g.add_node(OpKind::kReshape, {x, sv}, 1, g.unique_name(name));
  r->outputs[0]->type = x->type;
  std::vector<Dim> d;
  for (int64_t v : dims) d.push_back(Dim(v));
  r->outputs[0]->type.shape = Shape(d);
  u.add_node(r);
  return r->outputs[0];
}

}  // namespace

Expected<bool> fuse_attention(Graph& g) {
  UseMap uses(g);
  std::vector<Node*> dead;
  std::vector<Node*> roots;
  std::map<std::pair<const Value*, const Value*>, Value*> mask_sums;
  for (const auto& np : g.nodes) {
    if (np->op == OpKind::kMatMul) roots.push_back(np.get());
  }
  std::map<Node*, Node*> p_transposes;  // a rewritten P.V MatMul -> the Transpose of P it replaced
  for (size_t i = 0, n = roots.size(); i < n; ++i) {
    if (Node* pv = untranspose_pv(g, uses, *roots[i], dead, p_transposes)) roots.push_back(pv);
  }
  for (Node* pv : roots) {
    if (pv->op != OpKind::kMatMul) continue;  // a transposed P.V MatMul, now the Transpose after it
    if (std::find(dead.begin(), dead.end(), pv) != dead.end()) continue;
    auto m = match(uses, *pv);
    if (!m) continue;
    // K = K^T with its last two axes swapped: fold into K^T's Transpose when only the score
    // MatMul reads it, else a new Transpose.
    Value* k = nullptr;
    const size_t r = m->kt->type.shape->dims.size();
    std::vector<int64_t> swap(r);  // identity with the last two axes swapped
    for (size_t i = 0; i < r; ++i) swap[i] = int64_t(i);
    std::swap(swap[r - 2], swap[r - 1]);
    Type kt_type = m->kt->type;
    std::swap(kt_type.shape->dims[r - 2], kt_type.shape->dims[r - 1]);
    Node* tr = m->kt->producer;
    if (tr && tr->op == OpKind::kTranspose && tr->owner == &g && uses.num_uses(m->kt) == 1 && !uses.is_output(m->kt) &&
        tr->attr_ints("perm").size() == r) {
      std::vector<int64_t> p = tr->attr_ints("perm");
      if (p == swap && tr->inputs[0]->type == kt_type) {
        k = tr->inputs[0];  // K^T was a transpose of K itself (GPT-2): read K
        dead.push_back(tr);
      } else {
        std::swap(p[r - 2], p[r - 1]);
        tr->attrs["perm"] = Attribute::of_ints(p);
        m->kt->type = kt_type;
        k = m->kt;
      }
    } else {
      Node* t = g.add_node(OpKind::kTranspose, {m->kt}, 1, g.unique_name(m->kt->name + "_keys"));
      t->attrs["perm"] = Attribute::of_ints(swap);
      t->outputs[0]->type = kt_type;
      uses.add_node(t);
      k = t->outputs[0];
    }
    const std::string base = pv->name.empty() ? pv->outputs[0]->name : pv->name;
    if (m->where) {
      KILN_ASSIGN_OR_RETURN(m->mask, where_mask(g, uses, *m, base));
    }
    if (m->mask2) {  // every layer adds the same two masks: one sum serves them all
      Value*& sum = mask_sums[{m->mask, m->mask2}];
      if (!sum) sum = add_masks(g, uses, m->mask, m->mask2, base + "_mask_sum");
      m->mask = sum;
    }
    std::vector<Value*> ins = {m->q, k, m->v};
    // Shifted windows: Q, K, V as [B/W, W*H, S, D], one constant mask per (window, head) broadcast
    // over B/W; a new Attention node, and pv the Reshape back to [B, H, Sq, Dv].
    std::vector<int64_t> out4;
    if (m->windows) {
      const std::vector<int64_t> od = *pv->outputs[0]->type.shape->static_dims();
      const std::vector<int64_t> qd = *m->q->type.shape->static_dims();
      const int64_t w = m->windows, groups = od[0] / w, heads = od[1];
      KILN_ASSIGN_OR_RETURN(m->mask, window_heads_mask(g, *m, heads, qd[2], k->type.shape->dims[2].value(), base));
      for (Value*& x : ins) {
        const std::vector<int64_t> xd = *x->type.shape->static_dims();
        x = reshape_to(g, uses, x, {groups, w * heads, xd[2], xd[3]}, x->name + "_windows");
      }
      out4 = od;
    }
    // 3-D (bmm) attention: Attention's 4-D form with one batch, the B*H matrices as its heads; a
    // mask broadcasts the same way right-aligned.
    Value* axis0 = nullptr;
    if (r == 3) {
      KILN_ASSIGN_OR_RETURN(Tensor zero, Tensor::create(DType::kInt64, {1}));
      zero.data<int64_t>()[0] = 0;
      axis0 = g.add_constant(g.unique_name(base + "_axis0"), std::move(zero));
      for (Value*& x : ins) {
        Node* un = g.add_node(OpKind::kUnsqueeze, {x, axis0}, 1, g.unique_name(x->name + "_4d"));
        un->outputs[0]->type = x->type;
        un->outputs[0]->type.shape->dims.insert(un->outputs[0]->type.shape->dims.begin(), Dim(1));
        uses.add_node(un);
        x = un->outputs[0];
      }
    }
    if (m->mask) ins.push_back(m->mask);
    Node* att = pv;
    if (m->windows) {
      att = g.add_node(OpKind::kAttention, ins, 1, g.unique_name(base + "_attention"));
      att->outputs[0]->type = pv->outputs[0]->type;
      att->outputs[0]->type.shape = Shape({Dim(out4[0] / m->windows), Dim(m->windows * out4[1]), Dim(out4[2]), Dim(out4[3])});
      uses.add_node(att);
      ins = {att->outputs[0], add_i64_constant(g, base + "_heads_shape", out4)};
    } else if (r == 3) {  // a new Attention node; pv becomes the Squeeze back to 3-D, keeping its output
      att = g.add_node(OpKind::kAttention, ins, 1, g.unique_name(base + "_attention"));
      att->outputs[0]->type = pv->outputs[0]->type;
      att->outputs[0]->type.shape->dims.insert(att->outputs[0]->type.shape->dims.begin(), Dim(1));
      uses.add_node(att);
      ins = {att->outputs[0], axis0};
    }
    for (size_t i = 0; i < 2; ++i) uses.set_input(pv, i, nullptr);
    pv->inputs.clear();
    pv->inputs.resize(ins.size(), nullptr);
    for (size_t i = 0; i < ins.size(); ++i) uses.set_input(pv, i, ins[i]);
    pv->attrs.clear();
    pv->op = m->windows ? OpKind::kReshape : r == 3 ? OpKind::kSqueeze : OpKind::kAttention;
    att->attrs["scale"] = Attribute::of_float(float(m->scale));
    for (Node* a : m->absorbed) g.note_absorbed(*a, *att);
    if (auto tp = p_transposes.find(pv); tp != p_transposes.end()) g.note_absorbed(*tp->second, *att);
    dead.insert(dead.end(), m->absorbed.begin(), m->absorbed.end());
  }
  if (dead.empty()) return false;
  erase_unused(uses, dead);
  KILN_RETURN_IF_ERROR(g.topo_sort());
  return true;
}

}  // namespace kiln
