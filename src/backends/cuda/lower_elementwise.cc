// Elementwise ops (unary, binary with broadcasting, Where, Cast) lowered to kiln's kernels.
// They are layout-agnostic: inputs are read through their logical strides, so an NHWC input needs
// no conversion, and the output keeps NHWC when it has an NHWC input's shape.
#include <cmath>
#include <set>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

std::vector<int64_t> out_dims(const Value* v) {
  std::vector<int64_t> d;
  for (const Dim& x : v->type.shape->dims) d.push_back(x.value());
  return d;
}


// The output layout: NHWC when some input is NHWC with exactly the output's dims.
Layout pick_layout(const std::vector<const DevValue*>& ins, const std::vector<int64_t>& dims) {
  for (const DevValue* d : ins) {
    if (d->layout == Layout::kNHWC && d->dims == dims) return Layout::kNHWC;
  }
  return Layout::kRowMajor;
}

// Operand strides over the output's index space in the output's physical order, so the kernel
// writes the output contiguously whatever its layout.
k::NdStrides operand(const DevValue& in, const std::vector<int64_t>& dims, Layout out_layout) {
  std::vector<int64_t> s = broadcast_strides(in, dims);
  if (out_layout == Layout::kNHWC) {
    return nd({dims[0], dims[2], dims[3], dims[1]}, {s[0], s[2], s[3], s[1]});
  }
  return nd(dims, s);
}

// Operand i of n as a device value, converting a constant of another dtype to `want` (Pow's
// exponent, scalars exported as f64...).
Expected<const DevValue*> operand_value(Lowering& L, const Node& n, size_t i, std::optional<k::DT> want) {
  const Value* v = n.inputs[i];
  if (want && L.constant(v)) {
    KILN_ASSIGN_OR_RETURN(const DevValue* d, L.value(v));
    if (d->dt == *want) return d;
    // A second device copy in the wanted dtype, keyed by a private value slot.
    KILN_ASSIGN_OR_RETURN(Ref r, L.upload(*L.constant(v), *want));
    auto* copy = new DevValue(*d);  // owned by keep_alive below
    L.keep_alive.emplace_back(copy, [](void* p) { delete static_cast<DevValue*>(p); });
    copy->ref = r;
    copy->dt = *want;
    return static_cast<const DevValue*>(copy);
  }
  return L.value(v);
}


struct UnaryInfo {
  k::Unary op;
  bool ints_ok = false;
};

std::optional<UnaryInfo> unary_of(OpKind op) {
  switch (op) {
    case OpKind::kRelu: return UnaryInfo{k::Unary::kRelu};
    case OpKind::kSigmoid: return UnaryInfo{k::Unary::kSigmoid};
    case OpKind::kTanh: return UnaryInfo{k::Unary::kTanh};
    case OpKind::kExp: return UnaryInfo{k::Unary::kExp};
    case OpKind::kLog: return UnaryInfo{k::Unary::kLog};
    case OpKind::kSqrt: return UnaryInfo{k::Unary::kSqrt};
    case OpKind::kReciprocal: return UnaryInfo{k::Unary::kReciprocal};
    case OpKind::kNeg: return UnaryInfo{k::Unary::kNeg, true};
    case OpKind::kAbs: return UnaryInfo{k::Unary::kAbs, true};
    case OpKind::kErf: return UnaryInfo{k::Unary::kErf};
    case OpKind::kFloor: return UnaryInfo{k::Unary::kFloor};
    case OpKind::kCeil: return UnaryInfo{k::Unary::kCeil};
    case OpKind::kSin: return UnaryInfo{k::Unary::kSin};
    case OpKind::kCos: return UnaryInfo{k::Unary::kCos};
    case OpKind::kSoftplus: return UnaryInfo{k::Unary::kSoftplus};
    case OpKind::kSign: return UnaryInfo{k::Unary::kSign};
    case OpKind::kRound: return UnaryInfo{k::Unary::kRound};
    case OpKind::kGelu: return UnaryInfo{k::Unary::kGeluErf};
    case OpKind::kClip: return UnaryInfo{k::Unary::kClip, true};
    case OpKind::kLeakyRelu: return UnaryInfo{k::Unary::kLeakyRelu};
    case OpKind::kElu: return UnaryInfo{k::Unary::kElu};
    case OpKind::kHardSigmoid: return UnaryInfo{k::Unary::kHardSigmoid};
    case OpKind::kHardSwish: return UnaryInfo{k::Unary::kHardSwish};
    case OpKind::kNot: return UnaryInfo{k::Unary::kNot};
    case OpKind::kSelu: return UnaryInfo{k::Unary::kSelu};
    case OpKind::kCelu: return UnaryInfo{k::Unary::kCelu};
    case OpKind::kThresholdedRelu: return UnaryInfo{k::Unary::kThresholdedRelu};
    case OpKind::kSwish: return UnaryInfo{k::Unary::kSwish};
    case OpKind::kMish: return UnaryInfo{k::Unary::kMish};
    case OpKind::kSoftsign: return UnaryInfo{k::Unary::kSoftsign};
    case OpKind::kShrink: return UnaryInfo{k::Unary::kShrink};
    case OpKind::kTan: return UnaryInfo{k::Unary::kTan};
    case OpKind::kAtan: return UnaryInfo{k::Unary::kAtan};
    case OpKind::kAsin: return UnaryInfo{k::Unary::kAsin};
    case OpKind::kAcos: return UnaryInfo{k::Unary::kAcos};
    case OpKind::kSinh: return UnaryInfo{k::Unary::kSinh};
    case OpKind::kCosh: return UnaryInfo{k::Unary::kCosh};
    case OpKind::kAsinh: return UnaryInfo{k::Unary::kAsinh};
    case OpKind::kAcosh: return UnaryInfo{k::Unary::kAcosh};
    case OpKind::kAtanh: return UnaryInfo{k::Unary::kAtanh};
    default: return std::nullopt;
  }
}

Status lower_clip_bounds(Lowering& L, const Node& n);

Status lower_unary(Lowering& L, const Node& n) {
  UnaryInfo u = *unary_of(n.op);
  if (n.op == OpKind::kClip) {
    for (size_t i = 1; i < 3; ++i) {
      if (n.has_input(i) && !L.constant(n.inputs[i])) return lower_clip_bounds(L, n);
    }
  }
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  const bool int_dt = is_int_dt(x->dt);
  // SiLU as exporters write it, Mul(x, Sigmoid(x)) with x read by nothing else: one kernel for the
  // pair (YOLO and EfficientNet have one after nearly every convolution).
  if (const Node* mul = n.op == OpKind::kSigmoid ? L.only_consumer(n.outputs[0]) : nullptr;
      mul && mul->op == OpKind::kMul && mul->inputs.size() == 2 && L.readers(n.inputs[0]).size() == 2 &&
      is_float_dt(x->dt) && !L.fused_into(mul)) {
    const Value *a = mul->inputs[0], *b = mul->inputs[1], *in = n.inputs[0], *sig = n.outputs[0];
    if (((a == in && b == sig) || (a == sig && b == in)) && mul->outputs[0]->type.shape &&
        mul->outputs[0]->type.shape->static_dims() == std::optional(x->dims)) {
      const DevValue& y = L.define(mul->outputs[0], x->layout);
      emit_unary(L, &n, "kernel unary Silu (Sigmoid and Mul)", k::Unary::kSilu, x->dt, x->ref, y.ref, y.numel());
      L.mark_fused(mul, &n);
      return Status::ok();
    }
  }
  // f64: the ops the kernel computes in double (kernels/elementwise.cu, unary_f64).
  static const std::set<k::Unary> kF64 = {k::Unary::kRelu, k::Unary::kSigmoid, k::Unary::kTanh, k::Unary::kExp,
                                          k::Unary::kLog, k::Unary::kSqrt, k::Unary::kReciprocal, k::Unary::kNeg,
                                          k::Unary::kAbs, k::Unary::kErf, k::Unary::kFloor, k::Unary::kCeil,
                                          k::Unary::kSin, k::Unary::kCos, k::Unary::kSign, k::Unary::kRound,
                                          k::Unary::kSoftplus};
  const bool f64_ok = x->dt == k::DT::kF64 && kF64.count(u.op);
  if (u.op == k::Unary::kNot ? x->dt != k::DT::kBool : !is_float_dt(x->dt) && !f64_ok && !(u.ints_ok && int_dt)) {
    KILN_UNSUPPORTED("{} on {} has no CUDA kernel", op_name(n.op), dtype_name(ir_dtype_of(x->dt)));
  }
  k::UnaryParams p;
  switch (n.op) {
    case OpKind::kGelu:
      if (n.attr_string("approximate", "none") == "tanh") u.op = k::Unary::kGeluTanh;
      break;
    case OpKind::kLeakyRelu: p.a = n.attr_float("alpha", 0.01f); break;
    case OpKind::kElu: p.a = n.attr_float("alpha", 1.0f); break;
    case OpKind::kCelu: p.a = n.attr_float("alpha", 1.0f); break;
    case OpKind::kThresholdedRelu: p.a = n.attr_float("alpha", 1.0f); break;
    case OpKind::kSwish: p.a = n.attr_float("alpha", 1.0f); break;
    case OpKind::kSelu:
      p.a = n.attr_float("alpha", 1.67326319217681884765625f);
      p.b = n.attr_float("gamma", 1.05070102214813232421875f);
      break;
    case OpKind::kShrink:
      p.a = n.attr_float("lambd", 0.5f);
      p.b = n.attr_float("bias", 0.0f);
      break;
    case OpKind::kHardSigmoid:
      p.a = n.attr_float("alpha", 0.2f);
      p.b = n.attr_float("beta", 0.5f);
      break;
    case OpKind::kClip: {
      p.a = -INFINITY;
      p.b = INFINITY;
      for (size_t i = 1; i < 3; ++i) {
        if (!n.has_input(i)) continue;
        const Tensor* c = L.constant(n.inputs[i]);
        if (!c || c->numel() != 1) KILN_UNSUPPORTED("Clip bounds computed at run time");
        const double v = c->as_double(0);
        // Integer bounds travel as float: they must be exact in it.
        if (int_dt && double(float(v)) != v) KILN_UNSUPPORTED("Clip of integers with a bound ({}) not exact in float", v);
        (i == 1 ? p.a : p.b) = float(v);
      }
      break;
    }
    default: break;
  }
  const DevValue& y = L.define(n.outputs[0], x->layout);
  emit_unary(L, &n, fmt::format("kernel unary {}", op_name(n.op)), u.op, x->dt, x->ref, y.ref, y.numel(), p);
  return Status::ok();
}

Expected<StepFn> bind_unary(Params& in, BindCtx&) {
  const k::Unary op = in.en(k::Unary::kAtanh);
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  const int64_t count = in.i64();
  k::UnaryParams p;
  p.a = in.f32();
  p.b = in.f32();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::unary(op, dt, c.ptr(xr), c.ptr(yr), count, p, c.stream), "unary");
  });
}

std::optional<k::Binary> binary_of(OpKind op) {
  switch (op) {
    case OpKind::kAdd: case OpKind::kSum: case OpKind::kMean: return k::Binary::kAdd;
    case OpKind::kSub: return k::Binary::kSub;
    case OpKind::kMul: return k::Binary::kMul;
    case OpKind::kDiv: return k::Binary::kDiv;
    case OpKind::kPow: return k::Binary::kPow;
    case OpKind::kMax: return k::Binary::kMax;
    case OpKind::kMin: return k::Binary::kMin;
    case OpKind::kMod: return k::Binary::kMod;
    case OpKind::kEqual: return k::Binary::kEqual;
    case OpKind::kLess: return k::Binary::kLess;
    case OpKind::kLessOrEqual: return k::Binary::kLessOrEqual;
    case OpKind::kGreater: return k::Binary::kGreater;
    case OpKind::kGreaterOrEqual: return k::Binary::kGreaterOrEqual;
    case OpKind::kAnd: return k::Binary::kAnd;
    case OpKind::kOr: return k::Binary::kOr;
    case OpKind::kXor: return k::Binary::kXor;
    case OpKind::kPRelu: return k::Binary::kPRelu;
    case OpKind::kBitShift: return k::Binary::kShiftLeft;  // or right: lower_binary reads direction
    default: return std::nullopt;
  }
}

// Emits y = a op b over `dims` into a fresh buffer; returns the output value.
Expected<DevValue> emit_binary(Lowering& L, const Node& n, k::Binary op, const DevValue* a, const DevValue* b,
                               const Value* out, bool last) {
  std::vector<int64_t> dims = out_dims(out);
  if (dims.size() > size_t(k::kMaxRank)) KILN_UNSUPPORTED("rank {} > {}", dims.size(), k::kMaxRank);
  Layout lay = pick_layout({a, b}, dims);
  k::NdStrides sa = operand(*a, dims, lay), sb = operand(*b, dims, lay);
  DevValue y;
  if (last) {
    y = L.define(out, lay);
  } else {  // an intermediate of a variadic Max/Min/Sum chain
    y = *a;
    y.dims = dims;
    y.layout = lay;
    y.ref = Ref{false, L.scratch(size_t(y.numel()) * size_t(k::dt_size(a->dt)))};
  }
  emit_binary_nd(L, &n, fmt::format("kernel binary {}", op_name(n.op)), op, a->dt, a->ref, sa, b->ref, sb, y.ref);
  return y;
}

Expected<StepFn> bind_binary(Params& in, BindCtx&) {
  const k::Binary op = in.en(k::Binary::kShiftRight);
  const k::DT dt = in.dt();
  const Ref ar = in.ref();
  const k::NdStrides sa = in.nd();
  const Ref br = in.ref();
  const k::NdStrides sb = in.nd();
  const Ref yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::binary(op, dt, c.ptr(ar), sa, c.ptr(br), sb, c.ptr(yr), c.stream), "binary");
  });
}

// A scalar constant on the device in dtype dt (a Mean's count, IsInf's infinity).
Expected<const DevValue*> scalar_value(Lowering& L, double v, k::DT dt, DType ir) {
  KILN_ASSIGN_OR_RETURN(Ref r, L.upload(Tensor::scalar<double>(v), dt));
  auto* d = new DevValue{r, dt, ir, {}, Layout::kRowMajor};
  L.keep_alive.emplace_back(d, [](void* p) { delete static_cast<DevValue*>(p); });
  return static_cast<const DevValue*>(d);
}

// x converted to dt into a buffer of the node (same dims and layout).
const DevValue* cast_value(Lowering& L, const Node& n, const DevValue* x, k::DT dt, DType ir, const char* what) {
  auto* c = new DevValue(*x);
  L.keep_alive.emplace_back(c, [](void* p) { delete static_cast<DevValue*>(p); });
  c->dt = dt;
  c->ir_dtype = ir;
  c->ref = Ref{false, L.scratch(c->bytes())};
  emit_cast(L, &n, fmt::format("kernel cast ({})", what), x->dt, dt, x->ref, c->ref, x->numel());
  return c;
}

// Pow whose exponent has another dtype than the base (the result has the base's): a float base
// takes the exponent converted to it; an integer base with a float exponent is raised in f64 and
// the result converted back (truncating, as the ONNX reference's astype).
Status lower_pow_mixed(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* e, L.value(n.inputs[1]));
  const DevValue* base = x;
  k::DT in_dt = x->dt;
  if (is_float_dt(x->dt) || x->dt == k::DT::kF64 || !(is_float_dt(e->dt) || e->dt == k::DT::kF64)) {
    if (e->dt != x->dt) e = cast_value(L, n, e, x->dt, x->ir_dtype, "Pow's exponent");
  } else {
    // An integer base: raised in f64, as the CPU reference does (never the build's 16-bit type).
    in_dt = k::DT::kF64;
    const DType ir = DType::kFloat64;
    base = cast_value(L, n, x, in_dt, ir, "Pow's base");
    if (e->dt != in_dt) e = cast_value(L, n, e, in_dt, ir, "Pow's exponent");
  }
  if (in_dt == x->dt) return emit_binary(L, n, k::Binary::kPow, base, e, n.outputs[0], true).status();
  KILN_ASSIGN_OR_RETURN(DevValue p, emit_binary(L, n, k::Binary::kPow, base, e, n.outputs[0], false));
  const DevValue& y = L.define(n.outputs[0], p.layout);
  emit_cast(L, &n, "kernel cast (Pow's result)", in_dt, y.dt, p.ref, y.ref, y.numel());
  return Status::ok();
}

// Mod of integers with fmod = 1 (C's remainder: the dividend's sign) as a - trunc(a / b) * b; the
// division truncates, so this is exact.
Status lower_int_fmod(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* a, L.value(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* b, operand_value(L, n, 1, a->dt));
  if (b->dt != a->dt) KILN_UNSUPPORTED("Mod: mixed input dtypes");
  KILN_ASSIGN_OR_RETURN(DevValue q, emit_binary(L, n, k::Binary::kDiv, a, b, n.outputs[0], false));
  KILN_ASSIGN_OR_RETURN(DevValue qb, emit_binary(L, n, k::Binary::kMul, &q, b, n.outputs[0], false));
  return emit_binary(L, n, k::Binary::kSub, a, &qb, n.outputs[0], true).status();
}

Status lower_binary(Lowering& L, const Node& n) {
  k::Binary op = *binary_of(n.op);
  if (n.op == OpKind::kBitShift) {
    const std::string d = n.attr_string("direction", "");
    if (d != "LEFT" && d != "RIGHT") KILN_UNSUPPORTED("BitShift direction '{}'", d);
    op = d == "LEFT" ? k::Binary::kShiftLeft : k::Binary::kShiftRight;
  }
  if (n.inputs.size() < 2 && n.op != OpKind::kSum && n.op != OpKind::kMax && n.op != OpKind::kMin &&
      n.op != OpKind::kMean) {
    KILN_UNSUPPORTED("{} with {} input(s)", op_name(n.op), n.inputs.size());
  }
  if (n.inputs.size() == 1 && n.inputs[0]) {  // Sum/Max/Min of one input is that input
    KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
    L.define_alias(n.outputs[0], *x);
    return Status::ok();
  }
  if (n.inputs.size() < 2) KILN_UNSUPPORTED("variadic {} with no input", op_name(n.op));
  // The first non-constant input decides the compute dtype; constants are converted to it. Pow's
  // result has its base's dtype, whatever the exponent's.
  std::optional<k::DT> dt;
  if (n.op == OpKind::kPow) {
    if (n.inputs[1]->type.dtype != n.inputs[0]->type.dtype) return lower_pow_mixed(L, n);
    dt = L.device_dt(n.inputs[0]->type.dtype);
  }
  for (const Value* v : n.inputs) {
    if (v && !dt && !L.constant(v)) {
      KILN_ASSIGN_OR_RETURN(const DevValue* d, L.value(v));
      dt = d->dt;
      break;
    }
  }
  if (!dt) dt = L.device_dt(n.inputs[0]->type.dtype);
  if (!dt) KILN_UNSUPPORTED("{} on {}", op_name(n.op), n.inputs[0]->type.to_string());
  bool logic = op == k::Binary::kAnd || op == k::Binary::kOr || op == k::Binary::kXor;
  const bool shift = op == k::Binary::kShiftLeft || op == k::Binary::kShiftRight;
  bool ok = logic ? *dt == k::DT::kBool
                  : shift ? is_int_dt(*dt)
                          : is_float_dt(*dt) || *dt == k::DT::kF64 || is_int_dt(*dt) ||
                                (*dt == k::DT::kBool && op == k::Binary::kEqual);
  if (!ok) KILN_UNSUPPORTED("{} on {} has no CUDA kernel", op_name(n.op), dtype_name(ir_dtype_of(*dt)));
  const bool int_dt = !is_float_dt(*dt) && *dt != k::DT::kF64;
  if (n.op == OpKind::kMod && int_dt && n.attr_int("fmod", 0) != 0) return lower_int_fmod(L, n);
  if (n.op == OpKind::kMean && int_dt) KILN_UNSUPPORTED("Mean on {}", dtype_name(ir_dtype_of(*dt)));
  std::vector<const DevValue*> ins;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(const DevValue* d, operand_value(L, n, i, dt));
    if (d->dt != *dt) KILN_UNSUPPORTED("{}: mixed input dtypes", op_name(n.op));
    if (d->dims.size() > size_t(k::kMaxRank)) KILN_UNSUPPORTED("rank > {}", k::kMaxRank);
    ins.push_back(d);
  }
  // Variadic Sum/Max/Min/Mean: a chain of binary steps, the last writing the output (Mean's last
  // divides the sum by the count).
  const bool mean = n.op == OpKind::kMean;
  DevValue acc = *ins[0];
  for (size_t i = 1; i < ins.size(); ++i) {
    bool last = i + 1 == ins.size() && !mean;
    const Value* out = n.outputs[0];
    KILN_ASSIGN_OR_RETURN(acc, emit_binary(L, n, op, &acc, ins[i], out, last));
  }
  if (mean) {
    KILN_ASSIGN_OR_RETURN(const DevValue* count, scalar_value(L, double(ins.size()), *dt, n.outputs[0]->type.dtype));
    KILN_RETURN_IF_ERROR(emit_binary(L, n, k::Binary::kDiv, &acc, count, n.outputs[0], true).status());
  }
  return Status::ok();
}

// Clip with a bound fed at run time: Min(Max(x, lo), hi), each bound broadcast. NaN in x stays NaN
// (binary Max and Min propagate it); lo > hi gives hi, as ONNX asks.
Status lower_clip_bounds(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  std::vector<std::pair<k::Binary, size_t>> steps;
  if (n.has_input(1)) steps.emplace_back(k::Binary::kMax, 1);
  if (n.has_input(2)) steps.emplace_back(k::Binary::kMin, 2);
  DevValue acc = *x;
  for (size_t i = 0; i < steps.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(const DevValue* b, operand_value(L, n, steps[i].second, x->dt));
    if (b->dt != x->dt) KILN_UNSUPPORTED("Clip: a bound of another dtype");
    KILN_ASSIGN_OR_RETURN(acc, emit_binary(L, n, steps[i].first, &acc, b, n.outputs[0], i + 1 == steps.size()));
  }
  return Status::ok();
}

// IsNaN: Equal(x, x) is false exactly at NaN, then Not. IsInf: Equal(|x|, inf) (or x against
// +inf or -inf alone, per detect_positive/detect_negative).
Status lower_is_special(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  if (!is_float_dt(x->dt) && x->dt != k::DT::kF64) KILN_UNSUPPORTED("{} on {}", op_name(n.op), dtype_name(x->ir_dtype));
  const Value* out = n.outputs[0];
  if (n.op == OpKind::kIsNaN) {
    KILN_ASSIGN_OR_RETURN(DevValue eq, emit_binary(L, n, k::Binary::kEqual, x, x, out, false));
    const DevValue& y = L.define(out, eq.layout);
    emit_unary(L, &n, "kernel unary Not", k::Unary::kNot, k::DT::kBool, eq.ref, y.ref, y.numel());
    return Status::ok();
  }
  const bool pos = n.attr_int("detect_positive", 1) != 0, neg = n.attr_int("detect_negative", 1) != 0;
  // Neither: nothing is detected; NaN compares unequal to everything.
  const double want = pos && neg ? INFINITY : pos ? INFINITY : neg ? -INFINITY : NAN;
  KILN_ASSIGN_OR_RETURN(const DevValue* c, scalar_value(L, want, x->dt, x->ir_dtype));
  const DevValue* v = x;
  if (pos && neg && x->dt == k::DT::kF64) KILN_UNSUPPORTED("IsInf on f64 detecting both signs");
  if (pos && neg) {
    auto* a = new DevValue(*x);
    L.keep_alive.emplace_back(a, [](void* p) { delete static_cast<DevValue*>(p); });
    a->ref = Ref{false, L.scratch(a->bytes())};
    emit_unary(L, &n, "kernel unary Abs", k::Unary::kAbs, x->dt, x->ref, a->ref, x->numel());
    v = a;
  }
  return emit_binary(L, n, k::Binary::kEqual, v, c, out, true).status();
}

Status lower_where(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* cond, L.value(n.inputs[0]));
  auto dt = L.device_dt(n.outputs[0]->type.dtype);
  if (!dt || cond->dt != k::DT::kBool) KILN_UNSUPPORTED("Where on {}", n.outputs[0]->type.to_string());
  KILN_ASSIGN_OR_RETURN(const DevValue* x, operand_value(L, n, 1, dt));
  KILN_ASSIGN_OR_RETURN(const DevValue* z, operand_value(L, n, 2, dt));
  std::vector<int64_t> dims = out_dims(n.outputs[0]);
  if (dims.size() > size_t(k::kMaxRank)) KILN_UNSUPPORTED("rank > {}", k::kMaxRank);
  Layout lay = pick_layout({cond, x, z}, dims);
  k::NdStrides sc = operand(*cond, dims, lay), sx = operand(*x, dims, lay), sz = operand(*z, dims, lay);
  const DevValue& y = L.define(n.outputs[0], lay);
  ByteWriter w;
  w.put(int32_t(*dt));
  put(w, cond->ref);
  put(w, sc);
  put(w, x->ref);
  put(w, sx);
  put(w, z->ref);
  put(w, sz);
  put(w, y.ref);
  L.emit(&n, "kernel where", {read_id(cond), read_id(x), read_id(z)}, {y.ref.id}, StepOp::kWhere, std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_where(Params& in, BindCtx&) {
  const k::DT d = in.dt();
  const Ref cr = in.ref();
  const k::NdStrides sc = in.nd();
  const Ref xr = in.ref();
  const k::NdStrides sx = in.nd();
  const Ref zr = in.ref();
  const k::NdStrides sz = in.nd();
  const Ref yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::where(d, c.ptr(cr), sc, c.ptr(xr), sx, c.ptr(zr), sz, c.ptr(yr), c.stream), "where");
  });
}

Expected<StepFn> bind_cast(Params& in, BindCtx&) {
  const k::DT from = in.dt(), to = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  const int64_t count = in.i64();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::cast(from, to, c.ptr(xr), c.ptr(yr), count, c.stream), "cast");
  });
}

Status lower_cast(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  auto to = L.device_dt(n.outputs[0]->type.dtype);
  if (!to) KILN_UNSUPPORTED("Cast to {}", dtype_name(n.outputs[0]->type.dtype));
  if (*to == x->dt && !x->ref.weight) {
    L.define_alias(n.outputs[0], *x);  // f32 -> f32 inside a half build: same bytes
    return Status::ok();
  }
  const DevValue& y = L.define(n.outputs[0], x->layout);
  emit_cast(L, &n, "kernel cast", x->dt, *to, x->ref, y.ref, y.numel());
  return Status::ok();
}

}  // namespace

void register_elementwise_lowerings(std::map<OpKind, LowerFn>& t) {
  for (OpKind op : {OpKind::kRelu, OpKind::kSigmoid, OpKind::kTanh, OpKind::kExp, OpKind::kLog, OpKind::kSqrt,
                    OpKind::kReciprocal, OpKind::kNeg, OpKind::kAbs, OpKind::kErf, OpKind::kFloor, OpKind::kCeil,
                    OpKind::kSin, OpKind::kCos, OpKind::kSoftplus, OpKind::kSign, OpKind::kRound, OpKind::kGelu,
                    OpKind::kClip, OpKind::kLeakyRelu, OpKind::kElu, OpKind::kHardSigmoid, OpKind::kHardSwish,
                    OpKind::kNot, OpKind::kSelu, OpKind::kCelu, OpKind::kThresholdedRelu, OpKind::kSwish, OpKind::kMish,
                    OpKind::kSoftsign, OpKind::kShrink, OpKind::kTan, OpKind::kAtan, OpKind::kAsin, OpKind::kAcos,
                    OpKind::kSinh, OpKind::kCosh, OpKind::kAsinh, OpKind::kAcosh, OpKind::kAtanh}) {
    t[op] = lower_unary;
  }
  for (OpKind op : {OpKind::kAdd, OpKind::kSum, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kPow, OpKind::kMax,
                    OpKind::kMin, OpKind::kMod, OpKind::kEqual, OpKind::kLess, OpKind::kLessOrEqual, OpKind::kGreater,
                    OpKind::kGreaterOrEqual, OpKind::kAnd, OpKind::kOr, OpKind::kXor, OpKind::kPRelu, OpKind::kMean, OpKind::kBitShift}) {
    t[op] = lower_binary;
  }
  t[OpKind::kIsNaN] = lower_is_special;
  t[OpKind::kIsInf] = lower_is_special;
  t[OpKind::kWhere] = lower_where;
  t[OpKind::kCast] = lower_cast;
  t[OpKind::kCastLike] = lower_cast;
}

void emit_cast(Lowering& L, const Node* n, std::string label, k::DT from, k::DT to, Ref x, Ref y, int64_t count) {
  ByteWriter w;
  w.put(int32_t(from));
  w.put(int32_t(to));
  put(w, x);
  put(w, y);
  w.i64(count);
  L.emit(n, std::move(label), {x.weight ? -1 : x.id}, {y.id}, StepOp::kCast, std::move(w));
}

void emit_unary(Lowering& L, const Node* n, std::string label, k::Unary op, k::DT dt, Ref x, Ref y, int64_t count,
                k::UnaryParams p) {
  ByteWriter w;
  w.put(int32_t(op));
  w.put(int32_t(dt));
  put(w, x);
  put(w, y);
  w.i64(count);
  w.put(p.a);
  w.put(p.b);
  L.emit(n, std::move(label), {x.weight ? -1 : x.id}, {y.id}, StepOp::kUnary, std::move(w));
}

void emit_binary_nd(Lowering& L, const Node* n, std::string label, k::Binary op, k::DT dt, Ref a, const k::NdStrides& sa,
                    Ref b, const k::NdStrides& sb, Ref y) {
  ByteWriter w;
  w.put(int32_t(op));
  w.put(int32_t(dt));
  put(w, a);
  put(w, sa);
  put(w, b);
  put(w, sb);
  put(w, y);
  L.emit(n, std::move(label), {a.weight ? -1 : a.id, b.weight ? -1 : b.id}, {y.id}, StepOp::kBinary, std::move(w));
}

void register_elementwise_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kUnary] = bind_unary;
  t[StepOp::kBinary] = bind_binary;
  t[StepOp::kWhere] = bind_where;
  t[StepOp::kCast] = bind_cast;
}

}  // namespace kiln::cuda
