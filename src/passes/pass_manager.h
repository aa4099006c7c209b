// The pass manager: runs a list of graph passes once each, in order (DESIGN.md rule 2). A pass
// is a name (kebab-case, as in flags and logs), the reason it is in the pipeline, and a function
// Graph& -> Expected<bool> that says whether it changed the graph. A pass that needs a fixpoint
// iterates inside itself.
//
//   PassOptions opt;
//   opt.disabled = {"cse"};
//   opt.dump_ir_after = "canonicalize";        // or "all"
//   opt.dump_to = &std::cerr;
//   KILN_ASSIGN_OR_RETURN(PassReport r, run_passes(g, default_pipeline(), opt));
//   std::cerr << r.to_text();
//
// Between passes the IR verifier runs (always in debug builds, and whenever opt.verify is set);
// a graph the verifier rejects is an error that names the pass that produced it.
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

using PassFn = std::function<Expected<bool>(Graph&)>;

struct Pass {
  std::string name;    // kebab-case: "fold-batchnorm"
  std::string reason;  // why it is in the pipeline, and why there
  PassFn run;
};

struct PassOptions {
  // Passes to skip, by name; a name that is not in the pipeline is an error listing the valid ones.
  std::vector<std::string> disabled;
  // Print the IR after this pass ("all": after every pass, "": never) to dump_to, with tensors
  // over 16 elements elided (`dense<f32[64,3,7,7]> ...`).
  std::string dump_ir_after;
  std::ostream* dump_to = nullptr;  // null: std::cerr
  // Run the verifier on the input and after every pass. nullopt: on in debug builds (!NDEBUG).
  std::optional<bool> verify;
  // Record which pass removed each node and where its work went (Graph::absorbed, for the build
  // report's placements). Off for graphs whose report nobody reads (a dynamic engine's shape plans
  // made while serving): the bookkeeping is about a third of the pipeline's time on a BERT.
  bool track_provenance = true;
};

struct PassRecord {
  std::string name;
  bool skipped = false;  // disabled by PassOptions::disabled
  bool changed = false;
  double ms = 0;
  size_t nodes_before = 0, nodes_after = 0;
};

struct PassReport {
  std::vector<PassRecord> passes;
  double total_ms = 0;
  // A small table: pass, ms, nodes before -> after, changed.
  std::string to_text() const;
};

// Checks the option names against the pipeline without running anything.
Status check_pass_options(const std::vector<Pass>& passes, const PassOptions& opt);

Expected<PassReport> run_passes(Graph& g, const std::vector<Pass>& passes, const PassOptions& opt = {});

}  // namespace kiln
