#include "serve/scheduler.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

namespace kiln::serve {

namespace {

constexpr uint64_t kMaxTimeoutUs = uint64_t(86'400) * 1'000'000;

uint64_t us_between(Clock::time_point a, Clock::time_point b) {
  return b > a ? uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(b - a).count()) : 0;
}

// Requests whose inputs agree in dtype and in every dim past the batch dim can share a run.
bool same_past_batch(const std::vector<TensorView>& a, const std::vector<TensorView>& b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].dtype != b[k].dtype || a[k].on_device != b[k].on_device || a[k].shape.size() != b[k].shape.size() ||
        a[k].shape.empty()) {
      return false;
    }
    if (!std::equal(a[k].shape.begin() + 1, a[k].shape.end(), b[k].shape.begin() + 1)) return false;
  }
  return true;
}

// Rows [begin, begin + rows) of a tensor whose dim 0 is the batch, copied into memory of its own.
HostTensor slice_rows(const HostTensor& t, int64_t begin, int64_t rows) {
  std::vector<int64_t> shape = t.shape();
  const int64_t row = shape[0] ? t.numel() / shape[0] : 0;
  shape[0] = rows;
  if (!t.raw()) return HostTensor(t.dtype(), shape, nullptr, nullptr);  // written in place already
  const size_t n = size_t(rows * row);
  if (t.dtype() == DType::kString) {
    auto keep = std::make_shared<std::vector<std::string>>(t.data<std::string>() + begin * row,
                                                           t.data<std::string>() + begin * row + int64_t(n));
    return HostTensor(t.dtype(), shape, keep, keep->data());
  }
  const size_t es = dtype_size(t.dtype());
  auto keep = std::make_shared<std::vector<unsigned char>>(n * es);
  if (n) std::memcpy(keep->data(), static_cast<const unsigned char*>(t.raw()) + size_t(begin * row) * es, n * es);
  return HostTensor(t.dtype(), shape, keep, keep->data());
}

std::string timed_out_message(Clock::time_point enqueued) {
  return "the request timed out after " + std::to_string(us_between(enqueued, Clock::now())) +
         " us in the queue, before it ran";
}

}  // namespace

struct Scheduler::Pending {
  const std::vector<TensorView>* inputs = nullptr;
  const std::vector<OutputTarget>* targets = nullptr;
  int64_t rows = 1;
  Clock::time_point enqueued, until = Clock::time_point::max();  // until: when it leaves the queue unrun
  bool taken = false;  // by a batch (the scheduler's lock)
  // Submitted (submit()): answered by calling done_cb, owned by the scheduler until then; with a
  // deadline, its entry in deadlines_ while it is queued.
  Done done_cb;
  std::multimap<Clock::time_point, Pending*>::iterator deadline;
  bool has_deadline = false;
  int status = 0;  // 504 once the timer thread gave up on it
  // Answered under the request's own lock, not the scheduler's: the threads woken by a batch's
  // answers each take only their own, while new requests queue and the next batch forms.
  std::mutex m;
  std::condition_variable answered;
  bool done = false;  // m
  std::optional<Expected<std::vector<HostTensor>>> result;
};

Scheduler::Scheduler(std::vector<Session> sessions, const ModelSettings& settings, ModelMetrics& metrics,
                     std::vector<TensorInfo> outputs, bool gpu)
    : settings_(settings), metrics_(metrics), outputs_(std::move(outputs)), gpu_(gpu) {
  for (Session& s : sessions) slots_.push_back(std::make_unique<Slot>(std::move(s)));
  for (auto& slot : slots_) workers_.emplace_back([this, s = slot.get()] { work(*s); });
}

// The timer and answer threads serve submitted requests alone: started by the first submit(), so a
// repository served over HTTP only holds no idle threads for them per model version.
void Scheduler::start_submit_threads() {
  // Resumable: where a thread fails to start, call_once throws and the next submit() starts the rest.
  std::call_once(submit_threads_once_, [this] {
    if (!timer_thread_.joinable()) timer_thread_ = std::thread([this] { expire(); });
    while (answerers_.size() < 4) answerers_.emplace_back([this] { answer_loop(); });
  });
}

Scheduler::~Scheduler() {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  queued_.notify_all();
  drained_.wait(lock, [&] { return callers_ == 0; });
  queued_.notify_all();  // the queue is empty now and stays so: workers asleep on a busy slot leave
  timer_.notify_all();
  lock.unlock();
  for (std::thread& t : workers_) t.join();
  if (timer_thread_.joinable()) timer_thread_.join();
  {
    std::lock_guard<std::mutex> g(answers_mu_);
    answers_stop_ = true;  // every submitted request was answered (callers_ is 0)
  }
  answers_cv_.notify_all();
  for (std::thread& t : answerers_) t.join();
}

void Scheduler::prepare(Pending& p, const std::vector<TensorView>& inputs, uint64_t timeout_us, Clock::time_point deadline,
                        const std::vector<OutputTarget>* targets) const {
  p.inputs = &inputs;
  if (targets && targets->size() != outputs_.size()) throw HttpError{500, "output targets do not match the engine's outputs"};
  p.targets = targets;
  if (settings_.max_batch_size > 0) {
    for (const TensorView& v : inputs) {
      if (v.shape.empty()) throw HttpError{400, "a batched model's inputs have a batch dim; one is a scalar"};
      if (v.shape[0] != inputs[0].shape[0]) {
        throw HttpError{400, "the inputs' batch dims differ (" + std::to_string(inputs[0].shape[0]) + " and " +
                                 std::to_string(v.shape[0]) + ")"};
      }
    }
    p.rows = inputs.empty() ? 1 : inputs[0].shape[0];
    if (p.rows > settings_.max_batch_size) {
      throw HttpError{400, "the request's batch of " + std::to_string(p.rows) + " is over the model's max_batch_size " +
                               std::to_string(settings_.max_batch_size)};
    }
  }
  uint64_t t = settings_.default_timeout_us;
  if (timeout_us && settings_.allow_timeout_override) t = timeout_us;
  if (t > kMaxTimeoutUs) t = 0;  // longer than a day: no timeout (and no overflow in the clock's arithmetic)
  p.enqueued = Clock::now();
  p.until = deadline;
  if (t && settings_.reject_on_timeout) p.until = std::min(p.until, p.enqueued + std::chrono::microseconds(t));
}

void Scheduler::enqueue(Pending& p) {
  if (stopping_) throw HttpError{503, "the model is being unloaded"};
  if (settings_.max_queue_size && queue_.size() >= settings_.max_queue_size) {
    throw HttpError{503, "the model's queue is full (max_queue_size " + std::to_string(settings_.max_queue_size) + ")"};
  }
  queue_.push_back(&p);
  ++callers_;
}

Scheduler::Slot* Scheduler::idle_slot() {
  if (queue_.size() != 1 || forming_) return nullptr;
  for (auto& slot : slots_) {
    if (!slot->busy) return slot.get();
  }
  return nullptr;
}

void Scheduler::leave(bool locked) {
  if (--callers_ != 0 || !stopping_) return;
  if (locked) {
    drained_.notify_all();
  } else {
    std::lock_guard<std::mutex> g(mu_);
    drained_.notify_all();
  }
}

Expected<std::vector<HostTensor>> Scheduler::run(const std::vector<TensorView>& inputs, uint64_t timeout_us,
                                                 Clock::time_point deadline, const std::vector<OutputTarget>* targets) {
  Pending p;
  prepare(p, inputs, timeout_us, deadline, targets);
  const Clock::time_point until = p.until;
  std::unique_lock<std::mutex> lock(mu_);
  enqueue(p);
  // The destructor waits for the last caller to leave (told under the scheduler's lock, which the
  // caller holds when it leaves with an error and not when it leaves answered).
  struct Leave {
    Scheduler& s;
    std::unique_lock<std::mutex>& lock;
    ~Leave() { s.leave(lock.owns_lock()); }
  } leave{*this, lock};
  // Alone in the queue, with a session idle and no batch forming: this thread forms and runs the
  // batch itself (no hand-off to a worker and back). Otherwise a worker (or the batch forming) is told.
  Slot* idle = idle_slot();
  // A request still queued at its deadline leaves the queue, never to run (lock held).
  auto time_out = [&] {
    queue_.erase(std::find(queue_.begin(), queue_.end(), &p));
    queued_.notify_all();  // a batch forming around this request looks again
    return HttpError{504, timed_out_message(p.enqueued)};
  };
  if (idle) {
    run_batch(lock, *idle, until);
  } else {
    queued_.notify_all();
  }
  if (!p.taken && Clock::now() >= until) throw time_out();  // passed while it formed the batch (lock held since)
  lock.unlock();
  std::unique_lock<std::mutex> mine(p.m);
  if (until == Clock::time_point::max()) {
    p.answered.wait(mine, [&] { return p.done; });
  } else if (!p.answered.wait_until(mine, until, [&] { return p.done; })) {
    mine.unlock();
    lock.lock();
    if (!p.taken) throw time_out();
    lock.unlock();
    mine.lock();
    p.answered.wait(mine, [&] { return p.done; });  // taken in time: it runs to the end
  }
  return std::move(*p.result);
}

void Scheduler::submit(const std::vector<TensorView>& inputs, uint64_t timeout_us, Clock::time_point deadline,
                       const std::vector<OutputTarget>* targets, Done done) {
  auto owned = std::make_unique<Pending>();
  Pending* p = owned.get();
  prepare(*p, inputs, timeout_us, deadline, targets);
  p->done_cb = std::move(done);
  start_submit_threads();
  std::unique_lock<std::mutex> lock(mu_);
  // Whatever can fail (the deadline's entry, a full queue) fails before the request is queued: an
  // exception out of here means it was refused and its `done` will not be called.
  if (p->until != Clock::time_point::max()) {  // the timer answers it if it is still queued then
    p->deadline = deadlines_.emplace(p->until, p);
    p->has_deadline = true;
  }
  try {
    enqueue(*p);
  } catch (...) {
    if (p->has_deadline) deadlines_.erase(p->deadline);
    throw;
  }
  owned.release();  // the scheduler's until answer() calls done_cb
  // Run here only when the batch forms at once: the callback API's handlers must not block on a
  // queue delay (gRPC runs them on a few threads). The batch takes it off the deadlines.
  Slot* idle = idle_slot();
  if (idle && forms_now()) {
    run_batch(lock, *idle, Clock::time_point::max());
    return;
  }
  if (p->has_deadline && p->deadline == deadlines_.begin()) timer_.notify_one();
  queued_.notify_all();
}

void Scheduler::expire() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_ || callers_ != 0) {
    if (deadlines_.empty()) {
      timer_.wait(lock);
      continue;
    }
    const Clock::time_point first = deadlines_.begin()->first;
    if (Clock::now() < first) {
      timer_.wait_until(lock, first);
      continue;
    }
    std::vector<Pending*> late;  // still queued at their deadline (take() removes the taken)
    const Clock::time_point now = Clock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      Pending* p = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      p->has_deadline = false;
      queue_.erase(std::find(queue_.begin(), queue_.end(), p));
      p->status = 504;
      p->result = Status(ErrorCode::kInvalidArgument, timed_out_message(p->enqueued));
      late.push_back(p);
    }
    queued_.notify_all();  // a batch forming around them looks again
    lock.unlock();
    answer(late);
    lock.lock();
  }
}

void Scheduler::work(Slot& slot) {
  std::optional<InFlight> flying;  // a batch queued on the GPU, not yet answered
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::vector<Pending*> batch;
    if (flying) {
      // Once the GPU is done with it, the next batch (formed from what queued meanwhile, when that
      // needs no waiting) is queued before this one's requests are answered: the answers (a thread
      // woken per request) overlap the next run instead of delaying it. Forming the next batch
      // before this one ends, or only after answering when fewer rows wait than this batch had,
      // made the batches smaller (bench/RESULTS.md, thirty-ninth session).
      lock.unlock();
      finish(slot, *flying);
      lock.lock();
      if (!queue_.empty() && !forming_ && forms_now()) batch = take(lock, Clock::time_point::max());
    } else {
      queued_.wait(lock, [&] { return (stopping_ && queue_.empty()) || (!queue_.empty() && !forming_ && !slot.busy); });
      if (queue_.empty()) return;  // stopping, and every request answered or being answered
      slot.busy = true;
      batch = take(lock, Clock::time_point::max());
    }
    lock.unlock();
    std::optional<InFlight> queued;
    if (batch.empty() || !launch(slot, batch, queued.emplace())) queued.reset();
    if (flying) answer(flying->batch);
    if (!batch.empty() && !queued) {  // not for the GPU's queue: run as it comes
      execute_batch(slot, batch);
      answer(batch);
    }
    lock.lock();
    flying = std::move(queued);
    if (!flying) {
      slot.busy = false;
      if (!queue_.empty()) queued_.notify_all();
    }
  }
}

void Scheduler::deliver_done(std::unique_ptr<Pending> own) {
  Expected<std::vector<HostTensor>> r = std::move(*own->result);
  const int status = own->status ? own->status : r ? 200 : status_of(r.status());
  Done done = std::move(own->done_cb);
  own.reset();
  try {
    done(std::move(r), status);
  } catch (...) {  // the server's to handle; this thread goes on answering
  }
  leave(false);
}

void Scheduler::answer_loop() {
  std::unique_lock<std::mutex> lock(answers_mu_);
  for (;;) {
    answers_cv_.wait(lock, [&] { return answers_stop_ || !answers_.empty(); });
    if (answers_.empty()) return;
    std::unique_ptr<Pending> p(answers_.front());
    answers_.pop_front();
    lock.unlock();
    deliver_done(std::move(p));
    lock.lock();
  }
}

void Scheduler::answer(const std::vector<Pending*>& batch, bool here) {
  size_t handed = 0;
  for (Pending* p : batch) {
    if (p->done_cb) {
      if (here) {
        deliver_done(std::unique_ptr<Pending>(p));
      } else {
        std::lock_guard<std::mutex> g(answers_mu_);
        answers_.push_back(p);
        ++handed;
      }
      continue;
    }
    // Told under its lock: its caller cannot leave (and free it) before this is done with it.
    std::lock_guard<std::mutex> g(p->m);
    p->done = true;
    p->answered.notify_one();
  }
  if (handed == 1) answers_cv_.notify_one();
  if (handed > 1) answers_cv_.notify_all();
}

void Scheduler::execute_batch(Slot& slot, const std::vector<Pending*>& batch) {
  try {
    execute(slot.session, batch, slot.scratch, slot.staging);
  } catch (const HttpError& e) {  // device staging that failed (out of device memory...)
    for (Pending* p : batch) p->result = Status(e.status >= 500 ? ErrorCode::kInternal : ErrorCode::kInvalidArgument, e.message);
  } catch (const std::bad_alloc&) {  // a batch too large for host memory fails, the server stays
    for (Pending* p : batch) p->result = Status(ErrorCode::kOutOfMemory, "out of host memory running the batch");
  } catch (const std::exception& e) {
    for (Pending* p : batch) p->result = Status(ErrorCode::kInternal, std::string("internal error: ") + e.what());
  }
}

void Scheduler::run_batch(std::unique_lock<std::mutex>& lock, Slot& slot, Clock::time_point until) {
  slot.busy = true;
  std::vector<Pending*> batch = take(lock, until);
  if (!batch.empty()) {
    lock.unlock();
    execute_batch(slot, batch);
    answer(batch, true);  // the thread that formed it answers it
    lock.lock();
  }
  slot.busy = false;
  if (!queue_.empty()) queued_.notify_all();  // the slot's worker may take the next batch
}

bool Scheduler::launch(Slot& slot, const std::vector<Pending*>& batch, InFlight& f) {
  if (!gpu_ || !slot.queue_runs || settings_.max_batch_size <= 0) return false;
  for (const TensorView& v : *batch[0]->inputs) {  // the batch's requests lie alike (same_past_batch)
    if (!v.on_device) return false;
  }
  f.start = Clock::now();
  f.rows = 0;
  for (const Pending* p : batch) f.rows += p->rows;
  std::optional<std::vector<std::vector<int64_t>>> shapes = scatter_shapes(batch, f.rows);
  if (!shapes) return false;
  try {  // anything that fails here (staging out of device memory...) is execute()'s to try and report
    if (!slot.staging) slot.staging.emplace();
    std::vector<TensorView> views;
    for (size_t k = 0; k < batch[0]->inputs->size(); ++k) views.push_back(gather_on_device(batch, k, f.rows, *slot.staging));
    Expected<std::vector<HostTensor>> out = run_scattered(slot.session, views, batch, f.rows, *shapes, *slot.staging, true);
    if (!out) {  // nothing queued: execute() runs it (and reports a bad request as its own)
      if (out.status().code() == ErrorCode::kUnsupported) slot.queue_runs = false;
      return false;
    }
    slot.staging->mark();
    f.out = std::move(*out);
  } catch (...) {  // HttpError or std::exception: nothing answered yet; execute() runs it on the same streams
    return false;
  }
  for (const Pending* p : batch) metrics_.queue_us += us_between(p->enqueued, f.start);
  f.batch = batch;
  return true;
}

void Scheduler::finish(Slot& slot, InFlight& f) {
  std::optional<Status> failed;
  try {
    slot.staging->wait();
  } catch (const HttpError& e) {
    failed = Status(ErrorCode::kInternal, e.message);
  }
  const uint64_t compute = us_between(f.start, Clock::now());
  metrics_.executions += 1;
  metrics_.compute_us += compute * f.batch.size();
  metrics_.inferences += uint64_t(f.rows);
  for (Pending* p : f.batch) {
    if (failed) {
      p->result = *failed;
      continue;
    }
    std::vector<HostTensor> mine;  // written in the request's regions: shapes only
    for (const HostTensor& t : f.out) mine.push_back(slice_rows(t, 0, p->rows));
    p->result = std::move(mine);
  }
}

bool Scheduler::forms_now() const {
  if (!settings_.dynamic_batching) return true;
  const Joinable j = joinable();
  return j.rows >= settings_.max_batch_size || j.preferred ||
         Clock::now() >= queue_.front()->enqueued + std::chrono::microseconds(settings_.max_queue_delay_us);
}

unsigned char* Scheduler::Scratch::get(size_t k, size_t bytes) {
  if (inputs.size() <= k) inputs.resize(k + 1);
  Buffer& b = inputs[k];
  if (b.size < bytes) {
    const size_t n = std::max(bytes, b.size * 2);
    b.p = std::shared_ptr<unsigned char>(static_cast<unsigned char*>(::operator new[](n, std::align_val_t(64))),
                                         [](unsigned char* q) { ::operator delete[](q, std::align_val_t(64)); });
    b.size = n;
  }
  return b.p.get();
}

Scheduler::Joinable Scheduler::joinable() const {
  const Pending* head = queue_.front();
  const std::vector<int>& preferred = settings_.preferred_batch_sizes;
  Joinable j;
  for (const Pending* p : queue_) {
    if (j.rows + p->rows <= settings_.max_batch_size && same_past_batch(*head->inputs, *p->inputs)) {
      j.rows += p->rows;
      if (std::binary_search(preferred.begin(), preferred.end(), j.rows)) j.preferred = j.rows;
    }
  }
  return j;
}

std::vector<Scheduler::Pending*> Scheduler::take(std::unique_lock<std::mutex>& lock, Clock::time_point until) {
  std::vector<Pending*> batch;
  if (!settings_.dynamic_batching) {
    batch.push_back(queue_.front());
  } else {
    // Wait (up to the head request's queue delay) until the compatible rows reach max_batch_size or,
    // as in Triton, make a preferred size: a batch of a preferred size that can be formed runs at
    // once. Requests may leave meanwhile (timeouts): read the head anew.
    forming_ = true;
    for (;;) {
      if (queue_.empty()) break;
      if (stopping_ || forms_now()) break;
      const Clock::time_point end = queue_.front()->enqueued + std::chrono::microseconds(settings_.max_queue_delay_us);
      if (Clock::now() >= until) {  // the forming caller's own deadline: it leaves, a worker forms
        forming_ = false;
        queued_.notify_all();
        return batch;
      }
      queued_.wait_until(lock, std::min(end, until));
    }
    forming_ = false;
    if (!queue_.empty()) {
      // The largest preferred size the rows make; else (the delay ran out, or the rows reached
      // max_batch_size) the rows trimmed to the largest size the batcher forms (batch_sizes) that
      // they reach; fewer rows than the smallest size run as they are.
      const Pending* head = queue_.front();
      const Joinable j = joinable();
      int64_t target = j.preferred;
      if (!target) {
        auto it = std::upper_bound(settings_.batch_sizes.begin(), settings_.batch_sizes.end(), j.rows);
        target = it == settings_.batch_sizes.begin() ? j.rows : *std::prev(it);
      }
      // The head always goes (FIFO), whatever its size; then those behind it that fit.
      int64_t rows = head->rows;
      batch.push_back(queue_.front());
      for (auto it = std::next(queue_.begin()); it != queue_.end(); ++it) {
        Pending* p = *it;
        if (rows + p->rows <= target && same_past_batch(*head->inputs, *p->inputs)) {
          rows += p->rows;
          batch.push_back(p);
        }
      }
    }
  }
  for (Pending* p : batch) {
    p->taken = true;
    queue_.erase(std::find(queue_.begin(), queue_.end(), p));
    if (p->has_deadline) {
      deadlines_.erase(p->deadline);
      p->has_deadline = false;
    }
  }
  if (!queue_.empty()) queued_.notify_all();  // another idle worker may form the next batch
  return batch;
}

TensorView Scheduler::gather_on_device(const std::vector<Pending*>& batch, size_t k, int64_t rows,
                                      DeviceStaging& staging) const {
  TensorView v = (*batch[0]->inputs)[k];
  v.shape[0] = rows;
  unsigned char* all = staging.buffer(k, size_t(v.numel()) * dtype_size(v.dtype));
  DeviceCopies copies;
  size_t at = 0;
  for (const Pending* p : batch) {
    const TensorView& in = (*p->inputs)[k];
    copies.add(all + at, in.data, in.bytes());
    at += in.bytes();
  }
  staging.copy_all(copies);
  v.data = all;
  return v;
}

std::optional<std::vector<std::vector<int64_t>>> Scheduler::output_shapes(int64_t rows) const {
  if (!gpu_) return std::nullopt;
  std::vector<std::vector<int64_t>> shapes;
  for (const TensorInfo& o : outputs_) {
    std::vector<int64_t> shape = o.shape;
    if (settings_.max_batch_size > 0 && !shape.empty() && shape[0] < 0) shape[0] = rows;
    for (int64_t d : shape) {
      if (d < 0) return std::nullopt;
    }
    if (o.dtype == DType::kString) return std::nullopt;
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

std::optional<std::vector<std::vector<int64_t>>> Scheduler::scatter_shapes(const std::vector<Pending*>& batch,
                                                                          int64_t rows) const {
  std::optional<std::vector<std::vector<int64_t>>> shapes = output_shapes(rows);
  if (!shapes || settings_.max_batch_size <= 0) return std::nullopt;
  for (const std::vector<int64_t>& shape : *shapes) {  // not a batch along dim 0: execute() says so
    if (shape.empty() || shape[0] != rows) return std::nullopt;
  }
  for (const Pending* p : batch) {
    if (!p->targets) return std::nullopt;
    for (size_t k = 0; k < outputs_.size(); ++k) {
      const OutputTarget& t = (*p->targets)[k];
      TensorView v{outputs_[k].dtype, (*shapes)[k], nullptr, false};
      v.shape[0] = p->rows;
      if (!t.data || !t.on_device || v.bytes() > t.capacity) return std::nullopt;
    }
  }
  return shapes;
}

Expected<std::vector<HostTensor>> Scheduler::run_scattered(Session& s, const std::vector<TensorView>& inputs,
                                                           const std::vector<Pending*>& batch, int64_t rows,
                                                           const std::vector<std::vector<int64_t>>& shapes,
                                                           DeviceStaging& staging, bool queue) {
  std::vector<TensorView> views;
  std::vector<HostTensor> out;
  for (size_t k = 0; k < outputs_.size(); ++k) {
    TensorView v{outputs_[k].dtype, shapes[k], nullptr, true};
    v.data = staging.buffer(inputs.size() + k, std::max<size_t>(v.bytes(), 1));  // after the inputs' buffers
    out.emplace_back(v.dtype, v.shape, nullptr, nullptr);
    views.push_back(std::move(v));
  }
  if (Status st = queue ? s.enqueue(inputs, views, staging.stream()) : s.run(inputs, views, staging.stream()); !st) return st;
  DeviceCopies copies;
  for (size_t k = 0; k < views.size(); ++k) {
    const size_t row = rows ? views[k].bytes() / size_t(rows) : 0;
    size_t at = 0;
    for (const Pending* p : batch) {
      const size_t n = row * size_t(p->rows);
      copies.add((*p->targets)[k].data, static_cast<const unsigned char*>(views[k].data) + at, n);
      at += n;
    }
  }
  staging.copy_all(copies);
  return out;
}

Expected<std::vector<HostTensor>> Scheduler::run_views(Session& s, const std::vector<TensorView>& inputs, int64_t rows,
                                                       std::optional<DeviceStaging>& staging,
                                                       const std::vector<OutputTarget>* direct) {
  bool device = false;
  for (const TensorView& v : inputs) device |= v.on_device;
  if (!device) return s.run(inputs);
  if (!staging) staging.emplace();
  // The outputs' shapes: the engine's, dim 0 the batch's rows when the model batches.
  if (std::optional<std::vector<std::vector<int64_t>>> known = output_shapes(rows)) {
    const std::vector<std::vector<int64_t>>& shapes = *known;
    std::vector<HostTensor> out;
    std::vector<TensorView> views;
    for (size_t k = 0; k < outputs_.size(); ++k) {
      TensorView v{outputs_[k].dtype, shapes[k], nullptr, false};
      const OutputTarget* t = direct ? &(*direct)[k] : nullptr;
      if (t && t->data && t->on_device && v.bytes() <= t->capacity) {  // written where the client wants it
        v.data = t->data;
        v.on_device = true;
        out.emplace_back(v.dtype, v.shape, nullptr, nullptr);
      } else {
        auto keep = std::make_shared<std::vector<unsigned char>>(v.bytes());
        v.data = keep->data();
        out.emplace_back(v.dtype, v.shape, keep, keep->data());
      }
      views.push_back(std::move(v));
    }
    if (Status st = s.run(inputs, views, staging->stream()); !st) return st;
    return out;
  }
  // Shapes the engine decides (or a CPU engine): the device inputs come to the host first.
  std::vector<TensorView> host = inputs;
  std::vector<std::shared_ptr<void>> keep;
  for (TensorView& v : host) {
    if (!v.on_device) continue;
    std::shared_ptr<void> b(::operator new[](std::max<size_t>(v.bytes(), 1), std::align_val_t(64)),
                            [](void* q) { ::operator delete[](q, std::align_val_t(64)); });
    staging->copy(b.get(), v.data, v.bytes());
    v.data = b.get();
    v.on_device = false;
    keep.push_back(std::move(b));
  }
  staging->sync();
  return s.run(host);
}

void Scheduler::deliver(Pending& p, std::optional<DeviceStaging>& staging) {
  if (!p.targets || !p.result || !*p.result) return;
  std::vector<HostTensor>& out = **p.result;
  for (size_t k = 0; k < out.size() && k < p.targets->size(); ++k) {
    const OutputTarget& t = (*p.targets)[k];
    const HostTensor& h = out[k];
    if (!t.data || !h.raw() || h.dtype() == DType::kString) continue;  // returned, or already in place
    if (h.bytes() > t.capacity) {
      p.result = Status(ErrorCode::kInvalidArgument, "output '" + outputs_[k].name + "' needs " + std::to_string(h.bytes()) +
                                                         " bytes; shared_memory_byte_size is " + std::to_string(t.capacity));
      return;
    }
    if (t.on_device) {
      if (!staging) staging.emplace();
      staging->copy(t.data, h.raw(), h.bytes());
    } else if (h.bytes()) {
      std::memcpy(t.data, h.raw(), h.bytes());
    }
  }
}

void Scheduler::execute(Session& s, const std::vector<Pending*>& batch, Scratch& scratch,
                        std::optional<DeviceStaging>& staging) {
  const Clock::time_point start = Clock::now();
  int64_t total = 0;
  for (Pending* p : batch) {
    metrics_.queue_us += us_between(p->enqueued, start);
    total += p->rows;
  }
  Expected<std::vector<HostTensor>> out = Status(ErrorCode::kInternal, "not run");
  if (batch.size() == 1) {
    out = run_views(s, *batch[0]->inputs, total, staging, batch[0]->targets);
  } else {
    // One tensor per input holding every request's rows in queue order.
    const std::vector<TensorView>& first = *batch[0]->inputs;
    std::vector<std::shared_ptr<void>> keep;
    std::vector<TensorView> views;
    for (size_t k = 0; k < first.size(); ++k) {
      TensorView v = first[k];
      v.shape[0] = total;
      const size_t es = dtype_size(v.dtype);
      if (v.dtype == DType::kString) {
        auto all = std::make_shared<std::vector<std::string>>();
        for (Pending* p : batch) {
          const TensorView& in = (*p->inputs)[k];
          const auto* b = static_cast<const std::string*>(in.data);
          all->insert(all->end(), b, b + in.numel());
        }
        v.data = all->data();
        keep.push_back(all);
      } else if (v.on_device) {  // requests batch together only when their inputs lie alike (same_past_batch)
        if (!staging) staging.emplace();
        v = gather_on_device(batch, k, total, *staging);
      } else {
        unsigned char* all = scratch.get(k, size_t(v.numel()) * es);
        size_t at = 0;
        for (Pending* p : batch) {
          const TensorView& in = (*p->inputs)[k];
          if (in.bytes()) std::memcpy(all + at, in.data, in.bytes());
          at += in.bytes();
        }
        v.data = all;
      }
      views.push_back(std::move(v));
    }
    // Inputs in device memory and every output wanted there: no trip through the host.
    const bool device = std::any_of(views.begin(), views.end(), [](const TensorView& v) { return v.on_device; });
    std::optional<std::vector<std::vector<int64_t>>> scatter;  // staging exists: it gathered the inputs
    if (device) scatter = scatter_shapes(batch, total);
    out = scatter ? run_scattered(s, views, batch, total, *scatter, *staging) : run_views(s, views, total, staging);
  }
  const uint64_t compute = us_between(start, Clock::now());
  metrics_.executions += 1;
  metrics_.compute_us += compute * batch.size();
  metrics_.inferences += uint64_t(total);
  if (batch.size() > 1 && !out && out.status().code() == ErrorCode::kInvalidArgument) {
    // One request's data (an index out of range...) must not fail the others: each runs alone.
    for (Pending* p : batch) {
      p->result = run_views(s, *p->inputs, p->rows, staging, p->targets);
      deliver(*p, staging);
    }
    if (staging) staging->sync();
    return;
  }
  if (batch.size() == 1 || !out) {
    for (Pending* p : batch) {
      p->result = out;
      deliver(*p, staging);
    }
    if (staging) staging->sync();
    return;
  }
  for (const HostTensor& t : *out) {
    if (t.shape().empty() || t.shape()[0] != total) {
      Status bad(ErrorCode::kInvalidArgument,
                 "an output has " + (t.shape().empty() ? std::string("no batch dim") : std::to_string(t.shape()[0]) + " rows") +
                     " for a batch of " + std::to_string(total) +
                     ": the model's dim 0 is not a batch (its config.pbtxt should say max_batch_size: 0)");
      for (Pending* p : batch) p->result = bad;
      return;
    }
  }
  int64_t at = 0;
  for (Pending* p : batch) {
    std::vector<HostTensor> mine;
    for (const HostTensor& t : *out) mine.push_back(slice_rows(t, at, p->rows));
    p->result = std::move(mine);
    deliver(*p, staging);
    at += p->rows;
  }
  if (staging) staging->sync();
}

}  // namespace kiln::serve
