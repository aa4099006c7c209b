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
// the identity of its inputs: their storage address, dtype and dims. Entries keep their inputs alive,
// so an address is never reused for other data while the memo lives. Only results whose inputs all
// have more than kMinElements elements are remembered: clone_graph shares the storage of exactly those
// constants between copies (smaller ones are printed and parsed again), so only their addresses
// repeat from one copy to the next; an entry keyed by a copy's own small constant would never be found
// again and would only grow the memo. Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ir/tensor.h"
#include "support/status.h"

namespace kiln {

class DerivedConstants {
 public:
  static constexpr int64_t kMinElements = 17;  // runtime/engine_file.cc: constants of 16 or fewer are inlined
  static constexpr size_t kMaxEntries = 1 << 16;  // past this, results are made but not remembered

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
  size_t reused_ = 0;
};

}  // namespace kiln
