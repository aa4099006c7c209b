#include "passes/derived_constants.h"

#include <fmt/format.h>

namespace kiln {

Expected<Tensor> DerivedConstants::get(const std::string& recipe, const std::vector<const Tensor*>& inputs,
                                       const std::function<Expected<Tensor>()>& make) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Tensor* t : inputs) {
      if (!t->raw() || !shared_.count(t->raw())) return make();
    }
  }
  std::string key = recipe;
  for (const Tensor* t : inputs) {
    key += fmt::format("|{}:{}:", fmt::ptr(t->raw()), int(t->dtype()));
    for (int64_t d : t->dims()) key += fmt::format("{},", d);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      ++reused_;
      return it->second.out;
    }
  }
  KILN_ASSIGN_OR_RETURN(Tensor out, make());  // outside the lock: making one takes time
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.size() >= kMaxEntries && !entries_.count(key)) return out;
  auto [it, fresh] = entries_.try_emplace(std::move(key));
  if (fresh) {
    for (const Tensor* t : inputs) it->second.inputs.push_back(*t);
    it->second.out = std::move(out);
    if (it->second.out.raw()) shared_.insert(it->second.out.raw());
  }
  return it->second.out;  // another thread's, when it made the same one first
}

void DerivedConstants::share(const Tensor& t) {
  std::lock_guard<std::mutex> lock(mu_);
  if (t.raw()) shared_.insert(t.raw());
}

size_t DerivedConstants::made() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t DerivedConstants::reused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reused_;
}

}  // namespace kiln
