// The plan: what an engine runs, as data. A plan holds the optimized graph (the nodes host steps
// execute and their attributes), the weights, and the steps in order, each a kind plus plain
// parameters plus references to the values it reads and writes. Nothing in it is a closure or a
// pointer into a build, so it is written to and read from an engine file as it is (engine_file.h),
// and an executor runs it with no importer, pass or backend compiler in the process.
//
//   KILN_ASSIGN_OR_RETURN(Plan p, plan_host(std::move(graph)));   // an optimized graph
//   KILN_ASSIGN_OR_RETURN(std::vector<Data> out, run_plan(p, inputs));
//
// Today every step of a plan is a host step (an op on the CPU reference kernels); the CUDA
// backend's steps become records of their own kinds here as it moves onto plans.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

enum class StepKind : uint8_t {
  kHostOp,  // one node of the plan's graph on the CPU reference kernels
};
std::string_view step_kind_name(StepKind k);

// What a step reads or writes: a slot (a value the executor holds while it is live), a constant
// of the plan's graph (a weight), or nothing (an omitted optional input or output).
struct ValueRef {
  enum class Kind : uint8_t { kNone, kSlot, kConstant };
  Kind kind = Kind::kNone;
  uint32_t index = 0;  // slot number, or index into Plan::constants
  bool operator==(const ValueRef&) const = default;
};

struct PlanStep {
  StepKind kind = StepKind::kHostOp;
  uint32_t node = 0;                 // index into the graph's top-level nodes
  std::vector<ValueRef> inputs;      // one per node input
  std::vector<ValueRef> outputs;     // one per node output (constants never)
  std::vector<uint32_t> frees;       // slots whose last reader is this step, released after it
};

struct Plan {
  std::unique_ptr<Graph> graph;      // the optimized graph: host steps' nodes, I/O types, weights
  uint32_t slots = 0;
  std::vector<ValueRef> inputs;      // per graph input: the slot it is bound to
  std::vector<ValueRef> outputs;     // per graph output
  std::vector<const Value*> constants;  // top-level constants read by steps or returned
  std::vector<PlanStep> steps;
};

// The plan for an optimized, verified graph. Takes the graph: the plan owns it. With
// require_cpu_kernels, a node without a CPU kernel is kUnsupported naming it; without, the plan
// still records the graph and weights (a GPU engine's plan) and run_plan refuses it.
Expected<Plan> plan_host(std::unique_ptr<Graph> g, bool require_cpu_kernels = true);
Status verify_cpu_kernels(const Plan& p);

// Every value of g that node n reads, directly or from inside its subgraph bodies (which read
// enclosing values by name, as ONNX outer-scope references).
void values_read(const Graph& g, const Node& n, std::vector<const Value*>& out);

// The CPU engine's build report: steps, slots, weights, and the ops it runs.
std::string plan_report(const Plan& p);

// Checks a plan's internal consistency: refs in range, every slot written before it is read,
// nodes and arities matching the graph. Loading an engine file runs it, so a file that parses but
// does not hold together is an error, not a crash.
Status verify_plan(const Plan& p);

// Runs the plan on inputs in graph-input order (checked against the graph's declared inputs);
// outputs in graph-output order.
Expected<std::vector<Data>> run_plan(const Plan& p, std::vector<Data> inputs);

}  // namespace kiln
