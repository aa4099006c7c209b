// Shared helpers for graph rewrites: who reads each value (UseMap), forwarding every read of one
// value to another without changing the graph's output names or types, matching the chains a
// fusion absorbs (sole producers and readers, scalar constants, reduce axes), and removing nodes
// that a rewrite left without readers.
//
//   UseMap uses(g);
//   // Identity(x) -> x
//   if (uses.can_forward(n->outputs[0], n->inputs[0])) {
//     uses.forward(n->outputs[0], n->inputs[0]);
//     erase_unused(g, uses, {n});
//   }
//
// The helpers work on one graph level: reads from inside subgraphs (If/Loop/Scan bodies: their
// nodes' inputs and their outputs) count as uses and are rewritten, but nodes inside subgraphs
// are never removed.
#pragma once

#include <optional>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace kiln {

// One read of a value: node->inputs[input], or, when body is set, body->outputs[input] (a
// subgraph may return a value of an enclosing graph directly: `else_branch = ... { return %x }`).
struct Use {
  Node* node;    // a node of the graph or of one of its subgraphs; null for a body output
  size_t input;
  Graph* body = nullptr;
};

bool is_graph_input(const Graph& g, const Value* v);
bool is_graph_output(const Graph& g, const Value* v);
// The tensor of a value fixed at build time: an initializer, Constant or folded value that is
// not also a graph input (an input with a default may be overridden at run time).
const Tensor* constant_of(const Graph& g, const Value* v);
// Ops whose outputs differ from run to run: never merged or folded.
bool is_random_op(OpKind op);
// Ops that compute each output element from the same element of their (numpy-broadcast) inputs.
bool is_elementwise(OpKind op);
// ReduceSum, ReduceMean and the other Reduce* ops.
bool is_reduce(OpKind op);
// AllReduce/AllGather: their result depends on the other ranks' values, so never folded even when
// this rank's input is a constant.
bool is_collective(OpKind op);
bool has_subgraph(const Node& n);
// Ops with effects beyond their outputs, which DCE must keep. Standard ONNX ops are pure; the
// collectives are not: every rank must run each of them, even one whose result a rank does not read.
bool has_side_effects(const Node& n);
// The dims of a tensor value when all are static, else nullopt.
std::optional<std::vector<int64_t>> static_dims(const Value* v);
// Same dtype, dims and bytes (strings by value).
bool same_tensor(const Tensor& a, const Tensor& b);
// Same attribute names and values; floats compare bitwise; graph attributes never compare equal.
bool same_attrs(const Node& a, const Node& b);

class UseMap {
 public:
  explicit UseMap(Graph& g);

  Graph& graph() const { return g_; }
  const std::vector<Use>& uses(const Value* v) const;
  size_t num_uses(const Value* v) const { return uses(v).size(); }
  bool is_output(const Value* v) const { return is_graph_output(g_, v); }
  // Nothing reads v: no node (subgraph nodes included) and no graph output.
  bool unused(const Value* v) const { return num_uses(v) == 0 && !is_output(v); }

  // True when every read of `from` can be made to read `to`. Node inputs always can; a graph
  // output only when `to` can take over its name: `to` is a non-input value of this graph, not
  // itself a graph output, and of exactly the same type.
  bool can_forward(const Value* from, const Value* to) const;
  // Makes every reader of `from` read `to` (check can_forward first). When `from` is a graph
  // output, `to` takes over its name and `from` gets a fresh one, so the outputs keep theirs.
  void forward(Value* from, Value* to);
  // n->inputs[i] = v, keeping the map in step.
  void set_input(Node* n, size_t i, Value* v);
  // Registers the reads of a node added after the map was built.
  void add_node(Node* n);
  // Forgets the reads of n and of nodes in its subgraphs (n is being removed).
  void remove_node(const Node* n);

 private:
  void add_reads(Node* n);
  Graph& g_;
  std::unordered_map<const Value*, std::vector<Use>> uses_;
};

// ---- matching helpers for fusions (fuse-gelu, fuse-layernorm, fuse-softmax) ------------------

// The `op` node of this graph producing v, when v is an intermediate a fusion may absorb: read by
// exactly one node input (not twice by one node, not from a subgraph) and not a graph output.
Node* sole_producer(const UseMap& uses, const Value* v, OpKind op);
// The `op` node of this graph that is v's only reader (one input of it), v not a graph output.
Node* sole_reader(const UseMap& uses, const Value* v, OpKind op);
// New constants of this graph named after `base` (made unique): f32 values of the given dims (one
// per element, in order), and an i64 vector (Reshape targets, axes).
Value* add_f32_constant(Graph& g, const std::string& base, std::vector<int64_t> dims, const std::vector<double>& v);
Value* add_i64_constant(Graph& g, const std::string& base, const std::vector<int64_t>& v);
// The constant at the start of a chain of Identity nodes ending in v (torch's exporter routes
// initializers shared by several layers, identical zero biases included, through Identity nodes),
// or v itself when the chain does not start at a constant.
Value* through_identity(const Graph& g, Value* v);
// The bias of `add` when it is Add(m, b) or Add(b, m) with b a constant per-column bias of m's
// dtype, shape [n] or [1, n], or an Identity chain from one (through_identity: the constant is
// returned) (fuse-matmul-add, fuse-qdq-matmul).
Value* column_bias(const Graph& g, const Node& add, const Value* m, int64_t n);
// The float dtypes the fusions rewrite (f16, bf16, f32, f64).
bool is_float(DType t);
// A one-element float constant of this graph, as a double; nullopt for anything else.
std::optional<double> scalar_of(const Graph& g, const Value* v);
// True when v is a constant of one element (any shape: a broadcast shows in the result's type)
// of a numeric dtype and within 1e-3 of `want`, relatively; 4e-3 for bf16, whose 8 significand
// bits put a rounded constant (0.044715, 1/sqrt 2) up to 2e-3 away.
bool scalar_near(const Graph& g, const Value* v, double want);
// The axis a Reduce* node reduces, normalized to [0, rank), when its axes are a constant input
// holding one axis and keepdims is 1 (the importer moves opset < 18 `axes` attributes to input 1).
std::optional<int64_t> kept_reduce_axis(const Graph& g, const Node& reduce, size_t rank);
// For a binary node, the operand other than one for which `is` holds: Add(e, 1) -> e, Add(1, e)
// -> e. Input 1 is tried first.
template <typename Pred>
Value* other_operand(const Node* n, Pred is) {
  if (!n || n->inputs.size() != 2 || !n->inputs[0] || !n->inputs[1]) return nullptr;
  if (is(n->inputs[1])) return n->inputs[0];
  if (is(n->inputs[0])) return n->inputs[1];
  return nullptr;
}

// Removes those of `candidates` (nodes of uses.graph()) whose outputs nothing reads, repeating
// while removals leave more of them unread, together with their output values and with the
// constants only they read. Returns how many nodes it removed.
size_t erase_unused(UseMap& uses, const std::vector<Node*>& candidates);

// Removes constants (not graph inputs or outputs) that nothing reads. Returns how many.
size_t erase_unused_constants(UseMap& uses);
// The same, among `candidates` only: the former inputs of a node a rewrite kept but rewired.
size_t erase_unused_constants(UseMap& uses, const std::vector<Value*>& candidates);

}  // namespace kiln
