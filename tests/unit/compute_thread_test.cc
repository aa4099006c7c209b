// The compute thread (src/backends/cpu/compute_thread.h): every task runs on one thread, whichever
// thread submits it; a task that submits another runs it inline (no deadlock); results and
// exceptions come back to the caller.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backends/cpu/compute_thread.h"

namespace kiln {
namespace {

TEST(ComputeThread, EveryTaskRunsOnOneThread) {
  std::mutex mu;
  std::set<std::thread::id> seen;
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&] {
      for (int k = 0; k < 25; ++k) {
        const std::thread::id id = on_compute_thread<std::thread::id>([] { return std::this_thread::get_id(); });
        std::lock_guard<std::mutex> lock(mu);
        seen.insert(id);
        EXPECT_NE(id, std::this_thread::get_id());
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(seen.size(), 1u);
}

TEST(ComputeThread, NestedTasksRunInlineAndValuesAndErrorsComeBack) {
  const auto [outer, inner] = on_compute_thread<std::pair<std::thread::id, std::thread::id>>([] {
    return std::make_pair(std::this_thread::get_id(),
                          on_compute_thread<std::thread::id>([] { return std::this_thread::get_id(); }));
  });
  EXPECT_EQ(outer, inner);
  EXPECT_EQ(on_compute_thread<int>([] { return 41 + 1; }), 42);
  EXPECT_THROW(on_compute_thread<int>([]() -> int { throw std::runtime_error("task failed"); }), std::runtime_error);
  EXPECT_EQ(on_compute_thread<int>([] { return 7; }), 7);  // the thread survives a throwing task
}

}  // namespace
}  // namespace kiln
