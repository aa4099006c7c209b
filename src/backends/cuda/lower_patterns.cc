// Multi-node patterns the lowering replaces with one kernel, found before lowering starts (so
// the inner nodes can be skipped as they come up in topological order). Each match requires
// every inner value to have exactly one reader, so nothing else sees the intermediates.
//
//   erf GELU  (torch.onnx's nn.GELU):       Mul(Mul(x, Add(Erf(Div(x, 1.4142)), 1)), 0.5)
//   tanh GELU (GPT-2's NewGELUActivation):  Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Pow(x, 3),
//                                           0.044715)), 0.79788)), 1))
// Both become one unary kernel: one pass over the tensor instead of five or eight.
#include <cmath>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

bool near(Lowering& L, const Value* v, double want) {
  const Tensor* t = L.constant(v);
  return t && t->numel() == 1 && dtype_is_float(t->dtype()) && std::fabs(t->as_double(0) - want) <= 1e-3 * std::fabs(want);
}

// The producer of v if it is op `op`, v has no other reader, and v is not a graph output.
const Node* inner(Lowering& L, const Value* v, OpKind op) {
  if (!v || !v->producer || v->producer->op != op) return nullptr;
  return L.only_consumer(v) ? v->producer : nullptr;
}

// For a binary node: the input that is not `other`-matching; returns {this, that} where `that`
// satisfies pred, in either order.
template <typename Pred>
std::optional<std::pair<const Value*, const Value*>> split(const Node* n, Pred pred) {
  if (!n || n->inputs.size() != 2) return std::nullopt;
  if (pred(n->inputs[1])) return std::make_pair(n->inputs[0], n->inputs[1]);
  if (pred(n->inputs[0])) return std::make_pair(n->inputs[1], n->inputs[0]);
  return std::nullopt;
}

// erf GELU rooted at the final Mul(_, 0.5).
std::optional<Replacement> gelu_erf(Lowering& L, const Node& root) {
  auto r = split(&root, [&](const Value* v) { return near(L, v, 0.5); });
  if (!r) return std::nullopt;
  const Node* mul = inner(L, r->first, OpKind::kMul);
  if (!mul) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const Value* x = mul->inputs[size_t(side)];
    const Node* add = inner(L, mul->inputs[size_t(1 - side)], OpKind::kAdd);
    auto a = split(add, [&](const Value* v) { return near(L, v, 1.0); });
    if (!a) continue;
    const Node* erf = inner(L, a->first, OpKind::kErf);
    const Node* div = erf ? inner(L, erf->inputs[0], OpKind::kDiv) : nullptr;
    if (!div || div->inputs[0] != x || !near(L, div->inputs[1], std::sqrt(2.0))) continue;
    return Replacement{k::Unary::kGeluErf, x, {div, erf, add, mul}};
  }
  return std::nullopt;
}

// tanh GELU rooted at the final Mul(Mul(x, 0.5), Add(Tanh(...), 1)).
std::optional<Replacement> gelu_tanh(Lowering& L, const Node& root) {
  if (root.inputs.size() != 2) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const Node* half = inner(L, root.inputs[size_t(side)], OpKind::kMul);
    auto h = split(half, [&](const Value* v) { return near(L, v, 0.5); });
    if (!h) continue;
    const Value* x = h->first;
    const Node* add1 = inner(L, root.inputs[size_t(1 - side)], OpKind::kAdd);
    auto a1 = split(add1, [&](const Value* v) { return near(L, v, 1.0); });
    if (!a1) continue;
    const Node* th = inner(L, a1->first, OpKind::kTanh);
    const Node* sc = th ? inner(L, th->inputs[0], OpKind::kMul) : nullptr;
    auto s = split(sc, [&](const Value* v) { return near(L, v, std::sqrt(2.0 / M_PI)); });
    if (!s) continue;
    const Node* add2 = inner(L, s->first, OpKind::kAdd);
    auto a2 = split(add2, [&](const Value* v) { return v == x; });
    if (!a2) continue;
    const Node* cubic = inner(L, a2->first, OpKind::kMul);
    auto c = split(cubic, [&](const Value* v) { return near(L, v, 0.044715); });
    if (!c) continue;
    const Node* pw = inner(L, c->first, OpKind::kPow);
    if (!pw || pw->inputs[0] != x || !near(L, pw->inputs[1], 3.0)) continue;
    return Replacement{k::Unary::kGeluTanh, x, {half, add1, th, sc, add2, cubic, pw}};
  }
  return std::nullopt;
}

}  // namespace

void find_patterns(Lowering& L) {
  find_attention(L);
  find_conv_input_clips(L);
  for (const auto& up : L.graph().nodes) {
    const Node& n = *up;
    if (n.op != OpKind::kMul || L.is_fused(&n)) continue;
    std::optional<Replacement> r = gelu_erf(L, n);
    if (!r) r = gelu_tanh(L, n);
    if (!r || !(r->x->type == n.outputs[0]->type)) continue;
    DType dt = r->x->type.dtype;
    if (dt != DType::kFloat32 && dt != DType::kFloat16 && dt != DType::kBFloat16) continue;
    for (const Node* f : r->fused) L.mark_fused(f, &n);
    L.replacements[&n] = *r;
  }
}

Status lower_replacement(Lowering& L, const Node& n, const Replacement& r) {
  if (r.attention) return lower_attention(L, n, *r.attention);
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(r.x));
  if (x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16) {
    return KILN_ERROR(kInternal, "{}: GELU pattern on {}", n.describe(), dtype_name(x->ir_dtype));
  }
  const DevValue& y = L.define(n.outputs[0], x->layout);
  Ref xr = x->ref, yr = y.ref;
  k::DT dt = x->dt;
  int64_t count = y.numel();
  k::Unary op = r.op;
  L.emit(&n, op == k::Unary::kGeluErf ? "kernel unary gelu (erf pattern)" : "kernel unary gelu (tanh pattern)",
         {xr.weight ? -1 : xr.id}, {yr.id}, [=](const RunCtx& c) {
           return cuda_status(k::unary(op, dt, c.ptr(xr), c.ptr(yr), count, {}, c.stream), "unary gelu");
         });
  return Status::ok();
}

}  // namespace kiln::cuda
