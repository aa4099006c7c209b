// BatchNormalization and Dropout in their training forms, BatchNormalization's inference form
// with statistics computed at run time (lower_norm.cc folds constant ones into a channel affine),
// and MeanVarianceNormalization (the batch statistics without scale and bias):
//   - BatchNormalization, training_mode=1: k::batch_norm_train (batch statistics per channel in
//     f64, the running statistics as outputs);
//   - BatchNormalization with fed statistics: one generated kernel, the per-channel operands read
//     with stride 1 on the channel axis;
//   - Dropout in training: k::dropout_train keeps an element when its uniform draw is >= ratio.
//     A seeded Dropout's draws are the CPU reference's (numpy's sequence for that seed, drawn at
//     build and kept with the engine, so every run masks alike, as on the CPU); an unseeded one
//     draws anew on every run (k::random's Philox, with a run counter as RandomUniform's).
#include <algorithm>
#include <random>

#include "backends/cuda/kernels/train_mode.h"
#include "backends/cuda/lower.h"
#include "ops/numpy_random.h"

namespace kiln::cuda {

namespace {

bool float_dt(k::DT d) { return d == k::DT::kF32 || d == k::DT::kF16 || d == k::DT::kBF16 || d == k::DT::kF64; }

// y = (x - mean) / sqrt(var + eps) * scale + bias as one generated kernel.
Status lower_batch_norm_fed(Lowering& L, const Node& n, const std::vector<int64_t>& xd) {
  Graph body;
  body.name = "batch_norm_body";
  std::vector<Value*> in;
  for (size_t i = 0; i < 5; ++i) in.push_back(body.add_input(fmt::format("in{}", i), n.inputs[i]->type));
  const Type& t = n.outputs[0]->type;
  KILN_ASSIGN_OR_RETURN(Tensor e64, Tensor::create(DType::kFloat64, {}));
  e64.data<double>()[0] = n.attr_float("epsilon", 1e-5f);
  KILN_ASSIGN_OR_RETURN(Tensor eps, convert_tensor(e64, n.inputs[4]->type.dtype));
  auto op = [&](OpKind k, std::vector<Value*> args, const Type& ty) {
    Node* m = body.add_node(k, std::move(args), 1);
    m->outputs[0]->type = ty;
    return m->outputs[0];
  };
  const Type& st = n.inputs[4]->type;
  Value* d = op(OpKind::kSub, {in[0], in[3]}, t);
  Value* ve = op(OpKind::kAdd, {in[4], body.add_constant("eps", std::move(eps))}, st);
  Value* sd = op(OpKind::kSqrt, {ve}, st);
  Value* q = op(OpKind::kDiv, {d, sd}, t);
  Value* m = op(OpKind::kMul, {q, in[1]}, t);
  body.outputs.push_back(op(OpKind::kAdd, {m, in[2]}, t));
  std::vector<std::vector<int64_t>> strides(5);
  for (size_t i = 1; i < 5; ++i) {
    strides[i].assign(xd.size(), 0);
    strides[i][1] = 1;
  }
  return lower_generated(L, n, &body, strides);
}

Expected<StepFn> bind_batch_norm_train(Params& in, BindCtx&) {
  k::BatchNormTrain a;
  a.dt = in.dt();
  a.param_dt = in.dt();
  a.stat_dt = in.dt();
  a.n = in.i64();
  a.c = in.i64();
  a.plane = in.i64();
  a.eps = in.f64();
  a.momentum = in.f64();
  a.mvn = in.flag();
  const Ref xr = in.ref(), sr = in.opt_ref(), br = in.opt_ref(), mr = in.opt_ref(), vr = in.opt_ref(), yr = in.ref();
  const Ref rmr = in.opt_ref(), rvr = in.opt_ref(), scr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  const bool stats = sr.id >= 0 && br.id >= 0 && mr.id >= 0 && vr.id >= 0;
  if (a.n < 1 || a.c < 1 || a.c > INT32_MAX || a.plane < 1 || scr.weight || (!a.mvn && !stats) ||
      (a.mvn && (rmr.id >= 0 || rvr.id >= 0))) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed batch_norm_train parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    k::BatchNormTrain b = a;
    b.x = c.ptr(xr);
    if (stats) {
      b.scale = c.ptr(sr);
      b.bias = c.ptr(br);
      b.mean = c.ptr(mr);
      b.var = c.ptr(vr);
    }
    b.y = c.ptr(yr);
    b.running_mean = rmr.id >= 0 ? c.ptr(rmr) : nullptr;
    b.running_var = rvr.id >= 0 ? c.ptr(rvr) : nullptr;
    b.scratch = static_cast<double*>(c.ptr(scr));
    return cuda_status(k::batch_norm_train(b, c.stream), "batch_norm_train");
  });
}

}  // namespace

// MeanVarianceNormalization over every axis but the channel's (its default, [0, 2, 3] for NCHW):
// the batch statistics kernel, normalizing by sqrt(var) + 1e-9 as the CPU reference does.
Status lower_mvn(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  const int64_t r = int64_t(x->dims.size());
  std::vector<int64_t> axes = n.attr_ints("axes", {0, 2, 3});
  for (int64_t& a : axes) a = a < 0 ? a + r : a;
  std::sort(axes.begin(), axes.end());
  std::vector<int64_t> want{0};
  for (int64_t a = 2; a < r; ++a) want.push_back(a);
  if (r < 2 || axes != want) KILN_UNSUPPORTED("MeanVarianceNormalization over axes {} of rank {}", dims_to_string(axes), r);
  if (x->numel() == 0) KILN_UNSUPPORTED("MeanVarianceNormalization of an empty tensor");
  if (!float_dt(x->dt)) KILN_UNSUPPORTED("MeanVarianceNormalization on {}", dtype_name(x->ir_dtype));
  const DevValue& y = L.define(n.outputs[0]);
  const int scratch = L.scratch(size_t(2 * x->dims[1]) * sizeof(double));
  ByteWriter w;
  for (k::DT d : {x->dt, k::DT::kF32, k::DT::kF32}) w.put(int32_t(d));
  for (int64_t d : {x->dims[0], x->dims[1], prod_of(x->dims, 2, x->dims.size())}) w.i64(d);
  w.put(1e-9);
  w.put(0.0);
  w.u8(1);
  put(w, x->ref);
  for (int i = 0; i < 4; ++i) put(w, Ref{});
  put(w, y.ref);
  put(w, Ref{});
  put(w, Ref{});
  put(w, Ref{false, scratch});
  L.emit(&n, "kernel batch_norm_train (mean-variance normalization)", {read_id(x)}, {y.ref.id, scratch},
         StepOp::kBatchNormTrain, std::move(w));
  return Status::ok();
}

Status lower_batch_norm_train(Lowering& L, const Node& n) {
  if (n.op == OpKind::kMeanVarianceNormalization) return lower_mvn(L, n);
  for (size_t i = 0; i < 5; ++i) {
    if (i >= n.inputs.size() || !n.inputs[i]) KILN_UNSUPPORTED("BatchNormalization without input {}", i);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> xd, exact_dims(n.inputs[0]));
  if (xd.size() < 2 || prod_of(xd, 0, xd.size()) == 0) KILN_UNSUPPORTED("BatchNormalization of {}", dims_to_string(xd));
  for (size_t i = 1; i < 5; ++i) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> d, exact_dims(n.inputs[i]));
    if (d.size() != 1 || d[0] != xd[1]) KILN_UNSUPPORTED("BatchNormalization input {} of shape {}", i, dims_to_string(d));
  }
  const bool training = n.attr_int("training_mode", 0) != 0;
  if (!training) {
    for (size_t i = 1; i < n.outputs.size(); ++i) {
      if (n.has_output(i)) KILN_UNSUPPORTED("BatchNormalization's statistics outputs outside training mode");
    }
    return lower_batch_norm_fed(L, n, xd);
  }
  std::vector<const DevValue*> v;
  for (size_t i = 0; i < 5; ++i) {
    KILN_ASSIGN_OR_RETURN(const DevValue* d, L.rowmajor(n.inputs[i]));
    if (!float_dt(d->dt)) KILN_UNSUPPORTED("BatchNormalization on {}", dtype_name(d->ir_dtype));
    v.push_back(d);
  }
  if (v[1]->dt != v[2]->dt || v[3]->dt != v[4]->dt) KILN_UNSUPPORTED("BatchNormalization parameters of mixed types");
  const DevValue& y = L.define(n.outputs[0]);
  const DevValue* rm = n.outputs.size() > 1 && n.has_output(1) ? &L.define(n.outputs[1]) : nullptr;
  const DevValue* rv = n.outputs.size() > 2 && n.has_output(2) ? &L.define(n.outputs[2]) : nullptr;
  if ((rm && rm->dt != v[3]->dt) || (rv && rv->dt != v[3]->dt)) KILN_UNSUPPORTED("running statistics of another type");
  const int scratch = L.scratch(size_t(2 * xd[1]) * sizeof(double));
  ByteWriter w;
  for (k::DT d : {v[0]->dt, v[1]->dt, v[3]->dt}) w.put(int32_t(d));
  for (int64_t d : {xd[0], xd[1], prod_of(xd, 2, xd.size())}) w.i64(d);
  w.put(double(n.attr_float("epsilon", 1e-5f)));
  w.put(double(n.attr_float("momentum", 0.9f)));
  w.u8(0);
  for (const DevValue* d : v) put(w, d->ref);
  put(w, y.ref);
  put(w, rm ? rm->ref : Ref{});
  put(w, rv ? rv->ref : Ref{});
  put(w, Ref{false, scratch});
  std::vector<int> writes{y.ref.id, scratch};
  if (rm) writes.push_back(rm->ref.id);
  if (rv) writes.push_back(rv->ref.id);
  L.emit(&n, "kernel batch_norm_train", {read_id(v[0]), read_id(v[1]), read_id(v[2]), read_id(v[3]), read_id(v[4])},
         writes, StepOp::kBatchNormTrain, std::move(w));
  return Status::ok();
}

namespace {

Expected<StepFn> bind_dropout_train(Params& in, BindCtx&) {
  k::DropoutTrain a;
  a.dt = in.dt();
  a.ratio_dt = in.dt();
  a.n = in.i64();
  a.ratio_value = in.f64();
  a.training_value = in.flag();
  const bool seeded = in.flag();
  const uint64_t seed = uint64_t(in.i64());
  const Ref xr = in.ref(), dr = in.ref(), rr = in.opt_ref(), tr = in.opt_ref(), yr = in.ref(), mr = in.opt_ref();
  const int slot = in.step().bad_index_slot;
  KILN_RETURN_IF_ERROR(in.done());
  if (a.n < 0 || slot < 0 || (!seeded && dr.weight) || (seeded && !dr.weight) || yr.weight) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed dropout_train parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) -> Status {
    k::DropoutTrain b = a;
    if (!seeded) {  // fresh uniform draws in [0, 1) for this run
      KILN_RETURN_IF_ERROR(cuda_status(k::random(k::DT::kF64, c.ptr(dr), a.n, 0, 0.0f, 1.0f, seed, c.counters + slot,
                                                 nullptr, k::DT::kF32, c.stream),
                                       "random"));
    }
    b.x = c.ptr(xr);
    b.draws = static_cast<const double*>(c.ptr(dr));
    b.ratio = rr.id >= 0 ? c.ptr(rr) : nullptr;
    b.training = tr.id >= 0 ? c.ptr(tr) : nullptr;
    b.y = c.ptr(yr);
    b.mask = mr.id >= 0 ? c.ptr(mr) : nullptr;
    b.bad = c.bad_index + slot;
    return cuda_status(k::dropout_train(b, c.stream), "dropout_train");
  });
}

}  // namespace

Status lower_dropout_train(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (!float_dt(x->dt)) KILN_UNSUPPORTED("Dropout on {}", dtype_name(x->ir_dtype));
  // ratio and training_mode: constants baked in, or read by the kernel from their buffers.
  const DevValue* ratio = nullptr;
  const DevValue* training = nullptr;
  double ratio_value = 0.5;
  bool training_value = false;
  if (n.inputs.size() > 1 && n.inputs[1]) {
    if (const Tensor* t = L.constant(n.inputs[1])) {
      if (t->numel() != 1) KILN_UNSUPPORTED("Dropout ratio of {} elements", t->numel());
      ratio_value = t->as_double(0);
    } else {
      KILN_ASSIGN_OR_RETURN(ratio, L.rowmajor(n.inputs[1]));
      if (!float_dt(ratio->dt) || ratio->numel() != 1) KILN_UNSUPPORTED("Dropout ratio {}", n.inputs[1]->type.to_string());
    }
  }
  if (n.inputs.size() > 2 && n.inputs[2]) {
    if (const Tensor* t = L.constant(n.inputs[2])) {
      if (t->numel() != 1) KILN_UNSUPPORTED("Dropout training_mode of {} elements", t->numel());
      training_value = t->as_double(0) != 0;
    } else {
      KILN_ASSIGN_OR_RETURN(training, L.rowmajor(n.inputs[2]));
      if (training->dt != k::DT::kBool || training->numel() != 1) KILN_UNSUPPORTED("Dropout training_mode {}", n.inputs[2]->type.to_string());
    }
  }
  // A constant ratio outside [0, 1) in training is the CPU's error: leave the node to it.
  if (!ratio && (training || training_value) && (ratio_value < 0 || ratio_value >= 1)) {
    KILN_UNSUPPORTED("Dropout ratio {} outside [0, 1)", ratio_value);
  }
  const int64_t count = x->numel();
  const bool seeded = n.has_attr("seed");
  Ref draws;
  if (seeded) {
    if (count > (int64_t(1) << 24)) KILN_UNSUPPORTED("a seeded Dropout of {} elements (its draws are kept with the engine)", count);
    std::mt19937 rng(uint32_t(n.attr_int("seed", 0)));
    std::vector<double> u(size_t(std::max<int64_t>(count, 1)));
    for (int64_t i = 0; i < count; ++i) u[size_t(i)] = numpy_random_sample(rng);
    KILN_ASSIGN_OR_RETURN(draws, L.upload_raw(u.data(), u.size() * sizeof(double)));
  } else {
    draws = Ref{false, L.scratch(size_t(std::max<int64_t>(count, 1)) * sizeof(double))};
  }
  const uint64_t seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  const DevValue& y = L.define(n.outputs[0]);
  const DevValue* mask = n.outputs.size() > 1 && n.has_output(1) ? &L.define(n.outputs[1]) : nullptr;
  ByteWriter w;
  w.put(int32_t(x->dt));
  w.put(int32_t(ratio ? ratio->dt : k::DT::kF32));
  w.i64(count);
  w.put(ratio_value);
  w.u8(training_value);
  w.u8(seeded);
  w.u64(seed);
  put(w, x->ref);
  put(w, draws);
  put(w, ratio ? ratio->ref : Ref{});
  put(w, training ? training->ref : Ref{});
  put(w, y.ref);
  put(w, mask ? mask->ref : Ref{});
  std::vector<int> writes{y.ref.id};
  if (mask) writes.push_back(mask->ref.id);
  if (!seeded) writes.push_back(draws.id);
  // The slot's bad-index word counts a fed ratio outside [0, 1); its counter word is an unseeded
  // Dropout's run counter.
  const int slot = L.new_bad_index_slot();
  L.emit(&n, fmt::format("kernel dropout_train ({})", seeded ? "the reference's seeded draws" : "drawn per run"),
         {read_id(x), read_id(ratio), read_id(training)}, writes, StepOp::kDropoutTrain, std::move(w));
  L.steps.back().bad_index_slot = slot;
  return Status::ok();
}

void register_train_mode_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kBatchNormTrain] = bind_batch_norm_train;
  t[StepOp::kDropoutTrain] = bind_dropout_train;
}

}  // namespace kiln::cuda
