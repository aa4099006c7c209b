// Constants the passes derive from other constants (projection weights merged side by side, a batch
// norm folded into a convolution's weights, a weight transposed or cast by fold-constants),
// remembered across the graphs that share one set of weights. A dynamic engine optimizes a copy of
// its graph for each input shape it meets (specialize_graph); without this, every copy would make
// those constants again (BERT-base: 85 MB of merged Q/K/V weights per shape), and the device weight
// pool would then convert, hash and compare them to find that it already holds them. With it, the
// second copy receives the very tensors the first made, which the pool finds by their storage.
//
//   DerivedConstants memo;
//   KILN_ASSIGN_OR_RETURN(Tensor w, memo.get("concat-columns", {&wq, &wk, &wv}, [&] { return concat(...); }));
//
// An entry is found by its recipe (the operation and every parameter that shapes the result) and by
// the identity of its inputs: their storage address, dtype and dims. Only results made from storage
// the copies share are remembered: the source graph's constants, which clone_graph does not copy
// (share() names them), and the memo's own results. A copy's own constants (small ones clone_graph
// prints again, weights fold-constants made in that copy) have new addresses in every copy: an entry
// keyed by one would never be found again and would only grow the memo. Entries keep their inputs
// alive, so an address is never reused for other data while the memo lives. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "ir/tensor.h"
#include "support/status.h"

namespace kiln {

class DerivedConstants {
 public:
  static constexpr size_t kMaxEntries = 1 << 16;  // past this, results are made but not remembered
  // Marks t's storage as shared by the copies (a constant of the graph they are copied from).
  void share(const Tensor& t);

  // The tensor `make` returns for `recipe` over `inputs`, made on the first request only. A failed
  // make is returned and not remembered.
  Expected<Tensor> get(const std::string& recipe, const std::vector<const Tensor*>& inputs,
                       const std::function<Expected<Tensor>()>& make);
  size_t made() const;    // entries made so far
  size_t reused() const;  // requests answered from an entry

 private:
  struct Entry {
    std::vector<Tensor> inputs;  // kept alive: the key holds their addresses
    Tensor out;
  };
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  std::unordered_set<const void*> shared_;  // storage the copies share: share()'s and the results
  size_t reused_ = 0;
};

}  // namespace kiln
