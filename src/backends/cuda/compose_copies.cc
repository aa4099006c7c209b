// Copies of copies collapse (lower.h, compose_copy_steps). Data movement lowers to one copy_nd step
// per node, each into a fresh buffer: ShuffleNet's channel shuffle is a conversion of the
// concatenation from NHWC, a Transpose, two Slices and their conversions back to NHWC, five passes
// over the same bytes. Each copy whose readers are all copies is folded into them, in step order,
// so a chain ends as one copy from its first source per final reader.
#include <algorithm>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

void compose_copy_steps(Lowering& L, const std::vector<bool>& pinned) {
  const size_t nb = L.buffer_bytes.size();
  std::vector<int> writer(nb, -1);  // the one step writing each buffer; -2: several
  std::vector<std::vector<size_t>> readers(nb), writes(nb);
  for (size_t i = 0; i < L.steps.size(); ++i) {
    for (int b : L.steps[i].writes) {
      writer[size_t(b)] = writer[size_t(b)] == -1 ? int(i) : -2;
      writes[size_t(b)].push_back(i);
    }
    for (int b : L.steps[i].reads) readers[size_t(b)].push_back(i);
  }
  // The record of step i when it is a copy_nd step (a record outlives nothing: checked anyway).
  auto copy_at = [&](size_t i) -> CopyRecord* {
    auto it = L.copy_records.find(i);
    return it != L.copy_records.end() && L.steps[i].kind == uint16_t(StepOp::kCopyNd) ? &it->second : nullptr;
  };
  for (size_t i = 0; i < L.steps.size(); ++i) {
    const CopyRecord* ia = copy_at(i);
    if (!ia) continue;
    const CopyRecord a = *ia;
    const size_t b = size_t(a.dst.id);
    if (a.dst.weight || writer[b] != int(i) || (b < pinned.size() && pinned[b]) || a.zero_bytes ||
        readers[b].empty()) {
      continue;
    }
    std::vector<std::pair<size_t, StridedCopy>> folded;
    for (size_t r : readers[b]) {
      const CopyRecord* rb = r > i ? copy_at(r) : nullptr;
      if (!rb || rb->src.weight || size_t(rb->src.id) != b || rb->eb != a.eb) break;
      auto c = compose_copies(a.copy, rb->copy, k::kMaxRank);
      if (!c) break;
      // The reader will read a's source: nothing may write it in between.
      if (!a.src.weight) {
        const std::vector<size_t>& w = writes[size_t(a.src.id)];
        auto next = std::upper_bound(w.begin(), w.end(), i);
        if (next != w.end() && *next < r) break;
      }
      folded.emplace_back(r, std::move(*c));
    }
    if (folded.size() != readers[b].size()) continue;  // all or none: a kept copy saves nothing
    for (auto& [r, c] : folded) {
      CopyRecord& rec = L.copy_records[r];
      rec.src = a.src;
      rec.copy = std::move(c);
      Step& s = L.steps[r];
      s.params = std::move(encode_copy(rec).bytes());
      s.reads.clear();
      if (!a.src.weight) s.reads.push_back(a.src.id);
    }
    L.steps[i].drop_if_unread = true;
  }
}

}  // namespace kiln::cuda
