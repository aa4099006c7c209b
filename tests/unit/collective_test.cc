// The reference collectives (ops/collective.h) the CPU ranks of a tensor-parallel engine use.
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "ops/collective.h"

namespace kiln {
namespace {

Tensor filled(std::vector<int64_t> dims, float start) {
  Tensor t = Tensor::create(DType::kFloat32, std::move(dims)).value();
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + float(i);
  return t;
}

// Runs f(rank) on `n` threads at once.
template <typename F>
void on_threads(int n, F f) {
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back(f, r);
  for (auto& t : th) t.join();
}

TEST(ThreadComm, AllReduceSumsEveryRankAndEveryRankAgrees) {
  ThreadComm comm(3);
  std::vector<std::optional<Expected<Tensor>>> out(3);
  on_threads(3, [&](int r) { out[size_t(r)].emplace(comm.all_reduce(r, filled({2, 2}, float(10 * r)))); });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(*out[size_t(r)]) << out[size_t(r)]->status().message();
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ((*out[size_t(r)])->data<float>()[i], 30.0f + 3.0f * float(i)) << r << " " << i;
  }
}

TEST(ThreadComm, AllGatherConcatenatesAlongAnInnerAxis) {
  ThreadComm comm(2);
  std::vector<std::optional<Expected<Tensor>>> out(2);
  on_threads(2, [&](int r) { out[size_t(r)].emplace(comm.all_gather(r, filled({2, 2}, float(100 * r)), 1)); });
  ASSERT_TRUE(*out[0]);
  EXPECT_EQ((*out[0])->dims(), (std::vector<int64_t>{2, 4}));
  const std::vector<float> want = {0, 1, 100, 101, 2, 3, 102, 103};  // row by row: rank 0's columns, then rank 1's
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ((*out[0])->data<float>()[i], want[i]) << i;
}

TEST(ThreadComm, MismatchedShapesAreAnErrorOnEveryRank) {
  ThreadComm comm(2);
  std::vector<std::optional<Expected<Tensor>>> out(2);
  on_threads(2, [&](int r) { out[size_t(r)].emplace(comm.all_reduce(r, filled({2, r + 1}, 0))); });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(*out[size_t(r)]);
    EXPECT_NE(out[size_t(r)]->status().message().find("rank 1 holds"), std::string::npos) << out[size_t(r)]->status().message();
  }
}

// A rank that fails before its collective releases the ranks waiting in it (no hang), and they
// report why.
TEST(ThreadComm, AbortReleasesWaitingRanks) {
  ThreadComm comm(2);
  std::optional<Expected<Tensor>> waiting;
  std::thread t([&] { waiting.emplace(comm.all_reduce(0, filled({4}, 0))); });
  comm.abort();  // rank 1 gave up
  t.join();
  ASSERT_FALSE(*waiting);
  EXPECT_NE(waiting->status().message().find("another rank failed"), std::string::npos);
}

}  // namespace
}  // namespace kiln
