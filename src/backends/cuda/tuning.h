// Build-time timing of library and kiln kernels as they run inside a forward (pick_lt_algo,
// time_sm90): back to back, captured in one CUDA graph, each launch's weight cold in L2.
//
//   ProductOperands op(a_bytes, w_bytes, d_bytes, has_residual);
//   for (each candidate) {
//     float ms = time_in_graph(op.launches, [&](int i, cudaStream_t s) {
//       return my_gemm(op.a.copy(i), op.w.copy(i), d, s) == cudaSuccess;
//     });
//   }
//   KILN_RETURN_IF_ERROR(finish_timing("my_gemm m=.."));
//
// Timing one launch between two events counts the launch latency the graph hides and is noisy at a
// few microseconds: per-shape choices moved from build to build, and small-M tiles that won alone
// lost inside the graph (bench/RESULTS.md, "GEMM autotuning timed inside a captured graph (e558536)").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

#include "support/status.h"

namespace kiln::cuda {

// Device copies of a `bytes`-byte operand filled with 0x3c bytes (1.06 in fp16). `cold`: as many
// as make cycling through them read twice the L2, at most 64, so that each launch of a timed
// sequence reads its operand from DRAM as a forward reads its weights (operands under 2 x L2 / 64,
// 1.6 MB on the H100, cycle through less than that and stay partly in L2); otherwise one copy,
// which stays in L2 as far as it fits (an activation the previous kernel just wrote). ok() is
// false when the allocation failed.
class RotatingCopies {
 public:
  explicit RotatingCopies(size_t bytes, bool cold = true);
  ~RotatingCopies();
  RotatingCopies(const RotatingCopies&) = delete;
  RotatingCopies& operator=(const RotatingCopies&) = delete;

  bool ok() const { return base_ != nullptr; }
  int copies() const { return copies_; }
  // Launches per timed graph: every copy once, at least 8 (the larger of two operands' counts
  // when both rotate).
  int launches() const { return copies_ < 8 ? 8 : copies_; }
  void* copy(int i) const { return static_cast<char*>(base_) + size_t(i % copies_) * pitch_; }

 private:
  void* base_ = nullptr;
  size_t pitch_ = 0;
  int copies_ = 1;
};

// The operands of a product D = A . W (+ C) for timing. The weight is cold: a model's weights do not
// fit the L2. The activations (A, the residual C) were written by the kernels just before and are
// still in L2, unless the operands together outgrow half of it: then the forward streams them
// through DRAM as well, and they rotate too (timed with A and C hot, BERT b64's FFN-down chose a tile
// that was slower in the model than all-cold timing's: bench/RESULTS.md, "GEMM autotuning timed
// inside a captured graph (e558536)").
// c is a 256-byte stand-in without a residual. launches: every rotating operand's copies once.
struct ProductOperands {
  ProductOperands(size_t a_bytes, size_t w_bytes, size_t d_bytes, bool has_c);
  bool ok() const { return a.ok() && w.ok() && c.ok(); }

  const bool cold_activations;
  RotatingCopies a, w, c;
  const int launches;
};

// Captures launch(0..launches-1) on a private stream into one graph, replays it until the clocks
// have settled (4 replays and 2 ms, or 64 replays), and returns the median of the last three
// replays divided by `launches`: milliseconds per launch. Launch 0 runs once first, outside the
// graph: a candidate that refuses its operands is not captured. -1 when a launch or the capture
// fails (the candidate is then not chosen; a non-sticky CUDA error is cleared, a sticky one stays
// for finish_timing).
float time_in_graph(int launches, const std::function<bool(int, cudaStream_t)>& launch);

// After timing `what`'s candidates: an error if one of them broke the CUDA context (later steps
// would otherwise fail far from the cause), ok with any other error cleared.
Status finish_timing(const std::string& what);

}  // namespace kiln::cuda
