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

// One node on the CPU reference kernels (a plan's host steps run through this): `ins` per node
// input (null: omitted); `outer` resolves values of n's graph that its subgraph bodies read.
// Each output is checked against its inferred type.
using ValueLookup = std::function<const Data*(const Value*)>;
Expected<std::vector<Data>> run_node_on_cpu(const Node& n, std::vector<const Data*> ins, const ValueLookup& outer);

// Checks run-time inputs against the graph's declared inputs: count, kind, dtype, rank, static
// dims, and that each symbolic dim has one value across all inputs. Errors name the input.
Status check_inputs(const Graph& g, const std::vector<Data>& inputs);

}  // namespace kiln
