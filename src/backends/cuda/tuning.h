// Build-time timing of library and kiln kernels as they run inside a forward (pick_lt_algo,
// time_small): back to back, captured in one CUDA graph, each launch's weight cold in L2.
//
//   RotatingCopies w(bytes_of_weight);            // enough copies to stream ~2x the L2 from DRAM
//   float ms = time_in_graph(w.launches(), [&](int i, cudaStream_t s) {
//     return my_gemm(a, w.copy(i), d, s) == cudaSuccess;
//   });
//
// Timing one launch between two events (the method before 2026-11-24) counts the launch latency
// the graph hides and is noisy at a few microseconds: per-shape choices moved from build to build
// (BERT b64 FFN-down 63 vs 74 us) and small-M tiles that won alone lost inside the graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

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

// Whether a product's activations are cold in a forward: its operands together (bytes) outgrow
// half the L2, so the kernels before it have streamed them through DRAM rather than left them in
// L2 (pick_lt_algo and time_small time such products with the activations rotating too).
bool operands_outgrow_l2(size_t bytes);

// Captures launch(0..launches-1) on a private stream into one graph, replays it until the clocks
// have settled (4 replays and 2 ms, or 64 replays), and returns the median of the last three
// replays divided by `launches`: milliseconds per launch. -1 when a launch or the capture fails
// (the candidate is then not chosen; a non-sticky CUDA error is cleared, a sticky one stays for
// the caller's next call to report).
float time_in_graph(int launches, const std::function<bool(int, cudaStream_t)>& launch);

}  // namespace kiln::cuda
