// tensor-parallel: one rank's share of a model split across `ranks` GPUs, Megatron style. The pass
// runs once per rank on a copy of the same graph; each copy keeps its rank's slices of the split
// weights and the collectives (ai.kiln.AllReduce / AllGather) that join the ranks.
//
//   TensorParallelReport rep;
//   std::vector<Pass> p = tensor_parallel_pipeline(2, rank, &rep);   // the default pipeline with it
//   run_passes(rank_graph, p);
//
// See tensor_parallel.cc for the rules (which products split by columns, which by rows, how a
// split travels through reshapes, attention and elementwise ops) and what keeps a layer whole.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln {

struct TensorParallelReport {
  int ranks = 1;
  std::vector<std::string> column;      // products whose weight columns split (their outputs split)
  std::vector<std::string> row;         // products whose weight rows split (an AllReduce follows)
  std::vector<std::string> vocab;       // embedding tables split by rows (an AllReduce follows)
  std::vector<std::string> kept_whole;  // "node: why" for products every rank computes whole
  int all_reduces = 0, all_gathers = 0;
  size_t weight_bytes_whole = 0;  // the float weights before the split
  size_t weight_bytes_rank = 0;   // this rank's after it
  // Per forward, the bytes each collective carries (its tensor's size), for the estimator.
  size_t all_reduce_bytes = 0, all_gather_bytes = 0;
  size_t max_all_reduce_bytes = 0;  // the largest one's
  std::string to_text() const;
};

// The pass: rewrites `g` (static shapes, after fold-constants) into rank `rank` of `ranks`. Fails
// with a one-line error when the graph's inputs are not fixed; a model with nothing to split is
// left whole (the report says why).
Expected<bool> shard_tensor_parallel(Graph& g, int ranks, int rank, TensorParallelReport* report = nullptr);

}  // namespace kiln
