// Scaled-dot-product attention as exported by PyTorch (BERT, GPT-2, ViT), found before lowering
// and replaced by one fused kernel (kernels/attention.cu):
//
//   Qt = Transpose*(q) [* c]      Kt = Transpose*(k) [* c]      Vt = Transpose*(v)
//   P  = Softmax(MatMul(Qt, Kt) [* c | / c] [+ mask], axis=-1) [-> Cast to the same type]
//   O  = MatMul(P, Vt) [-> Transpose(0,2,1,3)]
//
// The transposes are never run: q, k and v (the [B,S,H,D] projection outputs) are read in place
// through composed strides, and O is written straight into [B,S,H,D] when the final transpose is
// there. Scalar multiplies anywhere on the score path fold into one scale. Each inner value must
// have exactly one reader. Half-precision builds only (the kernel is fp16/bf16, head_dim 64).
#include <algorithm>
#include <array>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

// v indexed [i0..i3] reads base at base dim perm[i]; base is materialized row-major.
struct AttnView {
  const Value* base = nullptr;
  std::array<int, 4> perm = {0, 1, 2, 3};
};

struct AttentionMatch {
  AttnView q, k, v;           // q, v: [B,H,S,D]; k: [B,H,D,S]
  const Value* mask = nullptr;  // additive, broadcast to [B,H,Sq,Sk]
  double scale = 1.0;
  bool out_bshd = false;      // root is the Transpose(0,2,1,3): O written as [B,S,H,D]
  int64_t b = 0, h = 0, sq = 0, sk = 0, d = 0;
};

namespace {

std::optional<std::vector<int64_t>> static_dims(const Value* v) {
  if (!v->type.shape) return std::nullopt;
  std::vector<int64_t> d;
  for (const Dim& x : v->type.shape->dims) {
    if (!x.is_static()) return std::nullopt;
    d.push_back(x.value());
  }
  return d;
}

std::optional<double> scalar(Lowering& L, const Value* v) {
  const Tensor* t = L.constant(v);
  if (!t || t->numel() != 1 || !dtype_is_float(t->dtype())) return std::nullopt;
  return t->as_double(0);
}

// The producer of v, if it is `op` and v has exactly one reader (and is no graph output).
const Node* sole(Lowering& L, const Value* v, OpKind op) {
  return v && v->producer && v->producer->op == op && L.only_consumer(v) ? v->producer : nullptr;
}

// Mul(x, c) / Mul(c, x) with a scalar constant c: returns x and multiplies scale by c.
const Value* through_scale(Lowering& L, const Node* n, double& scale) {
  if (!n || n->inputs.size() != 2) return nullptr;
  for (int side = 0; side < 2; ++side) {
    auto c = scalar(L, n->inputs[size_t(1 - side)]);
    if (!c) continue;
    if (n->op == OpKind::kMul) {
      scale *= *c;
      return n->inputs[size_t(side)];
    }
    if (n->op == OpKind::kDiv && side == 0 && *c != 0) {
      scale /= *c;
      return n->inputs[0];
    }
  }
  return nullptr;
}

// Walks back from v through single-reader Transposes (and scalar Muls when `scale` is given).
std::optional<AttnView> view(Lowering& L, const Value* v, double* scale, std::vector<const Node*>& fused) {
  AttnView r;
  const Value* cur = v;
  for (int guard = 0; guard < 8; ++guard) {
    if (const Node* t = sole(L, cur, OpKind::kTranspose)) {
      std::vector<int64_t> p = t->attr_ints("perm", {3, 2, 1, 0});
      if (p.size() != 4) return std::nullopt;
      for (int& x : r.perm) x = int(p[size_t(x)]);
      fused.push_back(t);
      cur = t->inputs[0];
      continue;
    }
    if (const Node* m = scale ? sole(L, cur, OpKind::kMul) : nullptr) {
      const Value* x = through_scale(L, m, *scale);
      if (!x) break;
      fused.push_back(m);
      cur = x;
      continue;
    }
    break;
  }
  auto d = static_dims(cur);
  if (!d || d->size() != 4) return std::nullopt;
  r.base = cur;
  return r;
}

std::vector<int64_t> view_dims(const AttnView& v) {
  std::vector<int64_t> base = *static_dims(v.base), out(4);
  for (int i = 0; i < 4; ++i) out[size_t(i)] = base[size_t(v.perm[size_t(i)])];
  return out;
}

// Strides of the view's axes in elements of its (contiguous) base.
std::array<int64_t, 4> view_strides(const AttnView& v) {
  std::vector<int64_t> s = contiguous_strides(*static_dims(v.base));
  std::array<int64_t, 4> r{};
  for (int i = 0; i < 4; ++i) r[size_t(i)] = s[size_t(v.perm[size_t(i)])];
  return r;
}

bool aligned(const std::array<int64_t, 4>& s, int d_axis) {
  for (int i = 0; i < 4; ++i) {
    if (i == d_axis ? s[size_t(i)] != 1 : s[size_t(i)] % 8 != 0) return false;
  }
  return true;
}

std::optional<std::pair<AttentionMatch, std::vector<const Node*>>> match(Lowering& L, const Node& sm) {
  std::vector<const Node*> fused = {&sm};
  AttentionMatch m;
  const Value* x = sm.inputs[0];
  auto xd = static_dims(x);
  if (!xd || xd->size() != 4) return std::nullopt;
  int64_t axis = sm.attr_int("axis", -1);
  if (axis != -1 && axis != 3) return std::nullopt;
  // Scores side: [+ mask] [* c | / c]* MatMul.
  const Node* mm = nullptr;
  const Value* s = x;
  if (const Node* add = sole(L, s, OpKind::kAdd)) {
    for (int side = 0; side < 2 && !mm; ++side) {
      double sc = 1.0;
      std::vector<const Node*> f;
      const Value* t = add->inputs[size_t(side)];
      while (const Node* n = sole(L, t, OpKind::kMul) ? sole(L, t, OpKind::kMul) : sole(L, t, OpKind::kDiv)) {
        const Value* u = through_scale(L, n, sc);
        if (!u) break;
        f.push_back(n);
        t = u;
      }
      if (const Node* c = sole(L, t, OpKind::kMatMul)) {
        mm = c;
        m.scale = sc;
        m.mask = add->inputs[size_t(1 - side)];
        fused.push_back(add);
        fused.insert(fused.end(), f.begin(), f.end());
      }
    }
  } else {
    while (const Node* n = sole(L, s, OpKind::kMul) ? sole(L, s, OpKind::kMul) : sole(L, s, OpKind::kDiv)) {
      const Value* u = through_scale(L, n, m.scale);
      if (!u) break;
      fused.push_back(n);
      s = u;
    }
    mm = sole(L, s, OpKind::kMatMul);
  }
  if (!mm) return std::nullopt;
  fused.push_back(mm);
  // Probabilities side: [Cast to the same type] -> MatMul(P, Vt) [-> Transpose(0,2,1,3)].
  const Value* p = sm.outputs[0];
  const Node* pv = L.only_consumer(p);
  if (pv && pv->op == OpKind::kCast && pv->outputs[0]->type.dtype == p->type.dtype) {
    fused.push_back(pv);
    p = pv->outputs[0];
    pv = L.only_consumer(p);
  }
  if (!pv || pv->op != OpKind::kMatMul || pv->inputs[0] != p) return std::nullopt;
  const Node* root = pv;
  if (const Node* t = L.only_consumer(pv->outputs[0]);
      t && t->op == OpKind::kTranspose && t->attr_ints("perm") == std::vector<int64_t>{0, 2, 1, 3}) {
    fused.push_back(pv);
    root = t;
    m.out_bshd = true;
  }
  auto q = view(L, mm->inputs[0], &m.scale, fused);
  auto k = view(L, mm->inputs[1], &m.scale, fused);
  auto v = view(L, pv->inputs[1], nullptr, fused);
  if (!q || !k || !v) return std::nullopt;
  m.q = *q;
  m.k = *k;
  m.v = *v;
  std::vector<int64_t> qd = view_dims(m.q), kd = view_dims(m.k), vd = view_dims(m.v);
  m.b = qd[0], m.h = qd[1], m.sq = qd[2], m.d = qd[3], m.sk = kd[3];
  if (kd != std::vector<int64_t>{m.b, m.h, m.d, m.sk} || vd != std::vector<int64_t>{m.b, m.h, m.sk, m.d}) return std::nullopt;
  if (*xd != std::vector<int64_t>{m.b, m.h, m.sq, m.sk}) return std::nullopt;
  if (!aligned(view_strides(m.q), 3) || !aligned(view_strides(m.k), 2) || !aligned(view_strides(m.v), 3)) {
    return std::nullopt;
  }
  if (m.mask) {
    auto md = static_dims(m.mask);
    if (!md || md->size() > 4 || !dtype_is_float(m.mask->type.dtype)) return std::nullopt;
    for (size_t i = 0; i < md->size(); ++i) {
      int64_t want = (*xd)[4 - md->size() + i];
      if ((*md)[i] != 1 && (*md)[i] != want) return std::nullopt;
    }
  }
  for (const Value* t : {m.q.base, m.k.base, m.v.base}) {
    if (t->type.dtype != sm.outputs[0]->type.dtype) return std::nullopt;
  }
  auto dt = L.device_dt(sm.outputs[0]->type.dtype);
  if (!dt || !k::attention_supported(*dt, int(m.d))) return std::nullopt;
  fused.erase(std::remove(fused.begin(), fused.end(), root), fused.end());
  return std::make_pair(m, fused);
}

}  // namespace

void find_attention(Lowering& L) {
  for (const auto& up : L.graph().nodes) {
    const Node& n = *up;
    if (n.op != OpKind::kSoftmax || L.is_fused(&n)) continue;
    auto r = match(L, n);
    if (!r) continue;
    bool clash = false;  // a node already claimed by another pattern
    for (const Node* f : r->second) clash = clash || L.is_fused(f) || L.replacements.count(f);
    if (clash) continue;
    // The root: the last node of the chain (the output transpose, or the P.V MatMul).
    const Node* pv = L.only_consumer(n.outputs[0]);
    if (pv->op == OpKind::kCast) pv = L.only_consumer(pv->outputs[0]);
    const Node* root = r->first.out_bshd ? L.only_consumer(pv->outputs[0]) : pv;
    for (const Node* f : r->second) L.mark_fused(f, root);
    Replacement rep;
    rep.attention = std::make_shared<AttentionMatch>(r->first);
    L.replacements[root] = rep;
  }
}

Status lower_attention(Lowering& L, const Node& root, const AttentionMatch& m) {
  KILN_ASSIGN_OR_RETURN(const DevValue* q, L.rowmajor(m.q.base));
  KILN_ASSIGN_OR_RETURN(const DevValue* kv, L.rowmajor(m.k.base));
  KILN_ASSIGN_OR_RETURN(const DevValue* v, L.rowmajor(m.v.base));
  const DevValue* mask = nullptr;
  if (m.mask) {
    KILN_ASSIGN_OR_RETURN(mask, L.rowmajor(m.mask));
  }
  k::AttentionShape sh{};
  sh.b = int(m.b), sh.h = int(m.h), sh.sq = int(m.sq), sh.sk = int(m.sk), sh.d = int(m.d);
  auto qs = view_strides(m.q), ks = view_strides(m.k), vs = view_strides(m.v);
  int64_t qk[3] = {qs[0], qs[1], qs[2]}, kk[3] = {ks[0], ks[1], ks[3]}, vv[3] = {vs[0], vs[1], vs[2]};
  std::copy(qk, qk + 3, sh.q);
  std::copy(kk, kk + 3, sh.k);
  std::copy(vv, vv + 3, sh.v);
  const DevValue& y = L.define(root.outputs[0]);
  if (m.out_bshd) {  // y [B,Sq,H,D]
    sh.o[0] = m.sq * m.h * m.d, sh.o[1] = m.d, sh.o[2] = m.h * m.d;
  } else {  // y [B,H,Sq,D]
    sh.o[0] = m.h * m.sq * m.d, sh.o[1] = m.sq * m.d, sh.o[2] = m.d;
  }
  k::DT mdt = k::DT::kF32;
  Ref mr;
  if (mask) {
    std::vector<int64_t> ms = broadcast_strides(*mask, {m.b, m.h, m.sq, m.sk});
    std::copy(ms.begin(), ms.end(), sh.m);
    mdt = mask->dt;
    mr = mask->ref;
  }
  bool has_mask = mask != nullptr;
  Ref qr = q->ref, kr = kv->ref, vr = v->ref, yr = y.ref;
  k::DT dt = y.dt;
  float scale = float(m.scale);
  std::vector<int> reads = {qr.weight ? -1 : qr.id, kr.weight ? -1 : kr.id, vr.weight ? -1 : vr.id};
  if (has_mask) reads.push_back(mr.weight ? -1 : mr.id);
  L.emit(&root,
         fmt::format("kernel attention (fused, b={} h={} sq={} sk={} d={}{}{})", m.b, m.h, m.sq, m.sk, m.d,
                     has_mask ? " +mask" : "", m.out_bshd ? ", out BSHD" : ""),
         reads, {yr.id}, [=](const RunCtx& c) {
           return cuda_status(k::attention(dt, c.ptr(qr), c.ptr(kr), c.ptr(vr), has_mask ? c.ptr(mr) : nullptr, mdt,
                                           c.ptr(yr), sh, scale, c.stream),
                              "attention");
         });
  return Status::ok();
}

}  // namespace kiln::cuda
