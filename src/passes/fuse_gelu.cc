// fuse-gelu: the decomposed GELU that exporters write (torch.onnx's nn.GELU before opset 20, GPT-2's
// NewGELUActivation, hand-written x * 0.5 * (1 + erf(x / sqrt 2))) becomes one Gelu node: one pass
// over the tensor instead of five to nine, and backends see the activation as one op (the CUDA
// GEMM's GELU epilogue, one CPU loop).
//
//   Before:  %d = Div(%x, %sqrt2) : f32[N,8]               (%sqrt2 = const dense<f32[]> [1.4142135])
//            %e = Erf(%d) : f32[N,8]
//            %a = Add(%e, %one) : f32[N,8]
//            %m = Mul(%x, %a) : f32[N,8]
//            %y = Mul(%m, %half) : f32[N,8] @act
//   After:   %y = Gelu(%x) : f32[N,8] @act
//
//   tanh form:  %y = Mul(Mul(%x, 0.5), Add(Tanh(Mul(Add(%x, Mul(Pow(%x, 3), 0.044715)), 0.7978846)), 1))
//           ->  %y = Gelu(%x) {approximate = "tanh"}
//
// The root is a Mul of the three factors x, 0.5 and a = Add(Erf|Tanh(...), 1), in any grouping
// (0.5 applied first or last, or to a) and either operand order of every Mul and Add. The erf
// argument is Div(x, sqrt 2) or Mul(x, 1/sqrt 2); the cube is Pow(x, 3) or x * x * x. The root
// node becomes the Gelu, so it keeps its name, position and output value (readers and graph
// outputs see no change); the absorbed nodes and their constants go.
//
// Preconditions, all checked: constants hold one element, within 1e-3 (bf16: 4e-3) of the value
// they stand for (scalar_near); every intermediate value has exactly one reader and is not a
// graph output; x is a float tensor (f16, bf16, f32, f64) of known rank and the root's output has
// x's type (a constant that broadcasts to a larger shape does not match). Constants must already be
// constants: run after fold-constants.
//
// Backend note: the CUDA lowering takes a Gelu node after a GEMM (+bias), also through a
// Reshape (GPT-2's Gemm rows), as cuBLASLt's GELU epilogue (lower_gemm.cc fuse_activation).
#include <cmath>

#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

struct Match {
  Value* x = nullptr;
  bool tanh = false;
  std::vector<Node*> absorbed;  // every pattern node but the root
};

// x * x * x, as Pow(x, 3) or Mul(Mul(x, x), x) in either operand order.
bool match_cube(const UseMap& u, const Value* v, const Value* x, Match& m) {
  const Graph& g = u.graph();
  if (Node* pw = sole_producer(u, v, OpKind::kPow)) {
    if (pw->inputs.size() != 2 || pw->inputs[0] != x || !scalar_near(g, pw->inputs[1], 3.0)) return false;
    m.absorbed.push_back(pw);
    return true;
  }
  Node* outer = sole_producer(u, v, OpKind::kMul);
  Value* sq = other_operand(outer, [&](const Value* o) { return o == x; });
  Node* inner = sole_producer(u, sq, OpKind::kMul);
  if (!inner || inner->inputs[0] != x || inner->inputs[1] != x) return false;
  m.absorbed.insert(m.absorbed.end(), {inner, outer});
  return true;
}

// erf(x / sqrt 2): Div(x, 1.4142) or Mul(x, 0.7071).
bool match_erf_arg(const UseMap& u, const Value* v, const Value* x, Match& m) {
  const Graph& g = u.graph();
  if (Node* div = sole_producer(u, v, OpKind::kDiv)) {
    if (div->inputs.size() != 2 || div->inputs[0] != x || !scalar_near(g, div->inputs[1], std::sqrt(2.0))) return false;
    m.absorbed.push_back(div);
    return true;
  }
  Node* mul = sole_producer(u, v, OpKind::kMul);
  if (other_operand(mul, [&](const Value* c) { return scalar_near(g, c, std::sqrt(0.5)); }) != x) return false;
  m.absorbed.push_back(mul);
  return true;
}

// tanh(sqrt(2/pi) * (x + 0.044715 * x^3)).
bool match_tanh_arg(const UseMap& u, const Value* v, const Value* x, Match& m) {
  const Graph& g = u.graph();
  Node* scale = sole_producer(u, v, OpKind::kMul);
  Value* sum = other_operand(scale, [&](const Value* c) { return scalar_near(g, c, std::sqrt(2.0 / M_PI)); });
  Node* add = sole_producer(u, sum, OpKind::kAdd);
  Value* cubic = other_operand(add, [&](const Value* o) { return o == x; });
  Node* coef = sole_producer(u, cubic, OpKind::kMul);
  Value* cube = other_operand(coef, [&](const Value* c) { return scalar_near(g, c, 0.044715); });
  if (!cube || !match_cube(u, cube, x, m)) return false;
  m.absorbed.insert(m.absorbed.end(), {coef, add, scale});
  return true;
}

// a = Add(Erf(x / sqrt 2), 1) or Add(Tanh(...), 1), either operand order.
bool match_one_plus(const UseMap& u, const Value* a, Value* x, Match& m) {
  Node* add = sole_producer(u, a, OpKind::kAdd);
  Value* t = other_operand(add, [&](const Value* c) { return scalar_near(u.graph(), c, 1.0); });
  if (!t) return false;
  const size_t mark = m.absorbed.size();
  if (Node* erf = sole_producer(u, t, OpKind::kErf); erf && match_erf_arg(u, erf->inputs[0], x, m)) {
    m.absorbed.insert(m.absorbed.end(), {erf, add});
    m.tanh = false;
  } else if (Node* th = sole_producer(u, t, OpKind::kTanh); th && match_tanh_arg(u, th->inputs[0], x, m)) {
    m.absorbed.insert(m.absorbed.end(), {th, add});
    m.tanh = true;
  } else {
    m.absorbed.resize(mark);
    return false;
  }
  m.x = x;
  return true;
}

// root = Mul of x, 0.5 and a, grouped by one inner Mul on either side.
std::optional<Match> match_gelu(const UseMap& u, const Node& root) {
  if (root.inputs.size() != 2 || !root.has_output(0)) return std::nullopt;
  for (size_t side = 0; side < 2; ++side) {
    Node* inner = sole_producer(u, root.inputs[side], OpKind::kMul);
    if (!inner || inner->inputs.size() != 2) continue;
    Value* f[3] = {root.inputs[1 - side], inner->inputs[0], inner->inputs[1]};
    for (size_t h = 0; h < 3; ++h) {
      if (!scalar_near(u.graph(), f[h], 0.5)) continue;
      Value* p = f[(h + 1) % 3];
      Value* q = f[(h + 2) % 3];
      for (int swap = 0; swap < 2; ++swap, std::swap(p, q)) {
        Match m;
        m.absorbed.push_back(inner);
        if (match_one_plus(u, p, q, m)) return m;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

Expected<bool> fuse_gelu(Graph& g) {
  UseMap uses(g);
  std::vector<Node*> dead;
  std::vector<Value*> rewired;  // the roots' former inputs: the 0.5 may be unread now
  for (const auto& np : g.nodes) {
    Node& root = *np;
    if (root.op != OpKind::kMul) continue;
    std::optional<Match> m = match_gelu(uses, root);
    if (!m) continue;
    const Type& xt = m->x->type;
    if (!xt.has_rank() || !is_float(xt.dtype) || !(root.outputs[0]->type == xt)) continue;
    rewired.insert(rewired.end(), root.inputs.begin(), root.inputs.end());
    uses.set_input(&root, 1, nullptr);
    root.inputs.pop_back();
    uses.set_input(&root, 0, m->x);
    root.op = OpKind::kGelu;
    root.attrs.clear();
    if (m->tanh) root.attrs["approximate"] = Attribute::of_string("tanh");
    for (Node* n : m->absorbed) g.note_absorbed(*n, root);
    dead.insert(dead.end(), m->absorbed.begin(), m->absorbed.end());
  }
  if (dead.empty()) return false;
  erase_unused_constants(uses, rewired);  // first: erase_unused frees some of these values
  erase_unused(uses, dead);
  return true;
}

}  // namespace kiln
