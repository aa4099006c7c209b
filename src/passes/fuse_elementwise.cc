// fuse-elementwise: a connected group of elementwise nodes (arithmetic, comparisons, Where, Cast,
// activations) whose intermediate values nobody else reads becomes one FusedElementwise node
// (ops/fused.cc): one pass over memory instead of one per node, and one launch. The CUDA backend
// generates a kernel for each such body (NVRTC, cached on disk); the CPU runs the body as before.
//
//   Before:  %m = Cast(%mask) {to = 1} : f32[N,1,1,128]
//            %s = Sub(%one, %m) : f32[N,1,1,128]                     (%one = const 1.0)
//            %b = Mul(%s, %big) : f32[N,1,1,128]                     (%big = const -3.4e38)
//   After:   %b = FusedElementwise(%mask) {body = graph b_body(%mask_in: i64[N,1,1,128]) {
//              %one = const dense<f32[]> [1]
//              %big = const dense<f32[]> [-3.4e38]
//              %m = Cast(%mask_in) {to = 1} : f32[N,1,1,128]
//              %s = Sub(%one, %m) : f32[N,1,1,128]
//              %b = Mul(%s, %big) : f32[N,1,1,128]
//              return %b
//            }} : f32[N,1,1,128]
//
// Grouping: walking the graph backwards, a group starts at an unassigned candidate (its root, the
// one value the group hands out) and takes in the producers of its inputs while they are
// candidates whose every reader is already in the group and whose output is no graph output. A
// group needs two or more nodes. Scalar constants move into the body (the generated kernel bakes
// them in); other inputs, larger constants included, become the node's inputs in first-use order.
// Broadcasting composes, so every member is evaluated at the root's index.
//
// The guard: a node on a "compute path" - fed, through elementwise or view ops other than
// QuantizeLinear, by MatMul, Gemm, Conv, ConvTranspose, Attention or QuantizedMatMul (whose 16-bit
// form is a GEMM) - is never fused.
// Those chains are what the GPU lowering folds into the library call itself (bias, activation and
// residual epilogues of cuBLASLt and cuDNN, the scale and mask of fused attention), which beats any
// separate kernel; fusing them here would hide them from it. Candidates are also limited to the
// dtypes and ops the generated kernels implement
// (f32/f16/bf16 math, i32/i64/bool for comparisons, logic, Where and Cast; QuantizeLinear and
// DequantizeLinear to and from int8/uint8 with one constant scale), so a fused node never
// falls back to the CPU where its members would not have. Run after the pattern fusions (GELU,
// LayerNorm, Softmax, MatMul+Add), which need the decomposed forms, and before dce.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "ops/quantize_util.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

constexpr size_t kMaxGroupNodes = 64;   // a generated kernel's body stays small
constexpr size_t kMaxGroupInputs = 16;  // kernel parameters

bool is_kernel_float(DType t) { return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16; }
bool is_int(DType t) { return t == DType::kInt32 || t == DType::kInt64; }
bool fusible_dtype(DType t) { return is_kernel_float(t) || is_int(t) || t == DType::kBool; }

bool is_compute_op(OpKind op) {
  return op == OpKind::kMatMul || op == OpKind::kGemm || op == OpKind::kConv || op == OpKind::kConvTranspose ||
         op == OpKind::kAttention || op == OpKind::kQuantizedMatMul;
}

bool is_view_op(OpKind op) {
  return op == OpKind::kReshape || op == OpKind::kTranspose || op == OpKind::kSqueeze || op == OpKind::kUnsqueeze ||
         op == OpKind::kFlatten || op == OpKind::kIdentity || op == OpKind::kExpand;
}

// Which input dtypes an elementwise op accepts in a fused body (its output dtype is checked too).
enum class Accepts { kNone, kFloat, kNumeric, kAny, kBool, kQuant };

Accepts accepts(const Node& n) {
  switch (n.op) {
    case OpKind::kSigmoid: case OpKind::kTanh: case OpKind::kExp: case OpKind::kLog: case OpKind::kSqrt:
    case OpKind::kReciprocal: case OpKind::kErf: case OpKind::kFloor: case OpKind::kCeil: case OpKind::kSin:
    case OpKind::kCos: case OpKind::kSoftplus: case OpKind::kGelu: case OpKind::kLeakyRelu: case OpKind::kElu:
    case OpKind::kHardSigmoid: case OpKind::kHardSwish: case OpKind::kDiv: case OpKind::kPow:
    case OpKind::kClip:
      return Accepts::kFloat;
    case OpKind::kRelu: case OpKind::kNeg: case OpKind::kAbs: case OpKind::kSign: case OpKind::kAdd:
    case OpKind::kSub: case OpKind::kMul: case OpKind::kLess: case OpKind::kLessOrEqual: case OpKind::kGreater:
    case OpKind::kGreaterOrEqual:
      return Accepts::kNumeric;
    case OpKind::kMax: case OpKind::kMin:
      return n.inputs.size() == 2 ? Accepts::kNumeric : Accepts::kNone;
    case OpKind::kEqual: case OpKind::kCast: case OpKind::kWhere:
      return Accepts::kAny;
    case OpKind::kNot: case OpKind::kAnd: case OpKind::kOr: case OpKind::kXor:
      return Accepts::kBool;
    case OpKind::kQuantizeLinear: case OpKind::kDequantizeLinear:
      return Accepts::kQuant;  // checked whole by is_scalar_int8_qdq
    default:
      return Accepts::kNone;
  }
}

bool dtype_ok(Accepts a, DType t) {
  switch (a) {
    case Accepts::kNone: return false;
    case Accepts::kFloat: return is_kernel_float(t);
    case Accepts::kNumeric: return is_kernel_float(t) || is_int(t);
    case Accepts::kAny: return fusible_dtype(t);
    case Accepts::kBool: return t == DType::kBool;
    case Accepts::kQuant: return false;
  }
  return false;
}

bool ranked(const Value* v) { return v && v->type.has_rank() && fusible_dtype(v->type.dtype); }

// An elementwise node the generated kernels implement, with every input present (Clip's bounds
// may be omitted) and of a dtype they take.
bool candidate_op(const Graph& g, const Node& n) {
  const Accepts a = accepts(n);
  if (a == Accepts::kQuant) {
    return !has_subgraph(n) && is_scalar_int8_qdq(n, [&g](const Value* v) { return constant_of(g, v); });
  }
  if (a == Accepts::kNone || n.outputs.size() != 1 || !ranked(n.outputs[0]) || has_subgraph(n)) return false;
  if (n.op == OpKind::kGelu) {
    const std::string approx = n.attr_string("approximate", "none");
    if (approx != "none" && approx != "tanh") return false;
  }
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Value* v = n.inputs[i];
    if (!v) {
      if (n.op == OpKind::kClip) continue;
      return false;
    }
    if (!ranked(v)) return false;
    // Where's condition is bool; Clip's bounds share x's dtype (checked by inference).
    const DType t = v->type.dtype;
    if (n.op == OpKind::kWhere && i == 0 ? t != DType::kBool : !dtype_ok(a, t)) return false;
  }
  return true;
}

struct Group {
  Node* root = nullptr;
  std::vector<Node*> members;  // root included, any order while collecting
};

}  // namespace

Expected<bool> fuse_elementwise(Graph& g) {
  UseMap uses(g);
  // Values on a compute path (see the header): the guard.
  std::unordered_set<const Value*> compute;
  std::unordered_set<const Node*> candidates;
  for (const auto& np : g.nodes) {
    const Node& n = *np;
    bool fed = is_compute_op(n.op);
    const bool elementwise = accepts(n) != Accepts::kNone;
    // A QuantizeLinear ends the path: no epilogue takes a quantization, so a QDQ model's Q/DQ pair
    // after a product's chain fuses on its own (one pass instead of two), the chain left as it is.
    if (!fed && n.op != OpKind::kQuantizeLinear && (elementwise || is_view_op(n.op))) {
      fed = std::any_of(n.inputs.begin(), n.inputs.end(), [&](const Value* v) { return v && compute.count(v); });
    }
    if (fed) {
      for (const Value* o : n.outputs) compute.insert(o);
    } else if (elementwise && candidate_op(g, n)) {
      candidates.insert(&n);
    }
  }

  std::unordered_map<const Node*, int> group_of;
  std::vector<Group> groups;
  for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) {
    Node* root = it->get();
    if (!candidates.count(root) || group_of.count(root)) continue;
    const int id = int(groups.size());
    Group grp{root, {root}};
    group_of[root] = id;
    // Members are taken in while every reader of theirs is in the group; a value read twice by
    // the group (a diamond) is reconsidered when its second reader joins.
    for (size_t w = 0; w < grp.members.size(); ++w) {
      for (Value* v : grp.members[w]->inputs) {
        Node* p = v ? v->producer : nullptr;
        if (!p || p->owner != &g || !candidates.count(p) || group_of.count(p) || uses.is_output(v)) continue;
        if (grp.members.size() >= kMaxGroupNodes) break;
        const auto& vu = uses.uses(v);
        const bool inside = std::all_of(vu.begin(), vu.end(), [&](const Use& u) {
          auto gi = u.node && !u.body ? group_of.find(u.node) : group_of.end();
          return gi != group_of.end() && gi->second == id;
        });
        if (!inside) continue;
        group_of[p] = id;
        grp.members.push_back(p);
      }
    }
    if (grp.members.size() < 2) {
      group_of[root] = -1;  // stays a node of its own; never absorbed by a later group either
      continue;
    }
    groups.push_back(std::move(grp));
  }
  if (groups.empty()) return false;

  // Node order, to build each body in topological order.
  std::unordered_map<const Node*, size_t> order;
  for (size_t i = 0; i < g.nodes.size(); ++i) order[g.nodes[i].get()] = i;

  bool changed = false;
  for (Group& grp : groups) {
    std::sort(grp.members.begin(), grp.members.end(), [&](Node* a, Node* b) { return order[a] < order[b]; });
    std::unordered_set<const Node*> in_group(grp.members.begin(), grp.members.end());
    // The group's inputs in first-use order; scalar constants stay inside.
    std::vector<Value*> ext;
    std::vector<Value*> scalars;
    for (Node* m : grp.members) {
      for (Value* v : m->inputs) {
        if (!v || (v->producer && in_group.count(v->producer))) continue;
        const Tensor* c = constant_of(g, v);
        auto& list = c && c->numel() == 1 ? scalars : ext;
        if (std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
      }
    }
    if (ext.empty() || ext.size() > kMaxGroupInputs) continue;  // all-constant: fold-constants' work

    Node* root = grp.root;
    auto body = std::make_shared<Graph>();
    body->name = g.unique_name(root->name.empty() ? "fused" : root->name) + "_body";
    body->parent = &g;
    body->parent_node = root;
    std::unordered_map<const Value*, Value*> map;
    for (Value* v : ext) map[v] = body->add_input(body->unique_name(v->name + "_in"), v->type);
    std::vector<std::pair<Value*, std::string>> names;  // body values to take the outer names once free
    for (Value* v : scalars) {
      map[v] = body->add_constant(body->unique_name(v->name), *constant_of(g, v));
      names.emplace_back(map[v], v->name);
    }
    for (Node* m : grp.members) {
      std::vector<Value*> ins;
      for (Value* v : m->inputs) ins.push_back(v ? map.at(v) : nullptr);
      Node* c = body->add_node(m->op, std::move(ins), 1);
      c->name = m->name;  // an unnamed node stays unnamed
      c->attrs = m->attrs;
      c->index = m->index;
      c->outputs[0]->type = m->outputs[0]->type;
      map[m->outputs[0]] = c->outputs[0];
      if (m != root) names.emplace_back(c->outputs[0], m->outputs[0]->name);
    }
    body->outputs.push_back(map.at(root->outputs[0]));

    // The root becomes the fused node, keeping its name, position and output value.
    for (size_t i = 0; i < root->inputs.size(); ++i) uses.set_input(root, i, nullptr);
    root->inputs.clear();
    for (Value* v : ext) {
      root->inputs.push_back(nullptr);
      uses.set_input(root, root->inputs.size() - 1, v);
    }
    root->op = OpKind::kFusedElementwise;
    root->attrs.clear();
    root->attrs["body"] = Attribute::of_graph(body);
    std::vector<Node*> dead;
    for (Node* m : grp.members) {
      if (m == root) continue;
      g.note_absorbed(*m, *root);
      dead.push_back(m);
    }
    // The root's former scalar inputs first: erase_unused frees the constants only dead members
    // read, so they must not be looked at after it (the run fuzzer found that use-after-free).
    erase_unused_constants(uses, scalars);
    erase_unused(uses, dead);
    // The members' outputs (and constants only they read) are gone from the graph: the body's
    // copies take their names.
    for (auto& [v, name] : names) {
      if (!body->lookup(name)) body->rename_value(v, name);
    }
    changed = true;
  }
  return changed;
}

}  // namespace kiln
