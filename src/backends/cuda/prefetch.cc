// L2 prefetch of streamed weights. At small batch a transformer's GEMMs read far more weight than
// activation bytes (BERT-base at batch 1: 14 MB of weights per layer against 0.2 MB of
// activations), and each one is a few microseconds of a handful of CTAs waiting on HBM. The H100's
// L2 (50 MB) holds a whole layer, so the weights are fetched one group ahead on a side stream
// (a one-warp-per-CTA kernel issuing bulk prefetches, kernels.h l2_prefetch) while the GEMMs of the
// previous group run from L2. Nothing waits on a prefetch: it is a hint, joined back to the main
// stream only at the end of the forward.
//
// Opt-in (BuildOptions::l2_prefetch_bytes, KILN_L2_PREFETCH_MB): measured on the H100 at batch 1
// (2026-11-24) it takes 1-3% off BERT-base and GPT-2 but adds 1-4% to ViT-B/16, i.e. the GEMMs
// gain far less from L2-resident weights than their 3-5x distance from the DRAM floor suggested:
// at M = 128 what they wait on is mostly not weight bytes.
#include <cstdlib>
#include <set>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

size_t budget_bytes(const BuildOptions& opt) {
  if (const char* e = std::getenv("KILN_L2_PREFETCH_MB"); e && *e) return size_t(std::max(0, std::atoi(e))) << 20;
  return opt.l2_prefetch_bytes;
}

}  // namespace

void plan_l2_prefetch(Lowering& L) {
  L.prefetches.clear();
  const size_t budget = budget_bytes(L.options());
  if (budget == 0) return;
  // Consecutive streamed weights up to `budget` bytes form a group; group g is fetched as group
  // g-1's first step starts (the first group at the forward's start), so at most two groups are
  // resident in L2 beside the activations. A step on the host synchronizes and may evict what was
  // fetched, so no group spans one and the next is fetched after it.
  size_t group_first = 0, after_host = 0;
  bool open = false;  // a group is open and no host step came since it started
  std::set<int> seen;  // a weight read by several steps is fetched for the first
  for (size_t i = 0; i < L.steps.size(); ++i) {
    const Step& s = L.steps[i];
    if (s.host) {
      open = false;
      after_host = i + 1;
      continue;
    }
    if (s.streamed.id < 0 || s.streamed_bytes > budget || !seen.insert(s.streamed.id).second) continue;
    const size_t bytes = (s.streamed_bytes + 15) / 16 * 16;  // weights are 256-byte aligned and padded
    if (!open || L.prefetches.back().bytes + bytes > budget ||
        int(L.prefetches.back().ranges.size()) == k::L2Ranges::kMax) {
      L2Prefetch f;
      f.before = open ? group_first : after_host;
      L.prefetches.push_back(std::move(f));
      group_first = i;
      open = true;
    }
    L2Prefetch& f = L.prefetches.back();
    f.ranges.emplace_back(s.streamed, bytes);
    f.bytes += bytes;
  }
}

}  // namespace kiln::cuda
