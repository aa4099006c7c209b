#include "runtime/strided_view.h"

#include <numeric>

namespace kiln {

StridedView StridedView::contiguous(const std::vector<int64_t>& dims) {
  StridedView v;
  int64_t stride = 1;
  v.dims_.resize(dims.size());
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i] != 1) v.dims_[i].push_back({dims[i], stride});
    stride *= dims[i];
  }
  return v;
}

std::vector<int64_t> StridedView::dims() const {
  std::vector<int64_t> d;
  for (const auto& atoms : dims_) {
    int64_t n = 1;
    for (const Atom& a : atoms) n *= a.first;
    d.push_back(n);
  }
  return d;
}

bool StridedView::transpose(const std::vector<int64_t>& perm) {
  if (perm.size() != dims_.size()) return false;
  std::vector<bool> seen(perm.size(), false);
  std::vector<std::vector<Atom>> out;
  for (int64_t p : perm) {
    if (p < 0 || p >= int64_t(perm.size()) || seen[size_t(p)]) return false;
    seen[size_t(p)] = true;
    out.push_back(dims_[size_t(p)]);
  }
  dims_ = std::move(out);
  return true;
}

bool StridedView::reshape(const std::vector<int64_t>& new_dims) {
  std::vector<Atom> flat;  // outermost first; size-1 atoms carry nothing
  for (const auto& atoms : dims_) {
    for (const Atom& a : atoms) {
      if (a.first != 1) flat.push_back(a);
    }
  }
  std::vector<std::vector<Atom>> out;
  size_t next = 0;
  for (int64_t want : new_dims) {
    if (want < 1) return false;
    std::vector<Atom> atoms;
    int64_t have = 1;
    while (have < want) {
      if (next >= flat.size()) return false;
      Atom& a = flat[next];
      int64_t need = want / have;
      if (want % have != 0) return false;
      if (a.first <= need) {
        if (need % a.first != 0) return false;
        atoms.push_back(a);
        have *= a.first;
        ++next;
      } else {  // take the outer `need` of this atom; its inner part stays for the next dim
        if (a.first % need != 0) return false;
        int64_t inner = a.first / need;
        atoms.push_back({need, a.second * inner});
        a.first = inner;
        have *= need;
      }
    }
    out.push_back(std::move(atoms));
  }
  if (next != flat.size()) return false;
  dims_ = std::move(out);
  return true;
}

bool StridedView::select(int axis, int64_t index, bool keep_dim) {
  if (axis < 0 || axis >= int(dims_.size())) return false;
  std::vector<int64_t> d = dims();
  int64_t n = d[size_t(axis)];
  if (index < 0) index += n;
  if (index < 0 || index >= n) return false;
  auto& atoms = dims_[size_t(axis)];
  for (size_t i = atoms.size(); i-- > 0;) {  // row-major digits of index, innermost first
    offset_ += (index % atoms[i].first) * atoms[i].second;
    index /= atoms[i].first;
  }
  if (keep_dim) atoms.clear();
  else dims_.erase(dims_.begin() + axis);
  return true;
}

bool StridedView::narrow(int axis, int64_t start, int64_t length) {
  if (axis < 0 || axis >= int(dims_.size())) return false;
  auto& atoms = dims_[size_t(axis)];
  int64_t n = dims()[size_t(axis)];
  if (start < 0 || length < 1 || start + length > n) return false;
  if (start == 0 && length == n) return true;
  if (atoms.size() > 1) return false;
  if (atoms.empty()) return true;  // size 1: start 0, length 1
  offset_ += start * atoms[0].second;
  if (length == 1) atoms.clear();
  else atoms[0].first = length;
  return true;
}

std::optional<std::vector<int64_t>> StridedView::strides() const {
  std::vector<int64_t> s;
  for (const auto& atoms : dims_) {
    if (atoms.empty()) {
      s.push_back(0);
      continue;
    }
    for (size_t i = 0; i + 1 < atoms.size(); ++i) {
      if (atoms[i].second != atoms[i + 1].second * atoms[i + 1].first) return std::nullopt;
    }
    s.push_back(atoms.back().second);
  }
  return s;
}

}  // namespace kiln
