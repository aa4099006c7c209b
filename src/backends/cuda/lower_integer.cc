// MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv (onnxruntime's dynamic and static
// quantization formats) as exact float products. Each operand minus its zero point is an integer of
// at most 9 bits (k::int_center), so every product term is exact and a sum of K of them is exact in
// f32 while K * 255 * 255 < 2^24 and in f64 always; cuBLASLt's GEMM (f32 or f64) or cuDNN's f64
// convolution computes it, and k::requantize rounds it back: to int32 for the *Integer ops (the sum
// itself), and for the QLinear ones to int8/uint8 as the CPU reference computes it,
// saturate(round((sum + bias) * (a_scale * b_scale / y_scale)) + y_zero_point), the factor rounded
// to the scales' type first (on the host when the scales and output zero point are constants,
// else by the kernel from their buffers). Zero points may be constants or values, per tensor or
// per row of A / column of B / output channel of W. QDQ models take the int8 tensor-core path instead
// (QuantizedMatMul, lower_gemm_quant.cc).
#include "backends/cuda/kernels/integer.h"
#include "backends/cuda/lower.h"
#include "ops/nn_util.h"

namespace kiln::cuda {

namespace {

// A buffer of node n: dims, dtype dt.
DevValue scratch_value(Lowering& L, const std::vector<int64_t>& dims, k::DT dt) {
  DevValue v;
  v.dt = dt;
  v.ir_dtype = ir_dtype_of(dt);
  v.dims = dims;
  v.ref = Ref{false, L.scratch(std::max<size_t>(v.bytes(), 1))};
  return v;
}

// v - zp as `to` (f32/f64): zp absent, one value, or 1-D along `axis` of v.
Expected<DevValue> centered(Lowering& L, const Node& n, const Value* value, const Value* zp, int64_t axis, k::DT to) {
  KILN_ASSIGN_OR_RETURN(const DevValue* v, L.rowmajor(value));
  if (v->dt != k::DT::kI8 && v->dt != k::DT::kU8) KILN_UNSUPPORTED("{} of {}", op_name(n.op), dtype_name(v->ir_dtype));
  const DevValue* z = nullptr;
  int64_t inner = 1, len = 1;
  if (zp) {
    KILN_ASSIGN_OR_RETURN(z, L.rowmajor(zp));
    if (z->dt != v->dt) KILN_UNSUPPORTED("zero point '{}' of another type than its operand", zp->name);
    if (z->numel() != 1) {
      if (z->dims.size() != 1 || axis < 0 || axis >= int64_t(v->dims.size()) || z->dims[0] != v->dims[size_t(axis)]) {
        KILN_UNSUPPORTED("zero point '{}' of shape {} for an operand {}", zp->name, dims_to_string(z->dims), dims_to_string(v->dims));
      }
      len = z->numel();
      inner = prod_of(v->dims, size_t(axis) + 1, v->dims.size());
    }
  }
  DevValue c = scratch_value(L, v->dims, to);
  ByteWriter w;
  w.put(int32_t(v->dt));
  w.put(int32_t(to));
  for (int64_t x : {v->numel(), inner, len}) w.i64(x);
  put(w, v->ref);
  put(w, z ? z->ref : Ref{});
  put(w, c.ref);
  L.emit(&n, fmt::format("kernel int_center (to {})", to == k::DT::kF64 ? "f64" : "f32"), {read_id(v), read_id(z)},
         {c.ref.id}, StepOp::kIntCenter, std::move(w));
  return c;
}

// How a sum becomes its output: factor 1 and zero point 0 (the *Integer ops), a host table of
// factors (constant scales), or scales read by the kernel (sa per `a_inner`-sized slice, sb per
// `b_inner`-sized one).
struct Requant {
  std::vector<double> factor;
  int64_t f_inner = 1;
  double zp = 0;
  const DevValue *sa = nullptr, *sb = nullptr, *sy = nullptr, *zy = nullptr;
  k::DT round_dt = k::DT::kF32;
  int64_t a_inner = 1, b_inner = 1;
};

// y = requantize(acc): bias (int32, may be null) per `b_inner`-sized slice.
Status emit_requantize(Lowering& L, const Node& n, const DevValue& acc, const DevValue& y, const DevValue* bias,
                       int64_t b_inner, const Requant& q) {
  Ref fr;
  if (!q.factor.empty()) {
    KILN_ASSIGN_OR_RETURN(fr, L.upload_raw(q.factor.data(), q.factor.size() * sizeof(double)));
  }
  ByteWriter w;
  for (k::DT d : {acc.dt, y.dt, q.sa ? q.sa->dt : k::DT::kF32, q.sb ? q.sb->dt : k::DT::kF32, q.sy ? q.sy->dt : k::DT::kF32,
                  q.round_dt, q.zy ? q.zy->dt : k::DT::kU8}) {
    w.put(int32_t(d));
  }
  for (int64_t v : {y.numel(), b_inner, bias ? bias->numel() : 1, q.f_inner, q.factor.empty() ? 1 : int64_t(q.factor.size()),
                    q.a_inner, q.sa ? q.sa->numel() : 1, q.b_inner, q.sb ? q.sb->numel() : 1}) {
    w.i64(v);
  }
  w.put(q.zp);
  put(w, acc.ref);
  for (const DevValue* d : {bias, q.sa, q.sb, q.sy, q.zy}) put(w, d ? d->ref : Ref{});
  put(w, fr);
  put(w, y.ref);
  L.emit(&n, fmt::format("kernel requantize (to {}{})", dtype_name(y.ir_dtype), q.sa ? ", scales read at run time" : ""),
         {acc.ref.id, read_id(bias), read_id(q.sa), read_id(q.sb), read_id(q.sy), read_id(q.zy)}, {y.ref.id},
         StepOp::kRequantize, std::move(w));
  return Status::ok();
}

const Value* input(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : nullptr; }

// A QLinear op's requantization: sa = input ia (one value or `a_len` of them, each covering
// `a_inner` output elements), sb = input ib (likewise), sy = input iy, zy = input iy + 1. Constant
// scales give the factor table round(round(sa * sb) / sy) in the scales' type, as the CPU reference
// computes it (sa outer, sb inner); computed ones are read by the kernel.
Expected<Requant> qlinear_requant(Lowering& L, const Node& n, size_t ia, int64_t a_len, int64_t a_inner, size_t ib,
                                  int64_t b_len, int64_t b_inner, size_t iy) {
  Requant q;
  const DType st = n.inputs[ia]->type.dtype;
  const bool constant = L.constant(n.inputs[ia]) && L.constant(n.inputs[ib]) && L.constant(n.inputs[iy]) &&
                        input(n, iy + 1) && L.constant(n.inputs[iy + 1]);
  if (constant) {
    const std::vector<double> sa = tensor_as_doubles(*L.constant(n.inputs[ia])), sb = tensor_as_doubles(*L.constant(n.inputs[ib])),
                              sy = tensor_as_doubles(*L.constant(n.inputs[iy])), zy = tensor_as_doubles(*L.constant(n.inputs[iy + 1]));
    if ((sa.size() != 1 && int64_t(sa.size()) != a_len) || (sb.size() != 1 && int64_t(sb.size()) != b_len) || sy.size() != 1 ||
        zy.size() != 1) {
      KILN_UNSUPPORTED("{} scales of {}, {} and {} values", op_name(n.op), sa.size(), sb.size(), sy.size());
    }
    for (double a : sa) {
      for (double b : sb) q.factor.push_back(round_to_dtype(round_to_dtype(a * b, st) / sy[0], st));
    }
    // The table is [sa, sb] row-major; sb's slices are inner to sa's (a row of N, or a channel's plane).
    q.f_inner = sb.size() > 1 ? b_inner : sa.size() > 1 ? a_inner : 1;
    q.zp = zy[0];
    return q;
  }
  KILN_ASSIGN_OR_RETURN(q.sa, L.rowmajor(n.inputs[ia]));
  KILN_ASSIGN_OR_RETURN(q.sb, L.rowmajor(n.inputs[ib]));
  KILN_ASSIGN_OR_RETURN(q.sy, L.rowmajor(n.inputs[iy]));
  if (!input(n, iy + 1)) KILN_UNSUPPORTED("{} without y_zero_point", op_name(n.op));
  KILN_ASSIGN_OR_RETURN(q.zy, L.rowmajor(n.inputs[iy + 1]));
  auto rd = to_kdt(st);
  for (const DevValue* d : {q.sa, q.sb, q.sy}) {
    if (!rd || (d->dt != k::DT::kF32 && d->dt != k::DT::kF16 && d->dt != k::DT::kBF16 && d->dt != k::DT::kF64)) {
      KILN_UNSUPPORTED("{} scales of {}", op_name(n.op), dtype_name(d->ir_dtype));
    }
  }
  if ((q.sa->numel() != 1 && q.sa->numel() != a_len) || (q.sb->numel() != 1 && q.sb->numel() != b_len) || q.sy->numel() != 1 ||
      q.zy->numel() != 1 || (q.zy->dt != k::DT::kU8 && q.zy->dt != k::DT::kI8)) {
    KILN_UNSUPPORTED("{} scales of {}, {} and {} values, y_zero_point {}", op_name(n.op), q.sa->numel(), q.sb->numel(),
                     q.sy->numel(), n.inputs[iy + 1]->type.to_string());
  }
  q.round_dt = *rd;
  q.a_inner = a_inner;
  q.b_inner = b_inner;
  return q;
}

Status lower_matmul_integer(Lowering& L, const Node& n) {
  const bool q = n.op == OpKind::kQLinearMatMul;
  const size_t ia = 0, iza = 2, ib = q ? 3 : 1, izb = q ? 5 : 3;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> ad, exact_dims(n.inputs[ia]));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> bd, exact_dims(n.inputs[ib]));
  KILN_ASSIGN_OR_RETURN(const GemmShape s, matmul_gemm_shape(ad, bd));
  const k::DT ct = s.k * 255 * 255 < (int64_t(1) << 24) ? k::DT::kF32 : k::DT::kF64;
  KILN_ASSIGN_OR_RETURN(DevValue a, centered(L, n, n.inputs[ia], input(n, iza), int64_t(ad.size()) - 2, ct));
  KILN_ASSIGN_OR_RETURN(DevValue b, centered(L, n, n.inputs[ib], input(n, izb), int64_t(bd.size()) - 1, ct));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  const DevValue acc = scratch_value(L, yd, ct);
  KILN_RETURN_IF_ERROR(emit_gemm(L, n, &a, &b, s, Epilogue{}, acc.ref, ct));
  Requant rq;
  if (q) {
    const int64_t m = ad[ad.size() - 2], nn = bd.back();
    KILN_ASSIGN_OR_RETURN(rq, qlinear_requant(L, n, 1, m, nn, 4, nn, 1, 6));
  }
  const DevValue& y = L.define(n.outputs[0]);
  return emit_requantize(L, n, acc, y, nullptr, 1, rq);
}

Status lower_conv_integer(Lowering& L, const Node& n) {
  const bool q = n.op == OpKind::kQLinearConv;
  const size_t ix = 0, izx = 2, iw = q ? 3 : 1, izw = q ? 5 : 3;
  if (const Value* zx = input(n, izx)) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> zd, exact_dims(zx));
    if (prod_of(zd, 0, zd.size()) != 1) KILN_UNSUPPORTED("{} with x_zero_point {}", op_name(n.op), dims_to_string(zd));
  }
  KILN_ASSIGN_OR_RETURN(DevValue x, centered(L, n, n.inputs[ix], input(n, izx), -1, k::DT::kF64));
  KILN_ASSIGN_OR_RETURN(DevValue w, centered(L, n, n.inputs[iw], input(n, izw), 0, k::DT::kF64));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  const DevValue acc = scratch_value(L, yd, k::DT::kF64);
  KILN_RETURN_IF_ERROR(emit_conv_f64(L, n, &x, &w, acc));
  const int64_t channels = yd.size() > 1 ? yd[1] : 1, plane = prod_of(yd, 2, yd.size());
  Requant rq;
  const DevValue* bias = nullptr;
  if (q) {
    KILN_ASSIGN_OR_RETURN(rq, qlinear_requant(L, n, 1, 1, 1, 4, channels, plane, 6));
    if (const Value* b = input(n, 8)) {
      KILN_ASSIGN_OR_RETURN(bias, L.rowmajor(b));
      if (bias->dt != k::DT::kI32 || bias->numel() != channels) KILN_UNSUPPORTED("QLinearConv bias {}", b->type.to_string());
    }
  }
  const DevValue& y = L.define(n.outputs[0]);
  return emit_requantize(L, n, acc, y, bias, plane, rq);
}

Expected<StepFn> bind_int_center(Params& in, BindCtx&) {
  const k::DT xdt = in.dt(), ydt = in.dt();
  const int64_t count = in.i64(), inner = in.i64(), len = in.i64();
  const Ref xr = in.ref(), zr = in.opt_ref(), yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (count < 0 || inner < 1 || len < 1 || yr.weight) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed int_center parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::int_center(xdt, c.ptr(xr), count, zr.id >= 0 ? c.ptr(zr) : nullptr, inner, len, ydt, c.ptr(yr), c.stream),
                       "int_center");
  });
}

Expected<StepFn> bind_requantize(Params& in, BindCtx&) {
  k::Requantize r;
  r.acc_dt = in.dt();
  r.ydt = in.dt();
  r.a_dt = in.dt();
  r.b_dt = in.dt();
  r.y_dt = in.dt();
  r.round_dt = in.dt();
  r.zp_dt = in.dt();
  for (int64_t* v : {&r.n, &r.b_inner, &r.b_len, &r.f_inner, &r.f_len, &r.a_inner, &r.a_len, &r.b2_inner, &r.b2_len}) *v = in.i64();
  r.zp = in.f64();
  const Ref ar = in.ref(), br = in.opt_ref(), sar = in.opt_ref(), sbr = in.opt_ref(), syr = in.opt_ref(), zr = in.opt_ref();
  const Ref fr = in.opt_ref(), yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  const bool scales = sar.id >= 0 && sbr.id >= 0 && syr.id >= 0 && zr.id >= 0;
  if (r.n < 0 || r.b_inner < 1 || r.b_len < 1 || r.f_inner < 1 || r.f_len < 1 || r.a_inner < 1 || r.a_len < 1 ||
      r.b2_inner < 1 || r.b2_len < 1 || yr.weight || (!scales && (sar.id >= 0 || sbr.id >= 0 || syr.id >= 0 || zr.id >= 0))) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed requantize parameters", in.step().label);
  }
  return StepFn([=](const RunCtx& c) {
    k::Requantize q = r;
    q.bias = br.id >= 0 ? static_cast<const int32_t*>(c.ptr(br)) : nullptr;
    q.factor = fr.id >= 0 ? static_cast<const double*>(c.ptr(fr)) : nullptr;
    if (scales) {
      q.scale_a = c.ptr(sar);
      q.scale_b = c.ptr(sbr);
      q.scale_y = c.ptr(syr);
      q.zp_ptr = c.ptr(zr);
    }
    return cuda_status(k::requantize(q, c.ptr(ar), c.ptr(yr), c.stream), "requantize");
  });
}

}  // namespace

void register_integer_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kMatMulInteger] = lower_matmul_integer;
  t[OpKind::kQLinearMatMul] = lower_matmul_integer;
  t[OpKind::kConvInteger] = lower_conv_integer;
  t[OpKind::kQLinearConv] = lower_conv_integer;
}

void register_integer_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kIntCenter] = bind_int_center;
  t[StepOp::kRequantize] = bind_requantize;
}

}  // namespace kiln::cuda
