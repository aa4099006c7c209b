// The CUDA side of kiln_conformance (--device cuda), compiled only when the CUDA backend is.
#pragma once

#include <functional>
#include <vector>

#include "ir/graph.h"
#include "support/status.h"

namespace kiln::conformance {

using RunFn = std::function<Expected<std::vector<Data>>(const std::vector<Data>&)>;

// Builds g as a CUDA engine at fp32 (no TF32), with the library heuristics' choices (nothing timed)
// and each session's arena filled with NaN bytes first, so a kernel reading memory nothing wrote
// shows as a wrong answer. CPU fallback is forbidden: a node the plan would run as a host step is an
// error naming it and why the GPU declined it.
Expected<RunFn> compile_cuda(const Graph& g);

// Whether a GPU is usable here (the reason when not). Call it only in a child process: it starts
// the CUDA runtime, which a process must not fork after.
bool cuda_usable(std::string* reason);

}  // namespace kiln::conformance
