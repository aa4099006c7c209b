#include "backends/cpu/compute_thread.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace kiln {

namespace {

class ComputeThread {
 public:
  ComputeThread() : thread_([this] { loop(); }) { thread_.detach(); }

  void run(std::function<void()> task) {
    if (std::this_thread::get_id() == id()) {
      task();
      return;
    }
    std::mutex done_mu;
    std::condition_variable done_cv;
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back([&] {
        task();
        std::lock_guard<std::mutex> l(done_mu);
        done = true;
        done_cv.notify_one();
      });
    }
    cv_.notify_one();
    std::unique_lock<std::mutex> lock(done_mu);
    done_cv.wait(lock, [&] { return done; });
  }

 private:
  std::thread::id id() {
    std::lock_guard<std::mutex> lock(mu_);
    return id_;
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    id_ = std::this_thread::get_id();
    for (;;) {
      cv_.wait(lock, [&] { return !queue_.empty(); });
      std::function<void()> t = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      t();  // tasks catch their own exceptions (on_compute_thread's packaged_task)
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::thread::id id_;
  std::thread thread_;
};

// Never destroyed: the detached thread may outlive static destructors at exit. A forked child has
// no compute thread (fork copies only the calling thread): it starts its own on first use.
std::atomic<ComputeThread*> g_thread{nullptr};
std::mutex g_start;

}  // namespace

void run_on_compute_thread(std::function<void()> task) {
  ComputeThread* t = g_thread.load(std::memory_order_acquire);
  if (!t) {
    std::lock_guard<std::mutex> lock(g_start);
    t = g_thread.load(std::memory_order_acquire);
    if (!t) {
      static const int registered = pthread_atfork(nullptr, nullptr, [] {
        new (&g_start) std::mutex();  // the parent's may have been held by a thread the child lacks
        g_thread.store(nullptr, std::memory_order_release);  // the parent's object is left behind
      });
      (void)registered;
      t = new ComputeThread();
      g_thread.store(t, std::memory_order_release);
    }
  }
  t->run(std::move(task));
}

}  // namespace kiln
