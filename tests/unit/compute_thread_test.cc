// The compute thread (src/backends/cpu/compute_thread.h): every task runs on one thread, whichever
// thread submits it; a task that submits another runs it inline (no deadlock); results and
// exceptions come back to the caller; a forked child gets a compute thread of its own.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

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

// A child forked after the parent used the compute thread (Python multiprocessing does this) has
// no such thread: its tasks must still run, not wait forever.
TEST(ComputeThread, AForkedChildStartsItsOwn) {
  ASSERT_EQ(on_compute_thread<int>([] { return 1; }), 1);  // the parent's thread exists
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(10);  // a hang ends the child with SIGALRM, which the parent sees
    _exit(on_compute_thread<int>([] { return 5; }) == 5 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child hung or crashed (signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace kiln
