// Offsets for device activation buffers inside one arena, from their lifetimes: two values that
// are never live at the same step may share bytes, so the arena can be far smaller than one
// buffer per value. The runtime Plan allocates `peak` bytes once and binds every value to
// arena + offset; the planner never sees graph inputs/outputs (DESIGN.md rule 11: those are
// never aliased), the caller leaves them out of `requests`.
//
// Depends only on the standard library so that tools and tests can plan without the IR.
//
//   std::vector<BufferRequest> reqs = {{4096, 0, 1}, {1024, 1, 2}, {4096, 2, 3}};
//   MemoryPlan plan = plan_memory(reqs);          // reqs[0] and reqs[2] share offset 0
//   assert(check_memory_plan(reqs, plan).empty());
//   void* arena = device_alloc(plan.peak);        // value i lives at arena + plan.offsets[i]
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kiln {

// One value's buffer: live in [first_step, last_step], inclusive, where steps index the
// execution order. A producer's output and its consumer's inputs are live at the same step, so a
// value last read at step s cannot share bytes with one first written at step s. first_step must
// not exceed last_step; a reversed range is planned as the swapped range (never less overlap than
// either reading) and reported by check_memory_plan.
struct BufferRequest {
  size_t bytes = 0;
  int first_step = 0;
  int last_step = 0;
};

struct MemoryPlan {
  std::vector<size_t> offsets;  // one per request, each a multiple of the alignment
  size_t peak = 0;              // arena size needed: max over requests of offset + aligned bytes
  size_t naive = 0;             // sum of all aligned sizes (one buffer per value)
  size_t lower_bound = 0;       // max over steps of the aligned bytes live at that step; no
                                // assignment of offsets can need less than this
};

// Greedy by size (Pisarchyk & Lee 2020, "Efficient Memory Management for Deep Neural Net
// Inference"; the TFLite arena planner does the same): largest buffer first, ties by earlier
// first_step, then by index, so the plan is deterministic. Each goes into the tightest gap that
// fits between the already-placed buffers whose lifetimes intersect its own (lowest such gap on a
// tie), else just above the highest of them. Zero-byte requests get offset 0 and occupy nothing.
// O(n^2) in the worst case (everything live at once); about O(n k log n) when at most k buffers
// are live together, the usual shape of a graph. An alignment of 0 is treated as 1.
MemoryPlan plan_memory(const std::vector<BufferRequest>& requests, size_t alignment = 256);

// Checks a plan against its requests: one offset per request, each a multiple of `alignment`,
// each buffer inside [0, peak), every lifetime well-formed, and no two requests whose lifetimes
// intersect sharing a byte. Returns an empty string when valid, else a description of the first
// violation found. Meant for tests and debug builds; it does not recompute naive/lower_bound.
std::string check_memory_plan(const std::vector<BufferRequest>& requests, const MemoryPlan& plan,
                              size_t alignment = 256);

}  // namespace kiln
