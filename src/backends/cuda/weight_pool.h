// Device weights shared by the shape plans of one dynamic engine (src/api/gpu_dynamic.cc). Each
// exact input shape of a dynamic engine is lowered to a plan of its own, and every plan reads the
// same weights: the pool uploads each distinct weight once and hands every plan the same device
// copy. A weight is found again by what it was made from: a graph constant converted to a device
// dtype by the tensor's identity (its storage is shared by every plan's graph, and the pool keeps
// it alive so its address is never reused), also when a lowering rearranged it (a convolution's
// filter transposed to KRSC: the form is part of the key), else by its bytes (a hash, then a compare): a weight
// the graph passes made again for another shape's plan is found by its bytes.
//
//   auto pool = std::make_shared<WeightPool>();
//   opt.weight_pool = pool;  Engine::build(g1, opt);  Engine::build(g2, opt);   // one upload each
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "ir/tensor.h"
#include "support/status.h"

namespace kiln::cuda {

class WeightPool {
 public:
  WeightPool() = default;
  ~WeightPool();
  WeightPool(const WeightPool&) = delete;
  WeightPool& operator=(const WeightPool&) = delete;

  // The id of a weight holding `bytes`.
  int intern_bytes(std::string_view bytes);
  // The id of graph constant `t` as device dtype `dt` in layout `form` ("" for as is; a lowering's
  // name for a rearrangement, e.g. a filter in KRSC order, with whatever parameters it depends on);
  // `make` converts it on the first request.
  Expected<int> intern_tensor(const Tensor& t, int dt, std::string_view form,
                              const std::function<Expected<std::string>()>& make);
  // The device copy of weight `id` (uploaded on the first request); its size in bytes.
  Expected<void*> device(int id);
  size_t size(int id) const;
  // Its bytes on the host (kept: later plans' lowerings read some, e.g. to transpose a GEMM weight).
  std::string_view host(int id) const;
  size_t device_bytes() const;  // uploaded so far

 private:
  struct Entry {
    std::string host;  // the bytes (a hash match is compared with them)
    size_t bytes = 0;
    void* dev = nullptr;
  };
  int add(std::string bytes);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_;
  std::unordered_multimap<size_t, int> by_hash_;
  std::map<std::tuple<const void*, size_t, int, std::string>, int, std::less<>> by_tensor_;
  std::vector<Tensor> keep_;  // the constants keyed by address
  size_t device_bytes_ = 0;
};

}  // namespace kiln::cuda
