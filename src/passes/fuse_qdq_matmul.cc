// fuse-qdq-matmul: a MatMul between a fake-quantized activation (QuantizeLinear -> DequantizeLinear
// with one scale) and a dequantized constant weight (DequantizeLinear of an int8 or float8 tensor,
// per-tensor or per-output-channel scales, zero weight offsets), with an optional bias Add, becomes
// one QuantizedMatMul (ops/fused.cc). This is the QDQ format onnxruntime's quantize_static, NVIDIA
// ModelOpt and `kiln quantize` write; without the pass, fold-constants turns the weight back into
// float and the product runs in float. Backends with int8/fp8 GEMMs run the node on the quantized
// values (the CUDA backend: cuBLASLt); the CPU reference runs its body, which is the matched
// subgraph itself, so the results are those of the unfused graph.
//
//   Before:  %q  = QuantizeLinear(%x, %sx, %zx) : i8[M,K]
//            %xd = DequantizeLinear(%q, %sx, %zx) : f32[M,K]
//            %wd = DequantizeLinear(%wq, %sw) {axis = 1} : f32[K,N]      (%wq = const i8[K,N], %sw f32[N])
//            %m  = MatMul(%xd, %wd) : f32[M,N] @fc
//            %y  = Add(%m, %b) : f32[M,N]                                 (%b = const f32[N])
//   After:   %m = ai.kiln.QuantizedMatMul(%x, %wq, %sw, %b) {body = graph fc_body(%x_in, %wq_in, %sw_in, %b_in) {
//              %sx = const ...   %zx = const ...
//              %q = QuantizeLinear(%x_in, %sx, %zx)
//              %xd = DequantizeLinear(%q, %sx, %zx)
//              %wd = DequantizeLinear(%wq_in, %sw_in) {axis = 1}
//              %p = MatMul(%xd, %wd)
//              %y = Add(%p, %b_in)                   (only with a bias)
//              return %y
//            }} : f32[M,N] @fc                        (%m takes %y's place)
//
// The body always has exactly this form (QuantizeLinear, DequantizeLinear, DequantizeLinear,
// MatMul [, Add]); backends read the scales and zero points from it. Preconditions, all checked:
// the activation's QuantizeLinear and DequantizeLinear use equal one-element float32 scales and
// equal (or absent) one-element zero points, no block_size or precision attribute, quantized type
// int8/uint8 with an int8 weight or float8e4m3fn with a float8e4m3fn weight; the weight is a 2-D
// constant [K,N] whose DequantizeLinear scale is a float32 constant of one element or [N] on axis 1
// and whose zero point is absent or all zeros; x, the product and the bias are float32; the bias is
// a constant [N] or [1,N] read only through the Add, and the MatMul output feeds only that Add.
// The Q/DQ nodes stay while something else reads them. Runs before fold-constants, which would
// fold the weight's DequantizeLinear.
#include <algorithm>
#include <cstring>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

bool is_dtype(const Value* v, DType t) { return v && v->type.is_tensor() && v->type.dtype == t; }

// A one-element constant (any rank).
const Tensor* scalar_constant(const Graph& g, const Value* v) {
  const Tensor* t = v ? constant_of(g, v) : nullptr;
  return t && t->numel() == 1 ? t : nullptr;
}

// Same dtype and bytes, whatever the rank ([] and [1] scales are one scale; same_tensor compares dims).
bool same_scalar(const Tensor* a, const Tensor* b) {
  return a && b && a->dtype() == b->dtype() && a->nbytes() == b->nbytes() && std::memcmp(a->raw(), b->raw(), a->nbytes()) == 0;
}

Value* input_or_null(const Node& n, size_t i) { return i < n.inputs.size() ? n.inputs[i] : nullptr; }

// The activation side: DequantizeLinear(QuantizeLinear(x, s, z), s, z) with one scale.
struct ActQdq {
  Node* q = nullptr;
  Node* dq = nullptr;
};

std::optional<ActQdq> match_activation(const Graph& g, Value* a) {
  Node* dq = a ? a->producer : nullptr;
  if (!dq || dq->owner != &g || dq->op != OpKind::kDequantizeLinear || !is_dtype(a, DType::kFloat32)) return std::nullopt;
  Value* qa = dq->inputs[0];
  Node* q = qa ? qa->producer : nullptr;
  if (!q || q->owner != &g || q->op != OpKind::kQuantizeLinear || !is_dtype(q->inputs[0], DType::kFloat32)) return std::nullopt;
  const DType qt = qa->type.dtype;
  if (qt != DType::kInt8 && qt != DType::kUInt8 && qt != DType::kFloat8E4M3FN) return std::nullopt;
  if (q->attr_int("block_size", 0) != 0 || dq->attr_int("block_size", 0) != 0 || q->attr_int("precision", 0) != 0 ||
      q->attr_int("saturate", 1) != 1 || dq->attr_int("output_dtype", 0) != 0) {
    return std::nullopt;
  }
  const Tensor* s1 = scalar_constant(g, q->inputs[1]);
  const Tensor* s2 = scalar_constant(g, dq->inputs[1]);
  if (!s1 || s1->dtype() != DType::kFloat32 || !same_scalar(s1, s2)) return std::nullopt;
  Value* z1 = input_or_null(*q, 2);
  Value* z2 = input_or_null(*dq, 2);
  if (bool(z1) != bool(z2)) return std::nullopt;
  if (z1 && !same_scalar(scalar_constant(g, z1), scalar_constant(g, z2))) return std::nullopt;
  return ActQdq{q, dq};
}

// The weight side: DequantizeLinear(w_q) of a 2-D constant with zero offsets.
Node* match_weight(const Graph& g, Value* b, DType act_type) {
  Node* dq = b ? b->producer : nullptr;
  if (!dq || dq->owner != &g || dq->op != OpKind::kDequantizeLinear || !is_dtype(b, DType::kFloat32)) return nullptr;
  if (dq->attr_int("block_size", 0) != 0 || dq->attr_int("output_dtype", 0) != 0) return nullptr;
  const Tensor* w = constant_of(g, dq->inputs[0]);
  if (!w || w->rank() != 2) return nullptr;
  const DType want = act_type == DType::kFloat8E4M3FN ? DType::kFloat8E4M3FN : DType::kInt8;
  if (w->dtype() != want) return nullptr;
  const Tensor* s = constant_of(g, dq->inputs[1]);
  if (!s || s->dtype() != DType::kFloat32) return nullptr;
  if (s->numel() != 1) {
    const int64_t axis = dq->attr_int("axis", 1);
    if (s->rank() != 1 || s->dim(0) != w->dim(1) || (axis != 1 && axis != -1)) return nullptr;
  }
  if (Value* zv = input_or_null(*dq, 2)) {
    const Tensor* z = constant_of(g, zv);
    if (!z || z->dtype() != w->dtype()) return nullptr;
    const auto* bytes = static_cast<const unsigned char*>(z->raw());
    for (size_t i = 0; i < z->nbytes(); ++i) {
      if (bytes[i] != 0) return nullptr;  // int8 0 and float8 +0 are all-zero bytes
    }
  }
  return dq;
}

// The Add that alone reads the product, when its other operand is a constant per-column bias.
Node* match_bias(const Graph& g, const UseMap& uses, const Value* m, int64_t n, Value** bias) {
  if (uses.num_uses(m) != 1 || uses.is_output(m) || !uses.uses(m)[0].node) return nullptr;
  Node* add = uses.uses(m)[0].node;
  if (add->op != OpKind::kAdd || add->owner != &g || !add->has_output(0)) return nullptr;
  Value* b = column_bias(g, *add, m, n);  // of m's dtype, float32 here
  if (!b || !(add->outputs[0]->type == m->type) || !uses.can_forward(add->outputs[0], m)) return nullptr;
  *bias = b;
  return add;
}

Value* body_copy(Graph& body, const Node& from, OpKind op, std::vector<Value*> ins) {
  Node* c = body.add_node(op, std::move(ins), 1);
  c->name = from.name;
  c->attrs = from.attrs;
  c->index = from.index;
  c->outputs[0]->type = from.outputs[0]->type;
  return c->outputs[0];
}

}  // namespace

Expected<bool> fuse_qdq_matmul(Graph& g) {
  UseMap uses(g);
  bool changed = false;
  std::vector<Node*> maybe_dead;
  for (const auto& np : g.nodes) {
    Node& mm = *np;
    if (mm.op != OpKind::kMatMul || mm.inputs.size() != 2 || !mm.has_output(0)) continue;
    Value* m = mm.outputs[0];
    if (!is_dtype(m, DType::kFloat32) || !mm.inputs[0] || !mm.inputs[0]->type.has_rank() ||
        mm.inputs[0]->type.shape->dims.size() < 2) {
      continue;
    }
    std::optional<ActQdq> act = match_activation(g, mm.inputs[0]);
    if (!act) continue;
    Node* wdq = match_weight(g, mm.inputs[1], act->q->outputs[0]->type.dtype);
    if (!wdq) continue;
    Value* x = act->q->inputs[0];
    Value* wq = wdq->inputs[0];
    Value* sw = wdq->inputs[1];
    Value* bias = nullptr;
    Node* add = match_bias(g, uses, m, constant_of(g, wq)->dim(1), &bias);
    // The matched nodes' attributes move into the body; a graph-valued one would keep pointing at
    // the node it came from.
    if (has_subgraph(*act->q) || has_subgraph(*act->dq) || has_subgraph(*wdq) || has_subgraph(mm) ||
        (add && has_subgraph(*add))) {
      continue;
    }

    auto body = std::make_shared<Graph>();
    body->name = g.unique_name(mm.name.empty() ? "qmatmul" : mm.name) + "_body";
    body->parent = &g;
    body->parent_node = &mm;
    Value* xi = body->add_input(body->unique_name(x->name + "_in"), x->type);
    Value* wi = body->add_input(body->unique_name(wq->name + "_in"), wq->type);
    Value* si = body->add_input(body->unique_name(sw->name + "_in"), sw->type);
    Value* bi = bias ? body->add_input(body->unique_name(bias->name + "_in"), bias->type) : nullptr;
    const Value* sx = act->dq->inputs[1];
    Value* sxc = body->add_constant(body->unique_name(sx->name), *constant_of(g, sx));
    Value* zxc = nullptr;
    if (const Value* zx = input_or_null(*act->dq, 2)) zxc = body->add_constant(body->unique_name(zx->name), *constant_of(g, zx));
    // The weight's zero point is all zeros (checked): the body's DequantizeLinear omits it, which
    // means the same, and keeps the body free of per-channel constants.
    Value* q = body_copy(*body, *act->q, OpKind::kQuantizeLinear, {xi, sxc, zxc});
    Value* xd = body_copy(*body, *act->dq, OpKind::kDequantizeLinear, {q, sxc, zxc});
    Value* wd = body_copy(*body, *wdq, OpKind::kDequantizeLinear, {wi, si});
    Value* out = body_copy(*body, mm, OpKind::kMatMul, {xd, wd});
    if (add) out = body_copy(*body, *add, OpKind::kAdd, {out, bi});
    body->outputs.push_back(out);

    for (size_t i = 0; i < mm.inputs.size(); ++i) uses.set_input(&mm, i, nullptr);
    mm.inputs.clear();
    for (Value* v : {x, wq, sw, bias}) {
      if (!v) continue;
      mm.inputs.push_back(nullptr);
      uses.set_input(&mm, mm.inputs.size() - 1, v);
    }
    mm.op = OpKind::kQuantizedMatMul;
    mm.attrs.clear();
    mm.attrs["body"] = Attribute::of_graph(body);
    if (add) {
      uses.forward(add->outputs[0], m);
      g.note_absorbed(*add, mm);
      maybe_dead.push_back(add);
    }
    for (Node* n : {act->dq, act->q, wdq}) {
      if (std::find(maybe_dead.begin(), maybe_dead.end(), n) == maybe_dead.end()) maybe_dead.push_back(n);
    }
    changed = true;
  }
  if (changed) erase_unused(uses, maybe_dead);
  return changed;
}

}  // namespace kiln
