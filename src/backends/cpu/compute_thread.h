// The one thread of a process on which oneDNN runs. oneDNN (the GOMP build kiln loads) parallelises
// each primitive with an OpenMP team owned by the calling thread; every thread that calls it becomes
// a master with a pool of its own. Once the pools' threads outnumber the cores, libgomp stops
// spinning between parallel regions and every primitive pays futex wake-ups: a session built on one
// thread and run on another (a server's worker, a Python thread) ran about twice as slow
// (bench/RESULTS.md, twenty-sixth session). So every runner is created
// and run here: one OpenMP master, one pool of cores-1 threads. Runs from several sessions take
// turns; each already uses every core.
//
//   Expected<T> r = on_compute_thread<Expected<T>>([&] { return work(); });
#pragma once

#include <functional>
#include <future>
#include <utility>

namespace kiln {

// Runs `task` on the compute thread and waits for it; inline when called from that thread.
void run_on_compute_thread(std::function<void()> task);

template <typename R, typename F>
R on_compute_thread(F&& f) {
  std::packaged_task<R()> task(std::forward<F>(f));
  std::future<R> result = task.get_future();
  run_on_compute_thread([&task] { task(); });
  return result.get();  // rethrows what the task threw
}

}  // namespace kiln
