#include "passes/rewrite.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

namespace kiln {

namespace {

const std::vector<Use> kNoUses;

void erase_use(std::vector<Use>& list, const Node* n, size_t i) {
  std::erase_if(list, [&](const Use& u) { return !u.body && u.node == n && u.input == i; });
}

// Every subgraph held by n's attributes.
std::vector<Graph*> bodies_of(const Node& n) {
  std::vector<Graph*> b;
  for (const auto& [k, a] : n.attrs) {
    if (a.g) b.push_back(a.g.get());
    for (const auto& sg : a.graphs) b.push_back(sg.get());
  }
  return b;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool same_attr(const Attribute& a, const Attribute& b) {
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Attribute::Kind::kFloat: return std::memcmp(&a.f, &b.f, sizeof(float)) == 0;
    case Attribute::Kind::kInt: return a.i == b.i;
    case Attribute::Kind::kString: return a.s == b.s;
    case Attribute::Kind::kTensor: return same_tensor(a.t, b.t);
    case Attribute::Kind::kFloats: return same_floats(a.floats, b.floats);
    case Attribute::Kind::kInts: return a.ints == b.ints;
    case Attribute::Kind::kStrings: return a.strings == b.strings;
    case Attribute::Kind::kTensors:
      if (a.tensors.size() != b.tensors.size()) return false;
      for (size_t i = 0; i < a.tensors.size(); ++i) {
        if (!same_tensor(a.tensors[i], b.tensors[i])) return false;
      }
      return true;
    case Attribute::Kind::kType:
    case Attribute::Kind::kTypes: return a.types == b.types;
    case Attribute::Kind::kGraph:
    case Attribute::Kind::kGraphs: return false;  // bodies are not compared
  }
  return false;
}

}  // namespace

bool is_graph_input(const Graph& g, const Value* v) {
  return std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end();
}

bool is_graph_output(const Graph& g, const Value* v) {
  return std::find(g.outputs.begin(), g.outputs.end(), v) != g.outputs.end();
}

const Tensor* constant_of(const Graph& g, const Value* v) {
  if (!v || !v->constant || v->producer || is_graph_input(g, v)) return nullptr;
  return &*v->constant;
}

bool is_random_op(OpKind op) {
  return op == OpKind::kRandomNormal || op == OpKind::kRandomUniform || op == OpKind::kRandomNormalLike ||
         op == OpKind::kRandomUniformLike || op == OpKind::kMultinomial || op == OpKind::kBernoulli;
}

bool is_collective(OpKind op) { return op == OpKind::kAllReduce || op == OpKind::kAllGather; }

bool has_subgraph(const Node& n) {
  for (const auto& [k, a] : n.attrs) {
    if (a.g || !a.graphs.empty()) return true;
  }
  return false;
}

bool has_side_effects(const Node& n) { return is_collective(n.op); }

std::optional<std::vector<int64_t>> static_dims(const Value* v) {
  if (!v || !v->type.is_tensor() || !v->type.shape) return std::nullopt;
  std::vector<int64_t> d;
  for (const Dim& x : v->type.shape->dims) {
    if (!x.is_static()) return std::nullopt;
    d.push_back(x.value());
  }
  return d;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.dims() != b.dims()) return false;
  if (a.numel() == 0) return true;
  if (!a.raw() || !b.raw()) return false;
  if (a.dtype() == DType::kString) {
    for (int64_t i = 0; i < a.numel(); ++i) {
      if (a.data<std::string>()[i] != b.data<std::string>()[i]) return false;
    }
    return true;
  }
  return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool same_attrs(const Node& a, const Node& b) {
  if (a.attrs.size() != b.attrs.size()) return false;
  for (auto i = a.attrs.begin(), j = b.attrs.begin(); i != a.attrs.end(); ++i, ++j) {
    if (i->first != j->first || !same_attr(i->second, j->second)) return false;
  }
  return true;
}

// ---- matching helpers -----------------------------------------------------------------------

Node* sole_producer(const UseMap& uses, const Value* v, OpKind op) {
  if (!v || !v->producer || v->producer->op != op || v->producer->owner != &uses.graph()) return nullptr;
  if (uses.num_uses(v) != 1 || uses.is_output(v) || !uses.uses(v)[0].node) return nullptr;
  return v->producer;
}

Node* sole_reader(const UseMap& uses, const Value* v, OpKind op) {
  if (!v || uses.num_uses(v) != 1 || uses.is_output(v)) return nullptr;
  Node* n = uses.uses(v)[0].node;
  return n && n->op == op && n->owner == &uses.graph() ? n : nullptr;
}

bool scalar_near(const Graph& g, const Value* v, double want) {
  const Tensor* t = constant_of(g, v);
  if (!t || t->numel() != 1 || !(dtype_is_float(t->dtype()) || dtype_is_int(t->dtype()))) return false;
  const double tol = t->dtype() == DType::kBFloat16 ? 4e-3 : 1e-3;
  return std::fabs(t->as_double(0) - want) <= tol * std::fabs(want);
}

std::optional<int64_t> kept_reduce_axis(const Graph& g, const Node& reduce, size_t rank) {
  if (reduce.attr_int("keepdims", 1) != 1 || !reduce.has_input(1)) return std::nullopt;
  const Tensor* t = constant_of(g, reduce.inputs[1]);
  if (!t || !dtype_is_int(t->dtype()) || t->numel() != 1 || t->rank() > 1) return std::nullopt;
  int64_t a = t->to_int_vector()[0];
  if (a < 0) a += int64_t(rank);
  if (a < 0 || a >= int64_t(rank)) return std::nullopt;
  return a;
}

// ---- UseMap ---------------------------------------------------------------------------------

UseMap::UseMap(Graph& g) : g_(g) {
  uses_.reserve(g.values.size());
  for (const auto& n : g.nodes) add_reads(n.get());
}

void UseMap::add_reads(Node* n) {
  for (size_t i = 0; i < n->inputs.size(); ++i) {
    if (n->inputs[i]) uses_[n->inputs[i]].push_back({n, i});
  }
  for (Graph* body : bodies_of(*n)) {
    for (auto& sn : body->nodes) add_reads(sn.get());
    for (size_t i = 0; i < body->outputs.size(); ++i) {
      if (body->outputs[i]) uses_[body->outputs[i]].push_back({nullptr, i, body});
    }
  }
}

const std::vector<Use>& UseMap::uses(const Value* v) const {
  auto it = uses_.find(v);
  return it == uses_.end() ? kNoUses : it->second;
}

bool UseMap::can_forward(const Value* from, const Value* to) const {
  if (!from || !to || from == to) return false;
  if (!is_output(from)) return true;
  return to->owner == &g_ && !is_graph_input(g_, to) && !is_output(to) && to->type == from->type;
}

void UseMap::forward(Value* from, Value* to) {
  std::vector<Use> moved = std::move(uses_[from]);
  uses_.erase(from);
  for (const Use& u : moved) (u.body ? u.body->outputs : u.node->inputs)[u.input] = to;
  auto& dst = uses_[to];
  dst.insert(dst.end(), moved.begin(), moved.end());
  if (is_output(from)) {
    std::string name = from->name;
    g_.rename_value(from, g_.unique_name(name));
    g_.rename_value(to, name);
    std::replace(g_.outputs.begin(), g_.outputs.end(), from, to);
  }
}

void UseMap::set_input(Node* n, size_t i, Value* v) {
  if (Value* old = n->inputs[i]) erase_use(uses_[old], n, i);
  n->inputs[i] = v;
  if (v) uses_[v].push_back({n, i});
}

void UseMap::add_node(Node* n) { add_reads(n); }

void UseMap::remove_node(const Node* n) {
  for (size_t i = 0; i < n->inputs.size(); ++i) {
    if (n->inputs[i]) erase_use(uses_[n->inputs[i]], n, i);
  }
  for (Graph* body : bodies_of(*n)) {
    for (const auto& sn : body->nodes) remove_node(sn.get());
    for (size_t i = 0; i < body->outputs.size(); ++i) {
      if (!body->outputs[i]) continue;
      std::erase_if(uses_[body->outputs[i]], [&](const Use& u) { return u.body == body && u.input == i; });
    }
  }
}

// ---- removal --------------------------------------------------------------------------------

size_t erase_unused(UseMap& uses, const std::vector<Node*>& candidates) {
  Graph& g = uses.graph();
  std::set<const Node*> dead;
  std::set<const Value*> dead_values;
  auto unread = [&](const Node* n) {
    return std::all_of(n->outputs.begin(), n->outputs.end(), [&](const Value* o) { return !o || uses.unused(o); });
  };
  // Later candidates first: removing a reader can leave its producer, an earlier one, unread.
  for (bool again = true; again;) {
    again = false;
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
      Node* n = *it;
      if (dead.count(n) || has_side_effects(*n) || !unread(n)) continue;
      uses.remove_node(n);
      dead.insert(n);
      again = true;
      for (const Value* o : n->outputs) {
        if (o) dead_values.insert(o);
      }
      for (const Value* v : n->inputs) {
        if (v && v->owner == &g && constant_of(g, v) && uses.unused(v)) dead_values.insert(v);
      }
    }
  }
  if (dead.empty()) return 0;
  std::erase_if(g.nodes, [&](const std::unique_ptr<Node>& n) { return dead.count(n.get()) > 0; });
  g.erase_values(dead_values);
  return dead.size();
}

size_t erase_unused_constants(UseMap& uses) {
  Graph& g = uses.graph();
  std::set<const Value*> dead;
  for (const auto& v : g.values) {
    if (constant_of(g, v.get()) && uses.unused(v.get())) dead.insert(v.get());
  }
  g.erase_values(dead);
  return dead.size();
}

size_t erase_unused_constants(UseMap& uses, const std::vector<Value*>& candidates) {
  Graph& g = uses.graph();
  std::set<const Value*> dead;
  for (const Value* v : candidates) {
    if (v && v->owner == &g && constant_of(g, v) && uses.unused(v)) dead.insert(v);
  }
  g.erase_values(dead);
  return dead.size();
}

Value* add_f32_constant(Graph& g, const std::string& base, std::vector<int64_t> dims, const std::vector<double>& v) {
  Tensor t = Tensor::create(DType::kFloat32, std::move(dims)).value();
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(v[size_t(i)]);
  return g.add_constant(g.unique_name(base), std::move(t));
}

Value* add_i64_constant(Graph& g, const std::string& base, const std::vector<int64_t>& v) {
  Tensor t = Tensor::create(DType::kInt64, {int64_t(v.size())}).value();
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return g.add_constant(g.unique_name(base), std::move(t));
}

Value* through_identity(const Graph& g, Value* v) {
  Value* s = v;
  while (s && s->producer && s->producer->op == OpKind::kIdentity && s->producer->owner == &g &&
         s->producer->inputs.size() == 1 && s->producer->inputs[0] != s) {
    s = s->producer->inputs[0];
  }
  return constant_of(g, s) ? s : v;
}

Value* column_bias(const Graph& g, const Node& add, const Value* m, int64_t n) {
  if (add.inputs.size() != 2) return nullptr;
  Value* b = add.inputs[0] == m ? add.inputs[1] : add.inputs[1] == m ? add.inputs[0] : nullptr;
  if (b) b = through_identity(g, b);
  const Tensor* t = b ? constant_of(g, b) : nullptr;
  if (!t || b == m || t->dtype() != m->type.dtype || t->rank() < 1 || t->rank() > 2) return nullptr;
  if (t->dims().back() != n || t->numel() != n) return nullptr;
  return b;
}

bool is_float(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat64;
}

std::optional<double> scalar_of(const Graph& g, const Value* v) {
  const Tensor* t = constant_of(g, v);
  if (!t || t->numel() != 1 || !dtype_is_float(t->dtype())) return std::nullopt;
  return t->as_double(0);
}

bool is_elementwise(OpKind op) {
  switch (op) {
    case OpKind::kAdd: case OpKind::kSub: case OpKind::kMul: case OpKind::kDiv: case OpKind::kPow:
    case OpKind::kMod: case OpKind::kMax: case OpKind::kMin: case OpKind::kSum: case OpKind::kMean:
    case OpKind::kEqual: case OpKind::kLess: case OpKind::kLessOrEqual: case OpKind::kGreater:
    case OpKind::kGreaterOrEqual: case OpKind::kAnd: case OpKind::kOr: case OpKind::kXor: case OpKind::kNot:
    case OpKind::kWhere: case OpKind::kCast: case OpKind::kIdentity: case OpKind::kDropout: case OpKind::kRelu:
    case OpKind::kNeg: case OpKind::kAbs: case OpKind::kSign: case OpKind::kSigmoid: case OpKind::kTanh:
    case OpKind::kExp: case OpKind::kLog: case OpKind::kSqrt: case OpKind::kReciprocal: case OpKind::kErf:
    case OpKind::kFloor: case OpKind::kCeil: case OpKind::kSin: case OpKind::kCos: case OpKind::kSoftplus:
    case OpKind::kGelu: case OpKind::kLeakyRelu: case OpKind::kElu: case OpKind::kSelu: case OpKind::kCelu:
    case OpKind::kHardSigmoid: case OpKind::kHardSwish: case OpKind::kMish: case OpKind::kSwish:
    case OpKind::kSoftsign: case OpKind::kThresholdedRelu: case OpKind::kClip: case OpKind::kIsNaN:
      return true;
    default:
      return false;
  }
}

bool is_reduce(OpKind op) {
  switch (op) {
    case OpKind::kReduceSum: case OpKind::kReduceMean: case OpKind::kReduceMax: case OpKind::kReduceMin:
    case OpKind::kReduceProd: case OpKind::kReduceL1: case OpKind::kReduceL2: case OpKind::kReduceLogSum:
    case OpKind::kReduceLogSumExp: case OpKind::kReduceSumSquare:
      return true;
    default:
      return false;
  }
}

}  // namespace kiln
