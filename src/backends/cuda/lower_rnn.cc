// RNN, GRU and LSTM (speech encoders, older text models) on the GPU: per direction, one cuBLASLt
// product projects every time step's input at once (X W^T), then each step is a product of the
// state with R (H R^T) and a kernel that adds the biases and peepholes, applies the gates and
// updates the state in place (kernels/rnn.h). GRU with linear_before_reset = 0 (ONNX's default)
// needs r before its recurrence product: a first kernel writes z and r * H, a second product
// (r * H) R_h^T, a second kernel the new state. Steps run in order within a direction; the reverse
// direction walks each row from its own last step (sequence_lens), rows past their length keep
// their state and leave Y at zero. Weights, biases, initial states and lengths may be constants or
// computed at run time. Default activations only (Sigmoid, Tanh, Tanh); others stay on the CPU.
#include "backends/cuda/kernels/rnn.h"
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

int gates_of(OpKind op) { return op == OpKind::kLSTM ? 4 : op == OpKind::kGRU ? 3 : 1; }

bool default_activations(const Node& n, int dirs) {
  if (!n.has_attr("activations")) return true;
  std::vector<std::string> want = n.op == OpKind::kLSTM  ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                   : n.op == OpKind::kGRU ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                          : std::vector<std::string>{"Tanh"};
  const std::vector<std::string> got = n.attr_strings("activations");
  if (got.size() != want.size() * size_t(dirs)) return false;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i % want.size()]) return false;
  }
  return true;
}

// Direction d's slice [rows, cols] of a [dirs, rows, cols] weight: uploaded when constant, else
// copied out of the arena value into a buffer of the node.
Expected<DevValue> direction_slice(Lowering& L, const Node& n, const Value* v, int64_t d, int64_t rows, int64_t cols,
                                   k::DT dt) {
  DevValue out;
  out.dt = dt;
  out.ir_dtype = v->type.dtype;
  out.dims = {rows, cols};
  if (const Tensor* t = L.constant(v)) {
    KILN_ASSIGN_OR_RETURN(Tensor whole, convert_tensor(*t, DType::kFloat32));
    KILN_ASSIGN_OR_RETURN(Tensor part, Tensor::create(DType::kFloat32, {rows, cols}));
    std::copy(whole.data<float>() + d * rows * cols, whole.data<float>() + (d + 1) * rows * cols, part.data<float>());
    KILN_ASSIGN_OR_RETURN(out.ref, L.upload(part, dt));
    return out;
  }
  KILN_ASSIGN_OR_RETURN(const DevValue* w, L.rowmajor(v));
  if (w->dt != dt) KILN_UNSUPPORTED("{}: weights of another dtype than X", op_name(n.op));
  if (w->numel() == rows * cols) {  // one direction: the value itself
    out.ref = w->ref;
    return out;
  }
  out.ref = Ref{false, L.scratch(size_t(rows * cols) * size_t(k::dt_size(dt)))};
  emit_copy_nd(L, &n, fmt::format("kernel copy_nd ({} weights, direction {})", op_name(n.op), d), k::dt_size(dt), w->ref,
               d * rows * cols, nd({rows * cols}, {1}), out.ref, 0, nd({rows * cols}, {1}));
  return out;
}

void fill_zero(Lowering& L, const Node& n, k::DT dt, Ref r, int64_t count, const char* what) {
  emit_fill(L, n, fmt::format("kernel fill ({})", what), dt, r, count, 0.0);
}

struct StepRefs {
  Ref gx, gh, wb, rb, peep, h, c, y, seq, aux0, aux1;
  int64_t wb_off = 0, rb_off = 0, peep_off = 0, y_off = 0;
};

void emit_cell(Lowering& L, const Node& n, k::RnnCell cell, k::DT dt, const k::RnnStep& s, const StepRefs& r) {
  ByteWriter w;
  w.put(int32_t(cell));
  w.put(int32_t(dt));
  for (int64_t v : {s.batch, s.hidden, s.steps, s.k, s.gx_t, s.gx_b, s.y_t, s.y_b, r.wb_off, r.rb_off, r.peep_off, r.y_off}) {
    w.i64(v);
  }
  w.u8(s.reverse);
  w.u8(s.input_forget);
  w.put(s.clip);
  for (Ref x : {r.gx, r.gh, r.wb, r.rb, r.peep, r.h, r.c, r.y, r.seq, r.aux0, r.aux1}) put(w, x);
  std::vector<int> reads;
  for (Ref x : {r.gx, r.gh, r.wb, r.rb, r.peep, r.h, r.c, r.seq, r.aux0, r.aux1}) {
    if (x.id >= 0 && !x.weight) reads.push_back(x.id);
  }
  std::vector<int> writes = {r.h.id};
  for (Ref x : {r.c, r.y, r.aux0, r.aux1}) {
    if (x.id >= 0) writes.push_back(x.id);
  }
  static const char* kNames[] = {"rnn", "lstm", "gru", "gru reset", "gru update"};
  L.emit(&n, fmt::format("kernel {} step {}", kNames[int(cell)], s.k), std::move(reads), std::move(writes),
         StepOp::kRnnStep, std::move(w));
}

Status lower_rnn(Lowering& L, const Node& n) {
  const int G = gates_of(n.op);
  const std::string dir = n.attr_string("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional") KILN_UNSUPPORTED("{} direction '{}'", op_name(n.op), dir);
  const int64_t D = dir == "bidirectional" ? 2 : 1;
  if (!default_activations(n, int(D))) KILN_UNSUPPORTED("{} with activations other than the defaults", op_name(n.op));
  const bool batch_first = n.attr_int("layout", 0) != 0;
  const bool lbr = n.op == OpKind::kGRU && n.attr_int("linear_before_reset", 0) != 0;
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  const k::DT dt = x->dt;
  if (!is_float_dt(dt) || x->dims.size() != 3) KILN_UNSUPPORTED("{} of {}", op_name(n.op), n.inputs[0]->type.to_string());
  const int64_t T = batch_first ? x->dims[1] : x->dims[0], B = batch_first ? x->dims[0] : x->dims[1], I = x->dims[2];
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> rdims, exact_dims(n.inputs[2]));
  if (rdims.size() != 3 || rdims[0] != D || rdims[1] % G != 0) KILN_UNSUPPORTED("{} R of shape {}", op_name(n.op), dims_to_string(rdims));
  const int64_t H = rdims[2], GH = G * H;
  if (rdims[1] != GH || n.attr_int("hidden_size", H) != H) KILN_UNSUPPORTED("{} hidden_size", op_name(n.op));
  // Every operand's shape, as the CPU checks them: anything else stays there and is named there.
  const std::vector<int64_t> state_dims = batch_first ? std::vector<int64_t>{B, D, H} : std::vector<int64_t>{D, B, H};
  const std::vector<std::pair<size_t, std::vector<int64_t>>> want = {
      {1, {D, GH, I}}, {3, {D, 2 * GH}}, {4, {B}}, {5, state_dims}, {6, state_dims}, {7, {D, 3 * H}}};
  for (const auto& [i, dims] : want) {
    if (!n.has_input(i) || (i >= 6 && n.op != OpKind::kLSTM)) continue;
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> got, exact_dims(n.inputs[i]));
    if (got != dims) {
      KILN_UNSUPPORTED("{} input {} is {}, expected {}", op_name(n.op), i, dims_to_string(got), dims_to_string(dims));
    }
  }
  const float clip = n.has_attr("clip") ? n.attr_float("clip", 0.f) : 0.f;
  const int eb = k::dt_size(dt);
  auto arena_value = [&](size_t i) -> Expected<const DevValue*> {
    if (!n.has_input(i)) return static_cast<const DevValue*>(nullptr);
    return L.rowmajor(n.inputs[i]);
  };
  KILN_ASSIGN_OR_RETURN(const DevValue* bias, arena_value(3));
  KILN_ASSIGN_OR_RETURN(const DevValue* lens, arena_value(4));
  KILN_ASSIGN_OR_RETURN(const DevValue* h0, arena_value(5));
  const DevValue *c0 = nullptr, *peep = nullptr;
  if (n.op == OpKind::kLSTM) {
    KILN_ASSIGN_OR_RETURN(c0, arena_value(6));
    KILN_ASSIGN_OR_RETURN(peep, arena_value(7));
  }
  for (const DevValue* v : {bias, h0, c0, peep}) {
    if (v && v->dt != dt) KILN_UNSUPPORTED("{}: biases or states of another dtype than X", op_name(n.op));
  }
  if (lens && lens->dt != k::DT::kI32) KILN_UNSUPPORTED("{}: sequence_lens of another type than int32", op_name(n.op));

  // Outputs: Y [T, D, B, H] ([B, T, D, H] batch-first), Y_h and Y_c [D, B, H] ([B, D, H]).
  const DevValue* y = n.has_output(0) ? &L.define(n.outputs[0]) : nullptr;
  if (y && lens) fill_zero(L, n, dt, y->ref, y->numel(), "Y past each sequence's length");
  const int64_t y_t = batch_first ? D * H : D * B * H, y_b = batch_first ? T * D * H : H, y_d = batch_first ? H : B * H;
  const int64_t gx_t = batch_first ? GH : B * GH, gx_b = batch_first ? T * GH : GH;

  // Per direction: the input projection of every step, then the steps.
  const Ref gx{false, L.scratch(size_t(T * B * GH) * size_t(eb))};
  const Ref gh{false, L.scratch(size_t(B * GH) * size_t(eb))};
  const Ref hs{false, L.scratch(size_t(D * B * H) * size_t(eb))};
  const Ref cs = n.op == OpKind::kLSTM ? Ref{false, L.scratch(size_t(D * B * H) * size_t(eb))} : Ref{};
  Ref z, rh, ghh;
  if (n.op == OpKind::kGRU && !lbr) {
    z = Ref{false, L.scratch(size_t(B * H) * size_t(eb))};
    rh = Ref{false, L.scratch(size_t(B * H) * size_t(eb))};
    ghh = Ref{false, L.scratch(size_t(B * H) * size_t(eb))};
  }
  // Initial states: [D, B, H] (or [B, D, H]) into the state buffers, direction by direction.
  for (auto [init, state] : {std::pair{h0, hs}, std::pair{c0, cs}}) {
    if (state.id < 0) continue;
    if (!init) {
      fill_zero(L, n, dt, state, D * B * H, "initial state");
      continue;
    }
    const std::vector<int64_t> dims = {D, B, H};
    emit_copy_nd(L, &n, "kernel copy_nd (initial state)", eb, init->ref, 0,
                 nd(dims, batch_first ? std::vector<int64_t>{H, D * H, 1} : contiguous_strides(dims)), state, 0,
                 nd(dims, contiguous_strides(dims)));
  }
  DevValue xrows = *x;
  xrows.dims = {T * B, I};
  for (int64_t d = 0; d < D; ++d) {
    KILN_ASSIGN_OR_RETURN(DevValue wd, direction_slice(L, n, n.inputs[1], d, GH, I, dt));
    // GRU with linear_before_reset = 0 takes R's rows apart (below); a constant R then needs no
    // whole-direction copy on the device.
    const bool split_r = n.op == OpKind::kGRU && !lbr;
    DevValue rd;
    rd.dt = dt;
    rd.ir_dtype = n.inputs[2]->type.dtype;
    rd.dims = {GH, H};
    if (!split_r || !L.constant(n.inputs[2])) {
      KILN_ASSIGN_OR_RETURN(rd, direction_slice(L, n, n.inputs[2], d, GH, H, dt));
    }
    GemmShape in_proj;
    in_proj.m = T * B;
    in_proj.k = I;
    in_proj.n = GH;
    in_proj.trans_b = true;
    KILN_RETURN_IF_ERROR(emit_gemm(L, n, &xrows, &wd, in_proj, Epilogue{}, gx, dt));
    // GRU (linear_before_reset = 0): R's z/r rows and h rows as separate products.
    DevValue r_zr = rd, r_h = rd;
    if (split_r) {
      if (const Tensor* rt = L.constant(n.inputs[2])) {
        // Slices of this direction's [3H, H] block: rows 0..2H and 2H..3H.
        KILN_ASSIGN_OR_RETURN(Tensor whole, convert_tensor(*rt, DType::kFloat32));
        KILN_ASSIGN_OR_RETURN(Tensor a, Tensor::create(DType::kFloat32, {2 * H, H}));
        KILN_ASSIGN_OR_RETURN(Tensor c, Tensor::create(DType::kFloat32, {H, H}));
        const float* base = whole.data<float>() + d * GH * H;
        std::copy(base, base + 2 * H * H, a.data<float>());
        std::copy(base + 2 * H * H, base + 3 * H * H, c.data<float>());
        KILN_ASSIGN_OR_RETURN(r_zr.ref, L.upload(a, dt));
        KILN_ASSIGN_OR_RETURN(r_h.ref, L.upload(c, dt));
      } else {
        r_zr.ref = Ref{false, L.scratch(size_t(2 * H * H) * size_t(eb))};
        r_h.ref = Ref{false, L.scratch(size_t(H * H) * size_t(eb))};
        emit_copy_nd(L, &n, "kernel copy_nd (GRU R, z and r rows)", eb, rd.ref, 0, nd({2 * H * H}, {1}), r_zr.ref, 0,
                     nd({2 * H * H}, {1}));
        emit_copy_nd(L, &n, "kernel copy_nd (GRU R, h rows)", eb, rd.ref, 2 * H * H, nd({H * H}, {1}), r_h.ref, 0,
                     nd({H * H}, {1}));
      }
      r_zr.dims = {2 * H, H};
      r_h.dims = {H, H};
    }
    DevValue state;
    state.dt = dt;
    state.ir_dtype = x->ir_dtype;
    state.dims = {B, H};
    // The state of direction d: rows d * B .. (d + 1) * B of hs; a copy keeps the product's operand at offset 0.
    Ref h_d = hs, c_d = cs;
    if (d > 0) {
      h_d = Ref{false, L.scratch(size_t(B * H) * size_t(eb))};
      emit_copy_nd(L, &n, "kernel copy_nd (direction 1 state)", eb, hs, B * H, nd({B * H}, {1}), h_d, 0, nd({B * H}, {1}));
      if (cs.id >= 0) {
        c_d = Ref{false, L.scratch(size_t(B * H) * size_t(eb))};
        emit_copy_nd(L, &n, "kernel copy_nd (direction 1 cell)", eb, cs, B * H, nd({B * H}, {1}), c_d, 0, nd({B * H}, {1}));
      }
    }
    state.ref = h_d;
    StepRefs refs;
    refs.gx = gx;
    refs.gh = gh;
    refs.h = h_d;
    refs.c = c_d;
    refs.y = y ? y->ref : Ref{};
    refs.y_off = d * y_d;
    refs.seq = lens ? lens->ref : Ref{};
    if (bias) {
      refs.wb = refs.rb = bias->ref;
      refs.wb_off = d * 2 * GH;
      refs.rb_off = d * 2 * GH + GH;
    }
    if (peep) {
      refs.peep = peep->ref;
      refs.peep_off = d * 3 * H;
    }
    k::RnnStep s;
    s.batch = B;
    s.hidden = H;
    s.steps = T;
    s.reverse = dir == "reverse" || d == 1;
    s.gx_t = gx_t;
    s.gx_b = gx_b;
    s.y_t = y_t;
    s.y_b = y_b;
    s.clip = clip;
    s.input_forget = n.attr_int("input_forget", 0) != 0;
    const k::RnnCell cell = n.op == OpKind::kLSTM ? k::RnnCell::kLstm
                            : n.op == OpKind::kRNN ? k::RnnCell::kRnn
                            : lbr                  ? k::RnnCell::kGru
                                                   : k::RnnCell::kGruReset;
    for (int64_t step = 0; step < T; ++step) {
      s.k = step;
      GemmShape rec;
      rec.m = B;
      rec.k = H;
      rec.trans_b = true;
      if (cell != k::RnnCell::kGruReset) {
        rec.n = GH;
        KILN_RETURN_IF_ERROR(emit_gemm(L, n, &state, &rd, rec, Epilogue{}, gh, dt));
        emit_cell(L, n, cell, dt, s, refs);
        if (step == 0 && lens) L.steps.back().bad_index_slot = L.new_bad_index_slot();
        continue;
      }
      rec.n = 2 * H;
      KILN_RETURN_IF_ERROR(emit_gemm(L, n, &state, &r_zr, rec, Epilogue{}, gh, dt));
      StepRefs first = refs;
      first.aux0 = z;
      first.aux1 = rh;
      first.y = Ref{};
      emit_cell(L, n, k::RnnCell::kGruReset, dt, s, first);
      if (step == 0 && lens) L.steps.back().bad_index_slot = L.new_bad_index_slot();
      DevValue rhv = state;
      rhv.ref = rh;
      rec.n = H;
      KILN_RETURN_IF_ERROR(emit_gemm(L, n, &rhv, &r_h, rec, Epilogue{}, ghh, dt));
      StepRefs second = refs;
      second.gh = ghh;
      second.aux0 = z;
      emit_cell(L, n, k::RnnCell::kGruUpdate, dt, s, second);
    }
    if (d > 0) {
      emit_copy_nd(L, &n, "kernel copy_nd (direction 1 state back)", eb, h_d, 0, nd({B * H}, {1}), hs, B * H, nd({B * H}, {1}));
      if (cs.id >= 0) {
        emit_copy_nd(L, &n, "kernel copy_nd (direction 1 cell back)", eb, c_d, 0, nd({B * H}, {1}), cs, B * H, nd({B * H}, {1}));
      }
    }
  }
  // Y_h and Y_c: the final states, [D, B, H] or [B, D, H].
  for (auto [i, state] : {std::pair{size_t(1), hs}, std::pair{size_t(2), cs}}) {
    if (!n.has_output(i) || state.id < 0) continue;
    const DevValue& o = L.define(n.outputs[i]);
    const std::vector<int64_t> dims = {D, B, H};
    emit_copy_nd(L, &n, i == 1 ? "kernel copy_nd (Y_h)" : "kernel copy_nd (Y_c)", eb, state, 0, nd(dims, contiguous_strides(dims)),
                 o.ref, 0, nd(dims, batch_first ? std::vector<int64_t>{H, D * H, 1} : contiguous_strides(dims)));
  }
  return Status::ok();
}

Expected<StepFn> bind_rnn_step(Params& in, BindCtx&) {
  const auto cell = k::RnnCell(in.i32());
  const k::DT dt = in.dt();
  k::RnnStep s;
  int64_t wb_off = 0, rb_off = 0, peep_off = 0, y_off = 0;
  for (int64_t* v : {&s.batch, &s.hidden, &s.steps, &s.k, &s.gx_t, &s.gx_b, &s.y_t, &s.y_b, &wb_off, &rb_off, &peep_off, &y_off}) {
    *v = in.i64();
  }
  s.reverse = in.flag();
  s.input_forget = in.flag();
  s.clip = in.f32();
  const Ref gx = in.ref(), gh = in.ref(), wb = in.opt_ref(), rb = in.opt_ref(), peep = in.opt_ref(), h = in.ref(),
            c = in.opt_ref(), y = in.opt_ref(), seq = in.opt_ref(), aux0 = in.opt_ref(), aux1 = in.opt_ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (int(cell) < 0 || int(cell) > 4 || (cell == k::RnnCell::kLstm && c.id < 0) ||
      ((cell == k::RnnCell::kGruReset || cell == k::RnnCell::kGruUpdate) && aux0.id < 0) ||
      (cell == k::RnnCell::kGruReset && aux1.id < 0)) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed recurrence parameters", in.step().label);
  }
  const int eb = k::dt_size(dt);
  const int slot = in.step().bad_index_slot;  // sequence lengths past the steps are counted here
  return StepFn([=](const RunCtx& ctx) {
    auto at = [&](Ref r, int64_t off) -> void* {
      return r.id < 0 ? nullptr : static_cast<char*>(ctx.ptr(r)) + off * eb;
    };
    k::RnnStep p = s;
    p.gx = ctx.ptr(gx);
    p.gh = ctx.ptr(gh);
    p.wb = at(wb, wb_off);
    p.rb = at(rb, rb_off);
    p.peep = at(peep, peep_off);
    p.h = ctx.ptr(h);
    p.c = at(c, 0);
    p.y = at(y, y_off);
    p.seq_lens = seq.id < 0 ? nullptr : static_cast<const int32_t*>(ctx.ptr(seq));
    p.aux0 = at(aux0, 0);
    p.aux1 = at(aux1, 0);
    p.bad = slot >= 0 ? ctx.bad_index + slot : nullptr;
    return cuda_status(k::rnn_step(cell, dt, p, ctx.stream), "rnn_step");
  });
}

}  // namespace

void register_rnn_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kRNN] = lower_rnn;
  t[OpKind::kGRU] = lower_rnn;
  t[OpKind::kLSTM] = lower_rnn;
}

void register_rnn_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kRnnStep] = bind_rnn_step; }

}  // namespace kiln::cuda
