// ONNX Attention nodes on one fused kernel (kernels/attention.cu). The fusion itself is decided
// by the fuse-attention pass (src/passes/fuse_attention.cc), which turns the Softmax(MatMul(Q, K)
// ...) chains PyTorch exports into Attention nodes; the lowering only chooses how to run them.
//
// Q, K and V are read in place through the data-movement chains that produced them, view() below:
// any chain of Transpose, Reshape, Squeeze, Unsqueeze, Flatten, Gather of one index, Split or Slice
// that is a strided view of its source (StridedView): BERT's head transposes, GPT-2's Split of the
// packed QKV, ViT's unbind of it. O is written straight into a following head transpose; the
// chains are skipped once nothing else reads them. Half-precision builds only (the kernel is
// fp16/bf16, head dim 32 or 64).
//
// An Attention node the kernel cannot take (fp32/tf32 builds, other head sizes) but that has
// nothing beyond Q, K, V and an additive mask still runs on the GPU, unfused: two batched cuBLASLt GEMMs around a mask add and a softmax. Only past K/V, causal,
// softcap, sliding windows and the extra outputs leave it to the CPU kernel.
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <unordered_set>

#include "backends/cuda/lower.h"
#include "runtime/strided_view.h"

namespace kiln::cuda {

// v read straight out of base (materialized, row-major) through a strided view.
struct AttnView {
  const Value* base = nullptr;
  StridedView view = StridedView::contiguous({});
};

struct AttentionMatch {
  AttnView q, k, v;           // q, v: [B,H,S,D]; k: [B,H,D,S]
  const Value* mask = nullptr;  // additive, broadcast to [B,H,Sq,Sk]
  double scale = 1.0;
  std::vector<int64_t> out_perm;  // root is Transpose(O, out_perm) (d innermost); empty: root is P.V
  std::optional<std::array<int64_t, 3>> o_strides;  // set: O's (b, h, query) strides, overriding out_perm
  int64_t b = 0, h = 0, sq = 0, sk = 0, d = 0;
};

namespace {

std::optional<std::vector<int64_t>> static_dims(const Value* v) {
  return v->type.shape ? v->type.shape->static_dims() : std::nullopt;
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

bool is_view_op(Lowering& L, const Node* n) {
  switch (n->op) {
    case OpKind::kTranspose: case OpKind::kReshape: case OpKind::kSqueeze: case OpKind::kUnsqueeze:
    case OpKind::kFlatten: case OpKind::kIdentity:
      return true;
    case OpKind::kGather: {
      const Tensor* idx = L.constant(n->inputs[1]);
      return idx && idx->numel() == 1 && idx->rank() <= 1;
    }
    case OpKind::kSplit: return n->inputs[0]->type.shape && !n->outputs.empty();
    case OpKind::kSlice: {  // constant starts/ends/axes, steps of 1
      for (size_t i = 1; i < n->inputs.size(); ++i) {
        if (n->has_input(int(i)) && !L.constant(n->inputs[i])) return false;
      }
      const Tensor* steps = n->has_input(4) ? L.constant(n->inputs[4]) : nullptr;
      if (steps) {
        for (int64_t i = 0; i < steps->numel(); ++i) {
          if (steps->as_double(i) != 1) return false;
        }
      }
      return n->inputs.size() >= 3;
    }
    default: return false;
  }
}

// Slice with constant starts/axes and unit steps: the output's dims give the lengths.
bool narrow_slice(Lowering& L, const Node& p, StridedView& v, const std::vector<int64_t>& out) {
  const Tensor* starts = L.constant(p.inputs[1]);
  const Tensor* axes = p.has_input(3) ? L.constant(p.inputs[3]) : nullptr;
  std::vector<int64_t> in = v.dims();
  int64_t rank = int64_t(in.size());
  for (int64_t i = 0; starts && i < starts->numel(); ++i) {
    int64_t axis = axes ? int64_t(axes->as_double(i)) : i;
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return false;
    int64_t st = int64_t(starts->as_double(i)), n = in[size_t(axis)];
    if (st < 0) st += n;
    st = std::clamp<int64_t>(st, 0, n);
    if (!v.narrow(int(axis), st, out[size_t(axis)])) return false;
  }
  return starts != nullptr;
}

// Walks back from v through data-movement ops (any number of readers: they only re-address
// bytes) and single-reader scalar Muls (when `scale` is given), then replays the chain forward
// as a strided view of where it started.
std::optional<AttnView> view(Lowering& L, const Value* v, double* scale, std::vector<const Node*>& fused, int rank = 4) {
  std::vector<std::pair<const Node*, const Value*>> chain;  // node and the output taken
  const Value* cur = v;
  while (cur->producer && chain.size() < 32) {
    const Node* p = cur->producer;
    if (is_view_op(L, p)) {
      chain.emplace_back(p, cur);
      cur = p->inputs[0];
      continue;
    }
    if (const Node* m = scale ? sole(L, cur, OpKind::kMul) : nullptr) {
      double sc = *scale;
      const Value* x = through_scale(L, m, sc);
      if (!x) break;
      *scale = sc;
      fused.push_back(m);
      cur = x;
      continue;
    }
    break;
  }
  auto d = static_dims(cur);
  if (!d) return std::nullopt;
  AttnView r{cur, StridedView::contiguous(*d)};
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Node* p = it->first;
    auto out = static_dims(it->second);
    if (!out) return std::nullopt;
    bool ok = true;
    int64_t rank = int64_t(r.view.dims().size());
    if (p->op == OpKind::kTranspose) {
      std::vector<int64_t> perm = p->attr_ints("perm");
      if (perm.empty()) {
        for (size_t i = r.view.dims().size(); i-- > 0;) perm.push_back(int64_t(i));
      }
      ok = r.view.transpose(perm);
    } else if (p->op == OpKind::kGather) {
      const Tensor* idx = L.constant(p->inputs[1]);
      int64_t axis = p->attr_int("axis", 0);
      if (axis < 0) axis += rank;
      ok = r.view.select(int(axis), int64_t(idx->as_double(0)), idx->rank() == 1);
    } else if (p->op == OpKind::kSplit) {  // the output's start: the sizes of the outputs before it
      int64_t axis = p->attr_int("axis", 0), start = 0;
      if (axis < 0) axis += rank;
      size_t which = 0;
      while (which < p->outputs.size() && p->outputs[which] != it->second) ++which;
      for (size_t i = 0; i < which; ++i) {
        auto od = static_dims(p->outputs[i]);
        if (!od || od->size() != size_t(rank)) return std::nullopt;
        start += (*od)[size_t(axis)];
      }
      ok = axis >= 0 && axis < rank && r.view.narrow(int(axis), start, (*out)[size_t(axis)]);
    } else if (p->op == OpKind::kSlice) {
      ok = narrow_slice(L, *p, r.view, *out);
    } else if (p->op != OpKind::kIdentity) {
      ok = r.view.reshape(*out);
    }
    if (!ok || r.view.dims() != *out) return std::nullopt;
  }
  if (r.view.dims().size() != size_t(rank) || !r.view.strides()) return std::nullopt;
  return r;
}

std::array<int64_t, 4> view_strides(const AttnView& v) {
  std::vector<int64_t> s = *v.view.strides();
  return {s[0], s[1], s[2], s[3]};
}

bool aligned(const AttnView& v, int d_axis) {
  auto s = view_strides(v);
  for (int i = 0; i < 4; ++i) {
    if (i == d_axis ? s[size_t(i)] != 1 : s[size_t(i)] % 8 != 0) return false;
  }
  return v.view.offset() % 8 == 0;
}

// An additive mask the kernels read through broadcast strides: static, float, rank <= 4,
// broadcasting to `full` ([B,H,Sq,Sk]).
Status check_mask(const Value* mask, const std::vector<int64_t>& full) {
  auto md = static_dims(mask);
  if (!md || md->size() > 4 || !dtype_is_float(mask->type.dtype)) KILN_UNSUPPORTED("Attention with a boolean or dynamic mask");
  for (size_t i = 0; i < md->size(); ++i) {
    int64_t want = full[4 - md->size() + i];
    if ((*md)[i] != 1 && (*md)[i] != want) KILN_UNSUPPORTED("Attention mask {} does not broadcast to [B,H,Sq,Sk]", mask->type.to_string());
  }
  // ONNX Attention reads a last dim shorter than Sk as padding (masked keys), not as a broadcast.
  if (md->empty() || md->back() != full[3]) KILN_UNSUPPORTED("Attention mask {} is shorter than the keys", mask->type.to_string());
  return Status::ok();
}

// Attention features neither GPU form has (the CPU kernel runs them).
Status check_plain_attention(const Node& n) {
  for (size_t i = 4; i < n.inputs.size(); ++i) {
    if (n.has_input(i)) KILN_UNSUPPORTED("Attention with past key/value or sequence lengths");
  }
  for (size_t i = 1; i < n.outputs.size(); ++i) {
    if (n.has_output(i)) KILN_UNSUPPORTED("Attention with present key/value or qk_matmul_output outputs");
  }
  if (n.attr_int("is_causal", 0) != 0 || n.attr_float("softcap", 0.0f) != 0.0f ||
      n.attr_int("left_window_size", -1) != -1 || n.attr_int("right_window_size", -1) != -1) {
    KILN_UNSUPPORTED("Attention with is_causal, softcap or a sliding window");
  }
  return Status::ok();
}

struct Found {
  AttentionMatch m;
  std::vector<const Node*> fused;
  const Node* root = nullptr;  // the chain's last node (the output transpose, or the P.V MatMul)
};

}  // namespace

Expected<AttentionMatch> match_attention_node(Lowering& L, const Node& n, bool through_views);

namespace {

// An ONNX Attention node (fuse-attention's, or the model's own) read through its inputs' views,
// writing O straight into a following head transpose ([B,H,S,D] -> [B,S,H,D]) when that is its
// only reader.
std::optional<Found> match_node(Lowering& L, const Node& n) {
  auto m = match_attention_node(L, n, true);
  if (!m) return std::nullopt;
  Found f{*m, {}, &n};
  if (const Node* t = L.only_consumer(n.outputs[0]); t && t->op == OpKind::kTranspose && !m->o_strides) {
    std::vector<int64_t> perm = t->attr_ints("perm");
    if (perm.size() == 4 && perm[3] == 3 && static_dims(t->outputs[0])) {
      f.fused = {&n};
      f.root = t;
      f.m.out_perm = perm;
    }
  }
  return f;
}

}  // namespace

void find_attention(Lowering& L) {
  std::unordered_set<const Value*> read_whole;  // what the kernels read as buffers: never skipped
  for (const auto& up : L.graph().nodes) {
    const Node& n = *up;
    if (n.op != OpKind::kAttention || L.is_fused(&n)) continue;
    auto r = match_node(L, n);
    if (!r) continue;
    bool clash = false;  // a node already claimed by another pattern
    for (const Node* f : r->fused) clash = clash || L.is_fused(f) || L.replacements.count(f);
    if (clash) continue;
    for (const Node* f : r->fused) L.mark_fused(f, r->root);
    read_whole.insert({r->m.q.base, r->m.k.base, r->m.v.base, r->m.mask});
    Replacement rep;
    rep.attention = std::make_shared<AttentionMatch>(r->m);
    L.replacements[r->root] = rep;
  }
  // The data-movement chains the fused kernels read through (ViT's QKV unbind: a 5-D transpose
  // copy and three gathers per layer) are dead once every reader is fused into an attention
  // (which reads the chain's source, never its values): skip them too, except where a kernel reads
  // a value whole (a mask from a Reshape, an input no view reached). Readers come later in
  // topological order, so one reverse sweep settles whole chains.
  auto into_attention = [&](const Node* r) -> const Node* {
    const Node* root = L.fused_into(r) ? L.fused_into(r) : r;  // r itself: an Attention root
    auto it = L.replacements.find(root);
    return it != L.replacements.end() && it->second.attention ? root : nullptr;
  };
  const auto& nodes = L.graph().nodes;
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    const Node& n = **it;
    if (L.is_fused(&n) || L.replacements.count(&n) || !is_view_op(L, &n)) continue;
    const Node* into = nullptr;
    bool dead = true;
    for (const Value* o : n.outputs) {
      if (!o) continue;
      dead = dead && !L.is_graph_output(o) && !read_whole.count(o);
      for (const Node* r : L.readers(o)) {
        const Node* root = into_attention(r);
        dead = dead && root;
        if (!into) into = root;
      }
    }
    if (dead && into) L.mark_fused(&n, into);
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
  if (m.o_strides) {
    std::copy(m.o_strides->begin(), m.o_strides->end(), sh.o);
  } else if (!m.out_perm.empty()) {  // y = Transpose(O, perm), contiguous: O's dim perm[j] has y's stride j
    std::vector<int64_t> ys = contiguous_strides(y.dims);
    for (int j = 0; j < 3; ++j) sh.o[m.out_perm[size_t(j)]] = ys[size_t(j)];
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
  const bool has_mask = mask != nullptr;
  const k::DT dt = y.dt;
  const size_t eb = size_t(k::dt_size(dt));
  std::vector<int> reads = {q->ref.weight ? -1 : q->ref.id, kv->ref.weight ? -1 : kv->ref.id, v->ref.weight ? -1 : v->ref.id};
  if (has_mask) reads.push_back(mr.weight ? -1 : mr.id);
  sh.pdl = L.follows_trigger();
  ByteWriter w;
  w.put(int32_t(dt));
  w.put(int32_t(mdt));
  put(w, q->ref);
  put(w, kv->ref);
  put(w, v->ref);
  put(w, mr);
  put(w, y.ref);
  for (int64_t off : {m.q.view.offset(), m.k.view.offset(), m.v.view.offset()}) w.i64(off * int64_t(eb));
  for (int x : {sh.b, sh.h, sh.sq, sh.sk, sh.d}) w.put(int32_t(x));
  for (const int64_t* a : {sh.q, sh.k, sh.v, sh.o}) {
    for (int i = 0; i < 3; ++i) w.i64(a[i]);
  }
  for (int i = 0; i < 4; ++i) w.i64(sh.m[i]);
  w.u8(sh.pdl);
  w.put(float(m.scale));
  L.emit(&root,
         fmt::format("kernel attention (fused, b={} h={} sq={} sk={} d={}{}{}{})", m.b, m.h, m.sq, m.sk, m.d,
                     !has_mask ? "" : k::attention_row_mask(sh, mdt) ? " +row mask" : " +mask",
                     m.out_perm.empty() ? "" : ", output transposed", sh.pdl ? ", programmatic launch" : ""),
         reads, {y.ref.id}, StepOp::kAttention, std::move(w));
  L.steps.back().triggers_dependents = true;  // the kernel calls pdl_launch_dependents() early
  return Status::ok();
}

namespace {

Expected<StepFn> bind_attention(Params& in, BindCtx&) {
  const k::DT dt = in.dt(), mdt = in.dt();
  const Ref qr = in.ref(), kr = in.ref(), vr = in.ref(), mr = in.opt_ref(), yr = in.ref();
  const int64_t qo = in.i64(), ko = in.i64(), vo = in.i64();
  k::AttentionShape sh{};
  for (int* x : {&sh.b, &sh.h, &sh.sq, &sh.sk, &sh.d}) *x = in.i32();
  for (int64_t* a : {sh.q, sh.k, sh.v, sh.o}) {
    for (int i = 0; i < 3; ++i) a[i] = in.i64();
  }
  for (int i = 0; i < 4; ++i) sh.m[i] = in.i64();
  sh.pdl = in.flag();
  const float scale = in.f32();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    auto at = [&](Ref r, int64_t off) { return static_cast<const char*>(c.ptr(r)) + off; };
    return cuda_status(k::attention(dt, at(qr, qo), at(kr, ko), at(vr, vo), mr.id >= 0 ? c.ptr(mr) : nullptr, mdt,
                                    c.ptr(yr), sh, scale, c.stream),
                       "attention");
  });
}

}  // namespace

void register_attention_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kAttention] = bind_attention; }

// ONNX Attention (opset 23+) on the fused kernel: Q, K, V as 4-D [B, H, S, D] or 3-D [B, S, H*D]
// (q_num_heads / kv_num_heads), as many K/V heads as Q heads, an additive float mask or none, no
// past K/V, causal flag, softcap, sliding window or extra outputs; half precision, head dim 32 or 64.
// through_views: Q, K and V are read in place through the data-movement chains that produced
// them (find_attention, for the nodes fuse-attention makes); else from their own buffers.
Expected<AttentionMatch> match_attention_node(Lowering& L, const Node& n, bool through_views) {
  KILN_RETURN_IF_ERROR(check_plain_attention(n));
  auto qd = static_dims(n.inputs[0]), kd = static_dims(n.inputs[1]), vd = static_dims(n.inputs[2]);
  auto yd = static_dims(n.outputs[0]);
  if (!qd || !kd || !vd || !yd || qd->size() != kd->size() || qd->size() != vd->size() ||
      (qd->size() != 3 && qd->size() != 4)) {
    KILN_UNSUPPORTED("Attention needs static 3-D or 4-D Q, K and V");
  }
  const bool three_d = qd->size() == 3;
  AttentionMatch m;
  // [B, H, S, D] views of the inputs; K as [B, H, D, S], as the kernel reads it.
  auto heads_view = [&](const Value* v, const std::vector<int64_t>& d, int64_t heads, bool key) -> std::optional<AttnView> {
    std::vector<const Node*> no_scalars;
    std::optional<AttnView> in = through_views ? view(L, v, nullptr, no_scalars, int(d.size())) : std::nullopt;
    AttnView r = in ? *in : AttnView{v, StridedView::contiguous(d)};
    bool ok = true;
    if (three_d) {
      if (heads <= 0 || d[2] % heads != 0) return std::nullopt;
      ok = r.view.reshape({d[0], d[1], heads, d[2] / heads}) && r.view.transpose(key ? std::vector<int64_t>{0, 2, 3, 1}
                                                                                     : std::vector<int64_t>{0, 2, 1, 3});
    } else if (key) {
      ok = r.view.transpose({0, 1, 3, 2});
    }
    if (!ok || !r.view.strides()) return std::nullopt;
    return r;
  };
  int64_t qh = three_d ? n.attr_int("q_num_heads", 0) : (*qd)[1];
  int64_t kvh = three_d ? n.attr_int("kv_num_heads", 0) : (*kd)[1];
  auto q = heads_view(n.inputs[0], *qd, qh, false);
  auto k = heads_view(n.inputs[1], *kd, kvh, true);
  auto v = heads_view(n.inputs[2], *vd, kvh, false);
  if (!q || !k || !v || qh != kvh) KILN_UNSUPPORTED("Attention with grouped K/V heads or mismatched head counts");
  m.q = *q, m.k = *k, m.v = *v;
  std::vector<int64_t> qv = m.q.view.dims(), kv = m.k.view.dims(), vv = m.v.view.dims();
  m.b = qv[0], m.h = qv[1], m.sq = qv[2], m.d = qv[3], m.sk = kv[3];
  if (kv != std::vector<int64_t>{m.b, m.h, m.d, m.sk} || vv != std::vector<int64_t>{m.b, m.h, m.sk, m.d}) {
    KILN_UNSUPPORTED("Attention with a V head size unlike Q's or mismatched batch/sequence dims");
  }
  if (!aligned(m.q, 3) || !aligned(m.k, 2) || !aligned(m.v, 3)) KILN_UNSUPPORTED("Attention with unaligned heads");
  m.scale = n.has_attr("scale") ? double(n.attr_float("scale", 1.0f)) : 1.0 / std::sqrt(double(m.d));
  if (n.has_input(3)) {
    m.mask = n.inputs[3];
    KILN_RETURN_IF_ERROR(check_mask(m.mask, {m.b, m.h, m.sq, m.sk}));
  }
  for (const Value* t : {n.inputs[0], n.inputs[1], n.inputs[2]}) {
    if (t->type.dtype != n.outputs[0]->type.dtype) KILN_UNSUPPORTED("Attention with mixed input types");
  }
  auto dt = L.device_dt(n.outputs[0]->type.dtype);
  if (!dt || !k::attention_supported(*dt, int(m.d))) {
    KILN_UNSUPPORTED("the fused attention kernel is fp16/bf16 with head dim 32 or 64 (head dim {})", m.d);
  }
  if (three_d) {  // Y [B, Sq, H*D]
    m.o_strides = std::array<int64_t, 3>{m.sq * m.h * m.d, m.d, m.h * m.d};
  }
  return m;
}

// A 4-D Attention the fused kernel does not take (fp32/tf32 builds, other head sizes), still on
// the GPU: S = scale * Q.K^T (cuBLASLt, batched over B*H), S += mask, P = Softmax(S), Y = P.V.
// The S x S scores go through two arena temporaries.
Status lower_attention_unfused(Lowering& L, const Node& n) {
  auto qd = static_dims(n.inputs[0]), kd = static_dims(n.inputs[1]), vd = static_dims(n.inputs[2]);
  if (!qd || qd->size() != 4 || !kd || !vd || kd->size() != 4 || vd->size() != 4) KILN_UNSUPPORTED("3-D Attention");
  const int64_t b = (*qd)[0], h = (*qd)[1], sq = (*qd)[2], d = (*qd)[3], sk = (*kd)[2], dv = (*vd)[3];
  if ((*kd)[0] != b || (*vd)[0] != b || (*kd)[1] != h || (*vd)[1] != h || (*kd)[3] != d || (*vd)[2] != sk) {
    KILN_UNSUPPORTED("Attention with grouped K/V heads or mismatched dims");
  }
  const std::vector<int64_t> sdims = {b, h, sq, sk};
  if (n.has_input(3)) KILN_RETURN_IF_ERROR(check_mask(n.inputs[3], sdims));
  for (const Value* t : {n.inputs[0], n.inputs[1], n.inputs[2]}) {
    if (t->type.dtype != n.outputs[0]->type.dtype) KILN_UNSUPPORTED("Attention with mixed input types");
  }
  if (n.has_input(3) && n.inputs[3]->type.dtype != n.outputs[0]->type.dtype) KILN_UNSUPPORTED("Attention mask of another dtype");
  KILN_ASSIGN_OR_RETURN(const DevValue* q, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* k, L.rowmajor(n.inputs[1]));
  KILN_ASSIGN_OR_RETURN(const DevValue* v, L.rowmajor(n.inputs[2]));
  const DevValue* mask = nullptr;
  if (n.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(mask, L.rowmajor(n.inputs[3]));
  }
  const DevValue& y = L.define(n.outputs[0]);
  const k::DT dt = y.dt;
  if (dt != k::DT::kF32 && dt != k::DT::kF16 && dt != k::DT::kBF16) {  // the softmax between the GEMMs
    KILN_UNSUPPORTED("Attention on {}", dtype_name(y.ir_dtype));
  }
  DevValue s = y, p = y;  // the scores and probabilities, [B,H,Sq,Sk]
  s.dims = p.dims = sdims;
  s.ref = Ref{false, L.scratch(s.bytes())};
  p.ref = Ref{false, L.scratch(p.bytes())};
  GemmShape qk;
  qk.m = sq, qk.n = sk, qk.k = d, qk.trans_b = true;
  qk.batch = b * h, qk.stride_a = sq * d, qk.stride_b = sk * d, qk.stride_d = sq * sk;
  Epilogue scaled;
  scaled.alpha = float(n.has_attr("scale") ? double(n.attr_float("scale", 1.0f)) : 1.0 / std::sqrt(double(d)));
  KILN_RETURN_IF_ERROR(emit_gemm(L, n, q, k, qk, scaled, s.ref, dt));
  if (mask) {
    k::NdStrides ss = nd(sdims, contiguous_strides(sdims)), ms = nd(sdims, broadcast_strides(*mask, sdims));
    emit_binary_nd(L, &n, "kernel add (attention mask)", k::Binary::kAdd, dt, s.ref, ss, mask->ref, ms, s.ref);
  }
  // A row whose every key the mask hides gives zeros (the spec; the fused kernel does the same).
  emit_softmax(L, &n, "kernel softmax (attention)", dt, s.ref, p.ref, b * h * sq, sk, false, true);
  GemmShape pv;
  pv.m = sq, pv.n = dv, pv.k = sk;
  pv.batch = b * h, pv.stride_a = sq * sk, pv.stride_b = sk * dv, pv.stride_d = sq * dv;
  return emit_gemm(L, n, &p, v, pv, Epilogue{}, y.ref, dt);
}

// The fused kernel when it takes the node; else the unfused GPU form; else (past K/V, causal...)
// kUnsupported: the CPU kernel.
Status lower_attention_node(Lowering& L, const Node& n) {
  auto m = match_attention_node(L, n, false);
  if (m) return lower_attention(L, n, *m);
  if (m.status().code() != ErrorCode::kUnsupported) return m.status();
  KILN_RETURN_IF_ERROR(check_plain_attention(n));
  return lower_attention_unfused(L, n);
}

void register_attention_lowerings(std::map<OpKind, LowerFn>& t) { t[OpKind::kAttention] = lower_attention_node; }

}  // namespace kiln::cuda
