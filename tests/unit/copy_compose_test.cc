// compose_copies (src/runtime/copy_compose.h): every composed copy reads, for every element it
// writes, the source element the two copies in a row would have put there (checked element by
// element on random chains of layout conversions, transposes, reshapes, slices and steps); the
// chains a backend meets (ShuffleNet's channel shuffle, a conversion and back) compose; what cannot
// be one strided copy is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "runtime/copy_compose.h"

namespace kiln {
namespace {

// Every destination offset a copy writes, mapped to the source offset it reads.
std::map<int64_t, int64_t> run(const StridedCopy& c) {
  std::map<int64_t, int64_t> out;
  std::vector<int64_t> idx(c.dims.size(), 0);
  int64_t n = 1;
  for (int64_t d : c.dims) n *= d;
  for (int64_t e = 0; e < n; ++e) {
    int64_t r = e, s = c.src_off, d = c.dst_off;
    for (size_t k = c.dims.size(); k-- > 0;) {
      const int64_t i = r % c.dims[k];
      r /= c.dims[k];
      s += i * c.src[k];
      d += i * c.dst[k];
    }
    out[d] = s;
  }
  return out;
}

// B after A, element by element: B's source offsets looked up in what A wrote.
std::map<int64_t, int64_t> run_both(const StridedCopy& a, const StridedCopy& b) {
  std::map<int64_t, int64_t> wrote = run(a), out;
  for (const auto& [d, s] : run(b)) {
    auto it = wrote.find(s);
    out[d] = it == wrote.end() ? -1 : it->second;  // -1: B read what A did not write
  }
  return out;
}

// Dense strides for dims laid out in `order` (outermost first).
std::vector<int64_t> dense(const std::vector<int64_t>& dims, const std::vector<size_t>& order) {
  std::vector<int64_t> s(dims.size());
  int64_t at = 1;
  for (size_t k = order.size(); k-- > 0;) {
    s[order[k]] = at;
    at *= dims[order[k]];
  }
  return s;
}

TEST(CopyCompose, ShuffleNetChannelShuffleIsOneCopyPerHalf) {
  // The concatenation [2, 8, 3, 3] in NHWC converted to NCHW (A), then x1 = channels [0, 4) of
  // Reshape(Transpose(Reshape(y, [2, 2, 4, 3, 3]), [0, 2, 1, 3, 4]), [2, 8, 3, 3]) written NHWC (B):
  // x1[n, 2j + g] = y[n, 4g + j], over dims [n, j, g, h, w].
  StridedCopy a{{2, 8, 3, 3}, {72, 1, 24, 8}, {72, 9, 3, 1}, 0, 0};
  StridedCopy b{{2, 2, 2, 3, 3}, {72, 9, 36, 3, 1}, {36, 2, 1, 12, 4}, 0, 0};
  auto c = compose_copies(a, b, 8);
  ASSERT_TRUE(c);
  EXPECT_EQ(run(*c), run_both(a, b));
  EXPECT_EQ(c->src, (std::vector<int64_t>{72, 1, 4, 24, 8}));
  // x2 = channels [4, 8): the same from channel 2 of each group.
  b.src_off = 2 * 9;
  c = compose_copies(a, b, 8);
  ASSERT_TRUE(c);
  EXPECT_EQ(run(*c), run_both(a, b));
}

TEST(CopyCompose, AReshapeThatMergesPermutedDimsIsSplitAgain) {
  // A transposes [3, 4] into [4, 3]; B reads the 12 elements as one flat dim.
  StridedCopy a{{4, 3}, {1, 4}, {3, 1}, 0, 0};
  StridedCopy b{{12}, {1}, {1}, 0, 0};
  auto c = compose_copies(a, b, 8);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->dims.size(), 2u);
  EXPECT_EQ(run(*c), run_both(a, b));
}

TEST(CopyCompose, RefusesWhatIsNotOneCopy) {
  StridedCopy a{{4, 3}, {1, 4}, {3, 1}, 0, 0};
  // A walk of 5 over a dim of 3 that does not divide: it would carry.
  EXPECT_FALSE(compose_copies(a, {{2}, {5}, {1}, 0, 0}, 8));
  // Reads past what A wrote.
  EXPECT_FALSE(compose_copies(a, {{4}, {4}, {1}, 0, 0}, 8));
  // A whose destination has holes (a padded copy's interior).
  EXPECT_FALSE(compose_copies({{4, 3}, {3, 1}, {4, 1}, 0, 0}, {{3}, {1}, {1}, 0, 0}, 8));
  // Too many dims for the kernel.
  EXPECT_FALSE(compose_copies(a, {{12}, {1}, {1}, 0, 0}, 1));
}

TEST(CopyCompose, RandomChainsComposeExactlyOrNotAtAll) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int composed = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    // A: dims of 1..4 sizes 1..4, read through a source laid out in a random order (optionally
    // every other element), written densely in another random order.
    const int ra = pick(1, 4);
    std::vector<int64_t> ad(size_t(ra), 1);
    for (auto& d : ad) d = pick(1, 4);
    std::vector<size_t> so(ad.size()), dord(ad.size());
    std::iota(so.begin(), so.end(), 0);
    std::iota(dord.begin(), dord.end(), 0);
    std::shuffle(so.begin(), so.end(), rng);
    std::shuffle(dord.begin(), dord.end(), rng);
    StridedCopy a{ad, dense(ad, so), dense(ad, dord), pick(0, 5), 0};
    if (pick(0, 3) == 0) {
      for (auto& s : a.src) s *= 2;
    }
    int64_t total = 1;
    for (int64_t d : ad) total *= d;
    // B: the dense buffer reshaped (a random factorization), permuted, narrowed, maybe stepped,
    // written densely in a random order.
    std::vector<int64_t> bd;
    for (int64_t rest = total; rest > 1;) {
      int64_t f = 1;
      for (int64_t cand = std::min<int64_t>(rest, pick(2, 6)); cand >= 2; --cand) {
        if (rest % cand == 0) {
          f = cand;
          break;
        }
      }
      bd.push_back(f);
      rest /= f;
    }
    if (bd.empty()) bd.push_back(1);
    std::vector<size_t> id(bd.size());
    std::iota(id.begin(), id.end(), 0);
    std::vector<int64_t> bs = dense(bd, id);
    std::vector<size_t> perm = id;
    std::shuffle(perm.begin(), perm.end(), rng);
    StridedCopy b;
    for (size_t p : perm) {
      b.dims.push_back(bd[p]);
      b.src.push_back(bs[p]);
    }
    const size_t ax = size_t(pick(0, int(b.dims.size()) - 1));
    if (b.dims[ax] > 1 && pick(0, 1)) {
      const int64_t from = pick(0, int(b.dims[ax]) - 1);
      const int64_t len = pick(1, int(b.dims[ax] - from));
      b.src_off += from * b.src[ax];
      b.dims[ax] = len;
      if (len > 2 && pick(0, 2) == 0) {  // step 2
        b.dims[ax] = (len + 1) / 2;
        b.src[ax] *= 2;
      }
    }
    std::vector<size_t> bo(b.dims.size());
    std::iota(bo.begin(), bo.end(), 0);
    std::shuffle(bo.begin(), bo.end(), rng);
    b.dst = dense(b.dims, bo);
    b.dst_off = pick(0, 3);
    auto c = compose_copies(a, b, 8);
    if (!c) continue;
    ++composed;
    ASSERT_EQ(run(*c), run_both(a, b)) << "trial " << trial;
  }
  EXPECT_GT(composed, 1500) << composed;  // most chains are one copy
  EXPECT_LT(composed, 3000) << composed;  // and some are not (steps, slices across a carry)
}

}  // namespace
}  // namespace kiln
