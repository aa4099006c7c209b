// propagate-layout: models exported from NHWC frameworks (TensorFlow/Keras through tf2onnx, or
// PyTorch channels-last code that permutes by hand) wrap every NCHW-only ONNX op in layout
// Transposes: NHWC -> NCHW before each Conv, NCHW -> NHWC after it, with the activations and
// residual adds in between done in NHWC. Each pair is two full copies of the tensor. This pass
// moves a Transpose down through the elementwise ops that follow it until it meets a Transpose
// it cancels with (or composes into one), or merges Transposes of the same perm that meet at a
// binary op or a Concat (TF's channel concats), so the layout flips disappear and the ops between
// run in the convs' layout. (The GPU lowering then picks NHWC for the convolutions itself,
// without Transposes in the graph.)
//
//   Before:  %a = Transpose(%c1) {perm = [0, 2, 3, 1]} : f32[1,8,8,16]     (%c1 = Conv(...) NCHW)
//            %r = Relu(%a) : f32[1,8,8,16]
//            %b = Add(%r, %bias) : f32[1,8,8,16]                         (%bias const f32[16])
//            %y = Transpose(%b) {perm = [0, 3, 1, 2]} : f32[1,16,8,8]    (-> the next Conv)
//   After:   %r = Relu(%c1) : f32[1,16,8,8]
//            %b = Add(%r, %bias_nchw) : f32[1,16,8,8]                    (%bias_nchw const f32[16,1,1])
//            (the next Conv reads %b)
//
//   Merge:   Add(Transpose(%x, p), Transpose(%z, p)) -> Transpose(Add(%x, %z), p)
//            Concat(Transpose(%x, p), Transpose(%z, p), axis a) -> Transpose(Concat(%x, %z, axis p[a]), p)
//
// Pushed through: unary elementwise ops (Relu, Sigmoid, Tanh, LeakyRelu, Elu, Selu, HardSigmoid,
// HardSwish, Softplus, Abs, Neg, Exp, Log, Sqrt, Reciprocal, Erf, Gelu, Identity; Clip with scalar
// bounds; Cast when it does not widen the element) and binary arithmetic (Add, Sub, Mul, Div, Pow,
// Max, Min, PRelu) whose other operand is a constant, which is permuted to match (a one-element
// constant stays as it is). The ops keep their names; their outputs take the untransposed dims.
//
// The guard: a Transpose moves only when the chain it would move through ends in another
// Transpose or in a merge, so the number of Transposes never grows and no Transpose moves away
// from where a library kernel absorbs it (a MatMul's transposed operand, the attention kernel's
// views) unless it disappears.
//
// Preconditions, all checked: every value on the chain has exactly one reader, is not a graph
// output and has static dims equal to the pushed Transpose's output dims; binary ops do not
// broadcast the transposed operand; the final Transposes are read by one node each. Before
// canonicalize in the pipeline is not needed: the pass composes the perms itself.
#include <algorithm>

#include "ops/shape_util.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

bool is_unary_elementwise(OpKind op) {
  switch (op) {
    case OpKind::kRelu: case OpKind::kSigmoid: case OpKind::kTanh: case OpKind::kLeakyRelu: case OpKind::kElu:
    case OpKind::kSelu: case OpKind::kHardSigmoid: case OpKind::kHardSwish: case OpKind::kSoftplus: case OpKind::kAbs:
    case OpKind::kNeg: case OpKind::kExp: case OpKind::kLog: case OpKind::kSqrt: case OpKind::kReciprocal:
    case OpKind::kErf: case OpKind::kGelu: case OpKind::kIdentity: case OpKind::kClip: case OpKind::kCast:
      return true;
    default: return false;
  }
}

bool is_binary_arith(OpKind op) {
  switch (op) {
    case OpKind::kAdd: case OpKind::kSub: case OpKind::kMul: case OpKind::kDiv: case OpKind::kPow:
    case OpKind::kMax: case OpKind::kMin: case OpKind::kPRelu:
      return true;
    default: return false;
  }
}

std::vector<int64_t> perm_of(const Node& t) { return t.attr_ints("perm"); }

bool is_identity(const std::vector<int64_t>& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != int64_t(i)) return false;
  }
  return true;
}

// A Transpose with an explicit perm that is a permutation of its static input rank.
bool valid_transpose(const Node* t) {
  if (!t || t->op != OpKind::kTranspose || t->inputs.size() != 1 || !t->has_output(0)) return false;
  std::vector<int64_t> p = perm_of(*t);
  auto d = static_dims(t->inputs[0]);
  if (!d || p.size() != d->size()) return false;
  std::vector<int64_t> s = p;
  std::sort(s.begin(), s.end());
  return is_identity(s);
}

// How node n reads the transposed value t (dims `td`): as an elementwise op whose output has td
// and whose other inputs are constants (or absent). Returns false for anything else.
bool pushable(const UseMap& u, const Node& n, const Value* t, const std::vector<int64_t>& td) {
  if (n.owner != &u.graph() || n.outputs.size() != 1 || !n.has_output(0)) return false;
  auto od = static_dims(n.outputs[0]);
  if (!od || *od != td || n.inputs.empty() || n.inputs[0] == nullptr) return false;
  const Graph& g = u.graph();
  if (is_unary_elementwise(n.op)) {
    if (n.inputs[0] != t) return false;
    if (n.op == OpKind::kCast && dtype_size(n.outputs[0]->type.dtype) > dtype_size(t->type.dtype)) return false;
    for (size_t i = 1; i < n.inputs.size(); ++i) {  // Clip's bounds: absent or one-element constants
      if (!n.inputs[i]) continue;
      const Tensor* c = constant_of(g, n.inputs[i]);
      if (!c || c->numel() != 1) return false;
    }
    return true;
  }
  if (!is_binary_arith(n.op) || n.inputs.size() != 2 || !n.inputs[1]) return false;
  const size_t other = n.inputs[0] == t ? 1 : 0;
  if (n.inputs[1 - other] != t || n.inputs[other] == t) return false;
  const Tensor* c = constant_of(g, n.inputs[other]);
  if (!c || int64_t(c->rank()) > int64_t(td.size())) return false;
  if (n.op == OpKind::kPRelu && other != 1) return false;
  return true;
}

// A constant operand for the untransposed layout: padded to rank r with leading 1s, then
// permuted by the inverse of p (a one-element constant stays as it is).
Expected<Value*> permuted_constant(Graph& g, Value* c, const std::vector<int64_t>& p) {
  const Tensor& t = *constant_of(g, c);
  if (t.numel() == 1) return c;
  std::vector<int64_t> dims(p.size() - size_t(t.rank()), 1);
  for (int64_t d : t.dims()) dims.push_back(d);
  std::vector<int64_t> inv(p.size());
  for (size_t i = 0; i < p.size(); ++i) inv[size_t(p[i])] = int64_t(i);
  KILN_ASSIGN_OR_RETURN(Tensor moved, transpose_tensor(t.reshaped(dims), inv));
  return g.add_constant(g.unique_name(c->name + "_untransposed"), std::move(moved));
}

// One Transpose pushed down its chain, if the chain ends in a cancelling/composing Transpose or a
// merge. Returns whether it changed the graph.
Expected<bool> push(Graph& g, UseMap& u, Node& t0, std::vector<Node*>& dead, std::vector<Value*>& replaced) {
  if (!valid_transpose(&t0)) return false;
  const std::vector<int64_t> p = perm_of(t0);
  Value* x = t0.inputs[0];
  const std::vector<int64_t> xd = *static_dims(x);
  auto td = static_dims(t0.outputs[0]);
  if (!td) return false;
  // Walk the single-reader chain of pushable ops.
  std::vector<Node*> chain;
  const Value* cur = t0.outputs[0];
  Node* end = nullptr;
  while (true) {
    if (u.num_uses(cur) != 1 || u.is_output(cur)) return false;
    Node* r = u.uses(cur)[0].node;
    if (!r) return false;
    if (valid_transpose(r) && r->owner == &g) {
      end = r;
      break;
    }
    // A merge: a binary op whose other operand is a Transpose of the same perm, read only here.
    if (is_binary_arith(r->op) && r->inputs.size() == 2 && r->owner == &g && r->has_output(0)) {
      const size_t other = r->inputs[0] == cur ? 1 : 0;
      Node* t1 = r->inputs[other] ? r->inputs[other]->producer : nullptr;
      auto od = static_dims(r->outputs[0]);
      if (t1 != &t0 && valid_transpose(t1) && perm_of(*t1) == p && u.num_uses(r->inputs[other]) == 1 &&
          !u.is_output(r->inputs[other]) && od && *od == *td && static_dims(t1->inputs[0]) == xd &&
          r->inputs[1 - other] == cur) {
        end = r;
        break;
      }
    }
    // A merge at a Concat: every other input a Transpose of the same perm, each read only here.
    if (r->op == OpKind::kConcat && r->owner == &g && r->has_output(0) && static_dims(r->outputs[0])) {
      bool all = true;
      for (const Value* in : r->inputs) {
        const Node* ti = in ? in->producer : nullptr;
        all = all && in && (in == cur || (ti != &t0 && valid_transpose(ti) && perm_of(*ti) == p && u.num_uses(in) == 1 &&
                                          !u.is_output(in) && ti->owner == &g));
      }
      if (all) {
        end = r;
        break;
      }
    }
    if (!pushable(u, *r, cur, *td)) return false;
    chain.push_back(r);
    cur = r->outputs[0];
  }
  // Rewire the chain in place onto x, untransposed: each node keeps its name and output value,
  // whose dims become x's; constant operands are permuted to match.
  auto untranspose = [&](Value* out) { out->type.shape = Shape(std::vector<Dim>(xd.begin(), xd.end())); };
  const Value* t = t0.outputs[0];
  Value* v = x;
  for (Node* n : chain) {
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      if (n->inputs[i] == t) {
        u.set_input(n, i, v);
      } else if (n->inputs[i] && is_binary_arith(n->op)) {
        Value* old = n->inputs[i];
        KILN_ASSIGN_OR_RETURN(Value* c, permuted_constant(g, old, p));
        u.set_input(n, i, c);
        if (c != old) replaced.push_back(old);
      }
    }
    untranspose(n->outputs[0]);
    t = n->outputs[0];
    v = n->outputs[0];
  }
  if (end->op == OpKind::kTranspose) {  // Transpose(Transpose(v, p), q) = Transpose(v, p[q])
    std::vector<int64_t> q = perm_of(*end), r(q.size());
    for (size_t i = 0; i < q.size(); ++i) r[i] = p[size_t(q[i])];
    u.set_input(end, 0, v);
    end->attrs["perm"] = Attribute::of_ints(r);
    if (is_identity(r) && u.can_forward(end->outputs[0], v)) {
      u.forward(end->outputs[0], v);
      dead.push_back(end);
    }
  } else {  // merge: the op on the untransposed operands, in their order, then one Transpose
    std::vector<int64_t> out = *static_dims(end->outputs[0]), untransposed(out.size());
    for (size_t i = 0; i < out.size(); ++i) untransposed[size_t(p[i])] = out[i];
    for (size_t i = 0; i < end->inputs.size(); ++i) {
      if (end->inputs[i] == t) {
        u.set_input(end, i, v);
      } else {
        Node* ti = end->inputs[i]->producer;
        u.set_input(end, i, ti->inputs[0]);
        dead.push_back(ti);
      }
    }
    if (end->op == OpKind::kConcat) {  // the axis of the untransposed operands
      int64_t axis = end->attr_int("axis", 0);
      if (axis < 0) axis += int64_t(p.size());
      end->attrs["axis"] = Attribute::of_int(p[size_t(axis)]);
    }
    Node* nt = g.add_node(OpKind::kTranspose, {nullptr}, 1, g.unique_name(end->outputs[0]->name + "_transpose"));
    nt->attrs["perm"] = Attribute::of_ints(p);
    nt->outputs[0]->type = end->outputs[0]->type;
    u.add_node(nt);
    u.forward(end->outputs[0], nt->outputs[0]);  // a fresh value of the same type: always allowed
    end->outputs[0]->type.shape = Shape(std::vector<Dim>(untransposed.begin(), untransposed.end()));
    u.set_input(nt, 0, end->outputs[0]);
  }
  dead.push_back(&t0);
  return true;
}

}  // namespace

Expected<bool> propagate_layout(Graph& g) {
  bool changed = false;
  // Each round moves every movable Transpose once; a moved one can move again (a merge's result).
  for (int round = 0; round < 16; ++round) {
    UseMap uses(g);
    std::vector<Node*> dead, transposes;
    std::vector<Value*> replaced;  // constants the chains stopped reading
    for (const auto& np : g.nodes) {
      if (np->op == OpKind::kTranspose) transposes.push_back(np.get());
    }
    bool any = false;
    for (Node* t : transposes) {
      if (std::find(dead.begin(), dead.end(), t) != dead.end()) continue;
      KILN_ASSIGN_OR_RETURN(bool moved, push(g, uses, *t, dead, replaced));
      any = any || moved;
    }
    // Constants first: one a chain stopped reading may also feed a dead node, and erase_unused
    // frees it with that node.
    erase_unused_constants(uses, replaced);
    erase_unused(uses, dead);
    if (!any) break;
    changed = true;
    KILN_RETURN_IF_ERROR(g.topo_sort());
  }
  return changed;
}

}  // namespace kiln
