// The communicator the CPU kernels of AllReduce and AllGather (ops/collective.cc) use: the ranks of
// one tensor-parallel engine (passes/tensor_parallel.cc) run as threads of one process, each with
// the same communicator installed for the duration of its run.
//
//   auto comm = std::make_shared<ThreadComm>(2);         // shared by both rank threads
//   // in rank r's thread:
//   ScopedComm scope(comm.get(), r);
//   run_plan(rank_plan[r], inputs);                        // its AllReduce nodes sum across ranks
//
// ThreadComm is the reference collective (for correctness, not speed): every rank reads every
// rank's buffer in rank order, so all ranks compute bitwise the same result. A rank that fails
// calls abort(), which wakes the others with an error instead of leaving them waiting forever.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "ir/tensor.h"

namespace kiln {

class ThreadComm {
 public:
  explicit ThreadComm(int size) : size_(size), posted_(size_t(size), nullptr) {}
  int size() const { return size_; }
  // The sum over ranks of each rank's `x` (same dtype and dims everywhere, else an error).
  Expected<Tensor> all_reduce(int rank, const Tensor& x);
  // The ranks' `x` concatenated along `axis`, rank 0 first.
  Expected<Tensor> all_gather(int rank, const Tensor& x, int64_t axis);
  // Makes every waiting and later collective fail (a rank failed and will not arrive).
  void abort();

 private:
  // Posts `x` for this rank and waits until every rank has; then `f` reads all posted tensors;
  // then waits until every rank has read before anyone may post again.
  template <typename F>
  Status exchange(int rank, const Tensor& x, F&& f);
  Status wait_phase(std::unique_lock<std::mutex>& lock);

  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<const Tensor*> posted_;
  int arrived_ = 0;
  uint64_t phase_ = 0;
  bool aborted_ = false;
};

// The communicator and rank of the current thread, while a ScopedComm lives (null outside one).
struct CommSlot {
  ThreadComm* comm = nullptr;
  int rank = 0;
};
const CommSlot& current_comm();

class ScopedComm {
 public:
  ScopedComm(ThreadComm* comm, int rank);
  ~ScopedComm();
  ScopedComm(const ScopedComm&) = delete;
  ScopedComm& operator=(const ScopedComm&) = delete;

 private:
  CommSlot saved_;
};

}  // namespace kiln
