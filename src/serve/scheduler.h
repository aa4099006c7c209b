// The queue in front of a model's sessions, and its dynamic batcher. Every request of a loaded model
// version goes through one Scheduler: it waits in a FIFO queue until a session is free; with dynamic
// batching, a free session takes the requests at the head of the queue whose inputs agree past dim 0
// (up to max_batch_size rows) as soon as they make a preferred size (Triton's rule) or reach
// max_batch_size, else once the head has waited max_queue_delay (then trimmed to the largest of
// ModelSettings::batch_sizes the rows reach), runs them as one and splits the outputs back along
// dim 0. A request that waits
// past its timeout is answered "timed out" (504) and never runs; one that finds the queue full is
// answered 503. Destroying the scheduler lets the queued requests finish first.
//
// Each session has a worker thread that forms and runs batches while requests are queued. A request
// that arrives to an empty queue, with a session idle and no batch forming, is run by the thread
// that called run() (a server's handler thread): it forms the batch itself (others arriving
// meanwhile join it) and runs it on the idle session, with no hand-off to a worker and back (two
// thread wake-ups; bench/RESULTS.md, thirty-ninth session, has what that saved). Under load the queue
// is rarely empty and the workers, which go from one batch to the next without waking, do the work.
// A worker whose batch lies in device memory (CUDA shared memory in and out) queues it on the GPU
// (Session::enqueue, the copies after it) and, once it is done, queues the next batch (when one
// forms without waiting) before it answers the first: the answers overlap the next run.
//
// submit() is run() for a server whose handlers must not block (gRPC's callback API): the request is
// queued and `done` called with its answer later. A worker hands the submitted requests of a batch it
// ran to answer threads, which call their `done` (encoding and sending the answer) while it goes on;
// a timer thread answers those still queued at their deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <memory>
#include <thread>
#include <vector>

#include "kiln/kiln.h"
#include "serve/kserve_codec.h"
#include "serve/model_config.h"
#include "serve/shared_memory.h"

namespace kiln::serve {

// Triton's per-model counters (its names and meanings, so dashboards built for Triton read them):
// requests answered and failed, inferences (batch rows) and executions, and cumulative microseconds
// in the whole request, waiting in the queue, and running (each request counts its batch's run).
struct ModelMetrics {
  std::atomic<uint64_t> success{0}, failure{0}, inferences{0}, executions{0};
  std::atomic<uint64_t> request_us{0}, queue_us{0}, compute_us{0};
};

using Clock = std::chrono::steady_clock;


class Scheduler {
 public:
  // `outputs` are the engine's; `gpu`: a GPU engine, which reads inputs in device memory (CUDA shared
  // memory regions) where they lie.
  Scheduler(std::vector<Session> sessions, const ModelSettings& settings, ModelMetrics& metrics,
            std::vector<TensorInfo> outputs, bool gpu);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Runs one request, blocking until it is answered. `timeout_us` is the request's own timeout (0:
  // none), honoured when the configuration allows overriding its default; `deadline` is the
  // client's (a gRPC deadline; Clock::time_point::max() for none). `targets` (null, or one per
  // engine output) say where outputs go instead of the result. The inputs and targets must stay
  // alive until it returns. Throws HttpError for a full queue (503), a timeout (504) or too many
  // rows (400).
  Expected<std::vector<HostTensor>> run(const std::vector<TensorView>& inputs, uint64_t timeout_us,
                                        Clock::time_point deadline, const std::vector<OutputTarget>* targets = nullptr);
  // What submit() answers with: the result, and the HTTP status of a failure (504 for a request that
  // timed out in the queue, else status_of(result)); 200 when it succeeded.
  using Done = std::function<void(Expected<std::vector<HostTensor>> result, int status)>;
  // run() without waiting (a server whose handlers must not block: gRPC's callback API). `done` is
  // called once: on an answer thread (a worker ran it), on the thread that formed its batch (a caller
  // of run(), or this one before submit returns: alone in the queue, a session idle, nothing to wait
  // for), or on the timer thread (504).
  // A request refused at once throws HttpError as run() does, and `done` is not called. The inputs
  // and targets must stay alive until `done` returns; the scheduler is not destroyed before then.
  void submit(const std::vector<TensorView>& inputs, uint64_t timeout_us, Clock::time_point deadline,
              const std::vector<OutputTarget>* targets, Done done);
  int sessions() const { return int(slots_.size()); }

 private:
  struct Pending;
  // A worker's buffers for the batches it concatenates, kept from batch to batch (64-byte aligned,
  // so the engine reads them in place; never zeroed).
  struct Scratch {
    struct Buffer {
      std::shared_ptr<unsigned char> p;
      size_t size = 0;
    };
    std::vector<Buffer> inputs;
    unsigned char* get(size_t k, size_t bytes);
  };
  // A session and what its runs keep from batch to batch.
  struct Slot {
    explicit Slot(Session s) : session(std::move(s)) {}
    Session session;
    Scratch scratch;
    std::optional<DeviceStaging> staging;  // made on the first batch with an input in device memory
    bool busy = false;                     // forming or running a batch (its worker or a caller)
    bool queue_runs = true;                // the engine takes Session::enqueue (until it says not)
  };
  // A batch queued on the GPU, answered once the staging stream passes its mark.
  struct InFlight {
    std::vector<Pending*> batch;
    std::vector<HostTensor> out;  // the outputs' shapes (the batch's rows), no data
    int64_t rows = 0;
    Clock::time_point start;
  };
  // Queues `batch` on the GPU when its inputs lie in device memory and its outputs go there
  // (run_scattered without waiting); false when it does not apply or queuing failed (then the
  // batch runs through execute()). Without the lock.
  bool launch(Slot& slot, const std::vector<Pending*>& batch, InFlight& f);
  // Waits for a queued batch and sets its requests' results. Without the lock.
  void finish(Slot& slot, InFlight& f);
  // execute() with its failures turned into the requests' results. Without the lock.
  void execute_batch(Slot& slot, const std::vector<Pending*>& batch);
  // Marks a batch's requests answered and wakes their callers, each under its own lock, and hands the
  // submitted ones to the answer threads, or with `here` calls their `done` on this thread (without
  // the scheduler's lock).
  void answer(const std::vector<Pending*>& batch, bool here = false);
  // A submitted request's `done` called with its result; the request is freed.
  void deliver_done(std::unique_ptr<Pending> p);
  // An answer thread: calls the `done` of the submitted requests a worker answered, so that the
  // worker goes on to the next batch instead of encoding and sending every answer itself.
  void answer_loop();
  // A request's checks and deadline, shared by run() and submit(): throws HttpError for a bad one.
  void prepare(Pending& p, const std::vector<TensorView>& inputs, uint64_t timeout_us, Clock::time_point deadline,
               const std::vector<OutputTarget>* targets) const;
  // Queues `p` (lock held); throws HttpError 503 when stopping or the queue is full.
  void enqueue(Pending& p);
  // A slot that can run `p` on the calling thread: p alone in the queue, no batch forming, a slot idle
  // (lock held); null otherwise.
  Slot* idle_slot();
  // One caller or submitted request fewer; tells the destructor when it was the last. `locked`:
  // whether this thread holds the lock.
  void leave(bool locked);
  void start_submit_threads();
  // The timer thread: answers submitted requests that are still queued at their deadline (504).
  void expire();
  // Whether the batch at the head of the queue would be formed without waiting (lock held, queue
  // not empty).
  bool forms_now() const;
  void work(Slot& slot);
  // Forms a batch, runs it on `slot` and answers its requests (lock held on entry and exit).
  // `until`: the forming caller's own deadline (forming stops there, running nothing).
  void run_batch(std::unique_lock<std::mutex>& lock, Slot& slot, Clock::time_point until);
  // The requests the next run takes, removed from the queue (lock held); waits for more while
  // batching wants them, but not past `until` (then returns none).
  std::vector<Pending*> take(std::unique_lock<std::mutex>& lock, Clock::time_point until);
  // The rows of the queued requests that can join the head's batch, in queue order up to
  // max_batch_size, and the largest preferred size that the rows make on the way (0: none) (lock
  // held, queue not empty). take() forms exactly that many when it is not 0.
  struct Joinable {
    int64_t rows = 0, preferred = 0;
  };
  Joinable joinable() const;
  // Device staging (`staging`) is made on the first batch that has an input in device memory.
  void execute(Session& s, const std::vector<Pending*>& batch, Scratch& scratch, std::optional<DeviceStaging>& staging);
  // One run of `inputs` (`rows` rows when batched). Inputs in device memory go to the GPU engine in
  // place when the outputs' shapes follow from the rows; otherwise they are copied to the host first.
  // `direct`: one request's targets, whose device outputs the engine may write in place.
  Expected<std::vector<HostTensor>> run_views(Session& s, const std::vector<TensorView>& inputs, int64_t rows,
                                              std::optional<DeviceStaging>& staging,
                                              const std::vector<OutputTarget>* direct = nullptr);
  // The engine's output shapes for a run of `rows` rows, when they follow from the rows (a GPU engine,
  // no string outputs); nullopt otherwise.
  std::optional<std::vector<std::vector<int64_t>>> output_shapes(int64_t rows) const;
  // The output shapes of a run of `batch` (`rows` rows in all) when every request wants every
  // output in device memory where its rows fit, so run_scattered can serve it; nullopt otherwise.
  std::optional<std::vector<std::vector<int64_t>>> scatter_shapes(const std::vector<Pending*>& batch, int64_t rows) const;
  // One run of a batch whose outputs (of `shapes`) go to the requests' device targets: the engine
  // writes them to device staging and each request's rows are copied to its targets on the staging
  // stream (left for the caller to sync). Returns the outputs' shapes with no data (the requests'
  // results).
  // `queue`: Session::enqueue instead of run (the copies follow on the staging stream either way).
  Expected<std::vector<HostTensor>> run_scattered(Session& s, const std::vector<TensorView>& inputs,
                                                  const std::vector<Pending*>& batch, int64_t rows,
                                                  const std::vector<std::vector<int64_t>>& shapes, DeviceStaging& staging,
                                                  bool queue = false);
  // Input k of `batch` (every request's rows, in order) gathered into device staging slot k.
  TensorView gather_on_device(const std::vector<Pending*>& batch, size_t k, int64_t rows, DeviceStaging& staging) const;
  // Writes a request's outputs that have targets (and were not written in place) there; an output
  // larger than its target fails the request. Device copies are left on `staging` to sync.
  void deliver(Pending& p, std::optional<DeviceStaging>& staging);

  ModelSettings settings_;
  ModelMetrics& metrics_;
  std::vector<TensorInfo> outputs_;
  bool gpu_ = false;
  std::mutex mu_;
  std::condition_variable queued_;   // for the caller forming a batch: a request was queued or left, or stopping
  std::condition_variable drained_;  // for the destructor: the last caller left
  std::condition_variable timer_;    // for the timer thread: a submitted request with a deadline came, or stopping
  std::multimap<Clock::time_point, Pending*> deadlines_;  // submitted requests queued with a deadline
  std::deque<Pending*> queue_;
  bool forming_ = false;  // a caller is waiting for a batch to fill
  // Written under mu_; read without it by a caller leaving answered (run()'s Leave).
  std::atomic<bool> stopping_{false};
  std::atomic<int> callers_{0};  // threads inside run() and submitted requests not yet answered
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::thread> workers_;  // one a slot
  std::thread timer_thread_;             // with the answer threads, from the first submit()
  std::once_flag submit_threads_once_;
  std::mutex answers_mu_;
  std::condition_variable answers_cv_;
  std::deque<Pending*> answers_;  // submitted requests answered by a worker, their `done` not yet called
  bool answers_stop_ = false;     // answers_mu_
  std::vector<std::thread> answerers_;
};

}  // namespace kiln::serve
