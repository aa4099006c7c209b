// Op family: attention. Attention (opset 23-25: 3-D or 4-D Q/K/V, grouped KV heads, bool or
// additive masks, causal and sliding-window masks aligned to the cache offset, past/present KV,
// softcap, the qk_matmul_output debug output) and RotaryEmbedding (opset 23). The arithmetic
// mirrors onnx/reference/ops/op_attention.py and op_rotary_embedding.py; it runs in float (double
// for f64) whatever the storage type.
#include <cmath>
#include <limits>

#include "ops/op_util.h"

namespace kiln {

namespace {

constexpr auto kIntAttr = Attribute::Kind::kInt;
constexpr auto kFloatAttr = Attribute::Kind::kFloat;

bool is_attention_dtype(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat16 || dt == DType::kBFloat16 || dt == DType::kFloat64;
}

// Q, K, V viewed as [batch, heads, seq, head_size] whatever their rank.
struct HeadsView {
  int64_t batch = 0, heads = 0, seq = 0, head_size = 0;
  bool three_d = false;
  // Offset of element (b, h, s, 0): 4-D is [B, H, S, D], 3-D is [B, S, H*D].
  int64_t offset(int64_t b, int64_t h, int64_t s) const {
    return three_d ? ((b * seq + s) * heads + h) * head_size : ((b * heads + h) * seq + s) * head_size;
  }
};

// ---- Attention: inference ---------------------------------------------------------------------

// The number of heads of a 3-D input from its attribute, or of a 4-D input from dim 1.
struct AttentionDims {
  Dim batch, q_heads, kv_heads, q_seq, kv_seq, past, head_size, v_head_size;
};

Status infer_attention(InferCtx& c) {
  const Node& n = c.node();
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (!is_attention_dtype(dt)) return c.error("Q must be f16, bf16, f32 or f64, got {}", dtype_name(dt));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, 3));
  int64_t mode = n.attr_int("qk_matmul_output_mode", 0);
  if (mode < 0 || mode > 3) return c.error("qk_matmul_output_mode must be 0..3, got {}", mode);
  if (c.has_input(4) != c.has_input(5)) return c.error("past_key and past_value must be given together");
  const Type &q = c.input_type(0), &k = c.input_type(1), &v = c.input_type(2);
  if (!q.has_rank() || !k.has_rank() || !v.has_rank()) {
    for (size_t i = 0; i < 4; ++i) c.set_output_tensor(i, dt, std::nullopt);
    return Status::ok();
  }
  size_t rank = q.shape->rank();
  if ((rank != 3 && rank != 4) || k.shape->rank() != rank || v.shape->rank() != rank) {
    return c.error("Q, K and V must all be 3-D or all 4-D, got {}, {} and {}", q.to_string(), k.to_string(), v.to_string());
  }
  const Shape &qs = *q.shape, &ks = *k.shape, &vs = *v.shape;
  AttentionDims d;
  d.batch = qs[0];
  if (rank == 4) {
    d.q_heads = qs[1], d.kv_heads = ks[1], d.q_seq = qs[2], d.kv_seq = ks[2], d.head_size = qs[3];
    d.v_head_size = vs[3];
  } else {
    int64_t qh = n.attr_int("q_num_heads", 0), kvh = n.attr_int("kv_num_heads", 0);
    if (qh <= 0 || kvh <= 0) return c.error("3-D inputs need positive q_num_heads and kv_num_heads, got {} and {}", qh, kvh);
    d.q_heads = Dim(qh), d.kv_heads = Dim(kvh), d.q_seq = qs[1], d.kv_seq = ks[1];
    d.head_size = qs[2] / Dim(qh);
    d.v_head_size = vs[2] / Dim(kvh);
  }
  d.past = Dim(int64_t{0});
  if (c.has_input(4) && c.input_type(4).has_rank()) {
    const Shape& ps = *c.input_type(4).shape;
    if (ps.rank() != 4) return c.error("past_key must be 4-D, got {}", c.input_type(4).to_string());
    d.past = ps[2];
  } else if (c.has_input(4)) {
    d.past = Dim();
  }
  Dim total = d.past + d.kv_seq;
  if (rank == 4) c.set_output_tensor(0, dt, Shape{d.batch, d.q_heads, d.q_seq, d.v_head_size});
  else c.set_output_tensor(0, dt, Shape{d.batch, d.q_seq, d.q_heads * d.v_head_size});
  c.set_output_tensor(1, dt, Shape{d.batch, d.kv_heads, total, d.head_size});
  c.set_output_tensor(2, dt, Shape{d.batch, d.kv_heads, total, d.v_head_size});
  c.set_output_tensor(3, dt, Shape{d.batch, d.q_heads, d.q_seq, total});
  return Status::ok();
}

// ---- Attention: kernel ------------------------------------------------------------------------

template <typename A>
struct AttentionProblem {
  HeadsView q, k, v;            // k and v: [B, kvh, total, D] after the past is prepended
  std::vector<A> qd, kd, vd;    // Q as stored; present K and V, 4-D
  int64_t past = 0;
  A scale = 1, softcap = 0;
  bool causal = false;
  int64_t left_window = -1, right_window = -1, mode = 0;
  const Tensor* mask = nullptr;        // attn_mask, broadcast to [B, qh, q_seq, total]
  std::vector<int64_t> mask_strides;   // per axis of that 4-D view, 0 where broadcast
  int64_t mask_len = 0;                // its last dim (may be shorter than total: padded)
  std::vector<int64_t> nonpad;         // per batch, empty when absent
};

template <typename T, typename A>
std::vector<A> to_compute(const Tensor& t) {
  std::vector<A> out(size_t(t.numel()));
  const T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = A(static_cast<compute_t<T>>(p[i]));
  return out;
}

// Present K or V: past (4-D, may be absent) then the new one (3-D or 4-D), as 4-D [B, H, S, D].
template <typename T, typename A>
std::vector<A> present(const Tensor* past, const Tensor& cur, const HeadsView& cur_view, int64_t past_len) {
  const int64_t B = cur_view.batch, H = cur_view.heads, S = cur_view.seq, D = cur_view.head_size, tot = past_len + S;
  std::vector<A> out(size_t(B * H * tot * D));
  std::vector<A> p = past ? to_compute<T, A>(*past) : std::vector<A>();
  std::vector<A> x = to_compute<T, A>(cur);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t s = 0; s < tot; ++s) {
        A* dst = &out[size_t(((b * H + h) * tot + s) * D)];
        const A* src = s < past_len ? &p[size_t(((b * H + h) * past_len + s) * D)]
                                    : &x[size_t(cur_view.offset(b, h, s - past_len))];
        std::copy(src, src + D, dst);
      }
    }
  }
  return out;
}

// The additive bias of score (b, h, i, j): the mask (bool: 0 / -inf, else its value; past its
// last dim: -inf), the causal and sliding-window limits relative to the cache offset, and the
// padding given by nonpad_kv_seqlen.
template <typename A>
A attention_bias(const AttentionProblem<A>& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();
  A bias = 0;
  if (p.mask) {
    if (j >= p.mask_len) return kNegInf;
    int64_t off = b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j * p.mask_strides[3];
    if (p.mask->dtype() == DType::kBool) {
      if (!p.mask->template data<bool>()[off]) return kNegInf;
    } else {
      bias = A(p.mask->as_double(off));
    }
  }
  // Offset: keys before this query block (the past, or the external cache's valid length).
  int64_t offset = !p.nonpad.empty() && p.past == 0 ? p.nonpad[size_t(b)] - p.q.seq : p.past;
  int64_t diff = i + offset - j;
  if (p.causal && diff < 0) return kNegInf;
  if (p.left_window >= 0 && diff > p.left_window) return kNegInf;
  if (p.right_window >= 0 && -diff > p.right_window) return kNegInf;
  if (!p.nonpad.empty() && j >= p.nonpad[size_t(b)]) return kNegInf;
  return bias;
}

// One query row: scores, softmax, weighted sum of V. y is the output row, qk_row the row of the
// qk_matmul_output (or null).
template <typename A>
void attention_row(const AttentionProblem<A>& p, int64_t b, int64_t h, int64_t i, A* y, A* qk_row) {
  const int64_t total = p.k.seq, D = p.q.head_size, Dv = p.v.head_size;
  const int64_t kvh = h / (p.q.heads / p.k.heads);  // grouped-query: q heads share a kv head
  const A* qrow = &p.qd[size_t(p.q.offset(b, h, i))];
  std::vector<A> score(static_cast<size_t>(total)), bias(static_cast<size_t>(total));
  bool all_masked = true;
  for (int64_t j = 0; j < total; ++j) {
    const A* krow = &p.kd[size_t(((b * p.k.heads + kvh) * total + j) * D)];
    A s = 0;
    for (int64_t e = 0; e < D; ++e) s += qrow[e] * krow[e];
    s *= p.scale;
    if (p.softcap > A(0)) s = p.softcap * std::tanh(s / p.softcap);
    bias[j] = attention_bias(p, b, h, i, j);
    all_masked = all_masked && std::isinf(bias[j]) && bias[j] < 0;
    if (qk_row && p.mode <= 1) qk_row[j] = s;
    score[j] = s + bias[j];
    if (qk_row && p.mode == 2) qk_row[j] = score[j];
  }
  // A row with no attendable key gives zeros (not NaN), in Y and in the mode-3 output.
  if (all_masked) {
    std::fill(score.begin(), score.end(), A(0));
  } else {
    A mx = -std::numeric_limits<A>::infinity();
    for (A s : score) mx = std::max(mx, s);
    A sum = 0;
    for (A& s : score) sum += (s = std::exp(s - mx));
    for (A& s : score) s /= sum;
  }
  if (qk_row && p.mode == 3) std::copy(score.begin(), score.end(), qk_row);
  for (int64_t e = 0; e < Dv; ++e) y[e] = 0;
  for (int64_t j = 0; j < total; ++j) {
    if (score[j] == A(0)) continue;
    const A* vrow = &p.vd[size_t(((b * p.v.heads + kvh) * total + j) * Dv)];
    for (int64_t e = 0; e < Dv; ++e) y[e] += score[j] * vrow[e];
  }
}

// Views Q/K/V as heads; for 3-D inputs the head counts come from the attributes.
Expected<HeadsView> heads_view(const KernelCtx& c, const Tensor& t, const char* name, int64_t heads_attr) {
  HeadsView v;
  v.three_d = t.rank() == 3;
  if (t.rank() == 4) {
    v.batch = t.dim(0), v.heads = t.dim(1), v.seq = t.dim(2), v.head_size = t.dim(3);
    return v;
  }
  if (t.rank() != 3) return c.error("{} must be 3-D or 4-D, got {}", name, t.summary());
  if (heads_attr <= 0 || t.dim(2) % heads_attr != 0) {
    return c.error("{} ({}) cannot be split into {} heads", name, t.summary(), heads_attr);
  }
  v.batch = t.dim(0), v.heads = heads_attr, v.seq = t.dim(1), v.head_size = t.dim(2) / heads_attr;
  return v;
}

// Strides that broadcast the mask (rank <= 4, right-aligned) to [B, qh, q_seq, mask_len].
Expected<std::vector<int64_t>> mask_strides(const KernelCtx& c, const Tensor& m, const std::vector<int64_t>& target) {
  if (m.rank() < 1 || m.rank() > 4) return c.error("attn_mask must have rank 1 to 4, got {}", m.summary());
  std::vector<int64_t> dims(4 - m.rank(), 1);
  dims.insert(dims.end(), m.dims().begin(), m.dims().end());
  for (size_t k = 0; k < 3; ++k) {
    if (dims[k] != 1 && dims[k] != target[k]) {
      return c.error("attn_mask {} does not broadcast to {}", m.summary(), dims_to_string(target));
    }
  }
  std::vector<int64_t> s = strides_of(dims);
  for (size_t k = 0; k < 4; ++k) if (dims[k] == 1) s[k] = 0;
  return s;
}

template <typename T>
Status attention_run(KernelCtx& c) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Node& n = c.node();
  AttentionProblem<A> p;
  const Tensor &q = c.tensor(0), &k = c.tensor(1), &v = c.tensor(2);
  if (k.rank() != q.rank() || v.rank() != q.rank()) return c.error("Q, K and V must have the same rank");
  KILN_ASSIGN_OR_RETURN(p.q, heads_view(c, q, "Q", n.attr_int("q_num_heads", 0)));
  KILN_ASSIGN_OR_RETURN(HeadsView kv, heads_view(c, k, "K", n.attr_int("kv_num_heads", 0)));
  KILN_ASSIGN_OR_RETURN(HeadsView vv, heads_view(c, v, "V", n.attr_int("kv_num_heads", 0)));
  if (kv.batch != p.q.batch || vv.batch != p.q.batch || kv.heads != vv.heads || kv.seq != vv.seq ||
      kv.head_size != p.q.head_size || p.q.heads % kv.heads != 0) {
    return c.error("incompatible Q {}, K {}, V {}: need equal batch, K/V heads dividing Q heads, K head size = Q's",
                   q.summary(), k.summary(), v.summary());
  }
  const Tensor* past_k = c.has_input(4) ? &c.tensor(4) : nullptr;
  const Tensor* past_v = c.has_input(5) ? &c.tensor(5) : nullptr;
  if (!past_k != !past_v) return c.error("past_key and past_value must be given together");
  if (past_k) {
    p.past = past_k->rank() == 4 ? past_k->dim(2) : -1;
    std::vector<int64_t> want_k = {kv.batch, kv.heads, p.past, kv.head_size};
    std::vector<int64_t> want_v = {kv.batch, kv.heads, p.past, vv.head_size};
    if (past_k->dims() != want_k || past_v->dims() != want_v) {
      return c.error("past_key {} / past_value {} do not match K and V", past_k->summary(), past_v->summary());
    }
  }
  p.qd = to_compute<T, A>(q);
  p.kd = present<T, A>(past_k, k, kv, p.past);
  p.vd = present<T, A>(past_v, v, vv, p.past);
  p.k = HeadsView{kv.batch, kv.heads, p.past + kv.seq, kv.head_size, false};
  p.v = HeadsView{vv.batch, vv.heads, p.past + vv.seq, vv.head_size, false};
  p.scale = n.has_attr("scale") ? A(n.attr_float("scale", 1.0f)) : A(1) / std::sqrt(A(p.q.head_size));
  p.softcap = A(n.attr_float("softcap", 0.0f));
  p.causal = n.attr_int("is_causal", 0) != 0;
  p.left_window = n.attr_int("left_window_size", -1);
  p.right_window = n.attr_int("right_window_size", -1);
  p.mode = n.attr_int("qk_matmul_output_mode", 0);
  if (c.has_input(3)) {
    p.mask = &c.tensor(3);
    KILN_ASSIGN_OR_RETURN(p.mask_strides, mask_strides(c, *p.mask, {p.q.batch, p.q.heads, p.q.seq}));
    p.mask_len = p.mask->dims().back();
  }
  if (c.has_input(6)) {
    const Tensor& np = c.tensor(6);
    if (np.numel() != p.q.batch) return c.error("nonpad_kv_seqlen must have {} values, got {}", p.q.batch, np.summary());
    p.nonpad = np.to_int_vector();
  }

  const int64_t B = p.q.batch, QH = p.q.heads, S = p.q.seq, Dv = p.v.head_size, total = p.k.seq;
  std::vector<A> y(size_t(B * QH * S * Dv)), qk(c.has_output(3) ? size_t(B * QH * S * total) : 0);
  parallel_for(B * QH * S, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t b = r / (QH * S), h = r / S % QH, i = r % S;
      // Y keeps Q's layout: [B, H, S, Dv] for 4-D, [B, S, H*Dv] for 3-D.
      HeadsView yv{B, QH, S, Dv, p.q.three_d};
      attention_row(p, b, h, i, &y[size_t(yv.offset(b, h, i))], qk.empty() ? nullptr : &qk[size_t(r * total)]);
    }
  });

  auto store = [&](size_t i, const std::vector<A>& buf, std::vector<int64_t> dims) -> Status {
    if (!c.has_output(i)) return Status::ok();
    KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(i, dtype_of<T>(), std::move(dims)));
    T* dst = out->data<T>();
    for (size_t e = 0; e < buf.size(); ++e) dst[e] = T(buf[e]);
    return Status::ok();
  };
  std::vector<int64_t> y_dims = p.q.three_d ? std::vector<int64_t>{B, S, QH * Dv} : std::vector<int64_t>{B, QH, S, Dv};
  KILN_RETURN_IF_ERROR(store(0, y, y_dims));
  KILN_RETURN_IF_ERROR(store(1, p.kd, {B, p.k.heads, total, p.k.head_size}));
  KILN_RETURN_IF_ERROR(store(2, p.vd, {B, p.v.heads, total, Dv}));
  KILN_RETURN_IF_ERROR(store(3, qk, {B, QH, S, total}));
  return Status::ok();
}

// Runs f.template operator()<T>() for the float storage types attention supports.
template <typename F>
Status visit_attention_dtype(KernelCtx& c, DType dt, F&& f) {
  return visit_dtype(dt, [&]<typename T>() -> Status {
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      return f.template operator()<T>();
    } else {
      return c.unsupported("{} is not supported for {}", op_name(c.node().op), dtype_name(dt));
    }
  });
}

Status attention_cpu(KernelCtx& c) {
  return visit_attention_dtype(c, c.tensor(0).dtype(), [&]<typename T>() { return attention_run<T>(c); });
}

// ---- RotaryEmbedding --------------------------------------------------------------------------

Status infer_rotary(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (!is_attention_dtype(dt)) return c.error("X must be f16, bf16, f32 or f64, got {}", dtype_name(dt));
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, 3));
  const Type& x = c.input_type(0);
  if (x.has_rank() && x.shape->rank() != 3 && x.shape->rank() != 4) {
    return c.error("X must be 3-D or 4-D, got {}", x.to_string());
  }
  if (x.has_rank() && x.shape->rank() == 3 && c.node().attr_int("num_heads", 0) <= 0) {
    return c.error("a 3-D X needs a positive num_heads attribute");
  }
  return infer_same_as_input0(c);
}

template <typename T>
Status rotary_run(KernelCtx& c) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Node& n = c.node();
  const Tensor& x = c.tensor(0);
  const Tensor &cos_t = c.tensor(1), &sin_t = c.tensor(2);
  // HeadsView expects [B, H, S, D] for 4-D and [B, S, H*D] for 3-D: exactly X's two forms.
  KILN_ASSIGN_OR_RETURN(HeadsView xv, heads_view(c, x, "X", n.attr_int("num_heads", 0)));
  int64_t rot = n.attr_int("rotary_embedding_dim", 0);
  if (rot == 0) rot = xv.head_size;
  if (rot < 0 || rot > xv.head_size || rot % 2 != 0) {
    return c.error("rotary_embedding_dim {} must be even and at most the head size {}", rot, xv.head_size);
  }
  const int64_t half_rot = rot / 2;
  const bool interleaved = n.attr_int("interleaved", 0) != 0;
  const Tensor* pos = c.has_input(3) ? &c.tensor(3) : nullptr;
  std::vector<int64_t> want = pos ? std::vector<int64_t>{-1, half_rot} : std::vector<int64_t>{xv.batch, xv.seq, half_rot};
  auto cache_ok = [&](const Tensor& t) {
    if (t.rank() != want.size()) return false;
    for (size_t k = 0; k < want.size(); ++k) if (want[k] >= 0 && t.dim(k) != want[k]) return false;
    return true;
  };
  if (!cache_ok(cos_t) || !cache_ok(sin_t) || cos_t.dims() != sin_t.dims()) {
    return c.error("cos_cache {} / sin_cache {} must be {}", cos_t.summary(), sin_t.summary(),
                   pos ? fmt::format("[max_position, {}]", half_rot) : dims_to_string(want));
  }
  if (pos && (pos->rank() != 2 || pos->dim(0) != xv.batch || pos->dim(1) != xv.seq)) {
    return c.error("position_ids must be [{}, {}], got {}", xv.batch, xv.seq, pos->summary());
  }
  std::vector<A> cs = to_compute<T, A>(cos_t), sn = to_compute<T, A>(sin_t);
  const T* src = x.data<T>();
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), x.dims()));
  T* dst = out->data<T>();
  std::copy(src, src + x.numel(), dst);  // the part past rotary_embedding_dim stays as is
  for (int64_t b = 0; b < xv.batch; ++b) {
    for (int64_t s = 0; s < xv.seq; ++s) {
      int64_t row = b * xv.seq + s;
      if (pos) {
        row = pos->as_int(row);
        if (row < 0 || row >= cos_t.dim(0)) return c.error("position id {} is outside [0, {})", row, cos_t.dim(0));
      }
      const A* cr = &cs[size_t(row * half_rot)];
      const A* sr = &sn[size_t(row * half_rot)];
      for (int64_t h = 0; h < xv.heads; ++h) {
        int64_t base = xv.offset(b, h, s);
        for (int64_t e = 0; e < half_rot; ++e) {
          // The pair rotated together: (2e, 2e+1) interleaved, else (e, e + rot/2).
          int64_t i1 = base + (interleaved ? 2 * e : e), i2 = base + (interleaved ? 2 * e + 1 : e + half_rot);
          A x1 = A(static_cast<compute_t<T>>(src[i1])), x2 = A(static_cast<compute_t<T>>(src[i2]));
          dst[i1] = T(cr[e] * x1 - sr[e] * x2);
          dst[i2] = T(sr[e] * x1 + cr[e] * x2);
        }
      }
    }
  }
  return Status::ok();
}

Status rotary_cpu(KernelCtx& c) {
  return visit_attention_dtype(c, c.tensor(0).dtype(), [&]<typename T>() { return rotary_run<T>(c); });
}

}  // namespace

void register_attention_ops(OpRegistry& r) {
  r.def(OpKind::kAttention,
        {.inputs = {3, 7}, .outputs = {1, 4},
         .attrs = {{"is_causal", kIntAttr}, {"kv_num_heads", kIntAttr}, {"q_num_heads", kIntAttr},
                   {"qk_matmul_output_mode", kIntAttr}, {"scale", kFloatAttr}, {"softcap", kFloatAttr},
                   {"softmax_precision", kIntAttr}, {"left_window_size", kIntAttr}, {"right_window_size", kIntAttr}},
         .infer = infer_attention, .cpu = attention_cpu});
  r.def(OpKind::kRotaryEmbedding, {.inputs = {3, 4}, .attrs = {{"interleaved", kIntAttr}, {"num_heads", kIntAttr},
                                                               {"rotary_embedding_dim", kIntAttr}},
                                   .infer = infer_rotary, .cpu = rotary_cpu});
}

}  // namespace kiln
