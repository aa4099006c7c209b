#include "ir/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

namespace kiln {

std::string Type::to_string() const {
  switch (kind) {
    case Kind::kUnknown: return "?";
    case Kind::kTensor: return std::string(dtype_name(dtype)) + (shape ? shape->to_string() : "[*]");
    case Kind::kSequence: return "seq<" + elem->to_string() + ">";
    case Kind::kOptional: return "opt<" + elem->to_string() + ">";
  }
  return "?";
}

bool Type::operator==(const Type& o) const {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::kUnknown: return true;
    case Kind::kTensor: return dtype == o.dtype && shape == o.shape;
    case Kind::kSequence:
    case Kind::kOptional: return *elem == *o.elem;
  }
  return false;
}

std::string_view attr_kind_name(Attribute::Kind k) {
  switch (k) {
    case Attribute::Kind::kFloat: return "float";
    case Attribute::Kind::kInt: return "int";
    case Attribute::Kind::kString: return "string";
    case Attribute::Kind::kTensor: return "tensor";
    case Attribute::Kind::kGraph: return "graph";
    case Attribute::Kind::kFloats: return "floats";
    case Attribute::Kind::kInts: return "ints";
    case Attribute::Kind::kStrings: return "strings";
    case Attribute::Kind::kTensors: return "tensors";
    case Attribute::Kind::kGraphs: return "graphs";
    case Attribute::Kind::kType: return "type";
    case Attribute::Kind::kTypes: return "types";
  }
  return "?";
}

std::string Node::describe() const {
  return fmt::format("node '{}' ({}, #{})", name, op_name(op), index);
}

const Attribute* Node::attr(const std::string& n) const {
  auto it = attrs.find(n);
  return it == attrs.end() ? nullptr : &it->second;
}

int64_t Node::attr_int(const std::string& n, int64_t dflt) const {
  const Attribute* a = attr(n);
  return a && a->kind == Attribute::Kind::kInt ? a->i : dflt;
}

float Node::attr_float(const std::string& n, float dflt) const {
  const Attribute* a = attr(n);
  if (a && a->kind == Attribute::Kind::kFloat) return a->f;
  if (a && a->kind == Attribute::Kind::kInt) return float(a->i);
  return dflt;
}

std::string Node::attr_string(const std::string& n, const std::string& dflt) const {
  const Attribute* a = attr(n);
  return a && a->kind == Attribute::Kind::kString ? a->s : dflt;
}

std::vector<int64_t> Node::attr_ints(const std::string& n, std::vector<int64_t> dflt) const {
  const Attribute* a = attr(n);
  return a && a->kind == Attribute::Kind::kInts ? a->ints : dflt;
}

std::vector<float> Node::attr_floats(const std::string& n, std::vector<float> dflt) const {
  const Attribute* a = attr(n);
  return a && a->kind == Attribute::Kind::kFloats ? a->floats : dflt;
}

std::vector<std::string> Node::attr_strings(const std::string& n) const {
  const Attribute* a = attr(n);
  return a && a->kind == Attribute::Kind::kStrings ? a->strings : std::vector<std::string>{};
}

const Graph* Node::attr_graph(const std::string& n) const {
  const Attribute* a = attr(n);
  return a && a->kind == Attribute::Kind::kGraph ? a->g.get() : nullptr;
}

const Tensor* Node::attr_tensor(const std::string& n) const {
  const Attribute* a = attr(n);
  return a && a->kind == Attribute::Kind::kTensor ? &a->t : nullptr;
}

std::string Graph::unique_name(const std::string& base) {
  std::string b = base.empty() ? "v" : base;
  if (!lookup(b)) return b;
  for (;;) {
    std::string n = fmt::format("{}_{}", b, next_id_++);
    if (!lookup(n)) return n;
  }
}

Value* Graph::add_value(std::string name, Type type) {
  auto v = std::make_unique<Value>();
  v->name = std::move(name);
  v->type = std::move(type);
  v->owner = this;
  Value* p = v.get();
  if (!p->name.empty()) by_name_[p->name] = p;
  values.push_back(std::move(v));
  return p;
}

Value* Graph::add_input(std::string name, Type type) {
  Value* v = add_value(std::move(name), std::move(type));
  inputs.push_back(v);
  return v;
}

Value* Graph::add_constant(std::string name, Tensor t) {
  Value* v = add_value(std::move(name), Type::tensor(t.dtype(), Shape::of(t.dims())));
  v->constant = std::move(t);
  return v;
}

Node* Graph::add_node(OpKind op, std::vector<Value*> ins, int num_outputs, std::string name) {
  auto n = std::make_unique<Node>();
  n->op = op;
  n->name = name.empty() ? unique_name(std::string(op_name(op))) : std::move(name);
  n->inputs = std::move(ins);
  n->owner = this;
  n->index = int(nodes.size());
  for (int i = 0; i < num_outputs; ++i) {
    Value* v = add_value(unique_name(n->name + "_out" + std::to_string(i)));
    v->producer = n.get();
    v->producer_output = i;
    n->outputs.push_back(v);
  }
  nodes.push_back(std::move(n));
  return nodes.back().get();
}

Value* Graph::lookup(const std::string& n) const {
  for (const Graph* g = this; g; g = g->parent) {
    auto it = g->by_name_.find(n);
    if (it != g->by_name_.end()) return it->second;
  }
  return nullptr;
}

void Graph::rename_value(Value* v, std::string name) {
  KILN_CHECK(v->owner == this, "rename_value: '{}' is not a value of graph '{}'", v->name, this->name);
  auto it = by_name_.find(v->name);
  if (it != by_name_.end() && it->second == v) by_name_.erase(it);
  v->name = std::move(name);
  if (!v->name.empty()) by_name_[v->name] = v;
}

void Graph::erase_values(const std::set<const Value*>& dead) {
  if (dead.empty()) return;
  for (auto it = by_name_.begin(); it != by_name_.end();) {
    it = dead.count(it->second) ? by_name_.erase(it) : std::next(it);
  }
  std::erase_if(values, [&](const std::unique_ptr<Value>& v) { return dead.count(v.get()) > 0; });
}

Status Graph::topo_sort() {
  // Kahn's algorithm over this graph's nodes; edges from values produced by nodes of this graph.
  // Reads inside subgraphs count too: an If reading x in its branch must come after x's producer.
  std::map<const Node*, size_t> pos;
  for (size_t i = 0; i < nodes.size(); ++i) pos[nodes[i].get()] = i;
  std::vector<std::vector<size_t>> users(nodes.size());
  std::vector<int> pending(nodes.size(), 0);
  std::function<void(const Graph&, size_t)> add_deps_from = [&](const Graph& g, size_t consumer) {
    for (const auto& n : g.nodes) {
      for (const Value* in : n->inputs) {
        if (!in || !in->producer) continue;
        auto it = pos.find(in->producer);
        if (it != pos.end() && it->second != consumer) {
          users[it->second].push_back(consumer);
          ++pending[consumer];
        }
      }
      for (const auto& [k, a] : n->attrs) {
        if (a.g) add_deps_from(*a.g, consumer);
        for (const auto& sg : a.graphs) add_deps_from(*sg, consumer);
      }
    }
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i];
    for (const Value* in : n.inputs) {
      if (!in || !in->producer) continue;
      auto it = pos.find(in->producer);
      if (it == pos.end()) continue;
      if (it->second == i) return KILN_ERROR(kInvalidModel, "{} reads its own output '{}' (a cycle)", n.describe(), in->name);
      users[it->second].push_back(i);
      ++pending[i];
    }
    for (const auto& [k, a] : n.attrs) {
      if (a.g) add_deps_from(*a.g, i);
      for (const auto& sg : a.graphs) add_deps_from(*sg, i);
    }
  }
  std::vector<size_t> ready, order;
  for (size_t i = nodes.size(); i-- > 0;) if (pending[i] == 0) ready.push_back(i);
  // Stable: among ready nodes take the earliest in the original order.
  std::set<size_t> ready_set(ready.begin(), ready.end());
  while (!ready_set.empty()) {
    size_t i = *ready_set.begin();
    ready_set.erase(ready_set.begin());
    order.push_back(i);
    for (size_t u : users[i]) if (--pending[u] == 0) ready_set.insert(u);
  }
  if (order.size() != nodes.size()) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (pending[i] > 0) {
        return KILN_ERROR(kInvalidModel, "the graph has a cycle through {}", nodes[i]->describe());
      }
    }
  }
  std::vector<std::unique_ptr<Node>> sorted;
  sorted.reserve(nodes.size());
  for (size_t i : order) sorted.push_back(std::move(nodes[i]));
  nodes = std::move(sorted);
  return Status::ok();
}

}  // namespace kiln
