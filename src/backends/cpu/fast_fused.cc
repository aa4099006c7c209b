#include "backends/cpu/fast_fused.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ops/op_registry.h"
#include "ops/quantize_util.h"

namespace kiln {

enum class FusedKernel::Op : uint8_t {
  kAdd, kSub, kMul, kDiv, kPow,  // binary
  kNeg, kAbs, kRelu, kSigmoid, kTanh, kExp, kLog, kSqrt, kReciprocal, kErf, kSin, kCos, kFloor, kCeil,
  kIdentity, kSoftplus, kLeakyRelu, kClip, kHardSigmoid, kGeluErf, kGeluTanh, kElu,
  kFakeQuant,  // QuantizeLinear to int8/uint8 then DequantizeLinear at the same scale and zero point
};

namespace {

constexpr int64_t kBlock = 256;  // outputs per block (a row of the last dim, or part of one)

using Op = FusedKernel::Op;

std::optional<Op> op_of(const Node& n) {
  switch (n.op) {
    case OpKind::kAdd: return Op::kAdd;
    case OpKind::kSub: return Op::kSub;
    case OpKind::kMul: return Op::kMul;
    case OpKind::kDiv: return Op::kDiv;
    case OpKind::kPow: return Op::kPow;
    case OpKind::kNeg: return Op::kNeg;
    case OpKind::kAbs: return Op::kAbs;
    case OpKind::kRelu: return Op::kRelu;
    case OpKind::kSigmoid: return Op::kSigmoid;
    case OpKind::kTanh: return Op::kTanh;
    case OpKind::kExp: return Op::kExp;
    case OpKind::kLog: return Op::kLog;
    case OpKind::kSqrt: return Op::kSqrt;
    case OpKind::kReciprocal: return Op::kReciprocal;
    case OpKind::kErf: return Op::kErf;
    case OpKind::kSin: return Op::kSin;
    case OpKind::kCos: return Op::kCos;
    case OpKind::kFloor: return Op::kFloor;
    case OpKind::kCeil: return Op::kCeil;
    case OpKind::kIdentity: return Op::kIdentity;
    case OpKind::kSoftplus: return Op::kSoftplus;
    case OpKind::kLeakyRelu: return Op::kLeakyRelu;
    case OpKind::kClip: return Op::kClip;
    case OpKind::kHardSigmoid: return Op::kHardSigmoid;
    case OpKind::kElu: return Op::kElu;
    case OpKind::kGelu: {
      const std::string a = n.attr_string("approximate", "none");
      if (a == "none") return Op::kGeluErf;
      if (a == "tanh") return Op::kGeluTanh;
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}

bool binary(Op op) { return op <= Op::kPow; }

bool f32_static(const Value* v) {
  return v && v->type.kind == Type::Kind::kTensor && v->type.dtype == DType::kFloat32 && v->type.shape &&
         v->type.shape->is_static();
}

bool scalar_constant(const Value* v) { return v && v->constant && v->constant->dtype() == DType::kFloat32 && v->constant->numel() == 1; }

// Element strides of a row-major tensor of dims `in` read at the output's dims `out` (numpy
// broadcasting, right-aligned: 0 where `in` has 1 or lacks the dim); empty when it does not fit.
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  if (in.size() > out.size()) return {};
  std::vector<int64_t> s(out.size(), 0);
  int64_t step = 1;
  for (size_t k = 0; k < in.size(); ++k) {
    const size_t i = in.size() - 1 - k, o = out.size() - 1 - k;
    if (in[i] != 1 && in[i] != out[o]) return {};
    s[o] = in[i] == 1 ? 0 : step;
    step *= in[i];
  }
  return s;
}

// The instructions of the body (`regs`: the number of registers they use), or an error naming what
// the loop does not evaluate.
Status translate(const Node& n, std::vector<FusedKernel::Instr>& code, int& regs, int& result) {
  const Graph* body = n.attr_graph("body");
  if (!body || body->outputs.size() != 1 || body->inputs.size() != n.inputs.size()) return KILN_ERROR(kUnsupported, "no body");
  std::unordered_map<const Value*, int> reg;
  for (size_t i = 0; i < body->inputs.size(); ++i) {
    if (!f32_static(body->inputs[i])) return KILN_ERROR(kUnsupported, "a body input that is not fp32");
    reg[body->inputs[i]] = int(i);
  }
  regs = int(body->inputs.size());
  std::unordered_set<const Node*> taken;  // a DequantizeLinear evaluated with its QuantizeLinear
  for (size_t bi = 0; bi < body->nodes.size(); ++bi) {
    const Node& b = *body->nodes[bi];
    if (taken.count(&b)) continue;
    if (b.op == OpKind::kQuantizeLinear) {
      // A Q/DQ pair (a QDQ model's fake-quantized activation) as one instruction; the int8 value
      // between them never leaves the register.
      const Node* dq = nullptr;
      int readers = 0;
      if (b.outputs.size() != 1 || !b.outputs[0]) return KILN_ERROR(kUnsupported, "{} in the body", b.describe());
      for (size_t j = bi + 1; j < body->nodes.size(); ++j) {
        for (const Value* v : body->nodes[j]->inputs) {
          if (v == b.outputs[0]) {
            ++readers;
            dq = body->nodes[j].get();
          }
        }
      }
      auto same = [](const Value* u, const Value* v) {
        return u == v || (u && v && u->constant && v->constant && u->constant->dtype() == v->constant->dtype() &&
                          u->constant->numel() == 1 && v->constant->numel() == 1 &&
                          u->constant->as_double(0) == v->constant->as_double(0));
      };
      auto constant = [](const Value* v) -> const Tensor* { return v && v->constant ? &*v->constant : nullptr; };
      // Each node one scale for the whole tensor (what fuse-elementwise fuses), the pair at one scale
      // and zero point, and nothing but the DequantizeLinear reading the integers.
      if (readers != 1 || dq->op != OpKind::kDequantizeLinear || dq->inputs[0] != b.outputs[0] ||
          !is_scalar_int8_qdq(b, constant) || !is_scalar_int8_qdq(*dq, constant) || !reg.count(b.inputs[0]) ||
          !same(b.inputs[1], dq->inputs[1]) ||
          !same(b.inputs.size() > 2 ? b.inputs[2] : nullptr, dq->inputs.size() > 2 ? dq->inputs[2] : nullptr) ||
          !f32_static(dq->outputs[0]) || b.attr_int("saturate", 1) != 1) {
        return KILN_ERROR(kUnsupported, "{} in the body", b.describe());
      }
      const DType qt = b.outputs[0]->type.dtype;
      const Value* zp = b.inputs.size() > 2 ? b.inputs[2] : nullptr;
      FusedKernel::Instr in;
      in.op = Op::kFakeQuant;
      in.a = reg[b.inputs[0]];
      in.alpha = float(b.inputs[1]->constant->as_double(0));
      in.beta = zp ? float(zp->constant->as_double(0)) : 0.f;
      in.ia = qt == DType::kInt8 ? -128.f : 0.f;
      in.ib = qt == DType::kInt8 ? 127.f : 255.f;
      if (!(in.alpha > 0) || !std::isfinite(in.alpha)) return KILN_ERROR(kUnsupported, "{}: its scale", b.describe());
      in.out = regs++;
      reg[dq->outputs[0]] = in.out;
      taken.insert(dq);
      code.push_back(in);
      continue;
    }
    auto op = op_of(b);
    if (!op || b.outputs.size() != 1 || !f32_static(b.outputs[0]) || b.inputs.empty()) {
      return KILN_ERROR(kUnsupported, "{} in the body", b.describe());
    }
    FusedKernel::Instr in;
    in.op = *op;
    auto operand = [&](size_t k, int& r, float& imm) -> Status {
      const Value* v = k < b.inputs.size() ? b.inputs[k] : nullptr;
      if (!v) return KILN_ERROR(kUnsupported, "{}: a missing operand", b.describe());
      if (auto it = reg.find(v); it != reg.end()) {
        r = it->second;
        return Status::ok();
      }
      if (!scalar_constant(v)) return KILN_ERROR(kUnsupported, "{}: reads a constant that is not one fp32 value", b.describe());
      r = -1;
      imm = float(v->constant->as_double(0));
      return Status::ok();
    };
    KILN_RETURN_IF_ERROR(operand(0, in.a, in.ia));
    if (in.a < 0) return KILN_ERROR(kUnsupported, "{}: a constant first operand", b.describe());
    if (binary(*op)) {
      if (b.inputs.size() != 2) return KILN_ERROR(kUnsupported, "{}: not two operands", b.describe());
      KILN_RETURN_IF_ERROR(operand(1, in.b, in.ib));
    } else if (*op == Op::kClip) {
      // Bounds: scalar constants, or absent (no bound).
      in.alpha = -std::numeric_limits<float>::infinity();
      in.beta = std::numeric_limits<float>::infinity();
      for (size_t k = 1; k < 3 && k < b.inputs.size(); ++k) {
        if (!b.inputs[k]) continue;
        if (!scalar_constant(b.inputs[k])) return KILN_ERROR(kUnsupported, "{}: a bound that is not constant", b.describe());
        (k == 1 ? in.alpha : in.beta) = float(b.inputs[k]->constant->as_double(0));
      }
    } else if (b.inputs.size() != 1) {
      return KILN_ERROR(kUnsupported, "{}: more operands than it reads", b.describe());
    }
    if (*op == Op::kLeakyRelu) in.alpha = b.attr_float("alpha", 0.01f);
    if (*op == Op::kElu) in.alpha = b.attr_float("alpha", 1.f);
    if (*op == Op::kHardSigmoid) {
      in.alpha = b.attr_float("alpha", 0.2f);
      in.beta = b.attr_float("beta", 0.5f);
    }
    in.out = regs++;
    reg[b.outputs[0]] = in.out;
    code.push_back(in);
  }
  auto it = reg.find(body->outputs[0]);
  if (it == reg.end() || it->second < int(body->inputs.size())) return KILN_ERROR(kUnsupported, "a body that returns an input");
  result = it->second;
  return Status::ok();
}

template <typename F>
void unary(float* o, const float* a, int64_t len, F f) {
  for (int64_t j = 0; j < len; ++j) o[j] = f(a[j]);
}

template <typename F>
void binary_op(float* o, const float* a, const float* b, float ib, int64_t len, F f) {
  if (b) {
    for (int64_t j = 0; j < len; ++j) o[j] = f(a[j], b[j]);
  } else {
    for (int64_t j = 0; j < len; ++j) o[j] = f(a[j], ib);
  }
}

void execute(const FusedKernel::Instr& in, float* regs, int64_t len) {
  float* o = regs + in.out * kBlock;
  const float* a = regs + in.a * kBlock;
  const float* b = in.b >= 0 ? regs + in.b * kBlock : nullptr;
  const float al = in.alpha, be = in.beta;
  switch (in.op) {
    case Op::kAdd: return binary_op(o, a, b, in.ib, len, [](float x, float y) { return x + y; });
    case Op::kSub: return binary_op(o, a, b, in.ib, len, [](float x, float y) { return x - y; });
    case Op::kMul: return binary_op(o, a, b, in.ib, len, [](float x, float y) { return x * y; });
    case Op::kDiv: return binary_op(o, a, b, in.ib, len, [](float x, float y) { return x / y; });
    case Op::kPow: return binary_op(o, a, b, in.ib, len, [](float x, float y) { return std::pow(x, y); });
    case Op::kNeg: return unary(o, a, len, [](float x) { return -x; });
    case Op::kAbs: return unary(o, a, len, [](float x) { return std::fabs(x); });
    case Op::kRelu: return unary(o, a, len, [](float x) { return x > 0 || x != x ? x : 0.f; });  // NaN stays
    case Op::kSigmoid: return unary(o, a, len, [](float x) { return 1.f / (1.f + std::exp(-x)); });
    case Op::kTanh: return unary(o, a, len, [](float x) { return std::tanh(x); });
    case Op::kExp: return unary(o, a, len, [](float x) { return std::exp(x); });
    case Op::kLog: return unary(o, a, len, [](float x) { return std::log(x); });
    case Op::kSqrt: return unary(o, a, len, [](float x) { return std::sqrt(x); });
    case Op::kReciprocal: return unary(o, a, len, [](float x) { return 1.f / x; });
    case Op::kErf: return unary(o, a, len, [](float x) { return std::erf(x); });
    case Op::kSin: return unary(o, a, len, [](float x) { return std::sin(x); });
    case Op::kCos: return unary(o, a, len, [](float x) { return std::cos(x); });
    case Op::kFloor: return unary(o, a, len, [](float x) { return std::floor(x); });
    case Op::kCeil: return unary(o, a, len, [](float x) { return std::ceil(x); });
    case Op::kIdentity: return unary(o, a, len, [](float x) { return x; });
    case Op::kSoftplus: return unary(o, a, len, [](float x) { return x > 20.f ? x : std::log1p(std::exp(x)); });
    case Op::kLeakyRelu: return unary(o, a, len, [al](float x) { return x >= 0 ? x : al * x; });
    case Op::kClip: return unary(o, a, len, [al, be](float x) { return std::min(std::max(x, al), be); });
    case Op::kHardSigmoid: return unary(o, a, len, [al, be](float x) { return std::clamp(al * x + be, 0.f, 1.f); });
    case Op::kElu: return unary(o, a, len, [al](float x) { return x >= 0 ? x : al * (std::exp(x) - 1.f); });
    case Op::kGeluErf:
      return unary(o, a, len, [](float x) { return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)); });
    case Op::kGeluTanh:
      return unary(o, a, len, [](float x) {
        return 0.5f * x * (1.f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
      });
    case Op::kFakeQuant: {
      // As ops/quantize.cc: x / scale rounded half to even, plus the zero point, saturated; NaN is
      // the stored integer 0; then (q - zp) * scale.
      const float lo = in.ia, hi = in.ib;
      return unary(o, a, len, [al, be, lo, hi](float x) {
        const float r = std::nearbyint(x / al);
        const float q = r != r ? 0.f : std::min(std::max(r + be, lo), hi);
        return (q - be) * al;
      });
    }
  }
}

}  // namespace

bool FusedKernel::supported(const Node& n) { return bool(compile(n)); }

Expected<FusedKernel> FusedKernel::compile(const Node& n) {
  auto no = [&] { return KILN_ERROR(kUnsupported, "{}: not a body the fused loop evaluates", n.describe()); };
  if (n.op != OpKind::kFusedElementwise || n.outputs.size() != 1 || !f32_static(n.outputs[0])) return no();
  FusedKernel k;
  k.dims_ = *n.outputs[0]->type.shape->static_dims();
  if (k.dims_.empty() || k.dims_.size() > 6) return no();
  for (int64_t d : k.dims_) {
    if (d <= 0) return no();  // an empty output: nothing to loop over (the reference makes it)
  }
  for (const Value* v : n.inputs) {
    if (!f32_static(v)) return no();
    k.strides_.push_back(broadcast_strides(*v->type.shape->static_dims(), k.dims_));
    if (k.strides_.back().empty()) return no();
  }
  KILN_RETURN_IF_ERROR(translate(n, k.code_, k.regs_, k.result_));
  return k;
}

void FusedKernel::run(const std::vector<const float*>& inputs, float* out) const {
  const size_t rank = dims_.size();
  const int64_t last = dims_.back();
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < rank; ++d) rows *= dims_[d];
  const int64_t chunks = (last + kBlock - 1) / kBlock;  // blocks per row
  parallel_for(rows * chunks, std::max<int64_t>(1, 4096 / std::min(last, kBlock)), [&](int64_t b0, int64_t b1) {
    std::vector<float> regs(size_t(regs_) * kBlock);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t row = blk / chunks, c0 = (blk % chunks) * kBlock, len = std::min(kBlock, last - c0);
      // Each input's offset of this row's first element.
      for (size_t i = 0; i < inputs.size(); ++i) {
        const std::vector<int64_t>& s = strides_[i];
        int64_t off = 0, rem = row;
        for (size_t d = rank - 1; d-- > 0;) {
          off += (rem % dims_[d]) * s[d];
          rem /= dims_[d];
        }
        float* r = regs.data() + i * kBlock;
        const float* src = inputs[i] + off;
        if (s[rank - 1] == 0) {
          std::fill(r, r + len, src[0]);
        } else {
          std::copy(src + c0, src + c0 + len, r);
        }
      }
      for (const Instr& in : code_) execute(in, regs.data(), len);
      std::copy(regs.data() + result_ * kBlock, regs.data() + result_ * kBlock + len, out + row * last + c0);
    }
  });
}

}  // namespace kiln
