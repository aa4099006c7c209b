// The L2 prefetch planner (backends/cuda/prefetch.cc) on synthetic step lists: which weights go in
// which group, and where each group's launch is issued. No GPU needed: planning only reads steps.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backends/cuda/lower.h"

namespace kiln::cuda {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

class PrefetchPlan : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("KILN_L2_PREFETCH_MB"); }

  // A lowering whose steps are given: weight id (< 0: the step streams nothing), bytes, host.
  struct S {
    int weight;
    size_t bytes;
    bool host = false;
  };
  std::vector<L2Prefetch> plan(const std::vector<S>& steps, size_t budget) {
    BuildOptions opt;
    opt.l2_prefetch_bytes = budget;
    Lowering L(g_, opt);
    for (const S& s : steps) {
      Step st;
      st.host = s.host;
      if (s.weight >= 0) {
        st.streamed = Ref{true, s.weight};
        st.streamed_bytes = s.bytes;
      }
      L.steps.push_back(std::move(st));
    }
    plan_l2_prefetch(L);
    return L.prefetches;
  }
  static std::vector<int> ids(const L2Prefetch& p) {
    std::vector<int> out;
    for (const auto& r : p.ranges) out.push_back(r.first.id);
    return out;
  }

  Graph g_;
};

TEST_F(PrefetchPlan, GroupsUpToTheBudgetEachFetchedAsThePreviousGroupStarts) {
  // Steps 0..5: a non-GEMM step, then weights of 3, 3, 3, 2 MiB (one at step 3 after a plain step).
  auto p = plan({{-1, 0}, {0, 3 * kMiB}, {1, 3 * kMiB}, {-1, 0}, {2, 3 * kMiB}, {3, 2 * kMiB}}, 8 * kMiB);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(ids(p[0]), (std::vector<int>{0, 1}));
  EXPECT_EQ(p[0].before, 0u);  // the first group at the forward's start
  EXPECT_EQ(p[0].bytes, 6 * kMiB);
  EXPECT_EQ(ids(p[1]), (std::vector<int>{2, 3}));
  EXPECT_EQ(p[1].before, 1u);  // as the first group's first GEMM (step 1) starts
  EXPECT_EQ(p[1].bytes, 5 * kMiB);
}

TEST_F(PrefetchPlan, SizesRoundUpTo16BytesAndASharedWeightIsFetchedOnce) {
  auto p = plan({{0, 1000}, {1, 33}, {0, 1000}}, kMiB);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(ids(p[0]), (std::vector<int>{0, 1}));
  EXPECT_EQ(p[0].ranges[0].second, 1008u);
  EXPECT_EQ(p[0].ranges[1].second, 48u);
}

TEST_F(PrefetchPlan, AHostStepClosesAGroupAndTheNextIsFetchedAfterIt) {
  auto p = plan({{0, kMiB}, {-1, 0, true}, {1, kMiB}, {2, kMiB}}, 8 * kMiB);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(ids(p[0]), (std::vector<int>{0}));
  EXPECT_EQ(ids(p[1]), (std::vector<int>{1, 2}));
  EXPECT_EQ(p[1].before, 2u);  // after the host step, not while the previous group runs
}

TEST_F(PrefetchPlan, AtMostEightRangesPerLaunchAndNothingLargerThanTheBudget) {
  std::vector<S> steps;
  for (int i = 0; i < 10; ++i) steps.push_back({i, 16});
  steps.push_back({10, 2 * kMiB});  // over the budget: never fetched
  auto p = plan(steps, kMiB);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].ranges.size(), size_t(k::L2Ranges::kMax));
  EXPECT_EQ(ids(p[1]), (std::vector<int>{8, 9}));
  // Non-decreasing, as the session launches them (here both at step 0: the first group's first
  // GEMM is the forward's first step).
  EXPECT_EQ(p[0].before, 0u);
  EXPECT_EQ(p[1].before, 0u);
}

TEST_F(PrefetchPlan, OffByDefaultAndTheEnvironmentOverrides) {
  EXPECT_TRUE(plan({{0, kMiB}}, 0).empty());
  setenv("KILN_L2_PREFETCH_MB", "4", 1);
  EXPECT_EQ(plan({{0, kMiB}}, 0).size(), 1u);
  setenv("KILN_L2_PREFETCH_MB", "0", 1);
  EXPECT_TRUE(plan({{0, kMiB}}, 16 * kMiB).empty());
  unsetenv("KILN_L2_PREFETCH_MB");
}

}  // namespace
}  // namespace kiln::cuda
