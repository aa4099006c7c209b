#include "cuda_run.h"

#include <memory>

#include "backends/cuda/engine.h"

namespace kiln::conformance {

Expected<RunFn> compile_cuda(const Graph& g) {
  cuda::BuildOptions bo;
  bo.precision = Precision::kFp32;
  bo.autotune = false;  // correctness only: the heuristics' choices, nothing timed
  bo.poison = true;
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<cuda::Engine> engine, cuda::Engine::build(g, bo));
  std::string host;
  int n = 0;
  for (const cuda::NodePlacement& p : engine->report().nodes) {
    if (p.placement != cuda::Placement::kHost) continue;
    if (n++ < 3) host += fmt::format("{}{} [{}]", host.empty() ? "" : "; ", p.node, p.why);
  }
  if (n) return KILN_ERROR(kUnsupported, "{} node(s) would run on the CPU: {}{}", n, host, n > 3 ? "; ..." : "");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<cuda::Session> s, engine->new_session());
  std::shared_ptr<cuda::Session> session(std::move(s));
  return RunFn([engine, session](const std::vector<Data>& in) { return session->run(in); });
}

bool cuda_usable(std::string* reason) { return cuda::gpu_available(reason); }

}  // namespace kiln::conformance
