#include "backends/cuda/codegen_elementwise.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>

namespace kiln::cuda {

namespace {

// The register type a body value is computed in.
enum class CType { kFloat, kI64, kI32, kBool };

std::optional<CType> ctype_of(DType d) {
  switch (d) {
    case DType::kFloat32: case DType::kFloat16: case DType::kBFloat16: return CType::kFloat;
    case DType::kInt64: return CType::kI64;
    case DType::kInt32: case DType::kInt8: case DType::kUInt8: return CType::kI32;  // 8-bit: QuantizeLinear's
    case DType::kBool: return CType::kBool;
    default: return std::nullopt;
  }
}

const char* cname(CType t) {
  switch (t) {
    case CType::kFloat: return "float";
    case CType::kI64: return "long long";
    case CType::kI32: return "int";
    case CType::kBool: return "bool";
  }
  return "?";
}

// Storage type and the load / store expressions of a device dtype.
std::optional<const char*> storage_of(k::DT d) {
  switch (d) {
    case k::DT::kF32: return "float";
    case k::DT::kF16: case k::DT::kBF16: return "unsigned short";
    case k::DT::kI64: return "long long";
    case k::DT::kI32: return "int";
    case k::DT::kI8: return "signed char";
    case k::DT::kU8: case k::DT::kBool: return "unsigned char";
    case k::DT::kI16: return "short";
    case k::DT::kU16: return "unsigned short";
    case k::DT::kU32: return "unsigned int";
    case k::DT::kU64: return "unsigned long long";
    default: return std::nullopt;
  }
}

std::string load_expr(k::DT d, const std::string& ref) {
  switch (d) {
    case k::DT::kF16: return "kh2f(" + ref + ")";
    case k::DT::kBF16: return "kb2f(" + ref + ")";
    case k::DT::kBool: return "(" + ref + " != 0)";
    default: return ref;
  }
}

std::string store_expr(k::DT d, const std::string& v) {
  switch (d) {
    case k::DT::kF16: return "kf2h(" + v + ")";
    case k::DT::kBF16: return "kf2b(" + v + ")";
    case k::DT::kBool: return "(unsigned char)(" + v + " ? 1 : 0)";
    case k::DT::kF32: return "(float)(" + v + ")";
    case k::DT::kI64: return "(long long)(" + v + ")";
    case k::DT::kI32: return "(int)(" + v + ")";
    case k::DT::kI8: return "(signed char)(" + v + ")";
    case k::DT::kU8: return "(unsigned char)(" + v + ")";
    case k::DT::kI16: return "(short)(" + v + ")";
    case k::DT::kU16: return "(unsigned short)(" + v + ")";
    case k::DT::kU32: return "(unsigned int)(" + v + ")";
    case k::DT::kU64: return "(unsigned long long)(" + v + ")";
    default: return v;
  }
}

// An exact literal: floats by their bits (inf and NaN included).
std::string float_lit(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  return fmt::format("__uint_as_float(0x{:08x}u)", bits);
}

Expected<std::string> constant_lit(const Value* v, CType t) {
  const Tensor& c = *v->constant;
  if (c.numel() != 1) return KILN_ERROR(kUnsupported, "body constant '{}' has {} elements", v->name, c.numel());
  switch (t) {
    case CType::kFloat: return float_lit(float(c.as_double(0)));
    case CType::kI64: {
      // Parenthesized (a negated operand must not read as --5), and INT64_MIN spelled so that it is
      // a signed literal (9223372036854775808LL alone is unsigned).
      const int64_t v = c.to_int_vector()[0];
      if (v == std::numeric_limits<int64_t>::min()) return std::string("(-9223372036854775807LL - 1)");
      return fmt::format("({}LL)", v);
    }
    case CType::kI32: {
      const int64_t v = c.to_int_vector()[0];
      if (v == std::numeric_limits<int32_t>::min()) return std::string("(-2147483647 - 1)");
      return fmt::format("({})", v);
    }
    case CType::kBool: return std::string(c.as_double(0) != 0 ? "true" : "false");
  }
  return KILN_ERROR(kInternal, "constant type");
}

// Integer +, -, * wrap (through unsigned, as the CPU reference): signed overflow is undefined in
// C, and the compiler folds comparisons on that assumption.
std::string arith(CType t, const std::string& a, const char* op, const std::string& b) {
  if (t == CType::kI64) return fmt::format("((long long)((unsigned long long)({}) {} (unsigned long long)({})))", a, op, b);
  if (t == CType::kI32) return fmt::format("((int)((unsigned)({}) {} (unsigned)({})))", a, op, b);
  return "(" + a + " " + op + " " + b + ")";
}

std::string fmax_like(CType t, const std::string& a, const std::string& b, bool max) {
  if (t == CType::kFloat) {  // NaN propagates, as numpy.maximum / the CPU reference
    return fmt::format("({0} != {0} ? {0} : {1} != {1} ? {1} : ({0} {2} {1} ? {1} : {0}))", a, b, max ? "<" : ">");
  }
  return fmt::format("({0} {2} {1} ? {1} : {0})", a, b, max ? "<" : ">");
}

// The C expression of one body node over its operand expressions.
Expected<std::string> node_expr(const Node& n, const std::vector<std::string>& x, CType in, CType out, DType out_ir) {
  auto need = [&](size_t k) -> Status {
    if (x.size() < k) return KILN_ERROR(kUnsupported, "{}: {} operands expected", n.describe(), k);
    return Status::ok();
  };
  const bool f = in == CType::kFloat;
  switch (n.op) {
    case OpKind::kAdd: KILN_RETURN_IF_ERROR(need(2)); return arith(in, x[0], "+", x[1]);
    case OpKind::kSub: KILN_RETURN_IF_ERROR(need(2)); return arith(in, x[0], "-", x[1]);
    case OpKind::kMul: KILN_RETURN_IF_ERROR(need(2)); return arith(in, x[0], "*", x[1]);
    case OpKind::kDiv: KILN_RETURN_IF_ERROR(need(2)); if (f) return "(" + x[0] + " / " + x[1] + ")"; break;
    case OpKind::kPow: KILN_RETURN_IF_ERROR(need(2)); if (f) return "powf(" + x[0] + ", " + x[1] + ")"; break;
    case OpKind::kMax: KILN_RETURN_IF_ERROR(need(2)); return fmax_like(in, x[0], x[1], true);
    case OpKind::kMin: KILN_RETURN_IF_ERROR(need(2)); return fmax_like(in, x[0], x[1], false);
    case OpKind::kEqual: KILN_RETURN_IF_ERROR(need(2)); return "(" + x[0] + " == " + x[1] + ")";
    case OpKind::kLess: KILN_RETURN_IF_ERROR(need(2)); return "(" + x[0] + " < " + x[1] + ")";
    case OpKind::kLessOrEqual: KILN_RETURN_IF_ERROR(need(2)); return "(" + x[0] + " <= " + x[1] + ")";
    case OpKind::kGreater: KILN_RETURN_IF_ERROR(need(2)); return "(" + x[0] + " > " + x[1] + ")";
    case OpKind::kGreaterOrEqual: KILN_RETURN_IF_ERROR(need(2)); return "(" + x[0] + " >= " + x[1] + ")";
    case OpKind::kAnd: KILN_RETURN_IF_ERROR(need(2)); return "(" + x[0] + " && " + x[1] + ")";
    case OpKind::kOr: KILN_RETURN_IF_ERROR(need(2)); return "(" + x[0] + " || " + x[1] + ")";
    case OpKind::kXor: KILN_RETURN_IF_ERROR(need(2)); return "(" + x[0] + " != " + x[1] + ")";
    case OpKind::kNot: KILN_RETURN_IF_ERROR(need(1)); return "(!" + x[0] + ")";
    case OpKind::kWhere: KILN_RETURN_IF_ERROR(need(3)); return "(" + x[0] + " ? " + x[1] + " : " + x[2] + ")";
    case OpKind::kNeg: KILN_RETURN_IF_ERROR(need(1)); return f ? "(-" + x[0] + ")" : arith(in, "0", "-", x[0]);
    case OpKind::kAbs:
      KILN_RETURN_IF_ERROR(need(1));
      return f ? "fabsf(" + x[0] + ")" : "(" + x[0] + " < 0 ? " + arith(in, "0", "-", x[0]) + " : " + x[0] + ")";
    case OpKind::kRelu: KILN_RETURN_IF_ERROR(need(1)); return "(" + x[0] + " < 0 ? 0 : " + x[0] + ")";
    case OpKind::kSign:  // NaN stays NaN, as the CPU reference
      KILN_RETURN_IF_ERROR(need(1));
      return f ? fmt::format("({0} > 0.0f ? 1.0f : {0} < 0.0f ? -1.0f : {0})", x[0])
               : fmt::format("(({0} > 0) - ({0} < 0))", x[0]);
    case OpKind::kCast: {
      KILN_RETURN_IF_ERROR(need(1));
      // Float -> int truncates toward zero (C's conversion, as ONNX); anything -> bool is != 0.
      // float -> int32 goes through int64 and wraps, as the CPU reference (a direct conversion saturates).
      const std::string v = out == CType::kBool                       ? fmt::format("({} != 0)", x[0])
                            : out == CType::kI32 && in == CType::kFloat ? fmt::format("((int)(long long){})", x[0])
                                                                        : fmt::format("(({}){})", cname(out), x[0]);
      // A cast to a 16-bit float rounds there, as the CPU reference stores it.
      if (out_ir == DType::kFloat16) return "kh2f(kf2h(" + v + "))";
      if (out_ir == DType::kBFloat16) return "kb2f(kf2b(" + v + "))";
      return v;
    }
    case OpKind::kQuantizeLinear: {  // scalar scale and zero point (fuse-elementwise checks)
      KILN_RETURN_IF_ERROR(need(2));
      const bool u8 = out_ir == DType::kUInt8;
      if (!u8 && out_ir != DType::kInt8) break;
      return fmt::format("kquant({}, {}, {}, {}, {})", x[0], x[1], x.size() > 2 && !x[2].empty() ? "(float)" + x[2] : "0.0f",
                         u8 ? "0.0f" : "-128.0f", u8 ? "255.0f" : "127.0f");
    }
    case OpKind::kDequantizeLinear: {
      KILN_RETURN_IF_ERROR(need(2));
      return fmt::format("(((float){} - {}) * {})", x[0], x.size() > 2 && !x[2].empty() ? "(float)" + x[2] : "0.0f", x[1]);
    }
    default: break;
  }
  if (!f) return KILN_ERROR(kUnsupported, "{} on {} is not generated", n.describe(), cname(in));
  KILN_RETURN_IF_ERROR(need(1));
  const std::string& a = x[0];
  const float alpha = n.attr_float("alpha", n.op == OpKind::kLeakyRelu ? 0.01f : n.op == OpKind::kHardSigmoid ? 0.2f : 1.0f);
  switch (n.op) {
    case OpKind::kSigmoid: return "(1.0f / (1.0f + expf(-" + a + ")))";
    case OpKind::kTanh: return "tanhf(" + a + ")";
    case OpKind::kExp: return "expf(" + a + ")";
    case OpKind::kLog: return "logf(" + a + ")";
    case OpKind::kSqrt: return "sqrtf(" + a + ")";
    case OpKind::kReciprocal: return "(1.0f / " + a + ")";
    case OpKind::kErf: return "erff(" + a + ")";
    case OpKind::kFloor: return "floorf(" + a + ")";
    case OpKind::kCeil: return "ceilf(" + a + ")";
    case OpKind::kSin: return "sinf(" + a + ")";
    case OpKind::kCos: return "cosf(" + a + ")";
    case OpKind::kSoftplus: return fmt::format("(fmaxf({0}, 0.0f) + log1pf(expf(-fabsf({0}))))", a);
    case OpKind::kGelu:
      if (n.attr_string("approximate", "none") == "tanh") {
        return fmt::format("(0.5f * {0} * (1.0f + tanhf(0.7978845608028654f * ({0} + 0.044715f * {0} * {0} * {0}))))", a);
      }
      return fmt::format("(0.5f * {0} * (1.0f + erff({0} * 0.7071067811865476f)))", a);
    case OpKind::kLeakyRelu: return fmt::format("({0} < 0.0f ? {1} * {0} : {0})", a, float_lit(alpha));
    case OpKind::kElu: return fmt::format("({0} < 0.0f ? {1} * expm1f({0}) : {0})", a, float_lit(alpha));
    case OpKind::kHardSigmoid:
      return fmt::format("fmaxf(0.0f, fminf(1.0f, {} * {} + {}))", float_lit(alpha), a, float_lit(n.attr_float("beta", 0.5f)));
    case OpKind::kHardSwish: return fmt::format("({0} * fmaxf(0.0f, fminf(1.0f, {0} / 6.0f + 0.5f)))", a);
    case OpKind::kClip: {  // min(max(x, lo), hi); omitted bounds are "" here; NaN stays NaN
      std::string v = a;
      if (x.size() > 1 && !x[1].empty()) v = fmt::format("({0} < {1} ? {1} : {0})", v, x[1]);
      if (x.size() > 2 && !x[2].empty()) v = fmt::format("({0} > {1} ? {1} : {0})", v, x[2]);
      return v;
    }
    default: break;
  }
  return KILN_ERROR(kUnsupported, "{} is not generated", n.describe());
}

constexpr const char* kPrelude = R"(// generated by kiln (codegen_elementwise.cc)
__device__ __forceinline__ float kh2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short kf2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float kb2f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ unsigned short kf2b(float f) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
// QuantizeLinear to an integer: x / scale correctly rounded, then half-to-even, plus the zero point,
// saturated; NaN gives 0 (the CPU reference's choice: ONNX leaves it undefined).
__device__ __forceinline__ int kquant(float x, float s, float zp, float lo, float hi) {
  const float q = rintf(__fdiv_rn(x, s));
  return q != q ? 0 : (int)fminf(fmaxf(q + zp, lo), hi);
}
)";

}  // namespace

Expected<std::string> generate_elementwise(const Graph& body, const EwKernelSpec& spec) {
  if (body.inputs.size() != spec.inputs.size() || body.outputs.size() != 1) {
    return KILN_ERROR(kInternal, "fused body '{}': {} inputs for {} operands", body.name, body.inputs.size(), spec.inputs.size());
  }
  if (spec.dims.size() > size_t(k::kMaxRank)) return KILN_ERROR(kUnsupported, "rank {} output", spec.dims.size());
  int64_t numel = 1;
  for (int64_t d : spec.dims) numel *= d;
  std::vector<int64_t> contiguous(spec.dims.size(), 1);
  for (size_t i = spec.dims.size(); i-- > 1;) contiguous[i - 1] = contiguous[i] * spec.dims[i];

  std::string params, loads;
  std::vector<std::string> offsets;                     // each input's element offset of output element i
  std::unordered_map<const Value*, std::string> name;  // body value -> C expression / variable
  std::unordered_map<const Value*, CType> type;
  bool need_coords = false;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const EwOperand& op = spec.inputs[i];
    const Value* v = body.inputs[i];
    auto st = storage_of(op.dt);
    auto ct = ctype_of(v->type.dtype);
    if (!st || !ct) return KILN_ERROR(kUnsupported, "fused input {} of dtype {}", i, dtype_name(v->type.dtype));
    if (op.strides.size() != spec.dims.size()) return KILN_ERROR(kInternal, "input {} strides of rank {}", i, op.strides.size());
    params += fmt::format("const {}* __restrict__ in{}, ", *st, i);
    std::string off;
    if (op.strides == contiguous) {
      off = "i";
    } else if (spec.runtime_dims) {
      need_coords = true;
      for (size_t d = 0; d < spec.dims.size(); ++d) off += fmt::format("{}c{} * s.st[{}][{}]", d ? " + " : "", d, i, d);
      if (off.empty()) off = "0";
    } else {
      need_coords = true;
      for (size_t d = 0; d < spec.dims.size(); ++d) {
        if (op.strides[d] == 0 || spec.dims[d] == 1) continue;
        off += fmt::format("{}c{} * {}LL", off.empty() ? "" : " + ", d, op.strides[d]);
      }
      if (off.empty()) off = "0";
    }
    loads += fmt::format("    const {} v{} = {};\n", cname(*ct), i, load_expr(op.dt, fmt::format("in{}[{}]", i, off)));
    offsets.push_back(off);
    name[v] = fmt::format("v{}", i);
    type[v] = *ct;
  }
  auto out_st = storage_of(spec.out_dt);
  if (!out_st) return KILN_ERROR(kUnsupported, "fused output dtype");

  // 32-bit index math when the grid-stride loop cannot wrap (the launch has at most 132 * 16 blocks).
  const bool narrow = numel < (int64_t{1} << 31);
  const char* ix = narrow ? "unsigned" : "long long";
  const char* sfx = narrow ? "u" : "LL";
  // What the loops and coordinates divide by: literals, or the shape argument's fields.
  const std::string count = spec.runtime_dims ? "s.n" : fmt::format("{}{}", numel, sfx);
  auto dim = [&](size_t d) { return spec.runtime_dims ? fmt::format("s.d[{}]", d) : fmt::format("{}{}", spec.dims[d], sfx); };
  std::string coords;
  if (need_coords) {
    coords += fmt::format("    {} rem = i;\n", ix);
    for (size_t d = spec.dims.size(); d-- > 0;) {
      coords += fmt::format("    const {} c{} = rem % {}; rem /= {};\n", ix, d, dim(d), dim(d));
    }
    coords += "    (void)rem;\n";
  }
  std::string shape_param;
  if (spec.runtime_dims) {
    shape_param = ", const kiln_shape s";
  }

  std::vector<std::string> stmts;  // one line each, indented where the kernel places them
  auto indented = [&](const char* pad) {
    std::string out;
    for (const std::string& st : stmts) out += pad + st;
    return out;
  };
  int tmp = 0;
  for (const auto& np : body.nodes) {
    const Node& n = *np;
    if (n.outputs.size() != 1 || !n.outputs[0]) return KILN_ERROR(kUnsupported, "{}: one output expected", n.describe());
    std::vector<std::string> x;
    CType in = CType::kFloat;
    bool first = true;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const Value* v = n.inputs[i];
      if (!v) { x.emplace_back(); continue; }
      auto it = name.find(v);
      if (it == name.end()) {
        if (!v->constant || v->producer) return KILN_ERROR(kUnsupported, "{}: reads '{}' from outside its body", n.describe(), v->name);
        auto ct = ctype_of(v->type.dtype);
        if (!ct) return KILN_ERROR(kUnsupported, "{}: constant of dtype {}", n.describe(), dtype_name(v->type.dtype));
        KILN_ASSIGN_OR_RETURN(std::string lit, constant_lit(v, *ct));
        it = name.emplace(v, lit).first;
        type[v] = *ct;
      }
      x.push_back(it->second);
      // The operand type of the op: Where's value operands, not its condition.
      if (!(n.op == OpKind::kWhere && i == 0) && first) {
        in = type[v];
        first = false;
      }
    }
    const Value* o = n.outputs[0];
    auto out = ctype_of(o->type.dtype);
    if (!out) return KILN_ERROR(kUnsupported, "{}: output dtype {}", n.describe(), dtype_name(o->type.dtype));
    KILN_ASSIGN_OR_RETURN(std::string e, node_expr(n, x, in, *out, o->type.dtype));
    // A 16-bit float value rounds where the unfused graph stores it (comparisons and Where must
    // see what the CPU reference sees); a Cast to one already did.
    if (n.op != OpKind::kCast && o->type.dtype == DType::kFloat16) e = "kh2f(kf2h(" + e + "))";
    if (n.op != OpKind::kCast && o->type.dtype == DType::kBFloat16) e = "kb2f(kf2b(" + e + "))";
    const std::string t = fmt::format("t{}", tmp++);
    stmts.push_back(fmt::format("const {} {} = ({}){};\n", cname(*out), t, cname(*out), e));
    name[o] = t;
    type[o] = *out;
  }
  auto res = name.find(body.outputs[0]);
  if (res == name.end()) return KILN_ERROR(kUnsupported, "fused body '{}' returns a value it does not compute", body.name);

  std::string src = kPrelude;
  if (spec.runtime_dims) {  // ew_shape_arg's layout
    src += fmt::format("struct kiln_shape {{ {0} n; {0} d[{1}]; {0} st[{2}][{1}]; }};\n", ix, std::max<size_t>(1, spec.dims.size()),
                       std::max<size_t>(1, spec.inputs.size()));
  }
  src += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({}{}* __restrict__ out{}) {{\n", kEwBlock, spec.name,
                     params, *out_st, shape_param);
  src += fmt::format("  for ({0} i = ({0})blockIdx.x * {1} + threadIdx.x; i < {2}; i += ({0})gridDim.x * {1}) {{\n", ix,
                     kEwBlock, count);
  src += coords + loads + indented("    ");
  src += fmt::format("    out[i] = {};\n  }}\n}}\n", store_expr(spec.out_dt, res->second));

  // The packed variant: a thread computes V consecutive outputs of the last dim. Inputs contiguous
  // along it are read as one pack at the first element's offset (the coordinates are those of
  // element i, c_last a multiple of V); inputs broadcast along it are read once per pack.
  const int vw = ew_vector_width(spec);
  if (vw > 1) {
    std::string vloads, unpack;
    for (size_t i = 0; i < spec.inputs.size(); ++i) {
      const EwOperand& op = spec.inputs[i];
      const std::string st = *storage_of(op.dt);
      const std::string ct = cname(*ctype_of(body.inputs[i]->type.dtype));
      if (const int align = ew_pack_alignment(spec, i); align > 0) {
        vloads += fmt::format("    struct __align__({}) P{} {{ {} v[{}]; }};\n    const P{} p{} = *reinterpret_cast<const P{}*>(in{} + {});\n",
                              align, i, st, vw, i, i, i, i, offsets[i]);
        unpack += fmt::format("      const {} v{} = {};\n", ct, i, load_expr(op.dt, fmt::format("p{}.v[e]", i)));
      } else {
        vloads += fmt::format("    const {} s{} = in{}[{}];\n", st, i, i, offsets[i]);
        unpack += fmt::format("      const {} v{} = {};\n", ct, i, load_expr(op.dt, fmt::format("s{}", i)));
      }
    }
    const int oalign = std::min(16, vw * k::dt_size(spec.out_dt));
    src += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}_v({}{}* __restrict__ out{}) {{\n", kEwBlock,
                       spec.name, params, *out_st, shape_param);
    src += fmt::format("  struct __align__({}) PO {{ {} v[{}]; }};\n", oalign, *out_st, vw);
    const std::string packs = spec.runtime_dims ? fmt::format("s.n / {}{}", vw, sfx) : fmt::format("{}{}", numel / vw, sfx);
    src += fmt::format("  for ({0} p = ({0})blockIdx.x * {1} + threadIdx.x; p < {2}; p += ({0})gridDim.x * {1}) {{\n", ix,
                       kEwBlock, packs);
    src += fmt::format("    const {} i = p * {};\n", ix, vw);
    src += coords + vloads + "    PO o;\n";
    src += fmt::format("#pragma unroll\n    for (int e = 0; e < {}; ++e) {{\n", vw);
    src += unpack + indented("      ");
    src += fmt::format("      o.v[e] = {};\n    }}\n    *reinterpret_cast<PO*>(out + i) = o;\n  }}\n}}\n",
                       store_expr(spec.out_dt, res->second));
  }
  return src;
}

std::string ew_shape_arg(const EwKernelSpec& spec) {
  if (!spec.runtime_dims) return {};
  int64_t numel = 1;
  for (int64_t d : spec.dims) numel *= d;
  const bool narrow = numel < (int64_t{1} << 31);
  std::string out;
  auto put = [&](int64_t v) {
    if (narrow) {
      const uint32_t x = uint32_t(v);
      out.append(reinterpret_cast<const char*>(&x), sizeof x);
    } else {
      out.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
  };
  const size_t rank = std::max<size_t>(1, spec.dims.size());
  put(numel);
  for (size_t d = 0; d < rank; ++d) put(d < spec.dims.size() ? spec.dims[d] : 1);
  for (size_t i = 0; i < std::max<size_t>(1, spec.inputs.size()); ++i) {
    for (size_t d = 0; d < rank; ++d) {
      put(i < spec.inputs.size() && d < spec.inputs[i].strides.size() ? spec.inputs[i].strides[d] : 0);
    }
  }
  return out;
}

int ew_pack_alignment(const EwKernelSpec& spec, size_t input) {
  const int vw = ew_vector_width(spec);
  if (vw < 2) return 0;
  const EwOperand& op = spec.inputs[input];
  const size_t last = spec.dims.size() - 1;
  if (op.strides[last] != 1 || spec.dims[last] == 1) return 0;  // broadcast along the last dim
  return std::min(16, vw * k::dt_size(op.dt));
}

int ew_vector_width(const EwKernelSpec& spec) {
  if (spec.dims.empty()) return 1;
  const size_t last = spec.dims.size() - 1;
  const int vw = std::min(8, std::max(1, 16 / k::dt_size(spec.out_dt)));
  if (vw < 2 || spec.dims[last] % vw != 0) return 1;
  for (const EwOperand& op : spec.inputs) {
    if (op.strides.size() != spec.dims.size()) return 1;
    if (op.strides[last] == 0 || spec.dims[last] == 1) continue;  // read once per pack
    if (op.strides[last] != 1) return 1;
    for (size_t d = 0; d < last; ++d) {
      if (op.strides[d] % vw != 0) return 1;  // every pack starts aligned
    }
  }
  return vw;
}

}  // namespace kiln::cuda
