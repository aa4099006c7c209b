// StridedView against materialized data: every op is also applied to a real array holding each
// element's source offset, and the view must address exactly those offsets.
#include "runtime/strided_view.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace kiln {
namespace {

struct Dense {  // row-major array of source offsets
  std::vector<int64_t> dims, data;
};

std::vector<int64_t> row_strides(const std::vector<int64_t>& d) {
  std::vector<int64_t> s(d.size(), 1);
  for (size_t i = d.size(); i-- > 1;) s[i - 1] = s[i] * d[i];
  return s;
}

int64_t numel(const std::vector<int64_t>& d) { return std::accumulate(d.begin(), d.end(), int64_t{1}, std::multiplies<>()); }

Dense transpose(const Dense& x, const std::vector<int64_t>& perm) {
  Dense y;
  for (int64_t p : perm) y.dims.push_back(x.dims[size_t(p)]);
  y.data.resize(x.data.size());
  auto xs = row_strides(x.dims);
  std::vector<int64_t> idx(y.dims.size(), 0);
  for (int64_t i = 0; i < numel(y.dims); ++i) {
    int64_t src = 0;
    for (size_t k = 0; k < idx.size(); ++k) src += idx[k] * xs[size_t(perm[k])];
    y.data[size_t(i)] = x.data[size_t(src)];
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < y.dims[k]) break;
      idx[k] = 0;
    }
  }
  return y;
}

Dense select(const Dense& x, int axis, int64_t index) {
  Dense y;
  for (size_t k = 0; k < x.dims.size(); ++k) {
    if (int(k) != axis) y.dims.push_back(x.dims[k]);
  }
  int64_t outer = numel(std::vector<int64_t>(x.dims.begin(), x.dims.begin() + axis));
  int64_t inner = numel(std::vector<int64_t>(x.dims.begin() + axis + 1, x.dims.end()));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) y.data.push_back(x.data[size_t((o * x.dims[size_t(axis)] + index) * inner + i)]);
  return y;
}

// The view addresses exactly the materialized offsets (when it has single strides).
void expect_same(const StridedView& v, const Dense& d) {
  ASSERT_EQ(v.dims(), d.dims);
  auto s = v.strides();
  ASSERT_TRUE(s.has_value());
  std::vector<int64_t> idx(d.dims.size(), 0);
  for (int64_t i = 0; i < numel(d.dims); ++i) {
    int64_t off = v.offset();
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * (*s)[k];
    ASSERT_EQ(off, d.data[size_t(i)]) << "element " << i;
    for (size_t k = idx.size(); k-- > 0;) {
      if (++idx[k] < d.dims[k]) break;
      idx[k] = 0;
    }
  }
}

Dense iota(const std::vector<int64_t>& dims) {
  Dense d{dims, std::vector<int64_t>(size_t(numel(dims)))};
  std::iota(d.data.begin(), d.data.end(), 0);
  return d;
}

// torchvision ViT's nn.MultiheadAttention export: packed [S, B, 3*E] projection -> per-head
// [B, H, S, D] query / key / value, through a reshape that merges non-adjacent dims (B and H).
TEST(StridedView, VitPackedQkvUnbind) {
  const int64_t S = 5, B = 2, H = 3, D = 8, E = H * D;
  for (int64_t which = 0; which < 3; ++which) {
    StridedView v = StridedView::contiguous({S, B, 3 * E});
    Dense d = iota({S, B, 3 * E});
    ASSERT_TRUE(v.reshape({S, B, 3, E}));
    d.dims = {S, B, 3, E};
    ASSERT_TRUE(v.reshape({1, S, B, 3, E}));  // Unsqueeze
    d.dims = {1, S, B, 3, E};
    ASSERT_TRUE(v.transpose({3, 1, 2, 0, 4}));
    d = transpose(d, {3, 1, 2, 0, 4});
    ASSERT_TRUE(v.reshape({3, S, B, E}));  // Squeeze
    d.dims = {3, S, B, E};
    ASSERT_TRUE(v.select(0, which));
    d = select(d, 0, which);
    ASSERT_TRUE(v.reshape({S, B * H, D}));
    d.dims = {S, B * H, D};
    EXPECT_FALSE(v.strides().has_value());  // B*H is not one stride: only a view of a view
    ASSERT_TRUE(v.transpose({1, 0, 2}));
    d = transpose(d, {1, 0, 2});
    ASSERT_TRUE(v.reshape({B, H, S, D}));
    d.dims = {B, H, S, D};
    expect_same(v, d);
    EXPECT_EQ(v.offset(), which * E);
    EXPECT_EQ(*v.strides(), (std::vector<int64_t>{3 * E, D, B * 3 * E, 1}));
  }
}

// GPT-2's attention: Split of the packed [B, S, 3E] projection, then per-head reshape/transpose.
TEST(StridedView, Gpt2SplitHeads) {
  const int64_t B = 2, S = 3, H = 2, D = 4, E = H * D;
  for (int64_t part = 0; part < 3; ++part) {
    StridedView v = StridedView::contiguous({B, S, 3 * E});
    ASSERT_TRUE(v.narrow(2, part * E, E));
    ASSERT_TRUE(v.reshape({B, S, H, D}));
    ASSERT_TRUE(v.transpose({0, 2, 1, 3}));
    // Materialized: element (b, h, s, d) of the part is b*S*3E + s*3E + part*E + h*D + d.
    Dense d{{B, H, S, D}, {}};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s2 = 0; s2 < S; ++s2)
          for (int64_t x = 0; x < D; ++x) d.data.push_back(b * S * 3 * E + s2 * 3 * E + part * E + h * D + x);
    expect_same(v, d);
  }
  StridedView w = StridedView::contiguous({4, 6});
  EXPECT_FALSE(w.narrow(1, 4, 3));  // past the end
  ASSERT_TRUE(w.transpose({1, 0}));
  ASSERT_TRUE(w.reshape({24}));
  EXPECT_FALSE(w.narrow(0, 0, 12));  // a dim of two strides cannot be narrowed
}

TEST(StridedView, RejectsWhatIsNotAView) {
  StridedView v = StridedView::contiguous({4, 6});
  EXPECT_FALSE(v.reshape({5, 5}));  // element count
  StridedView t = StridedView::contiguous({4, 6});
  ASSERT_TRUE(t.transpose({1, 0}));
  ASSERT_TRUE(t.reshape({24}));
  EXPECT_FALSE(t.strides().has_value());  // a transposed matrix flattened needs a copy
  StridedView u = StridedView::contiguous({4, 6});
  ASSERT_TRUE(u.transpose({1, 0}));
  EXPECT_FALSE(u.reshape({4, 6}));  // [6,4] -> [4,6] would split the 6 unevenly
  EXPECT_FALSE(u.transpose({0, 0}));
  StridedView w = StridedView::contiguous({3});
  EXPECT_FALSE(w.select(0, 3));
  EXPECT_FALSE(w.select(1, 0));
}

// Random chains of transposes, splits/merges and selects against the materialized result.
TEST(StridedView, RandomChainsMatchMaterialized) {
  std::mt19937_64 rng(1234);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Dense d = iota({2, 3, 4, 2});
    StridedView v = StridedView::contiguous(d.dims);
    bool ok = true;
    for (int step = 0; step < 5 && ok; ++step) {
      int op = int(rng() % 3);
      size_t r = d.dims.size();
      if (op == 0 && r >= 2) {
        std::vector<int64_t> perm(r);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        ASSERT_TRUE(v.transpose(perm));
        d = transpose(d, perm);
      } else if (op == 1 && r >= 2) {  // merge two adjacent dims: a view only if they are contiguous
        size_t k = rng() % (r - 1);
        std::vector<int64_t> nd;
        for (size_t i = 0; i < r; ++i) {
          if (i == k) nd.push_back(d.dims[i] * d.dims[i + 1]), ++i;
          else nd.push_back(d.dims[i]);
        }
        ASSERT_TRUE(v.reshape(nd));
        d.dims = nd;
      } else if (op == 2 && r >= 2) {
        int axis = int(rng() % r);
        int64_t idx = int64_t(rng() % uint64_t(d.dims[size_t(axis)]));
        ASSERT_TRUE(v.select(axis, idx));
        d = select(d, axis, idx);
      }
      ok = v.strides().has_value();
    }
    if (ok) {
      expect_same(v, d);
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);  // most chains stay single-stride; those are checked element by element
}

}  // namespace
}  // namespace kiln
