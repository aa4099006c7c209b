// Op family: rnn. RNN, GRU and LSTM over a whole sequence, following the ONNX equations (see
// onnx.defs.get_schema("LSTM").doc). Inputs are converted once to the compute type in the
// canonical layout (X [seq, batch, input], states [dirs, batch, hidden]); each (direction, batch
// row) is then an independent recurrence, run in parallel. sequence_lens stops a row early: its
// Y is zero past its length and Y_h/Y_c hold the state after its last valid step.
#include "ops/rnn_util.h"

namespace kiln {

namespace {

// Everything one RNN/GRU/LSTM call needs, in compute type A and canonical layout.
template <typename A>
struct RnnProblem {
  RnnCell cell = RnnCell::kRnn;
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, dirs = 1, gates = 1;
  bool reverse_only = false;  // direction == "reverse"
  bool linear_before_reset = false, input_forget = false;
  A clip = 0;  // 0: no clipping
  std::vector<RnnActivation> acts;  // rnn_num_activations(cell) per direction
  std::vector<A> x;                 // [seq, batch, input]
  std::vector<A> w, r, bias, peep;  // [dirs, G*H, I], [dirs, G*H, H], [dirs, 2*G*H], [dirs, 3*H]
  std::vector<A> h0, c0;            // [dirs, batch, hidden]
  std::vector<int64_t> lens;        // [batch]
  std::vector<A> y, yh, yc;         // [seq, dirs, batch, hidden], [dirs, batch, hidden] x2

  A clipped(A v) const { return clip > A(0) ? std::clamp(v, -clip, clip) : v; }
};

// out[j] = sum_k m[j, k] * v[k] for a row-major rows x cols matrix.
template <typename A>
void matvec(const A* m, const A* v, int64_t rows, int64_t cols, A* out) {
  for (int64_t j = 0; j < rows; ++j) {
    A s = 0;
    for (int64_t k = 0; k < cols; ++k) s += m[j * cols + k] * v[k];
    out[j] = s;
  }
}

// The per-step state of one (direction, batch row) recurrence and its scratch buffers.
template <typename A>
struct RnnState {
  std::vector<A> h, c, xw, hr, tmp, tmp2;
};

// One time step. xw = W x_t and hr = R h_{t-1} per gate; wb/rb the W and R biases; act the
// direction's activations; peep its peepholes (LSTM); rh the R of the h gate (GRU).
template <typename A>
void step_rnn(const RnnProblem<A>& p, RnnState<A>& s, const A* wb, const A* rb, const RnnActivation* act) {
  for (int64_t j = 0; j < p.hidden; ++j) s.h[j] = act[0](p.clipped(s.xw[j] + s.hr[j] + wb[j] + rb[j]));
}

template <typename A>
void step_gru(const RnnProblem<A>& p, RnnState<A>& s, const A* wb, const A* rb, const RnnActivation* act,
              const A* r_h) {
  const int64_t H = p.hidden;
  std::vector<A>& z = s.tmp;   // update gate
  std::vector<A>& rg = s.tmp2;  // reset gate
  for (int64_t j = 0; j < H; ++j) {
    z[j] = act[0](p.clipped(s.xw[j] + s.hr[j] + wb[j] + rb[j]));
    rg[j] = act[0](p.clipped(s.xw[H + j] + s.hr[H + j] + wb[H + j] + rb[H + j]));
  }
  // The candidate's recurrent term: r (.) (R_h h + Rb_h), or R_h (r (.) h) + Rb_h.
  std::vector<A> rec(size_t(H), A(0));
  if (p.linear_before_reset) {
    for (int64_t j = 0; j < H; ++j) rec[j] = rg[j] * (s.hr[2 * H + j] + rb[2 * H + j]);
  } else {
    std::vector<A> rh(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) rh[j] = rg[j] * s.h[j];
    matvec(r_h, rh.data(), H, H, rec.data());
    for (int64_t j = 0; j < H; ++j) rec[j] += rb[2 * H + j];
  }
  for (int64_t j = 0; j < H; ++j) {
    A cand = act[1](p.clipped(s.xw[2 * H + j] + wb[2 * H + j] + rec[j]));
    s.h[j] = (A(1) - z[j]) * cand + z[j] * s.h[j];
  }
}

template <typename A>
void step_lstm(const RnnProblem<A>& p, RnnState<A>& s, const A* wb, const A* rb, const RnnActivation* act,
               const A* peep) {
  const int64_t H = p.hidden;
  // Gate order in W, R and B is i, o, f, c; in P it is i, o, f.
  auto pre = [&](int64_t gate, int64_t j) { return s.xw[gate * H + j] + s.hr[gate * H + j] + wb[gate * H + j] + rb[gate * H + j]; };
  for (int64_t j = 0; j < H; ++j) {
    A c_prev = s.c[j];
    A i = act[0](p.clipped(pre(0, j) + peep[j] * c_prev));
    // input_forget couples the gates: the forget gate is 1 - input gate (as in onnxruntime).
    A f = p.input_forget ? A(1) - i : act[0](p.clipped(pre(2, j) + peep[2 * H + j] * c_prev));
    A cand = act[1](p.clipped(pre(3, j)));
    A c_new = f * c_prev + i * cand;
    A o = act[0](p.clipped(pre(1, j) + peep[H + j] * c_new));
    s.c[j] = c_new;
    s.h[j] = o * act[2](c_new);
  }
}

// Runs direction d over batch row b for that row's valid length, writing y, yh and yc.
template <typename A>
void run_row(RnnProblem<A>& p, int64_t d, int64_t b) {
  const int64_t H = p.hidden, I = p.input, G = p.gates, D = p.dirs, B = p.batch;
  const A* w = &p.w[size_t(d * G * H * I)];
  const A* r = &p.r[size_t(d * G * H * H)];
  const A* wb = &p.bias[size_t(d * 2 * G * H)];
  const A* rb = wb + G * H;
  const RnnActivation* act = &p.acts[size_t(d * rnn_num_activations(p.cell))];
  RnnState<A> s;
  s.h.assign(p.h0.begin() + (d * B + b) * H, p.h0.begin() + (d * B + b + 1) * H);
  if (p.cell == RnnCell::kLstm) s.c.assign(p.c0.begin() + (d * B + b) * H, p.c0.begin() + (d * B + b + 1) * H);
  s.xw.resize(size_t(G * H));
  s.hr.resize(size_t(G * H));
  s.tmp.resize(size_t(H));
  s.tmp2.resize(size_t(H));
  const bool reverse = p.reverse_only || d == 1;
  const int64_t len = p.lens[size_t(b)];
  for (int64_t step = 0; step < len; ++step) {
    int64_t t = reverse ? len - 1 - step : step;
    matvec(w, &p.x[size_t((t * B + b) * I)], G * H, I, s.xw.data());
    matvec(r, s.h.data(), G * H, H, s.hr.data());
    switch (p.cell) {
      case RnnCell::kRnn: step_rnn(p, s, wb, rb, act); break;
      case RnnCell::kGru: step_gru(p, s, wb, rb, act, r + 2 * H * H); break;
      case RnnCell::kLstm: step_lstm(p, s, wb, rb, act, &p.peep[size_t(d * 3 * H)]); break;
    }
    std::copy(s.h.begin(), s.h.end(), p.y.begin() + ((t * D + d) * B + b) * H);
  }
  std::copy(s.h.begin(), s.h.end(), p.yh.begin() + (d * B + b) * H);
  if (p.cell == RnnCell::kLstm) std::copy(s.c.begin(), s.c.end(), p.yc.begin() + (d * B + b) * H);
}

// ---- conversion between tensors and the canonical compute-type buffers ------------------------

// The tensor's elements in compute type A; when `swap01`, its first two axes are swapped (the
// layout=1 forms [batch, seq, ...] and [batch, dirs, hidden] to [seq, batch, ...] / [dirs, batch, hidden]).
template <typename T, typename A>
std::vector<A> load(const Tensor& t, bool swap01) {
  const T* src = t.data<T>();
  std::vector<A> out(size_t(t.numel()));
  int64_t d0 = t.rank() > 0 ? t.dim(0) : 1, d1 = t.rank() > 1 ? t.dim(1) : 1;
  int64_t inner = d0 * d1 == 0 ? 0 : t.numel() / (d0 * d1);
  for (int64_t i = 0; i < d0; ++i) {
    for (int64_t j = 0; j < d1; ++j) {
      int64_t to = swap01 ? (j * d0 + i) * inner : (i * d1 + j) * inner;
      for (int64_t k = 0; k < inner; ++k) out[size_t(to + k)] = A(static_cast<compute_t<T>>(src[(i * d1 + j) * inner + k]));
    }
  }
  return out;
}

template <typename T, typename A>
std::vector<A> load_or(const KernelCtx& c, size_t i, bool swap01, size_t zeros) {
  return c.has_input(i) ? load<T, A>(c.tensor(i), swap01) : std::vector<A>(zeros, A(0));
}

// Writes a canonical [outer, mid, inner...] buffer to output i with dims `dims`, moving axis 2 of
// the canonical order to the front when `batch_first` (Y: [seq, dirs, batch, H] -> [batch, seq,
// dirs, H]; states: [dirs, batch, H] -> [batch, dirs, H]).
template <typename T, typename A>
Status store(KernelCtx& c, size_t i, const std::vector<A>& buf, std::vector<int64_t> canon, bool batch_first) {
  if (!c.has_output(i)) return Status::ok();
  // Batch is the last-but-one canonical axis; hidden is the last.
  size_t bax = canon.size() - 2;
  std::vector<int64_t> dims = canon;
  if (batch_first) {
    dims.erase(dims.begin() + std::ptrdiff_t(bax));
    dims.insert(dims.begin(), canon[bax]);
  }
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(i, dtype_of<T>(), dims));
  T* dst = out->data<T>();
  int64_t H = canon.back(), B = canon[bax], outer = 1;
  for (size_t k = 0; k < bax; ++k) outer *= canon[k];
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t b = 0; b < B; ++b) {
      int64_t from = (o * B + b) * H, to = batch_first ? (b * outer + o) * H : from;
      for (int64_t j = 0; j < H; ++j) dst[to + j] = T(buf[size_t(from + j)]);
    }
  }
  return Status::ok();
}

// Checks input i has exactly `dims` (when present).
Status expect_dims(const KernelCtx& c, size_t i, const char* name, const std::vector<int64_t>& dims) {
  if (!c.has_input(i) || c.tensor(i).dims() == dims) return Status::ok();
  return c.error("{} must have shape {}, got {}", name, dims_to_string(dims), c.tensor(i).summary());
}

template <typename T>
Status rnn_run(KernelCtx& c, RnnCell cell) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const Node& n = c.node();
  RnnProblem<A> p;
  p.cell = cell;
  p.gates = rnn_num_gates(cell);
  KILN_ASSIGN_OR_RETURN(p.dirs, rnn_num_directions(n));
  KILN_ASSIGN_OR_RETURN(p.acts, rnn_parse_activations(n, cell, p.dirs));
  p.reverse_only = n.attr_string("direction", "forward") == "reverse";
  p.linear_before_reset = n.attr_int("linear_before_reset", 0) != 0;
  p.input_forget = n.attr_int("input_forget", 0) != 0;
  p.clip = A(n.attr_float("clip", 0.0f));
  const bool batch_first = n.attr_int("layout", 0) == 1;

  const Tensor& x = c.tensor(0);
  const Tensor& r = c.tensor(2);
  if (x.rank() != 3 || r.rank() != 3) return c.error("X and R must have rank 3, got {} and {}", x.summary(), r.summary());
  p.seq = batch_first ? x.dim(1) : x.dim(0);
  p.batch = batch_first ? x.dim(0) : x.dim(1);
  p.input = x.dim(2);
  p.hidden = r.dim(2);
  const int64_t D = p.dirs, G = p.gates, H = p.hidden, B = p.batch;
  std::vector<int64_t> state_dims = batch_first ? std::vector<int64_t>{B, D, H} : std::vector<int64_t>{D, B, H};
  KILN_RETURN_IF_ERROR(expect_dims(c, 1, "W", {D, G * H, p.input}));
  KILN_RETURN_IF_ERROR(expect_dims(c, 2, "R", {D, G * H, H}));
  KILN_RETURN_IF_ERROR(expect_dims(c, 3, "B", {D, 2 * G * H}));
  KILN_RETURN_IF_ERROR(expect_dims(c, 4, "sequence_lens", {B}));
  KILN_RETURN_IF_ERROR(expect_dims(c, 5, "initial_h", state_dims));
  if (cell == RnnCell::kLstm) {
    KILN_RETURN_IF_ERROR(expect_dims(c, 6, "initial_c", state_dims));
    KILN_RETURN_IF_ERROR(expect_dims(c, 7, "P", {D, 3 * H}));
  }

  p.x = load<T, A>(x, batch_first);
  p.w = load<T, A>(c.tensor(1), false);
  p.r = load<T, A>(r, false);
  p.bias = load_or<T, A>(c, 3, false, size_t(D * 2 * G * H));
  p.h0 = load_or<T, A>(c, 5, batch_first, size_t(D * B * H));
  if (cell == RnnCell::kLstm) {
    p.c0 = load_or<T, A>(c, 6, batch_first, size_t(D * B * H));
    p.peep = load_or<T, A>(c, 7, false, size_t(D * 3 * H));
  }
  p.lens.assign(size_t(B), p.seq);
  if (c.has_input(4)) {
    for (int64_t b = 0; b < B; ++b) {
      int64_t len = c.tensor(4).as_int(b);
      if (len < 0 || len > p.seq) return c.error("sequence_lens[{}] is {}, outside [0, {}]", b, len, p.seq);
      p.lens[size_t(b)] = len;
    }
  }
  p.y.assign(size_t(p.seq * D * B * H), A(0));
  p.yh.assign(size_t(D * B * H), A(0));
  p.yc.assign(size_t(D * B * H), A(0));
  parallel_for(D * B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) run_row(p, k / B, k % B);
  });

  KILN_RETURN_IF_ERROR((store<T, A>(c, 0, p.y, {p.seq, D, B, H}, batch_first)));
  KILN_RETURN_IF_ERROR((store<T, A>(c, 1, p.yh, {D, B, H}, batch_first)));
  if (cell == RnnCell::kLstm) KILN_RETURN_IF_ERROR((store<T, A>(c, 2, p.yc, {D, B, H}, batch_first)));
  return Status::ok();
}

template <RnnCell kCell>
Status rnn_cpu(KernelCtx& c) {
  return visit_dtype(c.tensor(0).dtype(), [&]<typename T>() -> Status {
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      return rnn_run<T>(c, kCell);
    } else {
      return c.unsupported("{} is not supported for {}", op_name(c.node().op), dtype_name(c.tensor(0).dtype()));
    }
  });
}

template <RnnCell kCell>
Status infer_rnn(InferCtx& c) {
  return infer_rnn_common(c, kCell);
}

std::vector<AttrSpec> rnn_attrs(RnnCell cell) {
  using K = Attribute::Kind;
  std::vector<AttrSpec> a = {{"activation_alpha", K::kFloats}, {"activation_beta", K::kFloats},
                             {"activations", K::kStrings},     {"clip", K::kFloat},
                             {"direction", K::kString},        {"hidden_size", K::kInt},
                             {"layout", K::kInt}};
  if (cell == RnnCell::kGru) a.push_back({"linear_before_reset", K::kInt});
  if (cell == RnnCell::kLstm) a.push_back({"input_forget", K::kInt});
  return a;
}

}  // namespace

void register_rnn_ops(OpRegistry& r) {
  r.def(OpKind::kRNN, {.inputs = {3, 6}, .outputs = {0, 2}, .attrs = rnn_attrs(RnnCell::kRnn),
                       .infer = infer_rnn<RnnCell::kRnn>, .cpu = rnn_cpu<RnnCell::kRnn>});
  r.def(OpKind::kGRU, {.inputs = {3, 6}, .outputs = {0, 2}, .attrs = rnn_attrs(RnnCell::kGru),
                       .infer = infer_rnn<RnnCell::kGru>, .cpu = rnn_cpu<RnnCell::kGru>});
  r.def(OpKind::kLSTM, {.inputs = {3, 8}, .outputs = {0, 3}, .attrs = rnn_attrs(RnnCell::kLstm),
                        .infer = infer_rnn<RnnCell::kLstm>, .cpu = rnn_cpu<RnnCell::kLstm>});
}

}  // namespace kiln
