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
  std::vector<std::vector<size_t>> readers(nb);
  for (size_t i = 0; i < L.steps.size(); ++i) {
    for (int b : L.steps[i].writes) writer[size_t(b)] = writer[size_t(b)] == -1 ? int(i) : -2;
    for (int b : L.steps[i].reads) readers[size_t(b)].push_back(i);
  }
  for (size_t i = 0; i < L.steps.size(); ++i) {
    auto ia = L.copy_records.find(i);
    if (ia == L.copy_records.end()) continue;
    const CopyRecord a = ia->second;
    const size_t b = size_t(a.dst.id);
    if (a.dst.weight || writer[b] != int(i) || (b < pinned.size() && pinned[b]) || a.zero_bytes ||
        readers[b].empty()) {
      continue;
    }
    std::vector<std::pair<size_t, StridedCopy>> folded;
    for (size_t r : readers[b]) {
      auto ib = L.copy_records.find(r);
      if (r <= i || ib == L.copy_records.end() || ib->second.src.weight || size_t(ib->second.src.id) != b ||
          ib->second.eb != a.eb) {
        break;
      }
      // The reader will read a's source: nothing may write it in between.
      bool clobbered = false;
      for (size_t j = i + 1; j < r && !a.src.weight; ++j) {
        const auto& w = L.steps[j].writes;
        clobbered = clobbered || std::find(w.begin(), w.end(), a.src.id) != w.end();
      }
      auto c = clobbered ? std::nullopt : compose_copies(a.copy, ib->second.copy, k::kMaxRank);
      if (!c) break;
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
      if (!a.src.weight) {
        s.reads.push_back(a.src.id);
        readers[size_t(a.src.id)].push_back(r);
      }
    }
    readers[b].clear();
    L.steps[i].drop_if_unread = true;
  }
}

}  // namespace kiln::cuda
