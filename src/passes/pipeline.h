// The default optimization pipeline: the passes kiln runs on every imported graph before a
// backend compiles it, in order, each with the reason it is there (pipeline.cc reads like a
// table of contents).
//
//   KILN_ASSIGN_OR_RETURN(PassReport r, run_passes(*model.graph, default_pipeline(), options));
#pragma once

#include <string_view>
#include <vector>

#include "passes/pass_manager.h"

namespace kiln {

class DerivedConstants;  // passes/derived_constants.h
// `memo` (may be null): where the passes that derive weights from weights (merge-sibling-matmuls,
// fold-batchnorm) find those an earlier run over a graph sharing these weights made.
std::vector<Pass> default_pipeline(DerivedConstants* memo = nullptr);

// The pass a CPU engine skips (src/api/build.cc says why): its QDQ products stay Q/DQ and MatMul,
// their weights dequantized by fold-constants, for the CPU's fp32 kernels.
inline constexpr std::string_view kCpuSkippedPass = "fuse-qdq-matmul";

struct TensorParallelReport;  // passes/tensor_parallel.h
// The default pipeline for rank `rank` of a model split over `ranks` (BuildConfig::tensor_parallel):
// "tensor-parallel" runs after canonicalize and propagate-layout, which leave constant targets and
// direct producer-consumer links, and before the fusions, which then see each rank's smaller graph.
// `report` (may be null) receives what the split did.
std::vector<Pass> tensor_parallel_pipeline(int ranks, int rank, TensorParallelReport* report);

}  // namespace kiln
