#include "backends/cuda/weight_pool.h"

#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"

namespace kiln::cuda {

WeightPool::~WeightPool() {
  std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
  for (auto& e : entries_) {
    if (e->dev) cudaFree(e->dev);
  }
}

int WeightPool::add(std::string bytes) {
  auto e = std::make_unique<Entry>();
  e->bytes = bytes.size();
  e->host = std::move(bytes);
  entries_.push_back(std::move(e));
  return int(entries_.size() - 1);
}

int WeightPool::intern_bytes(std::string_view bytes) {
  const size_t h = std::hash<std::string_view>{}(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto [lo, hi] = by_hash_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (entries_[size_t(it->second)]->host == bytes) return it->second;
  }
  int id = add(std::string(bytes));
  by_hash_.emplace(h, id);
  return id;
}

Expected<int> WeightPool::intern_tensor(const Tensor& t, int dt, std::string_view form,
                                        const std::function<Expected<std::string>()>& make) {
  const auto key = std::make_tuple(static_cast<const void*>(t.raw()), t.nbytes(), dt, std::string(form));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = by_tensor_.find(key); it != by_tensor_.end()) return it->second;
  }
  KILN_ASSIGN_OR_RETURN(std::string bytes, make());  // outside the lock: conversions take time
  const size_t h = std::hash<std::string_view>{}(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = by_tensor_.find(key); it != by_tensor_.end()) return it->second;  // another thread won
  // A weight the passes made again for this plan (a folded batch norm, merged projections): the
  // same bytes as an earlier plan's, found by them. Its tensor is not kept: only the first is.
  auto [lo, hi] = by_hash_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (entries_[size_t(it->second)]->host == bytes) return it->second;
  }
  int id = add(std::move(bytes));
  by_hash_.emplace(h, id);
  by_tensor_.emplace(key, id);
  keep_.push_back(t);
  return id;
}

Expected<void*> WeightPool::device(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || size_t(id) >= entries_.size()) return KILN_ERROR(kInternal, "weight pool id {} out of range", id);
  Entry& e = *entries_[size_t(id)];
  if (e.dev || e.bytes == 0) return e.dev;
  Status st = cuda_status(cudaMalloc(&e.dev, e.bytes), "cudaMalloc (weights)");
  if (!st) {
    e.dev = nullptr;
    return Status(st.code(), fmt::format("uploading a {:.1f} MiB weight: {}", double(e.bytes) / (1 << 20), st.message()));
  }
  KILN_CUDA_TRY(cudaMemcpy(e.dev, e.host.data(), e.bytes, cudaMemcpyHostToDevice));
  device_bytes_ += e.bytes;
  return e.dev;
}

std::string_view WeightPool::host(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return id >= 0 && size_t(id) < entries_.size() ? std::string_view(entries_[size_t(id)]->host) : std::string_view();
}

size_t WeightPool::size(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return id >= 0 && size_t(id) < entries_.size() ? entries_[size_t(id)]->bytes : 0;
}

size_t WeightPool::device_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_bytes_;
}

}  // namespace kiln::cuda
