// Composing strided copies (copy_compose.h).
#include "runtime/copy_compose.h"

#include <algorithm>

namespace kiln {

std::optional<StridedCopy> compose_copies(const StridedCopy& a, const StridedCopy& b, int max_rank) {
  if (a.dims.size() != a.src.size() || a.dims.size() != a.dst.size() || b.dims.size() != b.src.size() ||
      b.dims.size() != b.dst.size()) {
    return std::nullopt;
  }
  // A's digits: its dims of more than one element by destination stride, outermost first.
  struct Digit {
    int64_t size, dst, src;
  };
  std::vector<Digit> dg;
  for (size_t i = 0; i < a.dims.size(); ++i) {
    if (a.dims[i] <= 0) return std::nullopt;  // A writes nothing B could read
    if (a.dims[i] > 1) dg.push_back({a.dims[i], a.dst[i], a.src[i]});
  }
  std::sort(dg.begin(), dg.end(), [](const Digit& x, const Digit& y) { return x.dst > y.dst; });
  // Dense: the innermost stride 1, each stride the product of the sizes inside it.
  int64_t total = 1;
  for (size_t k = dg.size(); k-- > 0;) {
    if (dg[k].dst != total) return std::nullopt;
    total *= dg[k].size;
  }
  for (int64_t n : b.dims) {
    if (n <= 0) return std::nullopt;
  }
  // B's first read, as a digit per A dim.
  int64_t o = b.src_off - a.dst_off;
  if (o < 0 || o >= total) return std::nullopt;
  std::vector<int64_t> start(dg.size()), reach(dg.size(), 0);
  StridedCopy c;
  c.src_off = a.src_off;
  c.dst_off = b.dst_off;
  for (size_t k = 0; k < dg.size(); ++k) {
    start[k] = o / dg[k].dst;
    o %= dg[k].dst;
    c.src_off += start[k] * dg[k].src;
  }
  for (size_t m = 0; m < b.dims.size(); ++m) {
    int64_t n = b.dims[m], t = b.src[m], d = b.dst[m];
    if (n == 1) continue;  // index 0 only: adds nothing
    if (t < 0) return std::nullopt;
    if (t == 0) {  // a broadcast read stays one
      c.dims.push_back(n);
      c.src.push_back(0);
      c.dst.push_back(d);
      continue;
    }
    // Atoms, innermost first: a walk of n steps of t along the digit whose range holds t; one that
    // would run past its digit's end is split into the steps that fill the digit and the rest,
    // which then walks the next digit out.
    while (true) {
      size_t k = 0;
      while (k < dg.size() && !(dg[k].dst <= t && t < dg[k].dst * dg[k].size)) ++k;
      if (k == dg.size() || t % dg[k].dst != 0) return std::nullopt;
      const int64_t step = t / dg[k].dst;
      if ((n - 1) * step < dg[k].size) {
        c.dims.push_back(n);
        c.src.push_back(step * dg[k].src);
        c.dst.push_back(d);
        reach[k] += (n - 1) * step;
        break;
      }
      if (dg[k].size % step != 0 || n % (dg[k].size / step) != 0) return std::nullopt;
      const int64_t inner = dg[k].size / step;
      c.dims.push_back(inner);
      c.src.push_back(step * dg[k].src);
      c.dst.push_back(d);
      reach[k] += (inner - 1) * step;
      n /= inner;
      t *= inner;
      d *= inner;
    }
  }
  // No carries: each digit's first value plus the most that B's walks add to it stays inside it,
  // so every read's digits are the sums of its atoms' (and its source offset their sum too).
  for (size_t k = 0; k < dg.size(); ++k) {
    if (start[k] + reach[k] >= dg[k].size) return std::nullopt;
  }
  if (c.dims.empty()) {  // one element
    c.dims = {1};
    c.src = {0};
    c.dst = {0};
  }
  if (int(c.dims.size()) > max_rank) return std::nullopt;
  return c;
}

}  // namespace kiln
