// The engine's internals, shared by engine.cc (build) and session.cc (run).
#pragma once

#include "backends/cuda/lower.h"

namespace kiln::cuda {

class EngineImpl : public Engine, public std::enable_shared_from_this<EngineImpl> {
 public:
  EngineImpl(const Graph& g, const BuildOptions& opt);
  ~EngineImpl() override;

  const BuildReport& report() const override { return rep; }
  Expected<std::unique_ptr<Session>> new_session() override;

  Status create_build_resources();
  Status upload_weights();
  void finish_report(double build_ms);

  const Graph& graph;
  BuildOptions opt;
  std::unique_ptr<Lowering> lowering;
  std::vector<DevValue> input_stage, output_stage;  // per graph input / output
  std::vector<size_t> offsets;                      // arena offset per buffer id
  std::vector<void*> weight_ptrs;                   // device pointer per weight id
  void* weight_block = nullptr;                     // one allocation holds every weight
  BuildReport rep;
};

}  // namespace kiln::cuda
