// Normalizations and reductions: Softmax, LayerNorm, RMSNorm, BatchNorm (inference), GroupNorm and
// InstanceNorm, Reduce*, ArgMax/ArgMin, TopK, GlobalAverage/MaxPool. The kernels keep statistics in f32 whatever the storage
// dtype, which is what makes half-precision builds safe here.
#include <cmath>
#include <limits>

#include "backends/cuda/lower.h"
#include "backends/cuda/timing_cache.h"

namespace kiln::cuda {

namespace {



Status lower_softmax(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (!is_float_dt(x->dt)) KILN_UNSUPPORTED("Softmax on {}", dtype_name(x->ir_dtype));
  int64_t r = int64_t(x->dims.size()), axis = n.attr_int("axis", -1);
  if (axis < 0) axis += r;
  int64_t cols = r ? x->dims[size_t(axis)] : 1, rows = x->numel() / std::max<int64_t>(cols, 1);
  const DevValue& y = L.define(n.outputs[0]);
  const bool log = n.op == OpKind::kLogSoftmax;
  const char* what = log ? "kernel log_softmax" : "kernel softmax";
  const int64_t inner = r ? prod_of(x->dims, size_t(axis) + 1, size_t(r)) : 1;
  if (inner == 1) {
    emit_softmax(L, &n, what, x->dt, x->ref, y.ref, rows, cols, log);
    return Status::ok();
  }
  // Over a middle axis: x as [outer, C, inner] is copied to [outer, inner, C], normalized by rows
  // and copied back.
  const int64_t outer = rows / inner, eb = k::dt_size(x->dt);
  const size_t bytes = size_t(x->numel()) * size_t(eb);
  const Ref t{false, L.scratch(bytes)}, u{false, L.scratch(bytes)};
  const std::vector<int64_t> moved = {outer, inner, cols}, moved_strides = {inner * cols, 1, inner};
  emit_copy_nd(L, &n, "kernel copy_nd (softmax axis last)", int(eb), x->ref, 0, nd(moved, moved_strides), t, 0,
               nd(moved, {inner * cols, cols, 1}));
  emit_softmax(L, &n, what, x->dt, t, u, rows, cols, log);
  emit_copy_nd(L, &n, "kernel copy_nd (softmax axis back)", int(eb), u, 0, nd(moved, {inner * cols, cols, 1}), y.ref, 0,
               nd(moved, moved_strides));
  return Status::ok();
}

Expected<StepFn> bind_softmax(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  const int64_t rows = in.i64(), cols = in.i64();
  const int mode = in.u8_in(2);  // 0 softmax, 1 log-softmax, 2 softmax with masked rows zero
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::softmax(dt, c.ptr(xr), c.ptr(yr), rows, cols, mode == 1, mode == 2, c.stream), "softmax");
  });
}

// LayerNormalization's optional Mean and InvStdDev outputs ([rows] in the stash type), by a second
// kernel over x: they are rare in inference graphs, so the fused kernel stays as it is.
Status emit_row_moments(Lowering& L, const Node& n, const DevValue* x, int64_t rows, int64_t cols, float eps) {
  const Value* mo = n.has_output(1) ? n.outputs[1] : nullptr;
  const Value* io = n.has_output(2) ? n.outputs[2] : nullptr;
  if (!mo && !io) return Status::ok();
  const DevValue* m = mo ? &L.define(mo) : nullptr;
  const DevValue* iv = io ? &L.define(io) : nullptr;
  const k::DT dt = m ? m->dt : iv->dt;
  if (!is_float_dt(dt) || (m && iv && m->dt != iv->dt)) KILN_UNSUPPORTED("Mean/InvStdDev of {}", dtype_name((m ? m : iv)->ir_dtype));
  if ((m && m->numel() != rows) || (iv && iv->numel() != rows)) KILN_UNSUPPORTED("Mean/InvStdDev of {} rows", rows);
  ByteWriter w;
  w.put(int32_t(x->dt));
  w.put(int32_t(dt));
  put(w, x->ref);
  put(w, m ? m->ref : Ref{});
  put(w, iv ? iv->ref : Ref{});
  w.i64(rows);
  w.i64(cols);
  w.put(eps);
  std::vector<int> writes;
  if (m) writes.push_back(m->ref.id);
  if (iv) writes.push_back(iv->ref.id);
  L.emit(&n, "kernel row_moments (Mean, InvStdDev)", {read_id(x)}, writes, StepOp::kRowMoments, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_row_moments(Params& in, BindCtx&) {
  const k::DT dt = in.dt(), out_dt = in.dt();
  const Ref xr = in.ref(), mr = in.opt_ref(), ir = in.opt_ref();
  const int64_t rows = in.i64(), cols = in.i64();
  const float eps = in.f32();
  KILN_RETURN_IF_ERROR(in.done());
  if (rows < 0 || cols < 1 || (mr.id < 0 && ir.id < 0)) return KILN_ERROR(kInvalidModel, "step '{}': malformed", in.step().label);
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::row_moments(dt, c.ptr(xr), rows, cols, eps, out_dt, mr.id >= 0 ? c.ptr(mr) : nullptr,
                                      ir.id >= 0 ? c.ptr(ir) : nullptr, c.stream),
                       "row_moments");
  });
}

Status lower_layer_norm(Lowering& L, const Node& n) {
  if (n.op == OpKind::kRMSNormalization) {
    for (size_t i = 1; i < n.outputs.size(); ++i) {
      if (n.has_output(i)) KILN_UNSUPPORTED("{} with extra outputs", op_name(n.op));
    }
  }
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (!is_float_dt(x->dt)) KILN_UNSUPPORTED("{} on {}", op_name(n.op), dtype_name(x->ir_dtype));
  int64_t r = int64_t(x->dims.size()), axis = n.attr_int("axis", -1);
  if (axis < 0) axis += r;
  int64_t cols = prod_of(x->dims, size_t(axis), size_t(r)), rows = x->numel() / std::max<int64_t>(cols, 1);
  KILN_ASSIGN_OR_RETURN(const DevValue* scale, L.rowmajor(n.inputs[1]));
  if (scale->numel() != cols || scale->dt != x->dt) KILN_UNSUPPORTED("{} scale broadcast over rows", op_name(n.op));
  const DevValue* bias = nullptr;
  bool rms = n.op == OpKind::kRMSNormalization;
  if (!rms && n.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(bias, L.rowmajor(n.inputs[2]));
    if (bias->numel() != cols || bias->dt != x->dt) KILN_UNSUPPORTED("LayerNormalization bias broadcast over rows");
  }
  float eps = n.attr_float("epsilon", 1e-5f);
  KILN_RETURN_IF_ERROR(emit_row_moments(L, n, x, rows, cols, eps));
  // A half model's output that nothing else reads is written in its declared f32 by the kernel
  // itself: no output cast pass over the whole output (bench/RESULTS.md, "LayerNorm writes a half
  // model's f32 output (c38a9c8)").
  const Value* out = n.outputs[0];
  k::DT dt = x->dt, y_dt = dt;
  if (L.is_graph_output(out) && L.readers(out).empty() && to_kdt(out->type.dtype) == k::DT::kF32 &&
      (dt == k::DT::kF16 || dt == k::DT::kBF16)) {
    y_dt = k::DT::kF32;
  }
  const DevValue& y = L.define(out, Layout::kRowMajor, y_dt);
  const bool pdl = L.follows_trigger();
  ByteWriter w;
  w.u8(rms);
  w.put(int32_t(dt));
  w.put(int32_t(y_dt));
  put(w, x->ref);
  put(w, scale->ref);
  put(w, bias ? bias->ref : Ref{});
  put(w, y.ref);
  w.i64(rows);
  w.i64(cols);
  w.put(eps);
  w.u8(pdl);
  L.emit(&n, fmt::format("kernel {}{}{}", rms ? "rms_norm" : "layer_norm", y_dt != dt ? " (f32 output)" : "",
                         pdl ? " (programmatic launch)" : ""),
         {read_id(x), read_id(scale), bias ? read_id(bias) : -1}, {y.ref.id}, StepOp::kLayerNorm, std::move(w));
  L.steps.back().triggers_dependents = true;  // the kernels call pdl_launch_dependents() first
  return Status::ok();
}

Expected<StepFn> bind_layer_norm(Params& in, BindCtx&) {
  const bool rms = in.flag();
  const k::DT dt = in.dt(), y_dt = in.dt();
  const Ref xr = in.ref(), sr = in.ref(), br = in.opt_ref(), yr = in.ref();
  const int64_t rows = in.i64(), cols = in.i64();
  const float eps = in.f32();
  const bool pdl = in.flag();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    if (rms) {
      return cuda_status(k::rms_norm(dt, c.ptr(xr), c.ptr(sr), c.ptr(yr), y_dt, rows, cols, eps, c.stream, pdl), "rms_norm");
    }
    return cuda_status(k::layer_norm(dt, c.ptr(xr), c.ptr(sr), br.id >= 0 ? c.ptr(br) : nullptr, c.ptr(yr), y_dt, rows,
                                     cols, eps, c.stream, pdl), "layer_norm");
  });
}

// Inference BatchNormalization folds to y = x * s[c] + t[c], s = scale / sqrt(var + eps),
// t = bias - mean * s (computed on the host in double).
// Training mode and statistics computed at run time: lower_train_mode.cc.
Status lower_batch_norm(Lowering& L, const Node& n) {
  if (n.attr_int("training_mode", 0) != 0) return lower_batch_norm_train(L, n);
  for (size_t i = 1; i < n.outputs.size(); ++i) {
    if (n.has_output(i)) KILN_UNSUPPORTED("BatchNormalization's statistics outputs outside training mode");
  }
  for (size_t i = 1; i < 5; ++i) {
    if (i >= n.inputs.size() || !n.inputs[i]) KILN_UNSUPPORTED("BatchNormalization without input {}", i);
    if (!L.constant(n.inputs[i])) return lower_batch_norm_train(L, n);
  }
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  if (!is_float_dt(x->dt) || x->dims.size() < 2) KILN_UNSUPPORTED("BatchNormalization on {}", dtype_name(x->ir_dtype));
  const Tensor *sc = L.constant(n.inputs[1]), *b = L.constant(n.inputs[2]), *m = L.constant(n.inputs[3]),
               *v = L.constant(n.inputs[4]);
  int64_t c = x->dims[1];
  double eps = n.attr_float("epsilon", 1e-5f);
  std::vector<float> s(static_cast<size_t>(c)), t(static_cast<size_t>(c));
  for (int64_t i = 0; i < c; ++i) {
    double k = sc->as_double(i) / std::sqrt(v->as_double(i) + eps);
    s[size_t(i)] = float(k);
    t[size_t(i)] = float(b->as_double(i) - m->as_double(i) * k);
  }
  KILN_ASSIGN_OR_RETURN(Ref sr, L.upload_raw(s.data(), s.size() * sizeof(float)));
  KILN_ASSIGN_OR_RETURN(Ref tr, L.upload_raw(t.data(), t.size() * sizeof(float)));
  int64_t spatial = prod_of(x->dims, 2, x->dims.size());
  bool nhwc = x->layout == Layout::kNHWC;
  int64_t outer = nhwc ? x->dims[0] * spatial : x->dims[0], inner = nhwc ? 1 : spatial;
  // A Relu or a constant Clip that alone reads the output is the kernel's clamp (DenseNet's BN-ReLU).
  const Node* act = L.only_consumer(n.outputs[0]);
  if (act && L.is_fused(act)) act = nullptr;  // taken by a pattern (a depthwise convolution's input)
  float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
  if (act && act->op == OpKind::kRelu) {
    lo = 0;
  } else if (act && act->op == OpKind::kClip) {
    const Tensor* a = act->has_input(1) ? L.constant(act->inputs[1]) : nullptr;
    const Tensor* b = act->has_input(2) ? L.constant(act->inputs[2]) : nullptr;
    if ((act->has_input(1) && (!a || a->numel() != 1)) || (act->has_input(2) && (!b || b->numel() != 1))) act = nullptr;
    if (act && a) lo = float(a->as_double(0));
    if (act && b) hi = float(b->as_double(0));
  } else {
    act = nullptr;
  }
  const DevValue& y = L.define(act ? act->outputs[0] : n.outputs[0], x->layout);
  ByteWriter w;
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, sr);
  put(w, tr);
  put(w, y.ref);
  for (int64_t v : {outer, c, inner}) w.i64(v);
  if (!act) {
    L.emit(&n, "kernel channel_affine", {read_id(x)}, {y.ref.id}, StepOp::kChannelAffine, std::move(w));
    return Status::ok();
  }
  w.put(lo);
  w.put(hi);
  L.emit(&n, act->op == OpKind::kRelu ? "kernel channel_affine +relu" : "kernel channel_affine +clip", {read_id(x)},
         {y.ref.id}, StepOp::kChannelAffineClamp, std::move(w));
  L.mark_fused(act, &n);
  return Status::ok();
}

template <bool kClamp>
Expected<StepFn> bind_channel_affine(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), sr = in.ref(), tr = in.ref(), yr = in.ref();
  const int64_t outer = in.i64(), c = in.i64(), inner = in.i64();
  float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
  if (kClamp) {
    lo = in.f32();
    hi = in.f32();
  }
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& cx) {
    return cuda_status(k::channel_affine(dt, cx.ptr(xr), static_cast<const float*>(cx.ptr(sr)),
                                         static_cast<const float*>(cx.ptr(tr)), cx.ptr(yr), outer, c, inner, lo, hi,
                                         cx.stream),
                       "channel_affine");
  });
}

// Whether lower_group_norm will take n, so that an Add is fused in front of it only then: float x of
// static rank >= 3, channels in whole groups, rows the statistics kernels can take, constant
// parameters of c or `groups` values (where it declines anyway, lower_group_norm runs the Add).
bool group_norm_lowers(const Lowering& L, const Node& n) {
  const Type& t = n.inputs[0]->type;
  if (!t.is_tensor() || !t.has_rank() || !t.shape->is_static() || t.shape->rank() < 3) return false;
  if (t.dtype != DType::kFloat32 && t.dtype != DType::kFloat16 && t.dtype != DType::kBFloat16) return false;
  const std::vector<int64_t> d = *t.shape->static_dims();
  const int64_t c = d[1], groups = n.op == OpKind::kInstanceNormalization ? c : n.attr_int("num_groups", 0);
  if (groups < 1 || c % groups != 0 || (c / groups) * prod_of(d, 2, d.size()) > int64_t(65535) * 8192) return false;
  for (int i : {1, 2}) {
    const Tensor* p = n.has_input(i) ? L.constant(n.inputs[i]) : nullptr;
    if (!p || (p->numel() != c && p->numel() != groups)) return false;
  }
  return true;
}

}  // namespace

// A diffusion UNet's ResBlock adds the timestep embedding between its first convolution and its
// second GroupNorm, h + emb[:, :, None, None]: the normalization adds it as it reads h
// (k::GroupNormArgs::x_bias) and the Add's pass over h, a launch and a round trip, disappears.
// The Add must be the norm's input alone, h of the Add's shape and dtype, the other operand
// broadcasting only along the batch (per image, or one for all) and the channels.
void find_norm_input_bias(Lowering& L) {
  for (const auto& up : L.graph().nodes) {
    const Node& add = *up;
    if (add.op != OpKind::kAdd || L.is_fused(&add) || add.inputs.size() != 2 || !add.outputs[0]) continue;
    const Node* norm = L.only_consumer(add.outputs[0]);
    if (!norm || (norm->op != OpKind::kGroupNormalization && norm->op != OpKind::kInstanceNormalization) ||
        norm->inputs[0] != add.outputs[0] || L.is_fused(norm) || !group_norm_lowers(L, *norm)) {
      continue;
    }
    const Type& yt = add.outputs[0]->type;
    const std::vector<int64_t> yd = *yt.shape->static_dims();  // static: group_norm_lowers checked
    for (int i : {0, 1}) {
      const Value* h = add.inputs[size_t(i)];
      const Value* b = add.inputs[size_t(1 - i)];
      if (!(h->type == yt) || L.constant(h) || !b->type.is_tensor() || b->type.dtype != yt.dtype || !b->type.has_rank() ||
          !b->type.shape->is_static() || b->type.shape->rank() > yd.size()) {
        continue;
      }
      const std::vector<int64_t> bd = *b->type.shape->static_dims();
      const size_t lead = yd.size() - bd.size();
      auto dim = [&](size_t a) { return a < lead ? int64_t(1) : bd[a - lead]; };
      bool ok = dim(1) == yd[1] && (dim(0) == yd[0] || dim(0) == 1) && prod_of(bd, 0, bd.size()) < prod_of(yd, 0, yd.size());
      for (size_t a = 2; a < yd.size(); ++a) ok = ok && dim(a) == 1;
      if (!ok) continue;
      L.norm_input_bias[norm] = NormInputBias{&add, h, b, dim(0) == yd[0] && yd[0] > 1 ? yd[1] : 0};
      L.mark_fused(&add, norm);
      break;
    }
  }
}

namespace {

// The current GPU's SMs (132 on an H100 SXM when the driver cannot say).
int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms < 1) {
    return 132;
  }
  return sms;
}

// The blocks an image for the one-launch NHWC normalization (k::group_norm_nhwc_one_launch), or 0
// for the three launches. Where the build autotunes, the three launches, one launch with as many
// blocks as fit and with a half and a quarter of them are timed inside a graph on this shape (the
// input hot in L2, as a convolution just wrote it) and the choice kept in the timing cache as
// "three" or "one/D" (the blocks that fit divided by D, so that a dynamic engine's shape plan taking
// the nearest timed shape's choice scales it to its own batch); without timing, the three launches
// (bench/RESULTS.md, thirty-seventh session: each wins somewhere).
Expected<int> pick_group_norm_launch(Lowering& L, k::DT dt, int64_t nb, int64_t c, int64_t groups, int64_t spatial,
                                     int64_t pixels, int act) {
  const int most = L.options().group_norm_one < 0 ? 0 : k::group_norm_nhwc_one_blocks(dt, nb, c, groups, spatial);
  if (most == 0 || L.options().group_norm_one == 1) return most;
  TimingCache* cache = L.options().autotune ? L.options().timing_cache.get() : nullptr;
  const std::string key = fmt::format("dt{} c{} g{} a{} @ {}x{}", int(dt), c, groups, act, nb, spatial);
  if (cache) {
    std::optional<std::string> v = cache->get("groupnorm", key);
    if (!v && !L.options().time_misses) v = cache->nearest("groupnorm", key);
    int d = 0;
    if (v && std::sscanf(v->c_str(), "one/%d", &d) == 1 && (d == 1 || d == 2 || d == 4)) return std::max(most / d, 1);
    if (v && *v == "three") return 0;
  }
  if (!L.options().autotune || !L.options().time_misses) return 0;
  const size_t bytes = size_t(nb * spatial * c) * size_t(k::dt_size(dt));
  RotatingCopies x(bytes, false), y(bytes, false), p(size_t(c) * sizeof(float), false),
      scratch(std::max(k::group_norm_nhwc_scratch_bytes(nb, groups, spatial, pixels),
                       k::group_norm_nhwc_one_scratch_bytes(nb, groups, most)),
              false);
  int best = 0;  // the divisor of `most`; 0: three launches
  float best_ms = -1;
  if (x.ok() && y.ok() && p.ok() && scratch.ok()) {
    k::GroupNormArgs a = k::group_norm_shape(dt, nb, c, groups, spatial, 1e-5f, act);
    a.x = x.copy(0);
    a.scale = a.shift = static_cast<const float*>(p.copy(0));
    a.y = y.copy(0);
    a.scratch = scratch.copy(0);
    for (int d : {0, 1, 2, 4}) {
      if (d > 1 && most / d < 1) continue;  // small batches: fewer, fuller blocks merge faster
      const float ms = time_in_graph(8, [&](int, cudaStream_t s) {
        return (d == 0 ? k::group_norm_nhwc(a, pixels, s) : k::group_norm_nhwc_one_launch(a, most / d, s)) == cudaSuccess;
      });
      if (ms > 0 && (best_ms < 0 || ms < best_ms)) {
        best = d;
        best_ms = ms;
      }
    }
  }
  KILN_RETURN_IF_ERROR(finish_timing("group normalization"));
  if (cache) cache->put("groupnorm", key, best ? fmt::format("one/{}", best) : "three");
  return best ? most / best : 0;
}

// InstanceNormalization and GroupNormalization (k::group_norm): statistics per (batch, group) in
// f32, the channel's scale and shift (constants, per channel or, GroupNormalization-18, per group;
// or per-channel values computed at run time),
// and the output's only reader fused in when it is Relu or SiLU (diffusion UNets' GroupNorm ->
// SiLU), and an Add in front of it of a value broadcast per image and channel (find_norm_input_bias).
// NCHW x, or NHWC straight from a convolution; statistics scratch in the arena. With `ib`, the Add
// in front of it is applied as x is read.
Status lower_group_norm_with(Lowering& L, const Node& n, const NormInputBias* ib) {
  const bool instance = n.op == OpKind::kInstanceNormalization;
  // A convolution's NHWC output is normalized in its layout (no round trip through NCHW), its
  // statistics split over about two blocks per SM whatever the batch (bench/RESULTS.md, twenty-eighth
  // session: the UNet's round trips at batch 1 and 16).
  const Value* xv = ib ? ib->x : n.inputs[0];
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(xv));
  const int64_t groups_attr = instance ? (x->dims.size() > 1 ? x->dims[1] : 0) : n.attr_int("num_groups", 0);
  const bool nhwc = x->layout == Layout::kNHWC && x->dims.size() == 4 && groups_attr >= 1 &&
                    k::group_norm_nhwc_smem(x->dt, x->dims[1]) <= 48 * 1024;
  if (!nhwc) {
    KILN_ASSIGN_OR_RETURN(x, L.rowmajor(xv));
  }
  if (!is_float_dt(x->dt) || x->dims.size() < 2) KILN_UNSUPPORTED("{} on {}", op_name(n.op), dtype_name(x->ir_dtype));
  const int64_t nb = x->dims[0], c = x->dims[1], spatial = prod_of(x->dims, 2, x->dims.size());
  const int64_t groups = instance ? c : n.attr_int("num_groups", 0);
  if (groups < 1 || c % groups != 0) KILN_UNSUPPORTED("{} channels in {} groups", c, groups);
  if (k::group_norm_scratch_bytes(nb, c, groups, spatial) == 0 || (c / groups) * spatial > int64_t(65535) * 8192) {
    KILN_UNSUPPORTED("{} groups of {} values", nb * groups, (c / groups) * spatial);
  }
  // The per-channel scale and shift as f32: constants uploaded (a per-group one spread over its
  // channels), values computed at run time read in place (or cast to f32 first in half builds).
  std::vector<int> param_reads;
  auto channel_param = [&](const Value* v) -> Expected<Ref> {
    if (const Tensor* p = L.constant(v)) {
      if (p->numel() != c && p->numel() != groups) KILN_UNSUPPORTED("{} parameter of {} values", op_name(n.op), p->numel());
      std::vector<float> h(static_cast<size_t>(c));
      for (int64_t i = 0; i < c; ++i) h[size_t(i)] = float(p->as_double(p->numel() == c ? i : i / (c / groups)));
      return L.upload_raw(h.data(), h.size() * sizeof(float));
    }
    KILN_ASSIGN_OR_RETURN(const DevValue* d, L.rowmajor(v));
    if (d->numel() != c || !is_float_dt(d->dt)) {
      KILN_UNSUPPORTED("{} parameter of {} values computed at run time", op_name(n.op), d->numel());
    }
    param_reads.push_back(read_id(d));
    if (d->dt == k::DT::kF32) return d->ref;
    const Ref f{false, L.scratch(size_t(c) * sizeof(float))};
    emit_cast(L, &n, "kernel cast (norm parameter to f32)", d->dt, k::DT::kF32, d->ref, f, c);
    param_reads.push_back(f.id);
    return f;
  };
  KILN_ASSIGN_OR_RETURN(Ref sr, channel_param(n.inputs[1]));
  KILN_ASSIGN_OR_RETURN(Ref tr, channel_param(n.inputs[2]));
  const Value* out = n.outputs[0];
  int act = 0;
  const Node* next = L.only_consumer(out);
  if (next && next->op == OpKind::kRelu) act = 1;
  else if (next && is_silu(*next)) act = 2;
  if (act) out = next->outputs[0];
  const int64_t pixels = nhwc ? k::group_norm_nhwc_pixels(nb, spatial, 2 * int64_t(sm_count())) : 0;
  int one_blocks = 0;
  if (nhwc) {
    KILN_ASSIGN_OR_RETURN(one_blocks, pick_group_norm_launch(L, x->dt, nb, c, groups, spatial, pixels, act));
  }
  // The one-launch path keeps room for the three launches too: a session binds them instead where
  // its GPU cannot hold the recorded blocks at once (bind_group_norm).
  const int scratch = L.scratch(nhwc ? std::max(k::group_norm_nhwc_scratch_bytes(nb, groups, spatial, pixels),
                                                k::group_norm_nhwc_one_scratch_bytes(nb, groups, one_blocks))
                                     : k::group_norm_scratch_bytes(nb, c, groups, spatial));
  Ref br;
  if (ib) {  // [n or 1, c, 1...]: the same bytes row-major or NHWC
    KILN_ASSIGN_OR_RETURN(const DevValue* b, L.rowmajor(ib->bias));
    if (b->dt != x->dt) KILN_UNSUPPORTED("an input bias of {} on {}", dtype_name(b->ir_dtype), dtype_name(x->ir_dtype));
    br = b->ref;
    param_reads.push_back(read_id(b));
  }
  const DevValue& y = L.define(out, nhwc ? Layout::kNHWC : Layout::kRowMajor);
  const float eps = n.attr_float("epsilon", 1e-5f);
  ByteWriter w;
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, sr);
  put(w, tr);
  put(w, y.ref);
  put(w, Ref{false, scratch});
  for (int64_t v : {nb, c, groups, spatial}) w.i64(v);
  w.put(eps);
  w.put(int32_t(act));
  // Layout: 0 NCHW, 1 NHWC in 256-pixel blocks (engines from before the split was chosen), 2 NHWC
  // with the pixels per block recorded after it, 3 NHWC in one cooperative launch with the blocks an
  // image and then layout 2's pixels recorded after it. Plus 8 where an input bias follows (its
  // buffer and elements per image).
  w.u8(uint8_t((one_blocks ? 3 : nhwc ? 2 : 0) | (ib ? 8 : 0)));
  if (one_blocks) w.i64(one_blocks);
  if (nhwc) w.i64(pixels);
  if (ib) {
    put(w, br);
    w.i64(ib->stride);
  }
  if (act) L.mark_fused(next, &n);
  std::vector<int> reads = {read_id(x), scratch};
  reads.insert(reads.end(), param_reads.begin(), param_reads.end());
  L.emit(&n, fmt::format("kernel group_norm ({} groups{}){}{}{}", groups, nhwc ? ", NHWC" : "",
                         one_blocks ? fmt::format(" in one launch ({} blocks an image)", one_blocks) : "",
                         ib ? " +input bias" : "", act == 1 ? " +relu" : act == 2 ? " +silu" : ""),
         std::move(reads), {y.ref.id, scratch}, StepOp::kGroupNorm, std::move(w));
  return Status::ok();
}

Status lower_group_norm(Lowering& L, const Node& n) {
  const auto ib_it = L.norm_input_bias.find(&n);
  const NormInputBias* ib = ib_it == L.norm_input_bias.end() ? nullptr : &ib_it->second;
  if (ib) {
    Status s = lower_group_norm_with(L, n, ib);
    if (s || s.code() != ErrorCode::kUnsupported) return s;
    // The Add was taken as no step of its own: where the norm declines it, the Add runs here and
    // the norm reads its output as usual (or goes to the CPU reading it).
    const auto& table = lowering_table();
    auto add = table.find(OpKind::kAdd);
    if (add == table.end()) return KILN_ERROR(kInternal, "no CUDA lowering for Add");
    if (Status a = add->second(L, *ib->add); !a) {
      return KILN_ERROR(kInternal, "{} in front of {}: {}", ib->add->describe(), n.describe(), a.message());
    }
  }
  return lower_group_norm_with(L, n, nullptr);
}

Expected<StepFn> bind_group_norm(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), sr = in.ref(), tr = in.ref(), yr = in.ref(), scr = in.ref();
  const int64_t nb = in.i64(), c = in.i64(), groups = in.i64(), spatial = in.i64();
  const float eps = in.f32();
  const int32_t act = in.i32();
  const int code = in.u8_in(11);
  const int layout = code & 7;
  const bool nhwc = layout != 0, biased = (code & 8) != 0;
  const int64_t blocks = layout == 3 ? in.i64() : 0;
  const int64_t pixels = layout >= 2 ? in.i64() : 256;
  const Ref br = biased ? in.ref() : Ref{};
  const int64_t bstride = biased ? in.i64() : 0;
  KILN_RETURN_IF_ERROR(in.done());
  if (nb < 0 || c < 1 || groups < 1 || c % groups != 0 || spatial < 0 || act < 0 || act > 2 || scr.weight ||
      layout > 3 || pixels < 1 || (layout == 3 && (blocks < 1 || blocks > std::max<int64_t>(spatial, 1))) ||
      (biased && bstride != 0 && bstride != c)) {
    return KILN_ERROR(kInvalidModel, "{}: malformed group_norm parameters", in.step().label);
  }
  // A cooperative launch needs all its blocks resident at once: where this GPU (or its share of one)
  // holds fewer than the build's, the three launches run instead.
  const bool one = layout == 3 && k::group_norm_nhwc_one_blocks(dt, nb, c, groups, spatial) >= blocks;
  return StepFn([=](const RunCtx& cx) {
    k::GroupNormArgs a = k::group_norm_shape(dt, nb, c, groups, spatial, eps, act);
    a.x = cx.ptr(xr);
    a.x_bias = biased ? cx.ptr(br) : nullptr;
    a.bias_stride = bstride;
    a.scale = static_cast<const float*>(cx.ptr(sr));
    a.shift = static_cast<const float*>(cx.ptr(tr));
    a.y = cx.ptr(yr);
    a.scratch = cx.ptr(scr);
    if (one) return cuda_status(k::group_norm_nhwc_one_launch(a, int(blocks), cx.stream), "group_norm_nhwc_one_launch");
    if (nhwc) return cuda_status(k::group_norm_nhwc(a, pixels, cx.stream), "group_norm_nhwc");
    return cuda_status(k::group_norm(a, cx.stream), "group_norm");
  });
}

std::optional<k::Reduce> reduce_of(OpKind op) {
  switch (op) {
    case OpKind::kReduceSum: return k::Reduce::kSum;
    case OpKind::kReduceMean: return k::Reduce::kMean;
    case OpKind::kReduceMax: return k::Reduce::kMax;
    case OpKind::kReduceMin: return k::Reduce::kMin;
    case OpKind::kReduceProd: return k::Reduce::kProd;
    case OpKind::kReduceSumSquare: return k::Reduce::kSumSquare;
    case OpKind::kReduceL1: return k::Reduce::kL1;
    case OpKind::kReduceL2: return k::Reduce::kL2;
    case OpKind::kReduceLogSumExp: return k::Reduce::kLogSumExp;
    default: return std::nullopt;
  }
}

// Emits y = reduce(x viewed as [outer, cnt, inner]) over the middle axis.
void emit_reduce_3d(Lowering& L, const Node& n, std::string label, k::Reduce op, const DevValue* x, int64_t outer,
                    int64_t cnt, int64_t inner, Ref yr) {
  ByteWriter w;
  w.put(int32_t(op));
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, yr);
  for (int64_t v : {outer, cnt, inner}) w.i64(v);
  L.emit(&n, std::move(label), {read_id(x)}, {yr.id}, StepOp::kReduce, std::move(w));
}

// Emits a reduction of x's axes [a0, a1) (contiguous, row-major x) into y.
void emit_reduce(Lowering& L, const Node& n, k::Reduce op, const DevValue* x, size_t a0, size_t a1, Ref yr) {
  emit_reduce_3d(L, n, "kernel reduce", op, x, prod_of(x->dims, 0, a0), prod_of(x->dims, a0, a1),
                 prod_of(x->dims, a1, x->dims.size()), yr);
}

Expected<StepFn> bind_reduce(Params& in, BindCtx&) {
  const k::Reduce op = in.en(k::Reduce::kLogSumExp);
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  const int64_t outer = in.i64(), cnt = in.i64(), inner = in.i64();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::reduce(op, dt, c.ptr(xr), c.ptr(yr), outer, cnt, inner, c.stream, c.workspace, c.workspace_bytes),
                       "reduce");
  });
}

Status lower_reduce(Lowering& L, const Node& n) {
  // ReduceLogSum is log(ReduceSum): the sum, then Log in place.
  const bool log_sum = n.op == OpKind::kReduceLogSum;
  k::Reduce op = log_sum ? k::Reduce::kSum : *reduce_of(n.op);
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  bool float_only = log_sum || (op != k::Reduce::kSum && op != k::Reduce::kMax && op != k::Reduce::kMin);
  if (!is_float_dt(x->dt) && x->dt != k::DT::kF64 && (float_only || (x->dt != k::DT::kI64 && x->dt != k::DT::kI32))) {
    KILN_UNSUPPORTED("{} on {}", op_name(n.op), dtype_name(x->ir_dtype));
  }
  size_t r = x->dims.size();
  std::vector<bool> red(r, false);
  if (n.has_input(1)) {
    const Tensor* a = L.constant(n.inputs[1]);
    if (!a) KILN_UNSUPPORTED("reduction axes computed at run time");
    for (int64_t v : a->to_int_vector()) red[size_t(v < 0 ? v + int64_t(r) : v)] = true;
  }
  bool none = std::none_of(red.begin(), red.end(), [](bool b) { return b; });
  if (none) {
    if (n.attr_int("noop_with_empty_axes", 0) && !log_sum && op != k::Reduce::kSumSquare && op != k::Reduce::kL1 &&
        op != k::Reduce::kL2 && op != k::Reduce::kLogSumExp) {
      L.define_alias(n.outputs[0], *x);  // no axes: the input as it is
      return Status::ok();
    }
    if (n.attr_int("noop_with_empty_axes", 0)) KILN_UNSUPPORTED("{} with noop_with_empty_axes", op_name(n.op));
    red.assign(r, true);
  }
  // Axes of size 1 reduce trivially; drop them so that e.g. {1,3} of [N,C,1,W] stays contiguous.
  size_t a0 = r, a1 = 0;
  for (size_t i = 0; i < r; ++i) {
    if (red[i] && x->dims[i] != 1) { a0 = std::min(a0, i); a1 = i + 1; }
  }
  if (a0 == r) { a0 = 0; a1 = 0; }
  bool contiguous = true;
  for (size_t i = a0; i < a1; ++i) contiguous = contiguous && (red[i] || x->dims[i] == 1);
  const DevValue& y = L.define(n.outputs[0]);
  if (contiguous) {
    emit_reduce(L, n, op, x, a0, a1, y.ref);
  } else {
    // Reduced axes apart (MVN's [0, 2, 3]): one copy moves them last, after the kept axes in their
    // order, which is the output's element order; then one reduction over the trailing block.
    if (r > size_t(k::kMaxRank)) KILN_UNSUPPORTED("{} over non-contiguous axes of rank {}", op_name(n.op), r);
    std::vector<size_t> order;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < r; ++i) {
        if ((red[i] && x->dims[i] != 1) == (pass == 1)) order.push_back(i);
      }
    }
    const std::vector<int64_t> st = contiguous_strides(x->dims);
    std::vector<int64_t> dims, src_strides;
    for (size_t i : order) {
      dims.push_back(x->dims[i]);
      src_strides.push_back(st[i]);
    }
    const k::NdStrides src = nd(dims, src_strides), dst = nd(dims, contiguous_strides(dims));
    int64_t kept = 1;
    for (size_t i = 0; i < r; ++i) kept *= red[i] && x->dims[i] != 1 ? 1 : x->dims[i];
    DevValue moved = *x;
    moved.ref = Ref{false, L.scratch(size_t(x->numel()) * size_t(k::dt_size(x->dt)))};
    emit_copy_nd(L, &n, "copy (reduced axes last)", k::dt_size(x->dt), x->ref, 0, src, moved.ref, 0, dst);
    emit_reduce_3d(L, n, "kernel reduce", op, &moved, kept, x->numel() / std::max<int64_t>(kept, 1), 1, y.ref);
  }
  if (log_sum) emit_unary(L, &n, "kernel unary Log (of the sum)", k::Unary::kLog, y.dt, y.ref, y.ref, y.numel());
  return Status::ok();
}

Status lower_arg(Lowering& L, const Node& n) {
  const bool last = n.attr_int("select_last_index", 0) != 0;
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (!is_float_dt(x->dt)) KILN_UNSUPPORTED("{} on {}", op_name(n.op), dtype_name(x->ir_dtype));
  int64_t r = int64_t(x->dims.size()), axis = n.attr_int("axis", 0);
  if (axis < 0) axis += r;
  int64_t outer = prod_of(x->dims, 0, size_t(axis)), cnt = x->dims[size_t(axis)], inner = prod_of(x->dims, size_t(axis) + 1, size_t(r));
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter w;
  w.u8(n.op == OpKind::kArgMax);
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, y.ref);
  for (int64_t v : {outer, cnt, inner}) w.i64(v);
  // select_last_index has its own step kind, so that earlier engine files' records still read.
  L.emit(&n, last ? "kernel arg_reduce (last index)" : "kernel arg_reduce", {read_id(x)}, {y.ref.id},
         last ? StepOp::kArgReduceLast : StepOp::kArgReduce, std::move(w));
  return Status::ok();
}

// Hardmax: 1 at the first maximum along the axis, 0 elsewhere, as ArgMax into a buffer, the
// index compared with a constant iota [1, C, 1] over [outer, C, inner], and the bools cast.
Status lower_hardmax(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (!is_float_dt(x->dt)) KILN_UNSUPPORTED("Hardmax on {}", dtype_name(x->ir_dtype));
  const int64_t r = int64_t(x->dims.size());
  int64_t axis = n.attr_int("axis", -1);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) KILN_UNSUPPORTED("Hardmax axis {} of rank {}", n.attr_int("axis", -1), r);
  const int64_t outer = prod_of(x->dims, 0, size_t(axis)), cnt = x->dims[size_t(axis)],
                inner = prod_of(x->dims, size_t(axis) + 1, size_t(r));
  const Ref arg{false, L.scratch(size_t(outer * inner) * sizeof(int64_t))};
  ByteWriter w;
  w.u8(1);  // ArgMax
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, arg);
  for (int64_t v : {outer, cnt, inner}) w.i64(v);
  L.emit(&n, "kernel arg_reduce (Hardmax)", {read_id(x)}, {arg.id}, StepOp::kArgReduce, std::move(w));
  std::vector<int64_t> iota(static_cast<size_t>(cnt));
  for (int64_t i = 0; i < cnt; ++i) iota[size_t(i)] = i;
  KILN_ASSIGN_OR_RETURN(Ref ir, L.upload(Tensor::from_vector<int64_t>(iota, {cnt}), k::DT::kI64));
  const std::vector<int64_t> dims = {outer, cnt, inner};
  const Ref eq{false, L.scratch(size_t(x->numel()))};
  emit_binary_nd(L, &n, "kernel binary Equal (Hardmax)", k::Binary::kEqual, k::DT::kI64, ir, nd(dims, {0, 1, 0}), arg,
                 nd(dims, {inner, 0, 1}), eq);
  const DevValue& y = L.define(n.outputs[0]);
  emit_cast(L, &n, "kernel cast (Hardmax)", k::DT::kBool, y.dt, eq, y.ref, y.numel());
  return Status::ok();
}

template <bool kLast>
Expected<StepFn> bind_arg_reduce(Params& in, BindCtx&) {
  const bool mx = in.flag();
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  const int64_t outer = in.i64(), cnt = in.i64(), inner = in.i64();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::arg_reduce(mx, kLast, dt, c.ptr(xr), static_cast<int64_t*>(c.ptr(yr)), outer, cnt, inner, c.stream),
                       "arg_reduce");
  });
}

// TopK with a constant K over a line of up to 4096 values (k::topk: one block per line).
Status lower_topk(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (!is_float_dt(x->dt) && x->dt != k::DT::kI64 && x->dt != k::DT::kI32) {
    KILN_UNSUPPORTED("TopK of {}", dtype_name(x->ir_dtype));
  }
  const Tensor* kt = L.constant(n.inputs[1]);
  if (!kt || kt->numel() != 1) KILN_UNSUPPORTED("TopK with K computed at run time");
  const int64_t r = int64_t(x->dims.size());
  int64_t axis = n.attr_int("axis", -1);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) KILN_UNSUPPORTED("TopK axis {}", n.attr_int("axis", -1));
  const int64_t len = x->dims[size_t(axis)], kk = kt->as_int(0);
  if (!k::topk_supported(len) || kk < 0 || kk > len) KILN_UNSUPPORTED("TopK of {} from a line of {}", kk, len);
  const DevValue& v = L.define(n.outputs[0]);
  Ref ir;
  if (n.has_output(1)) ir = L.define(n.outputs[1]).ref;
  ByteWriter w;
  w.put(int32_t(x->dt));
  put(w, x->ref);
  put(w, v.ref);
  put(w, ir);
  for (int64_t q : {prod_of(x->dims, 0, size_t(axis)), len, prod_of(x->dims, size_t(axis) + 1, size_t(r)), kk}) w.i64(q);
  w.u8(n.attr_int("largest", 1) != 0);
  std::vector<int> writes = {v.ref.id};
  if (ir.id >= 0) writes.push_back(ir.id);
  L.emit(&n, "kernel topk", {read_id(x)}, writes, StepOp::kTopK, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_topk(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), vr = in.ref(), ir = in.opt_ref();
  const int64_t outer = in.i64(), len = in.i64(), inner = in.i64(), kk = in.i64();
  const bool largest = in.flag();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::topk(dt, c.ptr(xr), c.ptr(vr), ir.id >= 0 ? static_cast<int64_t*>(c.ptr(ir)) : nullptr, outer, len,
                               inner, kk, largest, c.stream), "topk");
  });
}

// GlobalAverage/MaxPool: a reduce over the spatial axes; from NHWC it is [N, HW, C] -> [N, C],
// which is also the row-major [N, C, 1, 1] output.
Status lower_global_pool(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  if (!is_float_dt(x->dt) || x->dims.size() < 3) KILN_UNSUPPORTED("{} on {}", op_name(n.op), dtype_name(x->ir_dtype));
  k::Reduce op = n.op == OpKind::kGlobalAveragePool ? k::Reduce::kMean : k::Reduce::kMax;
  const DevValue& y = L.define(n.outputs[0]);
  int64_t nb = x->dims[0], c = x->dims[1], hw = prod_of(x->dims, 2, x->dims.size());
  bool nhwc = x->layout == Layout::kNHWC;
  int64_t outer = nhwc ? nb : nb * c, inner = nhwc ? c : 1;
  emit_reduce_3d(L, n, fmt::format("kernel reduce ({})", nhwc ? "NHWC" : "NCHW"), op, x, outer, hw, inner, y.ref);
  return Status::ok();
}

}  // namespace

void register_norm_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kSoftmax] = lower_softmax;
  t[OpKind::kLogSoftmax] = lower_softmax;
  t[OpKind::kHardmax] = lower_hardmax;
  t[OpKind::kLayerNormalization] = lower_layer_norm;
  t[OpKind::kRMSNormalization] = lower_layer_norm;
  t[OpKind::kBatchNormalization] = lower_batch_norm;
  t[OpKind::kMeanVarianceNormalization] = lower_batch_norm_train;  // lower_train_mode.cc
  t[OpKind::kInstanceNormalization] = lower_group_norm;
  t[OpKind::kGroupNormalization] = lower_group_norm;
  for (OpKind op : {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax, OpKind::kReduceMin,
                    OpKind::kReduceProd, OpKind::kReduceSumSquare, OpKind::kReduceL1, OpKind::kReduceL2,
                    OpKind::kReduceLogSumExp, OpKind::kReduceLogSum}) {
    t[op] = lower_reduce;
  }
  t[OpKind::kArgMax] = lower_arg;
  t[OpKind::kArgMin] = lower_arg;
  t[OpKind::kGlobalAveragePool] = lower_global_pool;
  t[OpKind::kGlobalMaxPool] = lower_global_pool;
  t[OpKind::kTopK] = lower_topk;
}

void emit_softmax(Lowering& L, const Node* n, std::string label, k::DT dt, Ref x, Ref y, int64_t rows, int64_t cols,
                  bool log, bool zero_masked) {
  ByteWriter w;
  w.put(int32_t(dt));
  put(w, x);
  put(w, y);
  w.i64(rows);
  w.i64(cols);
  w.u8(log ? 1 : zero_masked ? 2 : 0);
  L.emit(n, std::move(label), {x.weight ? -1 : x.id}, {y.id}, StepOp::kSoftmax, std::move(w));
}

void register_norm_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kSoftmax] = bind_softmax;
  t[StepOp::kLayerNorm] = bind_layer_norm;
  t[StepOp::kRowMoments] = bind_row_moments;
  t[StepOp::kChannelAffine] = bind_channel_affine<false>;
  t[StepOp::kChannelAffineClamp] = bind_channel_affine<true>;
  t[StepOp::kGroupNorm] = bind_group_norm;
  register_squeeze_excite_binder(t);
  t[StepOp::kReduce] = bind_reduce;
  t[StepOp::kArgReduce] = bind_arg_reduce<false>;
  t[StepOp::kArgReduceLast] = bind_arg_reduce<true>;
  t[StepOp::kTopK] = bind_topk;
}

bool is_silu(const Node& n) {
  if (n.op != OpKind::kFusedElementwise || n.inputs.size() != 1) return false;
  const Graph* b = n.attr_graph("body");
  if (!b || b->inputs.size() != 1 || b->outputs.size() != 1 || b->nodes.size() != 2) return false;
  const Node& sig = *b->nodes[0];
  const Node& mul = *b->nodes[1];
  const Value* a = b->inputs[0];
  if (sig.op != OpKind::kSigmoid || sig.inputs[0] != a || mul.op != OpKind::kMul) return false;
  const Value* s = sig.outputs[0];
  return mul.outputs[0] == b->outputs[0] &&
         ((mul.inputs[0] == a && mul.inputs[1] == s) || (mul.inputs[0] == s && mul.inputs[1] == a));
}

}  // namespace kiln::cuda
