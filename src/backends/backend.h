// The narrow interface every backend implements (DESIGN.md rule 11):
//   supports(node)  -> can this backend run it (and why not)
//   compile(graph)  -> an Executable: allocate once, then run many times
// Placement (which backend runs which node, with copies between) is decided above this layer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

class Executable {
 public:
  virtual ~Executable() = default;
  // Runs the graph on inputs given in graph-input order; returns outputs in graph-output order.
  virtual Expected<std::vector<Data>> run(const std::vector<Data>& inputs) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // True if the backend can run n; otherwise *reason says why ("op X has no CPU kernel").
  virtual bool supports(const Node& n, std::string* reason) const = 0;
  virtual Expected<std::unique_ptr<Executable>> compile(const Graph& g) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();

// A backend that lowers a graph node by node into the steps of its plan (the CUDA backend). The
// placer (runtime/placement.h) offers it each node in order and decides what happens to the nodes
// it declines; the backend never calls the CPU kernels or the graph passes itself.
class StepBackend {
 public:
  virtual ~StepBackend() = default;
  virtual std::string_view name() const = 0;  // the report's column: "cuda"
  // The node whose steps already cover n (an epilogue fused into a convolution, the views feeding
  // a fused attention), or null.
  virtual const Node* fused_into(const Node& n) const = 0;
  // Values known at build time (initializers, and what the placer folded: set_constant).
  virtual const Tensor* constant(const Value* v) const = 0;
  virtual void set_constant(const Value* v, Tensor t) = 0;
  struct Lowered {
    bool alias = false;  // no work: n's outputs are views of its inputs
    std::string impl;    // what n became, for the report
  };
  // Lowers n into steps; kUnsupported with the reason declines it, having emitted nothing.
  virtual Expected<Lowered> lower(const Node& n) = 0;
  // n as a host step of this backend's plan: inputs copied to the host, the CPU backend's kernel
  // (run_node_on_cpu), outputs copied back. Called only for nodes the CPU backend supports.
  virtual Status lower_host(const Node& n) = 0;
};

// One node on the CPU reference kernels (a plan's host steps run through this): `ins` per node
// input (null: omitted); `outer` resolves values of n's graph that its subgraph bodies read.
// Each output is checked against its inferred type.
using ValueLookup = std::function<const Data*(const Value*)>;
Expected<std::vector<Data>> run_node_on_cpu(const Node& n, std::vector<const Data*> ins, const ValueLookup& outer);

// Checks run-time inputs against the graph's declared inputs: count, kind, dtype, rank, static
// dims, and that each symbolic dim has one value across all inputs. Errors name the input.
Status check_inputs(const Graph& g, const std::vector<Data>& inputs);

}  // namespace kiln
