// The kiln IR: a Model holds a Graph of Nodes connected by Values. Values are SSA: one producer
// (a Node output, a graph input, or a constant); Nodes are kept in topological order. Subgraphs
// (If/Loop/Scan bodies) are Graph attributes whose nodes may read Values of enclosing graphs.
//
//   Graph g;
//   Value* x = g.add_input("x", Type::tensor(DType::kFloat32, {Dim::symbol("N"), 4}));
//   Node* n = g.add_node(OpKind::kRelu, {x}, 1);
//   g.outputs.push_back(n->outputs[0]);
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/shape.h"
#include "ir/tensor.h"
#include "ops/op_kind.h"

namespace kiln {

class Graph;
class Node;

// The type of a Value: a tensor (dtype + optional shape), a sequence or optional of a type.
struct Type {
  enum class Kind { kUnknown, kTensor, kSequence, kOptional };
  Kind kind = Kind::kUnknown;
  DType dtype = DType::kFloat32;   // tensors: element type
  std::optional<Shape> shape;      // tensors: nullopt when even the rank is unknown
  std::shared_ptr<const Type> elem;  // sequences and optionals

  static Type tensor(DType dt, std::optional<Shape> s = std::nullopt) {
    Type t;
    t.kind = Kind::kTensor;
    t.dtype = dt;
    t.shape = std::move(s);
    return t;
  }
  static Type sequence(Type e) {
    Type t;
    t.kind = Kind::kSequence;
    t.elem = std::make_shared<const Type>(std::move(e));
    return t;
  }
  static Type optional(Type e) {
    Type t;
    t.kind = Kind::kOptional;
    t.elem = std::make_shared<const Type>(std::move(e));
    return t;
  }
  bool is_tensor() const { return kind == Kind::kTensor; }
  bool is_known() const { return kind != Kind::kUnknown; }
  bool has_rank() const { return is_tensor() && shape.has_value(); }
  std::string to_string() const;  // "f32[N,3]", "f32[*]" (unknown rank), "seq<i64[2]>", "opt<...>", "?"
  bool operator==(const Type& o) const;
};

struct Attribute {
  enum class Kind { kFloat, kInt, kString, kTensor, kGraph, kFloats, kInts, kStrings, kTensors,
                    kGraphs, kType, kTypes };
  Kind kind = Kind::kInt;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
  std::vector<Type> types;  // kType uses types[0]

  static Attribute of_int(int64_t v) { Attribute a; a.kind = Kind::kInt; a.i = v; return a; }
  static Attribute of_float(float v) { Attribute a; a.kind = Kind::kFloat; a.f = v; return a; }
  static Attribute of_string(std::string v) { Attribute a; a.kind = Kind::kString; a.s = std::move(v); return a; }
  static Attribute of_ints(std::vector<int64_t> v) { Attribute a; a.kind = Kind::kInts; a.ints = std::move(v); return a; }
  static Attribute of_floats(std::vector<float> v) { Attribute a; a.kind = Kind::kFloats; a.floats = std::move(v); return a; }
  static Attribute of_tensor(Tensor v) { Attribute a; a.kind = Kind::kTensor; a.t = std::move(v); return a; }
  static Attribute of_graph(std::shared_ptr<Graph> v) { Attribute a; a.kind = Kind::kGraph; a.g = std::move(v); return a; }
};
std::string_view attr_kind_name(Attribute::Kind k);

class Value {
 public:
  std::string name;
  Type type;
  Node* producer = nullptr;     // null for graph inputs and constants
  int producer_output = 0;
  std::optional<Tensor> constant;  // initializers and folded constants
  // For small integer tensors computed from shapes (Shape -> Gather -> Concat): their symbolic
  // element values, so Reshape(x, Concat(Shape(x)[0], 768)) infers [N,768].
  std::optional<std::vector<Dim>> dims_value;
  Graph* owner = nullptr;
};

class Node {
 public:
  OpKind op;
  std::string name;       // the ONNX node name (may be empty)
  int index = -1;         // position in the ONNX graph, for error messages
  std::vector<Value*> inputs;   // nullptr: an omitted optional input
  std::vector<Value*> outputs;  // nullptr: an omitted optional output
  std::map<std::string, Attribute> attrs;
  Graph* owner = nullptr;

  // "node 'conv1' (Conv, #3)": how errors name a node.
  std::string describe() const;
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  bool has_output(size_t i) const { return i < outputs.size() && outputs[i] != nullptr; }

  const Attribute* attr(const std::string& n) const;
  bool has_attr(const std::string& n) const { return attr(n) != nullptr; }
  int64_t attr_int(const std::string& n, int64_t dflt) const;
  float attr_float(const std::string& n, float dflt) const;
  std::string attr_string(const std::string& n, const std::string& dflt) const;
  std::vector<int64_t> attr_ints(const std::string& n, std::vector<int64_t> dflt = {}) const;
  std::vector<float> attr_floats(const std::string& n, std::vector<float> dflt = {}) const;
  std::vector<std::string> attr_strings(const std::string& n) const;
  const Graph* attr_graph(const std::string& n) const;
  const Tensor* attr_tensor(const std::string& n) const;
};

// A node that a graph pass removed, and where its work went, for `kiln build --report`:
// `into` is the live node that now does that work (a fusion or fold), null when the work is gone
// (evaluated at build time, a no-op, a duplicate merged, dead). The pass manager records every
// removal and keeps `into` pointing at a live node as later passes remove nodes in turn.
struct Absorbed {
  std::string node;           // Node::describe() of the removed node
  const Node* into = nullptr;
  std::string pass;           // the pass that removed it
};

class Graph {
 public:
  std::string name;
  std::vector<std::unique_ptr<Node>> nodes;    // topological order
  std::vector<std::unique_ptr<Value>> values;  // every Value defined in this graph
  std::vector<Value*> inputs;
  std::vector<Value*> outputs;
  Graph* parent = nullptr;  // enclosing graph, for subgraphs
  Node* parent_node = nullptr;
  std::vector<Absorbed> absorbed;  // provenance of the nodes graph passes removed (top level only)

  Value* add_value(std::string name, Type type = {});
  Value* add_input(std::string name, Type type);
  Value* add_constant(std::string name, Tensor t);
  // Appends a node with `num_outputs` fresh output values named after the node.
  Node* add_node(OpKind op, std::vector<Value*> inputs, int num_outputs, std::string name = "");
  // Finds a value by name in this graph or, failing that, enclosing ones.
  Value* lookup(const std::string& name) const;
  // Renames v (a value of this graph), keeping lookup() in step; `name` must be free.
  void rename_value(Value* v, std::string name);
  // Drops values of this graph that nothing reads any more (a pass removed their producers) from
  // `values` and from the name index; graph inputs and outputs must not be among them.
  void erase_values(const std::set<const Value*>& dead);
  // Re-sorts nodes topologically; fails (naming a node on the cycle) if there is a cycle.
  Status topo_sort();
  std::string unique_name(const std::string& base);
  // A pass about to remove `gone` records that `into` now does its work (see Absorbed).
  void note_absorbed(const Node& gone, const Node& into) { absorbed.push_back({gone.describe(), &into, ""}); }

 private:
  std::map<std::string, Value*> by_name_;
  int64_t next_id_ = 0;
};

struct Model {
  std::unique_ptr<Graph> graph;
  int64_t ir_version = 0;
  std::map<std::string, int64_t> opsets;  // domain -> version, as imported
  std::string producer_name, producer_version, domain, doc;
  int64_t model_version = 0;
  std::vector<std::pair<std::string, std::string>> metadata;
  std::string source_path;
};

}  // namespace kiln
