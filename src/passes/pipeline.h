// The default optimization pipeline: the passes kiln runs on every imported graph before a
// backend compiles it, in order, each with the reason it is there (pipeline.cc reads like a
// table of contents).
//
//   KILN_ASSIGN_OR_RETURN(PassReport r, run_passes(*model.graph, default_pipeline(), options));
#pragma once

#include <vector>

#include "passes/pass_manager.h"

namespace kiln {

std::vector<Pass> default_pipeline();

}  // namespace kiln
