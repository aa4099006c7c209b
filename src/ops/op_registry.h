// Each op is declared once (DESIGN.md rule 5): its input/output arity, attribute schema, shape and
// type inference, and CPU reference kernel live together in the op family's file, e.g.
//
//   // ops/activation.cc
//   void register_activation_ops(OpRegistry& r) {
//     r.def(OpKind::kRelu, {.inputs = {1, 1}, .infer = infer_same_as_input0, .cpu = relu_cpu});
//   }
//
// Opset differences are normalized by the importer, so a kernel only sees the canonical form.
// Kernels dispatch on dtype inside (visit_dtype); nothing is registered per dtype.
#pragma once

#include <climits>
#include <functional>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

class InferCtx;
class KernelCtx;
using InferFn = Status (*)(InferCtx&);
using CpuKernelFn = Status (*)(KernelCtx&);

struct Arity {
  int min = 0;
  int max = 0;  // kVariadic for no upper bound
};
inline constexpr int kVariadic = INT_MAX;

struct AttrSpec {
  const char* name;
  Attribute::Kind kind;
  bool required = false;
};

struct OpDef {
  Arity inputs{0, 0};
  Arity outputs{1, 1};
  std::vector<AttrSpec> attrs;  // attributes the op reads; checked for kind and presence on import
  InferFn infer = nullptr;      // null: the op is not implemented yet
  CpuKernelFn cpu = nullptr;    // null: no CPU kernel
};

class OpRegistry {
 public:
  void def(OpKind op, OpDef d) { defs_[size_t(op)] = std::move(d); }
  const OpDef& get(OpKind op) const { return defs_[size_t(op)]; }

 private:
  std::vector<OpDef> defs_ = std::vector<OpDef>(size_t(kNumOps));
};

const OpRegistry& op_registry();
inline const OpDef& op_def(OpKind op) { return op_registry().get(op); }

// ---- shape and type inference -------------------------------------------------------------

// Runs inference over a whole (sub)graph; set by the inference driver for control-flow ops.
using GraphInferFn = std::function<Expected<std::vector<Type>>(const Graph&, const std::vector<Type>&)>;

class InferCtx {
 public:
  InferCtx(const Node& node, GraphInferFn infer_graph) : node_(node), infer_graph_(std::move(infer_graph)) {}

  const Node& node() const { return node_; }
  size_t num_inputs() const { return node_.inputs.size(); }
  size_t num_outputs() const { return node_.outputs.size(); }
  bool has_input(size_t i) const { return node_.has_input(i); }
  bool has_output(size_t i) const { return node_.has_output(i); }
  // Type of input i (an unknown Type when omitted).
  const Type& input_type(size_t i) const;
  // The input's value when it is a constant (initializer or folded), else null.
  const Tensor* input_constant(size_t i) const;
  // Symbolic element values of a small int tensor computed from shapes, else null (see Value).
  const std::vector<Dim>* input_dims_value(size_t i) const;
  // A 1-D (or scalar) integer input as dims: from its constant value, or its symbolic dims_value.
  std::optional<std::vector<Dim>> input_as_dims(size_t i) const;

  void set_output(size_t i, Type t);
  void set_output_tensor(size_t i, DType dt, std::optional<Shape> s) { set_output(i, Type::tensor(dt, std::move(s))); }
  void set_output_dims_value(size_t i, std::vector<Dim> v);
  const Type& output_type(size_t i) const;

  Expected<std::vector<Type>> infer_graph(const Graph& g, const std::vector<Type>& input_types) const {
    return infer_graph_(g, input_types);
  }

  // An error naming the node: "node 'x' (Add, #3): <message>".
  template <typename... Args>
  Status error(fmt::format_string<Args...> f, Args&&... args) const {
    return Status(ErrorCode::kInvalidModel,
                  node_.describe() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  Status unsupported(fmt::format_string<Args...> f, Args&&... args) const {
    return Status(ErrorCode::kUnsupported,
                  node_.describe() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }

  // Requires input i to be a tensor; returns its dtype or an error.
  Expected<DType> tensor_dtype(size_t i) const;

 private:
  const Node& node_;
  GraphInferFn infer_graph_;
};

// ---- CPU kernels ---------------------------------------------------------------------------

// Runs a subgraph (If/Loop/Scan body) with the given inputs; enclosing values stay visible.
using GraphRunFn = std::function<Expected<std::vector<Data>>(const Graph&, std::vector<Data>)>;

class KernelCtx {
 public:
  KernelCtx(const Node& node, std::vector<const Data*> inputs, GraphRunFn run_graph)
      : node_(node), inputs_(std::move(inputs)), outputs_(node.outputs.size()), run_graph_(std::move(run_graph)) {}

  const Node& node() const { return node_; }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  bool has_output(size_t i) const { return node_.has_output(i); }
  const Data& input(size_t i) const;
  // Input i as a tensor (checked: an error is raised by the executor if it is not one).
  const Tensor& tensor(size_t i) const { return input(i).tensor; }

  // Allocates output i (zero-filled); errors on bad dims or sizes over the limit.
  Expected<Tensor*> alloc_output(size_t i, DType dt, std::vector<int64_t> dims);
  void set_output(size_t i, Data d) { outputs_[i] = std::move(d); }
  std::vector<Data>& outputs() { return outputs_; }

  Expected<std::vector<Data>> run_graph(const Graph& g, std::vector<Data> inputs) const {
    return run_graph_(g, std::move(inputs));
  }

  template <typename... Args>
  Status error(fmt::format_string<Args...> f, Args&&... args) const {
    return Status(ErrorCode::kInvalidArgument,
                  node_.describe() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  Status unsupported(fmt::format_string<Args...> f, Args&&... args) const {
    return Status(ErrorCode::kUnsupported,
                  node_.describe() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }

 private:
  const Node& node_;
  std::vector<const Data*> inputs_;
  std::vector<Data> outputs_;
  GraphRunFn run_graph_;
};

// Splits [0, n) into chunks run on a small shared thread pool; runs inline when n is small.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& fn);

}  // namespace kiln
