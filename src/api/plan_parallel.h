// The tensor-parallel estimator (`kiln plan-parallel model.onnx --gpus 1,2,4,8`): for each GPU count,
// what one GPU holds (weights, activations for the given shapes, the KV a cache would keep per
// token) and what the ranks exchange per forward and per token, from the same split a
// `--tensor-parallel` build makes. Times come from a link bandwidth: measured here through NCCL
// when the GPUs are present, else the one the caller gives.
//
//   KILN_ASSIGN_OR_RETURN(auto rows, estimate_parallel("gpt2.onnx", config, {1, 2, 4, 8}));
//   for (const ParallelEstimate& r : rows) ... r.weight_bytes, r.bus_bytes ...
#pragma once

#include <string>
#include <vector>

#include "kiln/engine.h"

namespace kiln {

struct ParallelEstimate {
  int gpus = 1;
  size_t weight_bytes = 0;      // per GPU, stored in the build's precision
  size_t activation_bytes = 0;  // per GPU: the planned arena of one forward at the given shapes
  double kv_bytes_per_token = 0;  // per GPU: keys and values attention reads, per token
  double tokens = 0;            // tokens per forward: the largest integer input's elements (ids), else the batch
  int all_reduces = 0, all_gathers = 0;
  size_t payload_bytes = 0;     // per forward: the collectives' tensors, in the build's precision
  // Per forward, what each GPU sends over its links in ring algorithms: 2(n-1)/n of each
  // AllReduce's tensor, (n-1)/n of each gathered result (NCCL's "bus bandwidth" accounting).
  double bus_bytes = 0;
  std::vector<std::string> kept_whole;  // products the split leaves whole, and why
};

// Estimates for each count in `gpus` (1 is the unsplit model). `config` gives shapes and precision.
Expected<std::vector<ParallelEstimate>> estimate_parallel(const std::string& onnx_path, const BuildConfig& config,
                                                          const std::vector<int>& gpus);

// NCCL all-reduce of `bytes` (fp16 elements) across GPUs 0..n-1 of this process: median ms per call
// over `iterations` after a warmup. kUnsupported without n GPUs or NCCL.
Expected<double> measure_all_reduce_ms(int n, size_t bytes, int iterations);

}  // namespace kiln
