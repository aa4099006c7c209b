#include "quant/fast_runner.h"

#include "backends/cpu/fast_session.h"
#include "passes/pass_manager.h"
#include "passes/pipeline.h"
#include "runtime/engine_file.h"
#include "runtime/plan.h"

namespace kiln {

namespace {

class FastExecutable : public Executable {
 public:
  explicit FastExecutable(std::unique_ptr<CpuRunner> r) : runner_(std::move(r)) {}
  Expected<std::vector<Data>> run(const std::vector<Data>& inputs) override { return runner_->run(inputs); }

 private:
  std::unique_ptr<CpuRunner> runner_;
};

}  // namespace

Expected<std::unique_ptr<Executable>> compile_fast_cpu(const Graph& g) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> copy, clone_graph(g));
  // The passes keep every graph output (the observed activations among them) and its order; the
  // QDQ products stay float products, as in any CPU engine (pipeline.h, kCpuSkippedPass).
  PassOptions po;
  po.disabled.push_back(std::string(kCpuSkippedPass));
  KILN_RETURN_IF_ERROR(run_passes(*copy, default_pipeline(), po).status());
  KILN_ASSIGN_OR_RETURN(Plan plan, plan_host(std::move(copy)));
  auto shared = std::make_shared<const Plan>(std::move(plan));
  Expected<CpuPlan> cp = plan_fast_cpu(*shared, /*deterministic=*/false);
  Expected<std::unique_ptr<CpuRunner>> runner =
      cp ? CpuRunner::create(shared, std::make_shared<const CpuPlan>(std::move(*cp))) : Expected<std::unique_ptr<CpuRunner>>(cp.status());
  if (runner) return std::unique_ptr<Executable>(std::make_unique<FastExecutable>(std::move(*runner)));
  if (runner.status().code() != ErrorCode::kUnsupported) return runner.status();
  return make_cpu_backend()->compile(g);  // no oneDNN here: the reference kernels, as before
}

}  // namespace kiln
