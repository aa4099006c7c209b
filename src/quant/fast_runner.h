// The model runs `kiln quantize` makes (calibration with every observed activation as an output,
// the fp32 reference on the evaluation set, each quantized candidate's accuracy) on the fast CPU
// backend: the default passes (less fuse-qdq-matmul, as for any CPU engine), then oneDNN's kernels
// where it has them (backends/cpu/fast_plan.h), the reference kernels for the rest. ResNet-50 calibrates at tens of milliseconds a sample instead
// of the reference backend's two seconds. Where oneDNN cannot be loaded, the reference backend
// runs the graph as given.
#pragma once

#include <memory>

#include "backends/backend.h"

namespace kiln {

// An Executable for g (outputs in g's order; g itself is not changed).
Expected<std::unique_ptr<Executable>> compile_fast_cpu(const Graph& g);

}  // namespace kiln
