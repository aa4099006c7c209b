// The engine's internals, shared by engine.cc (build and load) and session.cc (run). An engine is
// its device plan (records, memory plan, weights) plus what binding it made: the uploaded weights,
// the steps' closures and the descriptors they use. Nothing here refers to the lowering or to the
// graph, except host steps, which run nodes of the plan's graph.
#pragma once

#include "backends/cuda/executor.h"
#include "backends/cuda/lower.h"

namespace kiln::cuda {

class EngineImpl : public Engine, public std::enable_shared_from_this<EngineImpl> {
 public:
  EngineImpl(const Graph* g, const BuildOptions& opt) : graph(g), opt(opt) {}
  ~EngineImpl() override;

  const BuildReport& report() const override { return rep; }
  Expected<std::unique_ptr<Session>> new_session(void* comm = nullptr, SharedSessionMemory* shared = nullptr) override;
  Expected<std::unique_ptr<Session>> new_lanes_session(void* comm, int micro_batches, std::vector<bool> batched) override;
  Expected<std::pair<std::string, std::string>> serialize() const override;

  // Checks the memory budget, uploads the weights, binds every step and fills the report's numbers.
  // The same for a fresh build and a loaded plan.
  Status finish();

  const Graph* graph;  // the plan's graph: host steps' nodes (never read by device steps)
  BuildOptions opt;
  DevicePlan plan;
  std::vector<StepFn> fns;                          // per step, bound from its record
  std::vector<std::shared_ptr<void>> keep_alive;    // what the closures use (descriptors, libraries)
  std::vector<void*> weight_ptrs;                   // device pointer per weight id
  std::vector<size_t> weight_sizes;                 // bytes per weight id
  void* weight_block = nullptr;                     // one allocation holds every weight
  BuildReport rep;
  cudnnHandle_t dnn = nullptr;                      // for binding (descriptors, algorithm checks)
  cublasLtHandle_t lt = nullptr;
  bool uses_dnn = false, uses_lt = false;           // whether any step needs cuDNN / cuBLASLt handles
  bool uses_comm = false;                           // whether any step is a collective (NCCL)
};

// A node the CUDA backend declined, as a host step (lower_host.cc).
Status lower_on_cpu(Lowering& L, const Node& n);

}  // namespace kiln::cuda
