// Sessions: one stream, one arena, one cuBLASLt and cuDNN handle each; the forward is captured
// into CUDA graphs once (one per run of device steps between host steps) and replayed. Inputs and outputs pass through pinned host buffers so the
// copies are true async DMA. Nothing is allocated in the steady-state loop.
#include <cuda_profiler_api.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "backends/backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda/engine_impl.h"
#include "backends/cuda/weight_pool.h"

namespace kiln::cuda {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

size_t io_bytes(const DeviceIo& d) {
  size_t n = 1;
  for (int64_t x : d.dims) n *= size_t(x);
  return n * size_t(k::dt_size(k::DT(d.device_dtype)));
}

// Owns device/pinned memory and handles; frees them on every path, including failed builds.
struct DeviceMem {
  void* p = nullptr;
  ~DeviceMem() { reset(); }
  void reset() {
    if (p) cudaFree(p);
    p = nullptr;
  }
};
struct PinnedMem {
  void* p = nullptr;
  ~PinnedMem() { reset(); }
  void reset() {
    if (p) cudaFreeHost(p);
    p = nullptr;
  }
};

// cuDNN handles are lent to sessions from a process-wide pool and taken back when a session ends:
// creating and destroying a handle per session leaks about 36 KB of host memory in cuDNN each time
// (bench/RESULTS.md, fourteenth session: 999 sessions of a convolution engine, +36.8 MiB RSS; none
// for an engine without cuDNN). A handle serves one session at a time, so concurrent sessions
// still each have their own.
class DnnPool {
 public:
  static DnnPool& get() {
    static DnnPool* pool = new DnnPool;  // never destroyed: its handles may outlive static teardown
    return *pool;
  }
  // A handle of the calling thread's current GPU (a handle belongs to the device it was made on:
  // the ranks of a tensor-parallel engine take theirs on their own GPUs).
  Expected<cudnnHandle_t> take() {
    int dev = 0;
    KILN_CUDA_TRY(cudaGetDevice(&dev));
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<cudnnHandle_t>& free = free_[dev];
      if (!free.empty()) {
        cudnnHandle_t h = free.back();
        free.pop_back();
        return h;
      }
    }
    cudnnHandle_t h = nullptr;
    KILN_CUDA_TRY(cudnnCreate(&h));
    std::lock_guard<std::mutex> lock(mu_);
    device_[h] = dev;
    return h;
  }
  void give_back(cudnnHandle_t h) {
    cudnnSetStream(h, nullptr);  // not the ended session's stream, which is destroyed next
    std::lock_guard<std::mutex> lock(mu_);
    free_[device_[h]].push_back(h);
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<cudnnHandle_t>> free_;  // per device
  std::map<cudnnHandle_t, int> device_;
};

std::mutex g_init_stats_mu;
SessionInitStats g_init_stats;

int sessions_made() {
  std::lock_guard<std::mutex> l(g_init_stats_mu);
  return g_init_stats.sessions;
}

class CudaSession : public Session {
 public:
  // `lanes` > 1: micro-batches (Engine::new_lanes_session), `batched` per input.
  CudaSession(std::shared_ptr<EngineImpl> e, void* comm, int lanes = 1, std::vector<bool> batched = {},
              SharedSessionMemory* shared = nullptr)
      : e_(std::move(e)), lanes_(lanes), batched_(std::move(batched)), shared_(shared) {
    ctx_.comm = comm;
    batched_.resize(e_->plan.inputs.size(), false);
  }
  ~CudaSession() override {
    if (stream_) cudaStreamSynchronize(stream_);  // a queued run (run_buffers without wait) ends first
    std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
    for (const Segment& g : segments_) {
      if (g.exec) cudaGraphExecDestroy(g.exec);
    }
    for (Lane& l : lanes_extra_) {
      if (l.dnn) DnnPool::get().give_back(l.dnn);
      if (l.ctx.stream) cudaStreamDestroy(l.ctx.stream);
    }
    for (cudaEvent_t ev : lane_events_) {
      if (ev) cudaEventDestroy(ev);
    }
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
    if (dnn_) DnnPool::get().give_back(dnn_);
    if (lt_) cublasLtDestroy(lt_);
    if (io_event_) cudaEventDestroy(io_event_);
    if (done_event_) cudaEventDestroy(done_event_);
    if (stream_) cudaStreamDestroy(stream_);
    mem_.reset();
    pinned_.reset();
    shared_dev_.reset();  // the last session placed in a replaced block frees it
    shared_host_.reset();
  }

  Status init() {
    std::unique_lock<std::recursive_mutex> lock(device_mutation_mutex());
    const DevicePlan& P = e_->plan;
    if (e_->uses_comm && !ctx_.comm) {
      return KILN_ERROR(kInvalidArgument, "this engine is one rank of a tensor-parallel engine: it runs in the whole "
                        "engine's sessions, beside its peers");
    }
    using clock = std::chrono::steady_clock;
    auto t = clock::now();
    SessionInitStats st;
    auto lap = [&t](double& into) {
      auto now = clock::now();
      into += std::chrono::duration<double, std::milli>(now - t).count();
      t = now;
    };
    KILN_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KILN_CUDA_TRY(cudaEventCreateWithFlags(&io_event_, cudaEventDisableTiming));
    KILN_CUDA_TRY(cudaEventCreateWithFlags(&done_event_, cudaEventDisableTiming));
    // A library's handle only where a step uses it: a cold process pays ~100 ms for cuDNN's first
    // handle (bench/RESULTS.md, init_costs), which a transformer never needs.
    if (e_->uses_lt) KILN_CUDA_TRY(cublasLtCreate(&lt_));
    if (e_->uses_dnn) {
      KILN_ASSIGN_OR_RETURN(dnn_, DnnPool::get().take());
      KILN_CUDA_TRY(cudnnSetStream(dnn_, stream_));
    }
    lap(st.handles_ms);
    const size_t slots = size_t(std::max(1, P.bad_index_slots));
    // Each lane's block: arena, workspace, bad-index slots, counters (the first two in the shared
    // memory when the session is placed there).
    const size_t arena_ws = align_up(e_->rep.arena_peak) + align_up(e_->opt.workspace_bytes);
    const size_t tail = align_up(sizeof(int) * slots) + align_up(sizeof(unsigned long long) * slots);
    const bool share = shared_ && lanes_ == 1;
    lane_bytes_ = share ? tail : arena_ws + tail;
    bytes_ = lane_bytes_ * size_t(lanes_);
    KILN_CUDA_TRY(cudaMalloc(&mem_.p, bytes_));
    size_t staging = 0;  // pinned: inputs and outputs
    for (size_t i = 0; i < P.inputs.size(); ++i) staging += align_up(io_bytes(P.inputs[i]) * lanes_of(i));
    for (const DeviceIo& d : P.outputs) staging += align_up(io_bytes(d) * size_t(lanes_));
    const size_t bad_bytes = sizeof(int) * slots * size_t(lanes_);
    char* h = nullptr;
    if (share) {
      // The bad-index counts are read back into the shared block too, after the staging: a session's
      // calls never overlap another's, and a pinned allocation of its own took ~10 ms of each new
      // shape's first run on the H200 (bench/RESULTS.md).
      KILN_RETURN_IF_ERROR(place_shared(arena_ws, staging + bad_bytes));
      h = static_cast<char*>(shared_host_.get());
      bad_host_ = reinterpret_cast<int*>(h + staging);
    } else {
      KILN_CUDA_TRY(cudaMallocHost(&pinned_.p, staging + bad_bytes));
      h = static_cast<char*>(pinned_.p);
      bad_host_ = reinterpret_cast<int*>(h + staging);
    }
    ctx_.stream = stream_;
    ctx_.lt = lt_;
    ctx_.dnn = dnn_;
    ctx_.offsets = &P.offsets;
    ctx_.weights = &e_->weight_ptrs;
    ctx_.workspace_bytes = e_->opt.workspace_bytes;
    if (share) {
      place_lane(ctx_, static_cast<char*>(shared_dev_.get()), static_cast<char*>(mem_.p));
    } else {
      place_lane(ctx_, static_cast<char*>(mem_.p), static_cast<char*>(mem_.p) + arena_ws);
    }
    KILN_RETURN_IF_ERROR(init_lanes(arena_ws));
    for (size_t i = 0; i < P.inputs.size(); ++i) { in_host_.push_back(h); h += align_up(io_bytes(P.inputs[i]) * lanes_of(i)); }
    for (const DeviceIo& d : P.outputs) { out_host_.push_back(h); h += align_up(io_bytes(d) * size_t(lanes_)); }
    KILN_CUDA_TRY(cudaMemsetAsync(mem_.p, 0, bytes_, stream_));
    lap(st.memory_ms);
    lock.unlock();
    std::unique_lock<std::recursive_mutex> forward_lock = capture_lock();
    if (e_->rep.cuda_graph) {
      // Capture straight away where the libraries' lazy state is likely made already (an earlier
      // session in this process); a capture that fails (a library initializing itself, which capture
      // forbids) is dropped, one eager pass makes that state, and the capture is made again. A
      // tensor-parallel rank's session always runs the eager pass first: NCCL connects lazily.
      bool captured = false;
      if (lanes_ == 1 && !ctx_.comm && sessions_made() > 0) {
        captured = bool(capture());
        if (!captured) {
          cudaGetLastError();  // the failed capture's error, not a sticky one
          for (Segment& g : segments_) {
            if (g.exec) cudaGraphExecDestroy(g.exec);
          }
          segments_.clear();
        }
      }
      lap(st.capture_ms);
      if (!captured) {
        KILN_RETURN_IF_ERROR(lanes_ > 1 ? enqueue_lanes() : run_steps());
        KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
        lap(st.eager_ms);
        st.eager_runs = 1;
        KILN_RETURN_IF_ERROR(lanes_ > 1 ? capture_lanes() : capture());
        lap(st.capture_ms);
      }
    }
    {
      std::lock_guard<std::mutex> l(g_init_stats_mu);
      ++g_init_stats.sessions;
      g_init_stats.handles_ms += st.handles_ms;
      g_init_stats.memory_ms += st.memory_ms;
      g_init_stats.eager_ms += st.eager_ms;
      g_init_stats.eager_runs += st.eager_runs;
      g_init_stats.capture_ms += st.capture_ms;
    }
    for (int k = 0; k < lanes_; ++k) {
      const RunCtx& c = lane(k);
      if (e_->opt.poison) {
        // 0xFF bytes are NaN in every float dtype: an output element no kernel wrote stays NaN.
        KILN_CUDA_TRY(cudaMemsetAsync(c.arena, 0xFF, align_up(e_->rep.arena_peak), stream_));
      }
      // The first run the caller makes is run 0 of the session's random steps, warm-up or not.
      KILN_CUDA_TRY(cudaMemsetAsync(c.counters, 0, sizeof(unsigned long long) * slots, stream_));
    }
    KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status::ok();
  }

  Expected<std::vector<Data>> run(const std::vector<Data>& inputs) override {
    KILN_RETURN_IF_ERROR(stage_inputs(inputs));
    KILN_RETURN_IF_ERROR(enqueue(true));
    KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
    KILN_RETURN_IF_ERROR(check_bad_indices());
    std::vector<Data> outs;
    for (size_t i = 0; i < e_->plan.outputs.size(); ++i) {
      const DeviceIo& d = e_->plan.outputs[i];
      KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(ir_dtype_of(k::DT(d.device_dtype)), lane_dims(d, true)));
      std::memcpy(t.raw(), out_host_[i], io_bytes(d) * size_t(lanes_));
      KILN_ASSIGN_OR_RETURN(Tensor ir, convert_tensor(t, DType(d.ir_dtype)));
      outs.emplace_back(std::move(ir));
    }
    return outs;
  }

  Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) override {
    KILN_RETURN_IF_ERROR(stage_inputs(inputs));
    KILN_RETURN_IF_ERROR(enqueue(true));  // inputs into the arena once
    KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
    KILN_RETURN_IF_ERROR(check_bad_indices());
    for (int i = 0; i < warmup; ++i) KILN_RETURN_IF_ERROR(enqueue(false));
    cudaEvent_t a = nullptr, b = nullptr;
    KILN_CUDA_TRY(cudaEventCreate(&a));
    Status st = cuda_status(cudaEventCreate(&b), "cudaEventCreate");
    std::vector<double> times;
    for (int i = 0; st && i < iterations; ++i) {
      st = cuda_status(cudaEventRecord(a, stream_), "cudaEventRecord");
      if (st) st = enqueue(false);
      if (st) st = cuda_status(cudaEventRecord(b, stream_), "cudaEventRecord");
      if (st) st = cuda_status(cudaEventSynchronize(b), "cudaEventSynchronize");
      float ms = 0;
      if (st) st = cuda_status(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
      times.push_back(ms);
    }
    cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    KILN_RETURN_IF_ERROR(st);
    return times;
  }

  Expected<std::vector<ProfiledStep>> profile(const std::vector<Data>& inputs) override {
    KILN_RETURN_IF_ERROR(stage_inputs(inputs));
    KILN_RETURN_IF_ERROR(enqueue(true));
    KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
    const auto& steps = e_->plan.steps;
    std::vector<cudaEvent_t> ev(steps.size() + 1, nullptr);
    Status st;
    for (auto& e : ev) {
      if (st) st = cuda_status(cudaEventCreate(&e), "cudaEventCreate");
    }
    // Each step's median over kRuns step-by-step forwards: a step's first launches (lazily loaded
    // modules, cold caches) are not its time. The last forward alone is what `ncu
    // --profile-from-start off` sees (not the build's autotuning launches); both profiler calls are
    // no-ops without a profiler attached.
    constexpr int kRuns = 5;
    std::vector<std::vector<float>> times(steps.size());
    for (int run = 0; st && run < kRuns; ++run) {
      if (run == kRuns - 1) cudaProfilerStart();
      for (size_t i = 0; st && i < steps.size(); ++i) {
        st = cuda_status(cudaEventRecord(ev[i], stream_), "cudaEventRecord");
        if (st) st = run_step(i);
      }
      if (st) st = cuda_status(cudaEventRecord(ev.back(), stream_), "cudaEventRecord");
      if (st) st = cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      if (run == kRuns - 1) cudaProfilerStop();
      for (size_t i = 0; st && i < steps.size(); ++i) {
        float ms = 0;
        st = cuda_status(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]), "cudaEventElapsedTime");
        times[i].push_back(ms);
      }
    }
    const Precision p = e_->opt.precision;
    const size_t float_bytes = p == Precision::kFp16 || p == Precision::kBf16 ? 2 : 4;
    std::vector<ProfiledStep> out;
    for (size_t i = 0; st && i < steps.size(); ++i) {
      std::vector<float>& t = times[i];
      std::nth_element(t.begin(), t.begin() + ptrdiff_t(t.size() / 2), t.end());
      out.push_back({steps[i].label, steps[i].node, steps[i].node_index, t[t.size() / 2], float_bytes});
    }
    for (auto& e : ev) {
      if (e) cudaEventDestroy(e);
    }
    KILN_RETURN_IF_ERROR(st);
    return out;
  }

  Expected<std::vector<NonFinite>> check_finite(const std::vector<Data>& inputs) override {
    const DevicePlan& P = e_->plan;
    KILN_RETURN_IF_ERROR(stage_inputs(inputs));
    // A value is counted once, right after the last step that writes its buffer: then every slice
    // of it is written (Concat's copies, a scatter into its copy, an op in place) and none of its
    // bytes is what a dead buffer left in the arena.
    std::vector<size_t> last_writer(P.buffer_bytes.size(), P.steps.size());
    for (size_t i = 0; i < P.steps.size(); ++i) {
      for (int32_t b : P.steps[i].writes) last_writer[size_t(b)] = i;
    }
    for (size_t i = 0; i < P.inputs.size(); ++i) {
      const DeviceIo& d = P.inputs[i];
      KILN_CUDA_TRY(cudaMemcpyAsync(ctx_.ptr(d.ref), in_host_[i], io_bytes(d), cudaMemcpyHostToDevice, stream_));
    }
    if (P.bad_index_slots) {
      KILN_CUDA_TRY(cudaMemsetAsync(ctx_.bad_index, 0, sizeof(int) * size_t(P.bad_index_slots), stream_));
    }
    DeviceMem counter;
    KILN_CUDA_TRY(cudaMalloc(&counter.p, sizeof(unsigned long long)));
    auto* cnt = static_cast<unsigned long long*>(counter.p);
    std::vector<NonFinite> found;
    for (size_t i = 0; i < P.steps.size(); ++i) {
      KILN_RETURN_IF_ERROR(run_step(i));
      NonFinite nf{P.steps[i].label, 0, 0};
      KILN_CUDA_TRY(cudaMemsetAsync(cnt, 0, sizeof(unsigned long long), stream_));
      for (int32_t b : P.steps[i].writes) {
        const uint8_t dt = P.buffer_dtype[size_t(b)];
        if (last_writer[size_t(b)] != i) continue;
        const auto kdt = k::DT(dt);
        if (dt == DevicePlan::kNoDtype ||
            (kdt != k::DT::kF32 && kdt != k::DT::kF16 && kdt != k::DT::kBF16 && kdt != k::DT::kF64)) {
          continue;
        }
        const int64_t n = int64_t(P.buffer_bytes[size_t(b)] / size_t(k::dt_size(kdt)));
        KILN_CUDA_TRY(k::count_nonfinite(kdt, ctx_.arena + P.offsets[size_t(b)], n, cnt, stream_));
        nf.numel += n;
      }
      unsigned long long c = 0;
      KILN_CUDA_TRY(cudaMemcpyAsync(&c, cnt, sizeof(c), cudaMemcpyDeviceToHost, stream_));
      KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
      nf.count = int64_t(c);
      if (c != 0) found.push_back(std::move(nf));
    }
    if (P.bad_index_slots) {
      KILN_CUDA_TRY(cudaMemcpyAsync(bad_host_, ctx_.bad_index, sizeof(int) * size_t(P.bad_index_slots),
                                    cudaMemcpyDeviceToHost, stream_));
      KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
    }
    KILN_RETURN_IF_ERROR(check_bad_indices(1));
    return found;
  }

  size_t device_bytes() const override { return bytes_; }
  void wait() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (const Lane& l : lanes_extra_) {
      if (l.ctx.stream) cudaStreamSynchronize(l.ctx.stream);
    }
    if (comm_stream_) cudaStreamSynchronize(comm_stream_);
  }

  Status run_buffers(const std::vector<IoBuffer>& inputs, const std::vector<IoBuffer>& outputs, void* stream,
                     bool wait) override {
    if (lanes_ > 1) return KILN_ERROR(kUnsupported, "a micro-batched session takes host tensors");
    if (!wait && e_->plan.bad_index_slots) {
      return KILN_ERROR(kUnsupported, "this engine checks index bounds on the host after each run: it cannot be queued");
    }
    const Graph& g = *e_->graph;
    const DevicePlan& P = e_->plan;
    auto check = [](const char* what, size_t i, const Value* v, const DeviceIo& d, const IoBuffer& b) -> Status {
      if (b.dtype != DType(d.ir_dtype) || b.dims != d.dims) {
        return KILN_ERROR(kInvalidArgument, "{} {} ('{}'): got {}{}, the engine takes {}{}", what, i, v->name,
                          dtype_name(b.dtype), dims_to_string(b.dims), dtype_name(DType(d.ir_dtype)), dims_to_string(d.dims));
      }
      if (!b.data && io_bytes(d) > 0) return KILN_ERROR(kInvalidArgument, "{} {} ('{}'): null data", what, i, v->name);
      return Status::ok();
    };
    if (inputs.size() != P.inputs.size() || outputs.size() != P.outputs.size()) {
      return KILN_ERROR(kInvalidArgument, "expected {} inputs and {} outputs, got {} and {}", P.inputs.size(),
                        P.outputs.size(), inputs.size(), outputs.size());
    }
    for (size_t i = 0; i < inputs.size(); ++i) KILN_RETURN_IF_ERROR(check("input", i, g.inputs[i], P.inputs[i], inputs[i]));
    for (size_t i = 0; i < outputs.size(); ++i) {
      KILN_RETURN_IF_ERROR(check("output", i, g.outputs[i], P.outputs[i], outputs[i]));
    }
    // The forward starts after the caller's queued work (which may be producing the inputs).
    auto caller = static_cast<cudaStream_t>(stream);
    if (!wait) {  // a queued run that fails part way returns once what it queued is done
      Status st = queue_buffers(inputs, outputs, caller);
      if (!st) cudaStreamSynchronize(stream_);
      return st;
    }
    return run_buffers_waiting(inputs, outputs, caller);
  }

 private:
  // run_buffers' work once the buffers are checked: queued and left for the caller's stream to wait
  // for, or waited for here (with the index-bound check).
  Status queue_buffers(const std::vector<IoBuffer>& inputs, const std::vector<IoBuffer>& outputs, cudaStream_t caller) {
    KILN_RETURN_IF_ERROR(copy_in_and_run(inputs, outputs, caller));
    KILN_CUDA_TRY(cudaEventRecord(done_event_, stream_));
    return cuda_status(cudaStreamWaitEvent(caller, done_event_), "cudaStreamWaitEvent");
  }
  Status run_buffers_waiting(const std::vector<IoBuffer>& inputs, const std::vector<IoBuffer>& outputs, cudaStream_t caller) {
    const DevicePlan& P = e_->plan;
    KILN_RETURN_IF_ERROR(copy_in_and_run(inputs, outputs, caller));
    if (P.bad_index_slots) {
      KILN_CUDA_TRY(cudaMemcpyAsync(bad_host_, ctx_.bad_index, sizeof(int) * size_t(P.bad_index_slots),
                                    cudaMemcpyDeviceToHost, stream_));
    }
    KILN_CUDA_TRY(cudaStreamSynchronize(stream_));
    return check_bad_indices();
  }
  Status copy_in_and_run(const std::vector<IoBuffer>& inputs, const std::vector<IoBuffer>& outputs, cudaStream_t caller) {
    const DevicePlan& P = e_->plan;
    KILN_CUDA_TRY(cudaEventRecord(io_event_, caller));
    KILN_CUDA_TRY(cudaStreamWaitEvent(stream_, io_event_));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const DeviceIo& d = P.inputs[i];
      KILN_CUDA_TRY(cudaMemcpyAsync(ctx_.ptr(d.ref), inputs[i].data, io_bytes(d),
                                    inputs[i].on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice, stream_));
    }
    if (P.bad_index_slots) {
      KILN_CUDA_TRY(cudaMemsetAsync(ctx_.bad_index, 0, sizeof(int) * size_t(P.bad_index_slots), stream_));
    }
    KILN_RETURN_IF_ERROR(enqueue(false));
    for (size_t i = 0; i < outputs.size(); ++i) {
      const DeviceIo& d = P.outputs[i];
      KILN_CUDA_TRY(cudaMemcpyAsync(outputs[i].data, ctx_.ptr(d.ref), io_bytes(d),
                                    outputs[i].on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost, stream_));
    }
    return Status::ok();
  }
  Status run_steps() {
    for (size_t i = 0; i < e_->fns.size(); ++i) KILN_RETURN_IF_ERROR(run_step(i));
    return Status::ok();
  }

  Status run_step(size_t i, const RunCtx& c) {
    Status st = e_->fns[i](c);
    return st ? st : st.with_context(e_->plan.steps[i].label);
  }
  Status run_step(size_t i) { return run_step(i, ctx_); }

  // ---- lanes (micro-batches) ----

  const RunCtx& lane(int k) const { return k == 0 ? ctx_ : lanes_extra_[size_t(k - 1)].ctx; }
  size_t lanes_of(size_t input) const { return batched_[input] ? size_t(lanes_) : 1; }
  // An input's or output's dims as the caller sees them: every lane's rows where it is batched.
  std::vector<int64_t> lane_dims(const DeviceIo& d, bool batched) const {
    std::vector<int64_t> dims = d.dims;
    if (batched && !dims.empty()) dims[0] *= lanes_;
    return dims;
  }

  // Points c's memory at an arena-and-workspace block and a block of bad-index slots and counters.
  void place_lane(RunCtx& c, char* arena_ws, char* tail) {
    const size_t slots = size_t(std::max(1, e_->plan.bad_index_slots));
    c.arena = arena_ws;
    c.workspace = arena_ws + align_up(e_->rep.arena_peak);
    c.bad_index = reinterpret_cast<int*>(tail);
    c.counters = reinterpret_cast<unsigned long long*>(tail + align_up(sizeof(int) * slots));
  }

  // The shared memory's current blocks when they hold `device` and `host` bytes, else new ones of
  // that size (or the reserve) made current; this session keeps its blocks alive either way.
  Status place_shared(size_t device, size_t host) {
    SharedSessionMemory& m = *shared_;
    KILN_RETURN_IF_ERROR(ensure_shared(m, device, host));
    shared_dev_ = m.device;
    shared_host_ = m.host;
    return Status::ok();
  }

  // Lanes 1.. get a stream, memory and (where steps use one) a cuDNN handle of their own; the
  // collectives of every lane share one more stream.
  Status init_lanes(size_t arena_ws) {
    if (lanes_ == 1) return Status::ok();
    for (const DeviceStep& s : e_->plan.steps) {
      if (s.host) return KILN_ERROR(kUnsupported, "micro-batches need every step on the GPU; '{}' runs on the host", s.label);
    }
    KILN_CUDA_TRY(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    lanes_extra_.resize(size_t(lanes_ - 1));
    for (int k = 1; k < lanes_; ++k) {
      Lane& l = lanes_extra_[size_t(k - 1)];
      l.ctx = ctx_;
      l.ctx.stream = nullptr;
      char* base = static_cast<char*>(mem_.p) + size_t(k) * lane_bytes_;
      place_lane(l.ctx, base, base + arena_ws);
      KILN_CUDA_TRY(cudaStreamCreateWithFlags(&l.ctx.stream, cudaStreamNonBlocking));
      if (e_->uses_dnn) {
        KILN_ASSIGN_OR_RETURN(l.dnn, DnnPool::get().take());
        KILN_CUDA_TRY(cudnnSetStream(l.dnn, l.ctx.stream));
        l.ctx.dnn = l.dnn;
      }
    }
    lane_events_.assign(size_t(2 * lanes_ + 1), nullptr);
    for (cudaEvent_t& ev : lane_events_) KILN_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return Status::ok();
  }

  // Every lane's forward, interleaved: a lane runs its steps up to its next collective on its own
  // stream, the collective runs on the shared stream once the lane is there, and the lane goes on
  // after it. The shared stream takes lane 0's collective, then lane 1's, and so on, phase by
  // phase: the same order on every rank, so no rank waits in one collective while its peer is in
  // another. While lane 0's all-reduce is in flight, lane 1 computes. Forks from and joins back to
  // the session's stream (lane 0's), so it captures as one graph.
  Status enqueue_lanes() {
    const auto& steps = e_->plan.steps;
    auto collective = [&](size_t i) {
      return steps[i].kind == uint16_t(StepOp::kAllReduce) || steps[i].kind == uint16_t(StepOp::kAllGather);
    };
    cudaEvent_t fork = lane_events_.back();
    KILN_CUDA_TRY(cudaEventRecord(fork, stream_));
    KILN_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, fork));
    for (int k = 1; k < lanes_; ++k) KILN_CUDA_TRY(cudaStreamWaitEvent(lane(k).stream, fork));
    std::vector<size_t> at(size_t(lanes_), 0);
    while (at.back() < steps.size()) {
      for (int k = 0; k < lanes_; ++k) {
        size_t& i = at[size_t(k)];
        const RunCtx& c = lane(k);
        while (i < steps.size() && !collective(i)) KILN_RETURN_IF_ERROR(run_step(i++, c));
        if (i == steps.size()) continue;
        cudaEvent_t ready = lane_events_[size_t(2 * k)], done = lane_events_[size_t(2 * k + 1)];
        KILN_CUDA_TRY(cudaEventRecord(ready, c.stream));
        KILN_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, ready));
        RunCtx on_comm = c;
        on_comm.stream = comm_stream_;
        KILN_RETURN_IF_ERROR(run_step(i++, on_comm));
        KILN_CUDA_TRY(cudaEventRecord(done, comm_stream_));
        KILN_CUDA_TRY(cudaStreamWaitEvent(c.stream, done));
      }
    }
    for (int k = 1; k < lanes_; ++k) {
      KILN_CUDA_TRY(cudaEventRecord(lane_events_[size_t(2 * k)], lane(k).stream));
      KILN_CUDA_TRY(cudaStreamWaitEvent(stream_, lane_events_[size_t(2 * k)]));
    }
    KILN_CUDA_TRY(cudaEventRecord(fork, comm_stream_));
    KILN_CUDA_TRY(cudaStreamWaitEvent(stream_, fork));
    return Status::ok();
  }

  Status capture_lanes() {
    std::unique_lock<std::recursive_mutex> lock = capture_lock();
    cudaGraph_t graph = nullptr;
    KILN_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    Status st = enqueue_lanes();
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if ((!st || e != cudaSuccess) && graph) cudaGraphDestroy(graph);
    KILN_RETURN_IF_ERROR(st);
    KILN_CUDA_TRY(e);
    Segment seg{0, e_->plan.steps.size(), nullptr};
    cudaError_t inst = cudaGraphInstantiate(&seg.exec, graph, 0);
    cudaGraphDestroy(graph);
    KILN_CUDA_TRY(inst);
    segments_.push_back(seg);
    return Status::ok();
  }

  // The process-wide lock (device.h) for a session's first forward and its capture, except in a
  // tensor-parallel rank's session: its forward waits in collectives for its peers (and NCCL may
  // connect to them while a capture records its first use of a path), so a rank holding the lock
  // there keeps the peers that wait for the lock from ever arriving. Its peers' sessions are made
  // together, their allocations done before any of them reaches its first collective; the ranks'
  // captures may still overlap another thread's allocation in the same process.
  std::unique_lock<std::recursive_mutex> capture_lock() {
    if (ctx_.comm) return std::unique_lock<std::recursive_mutex>();
    return std::unique_lock<std::recursive_mutex>(device_mutation_mutex());
  }

  // One CUDA graph per run of device steps between host steps (a CPU node costs its round trip,
  // not the graph for the whole forward); host steps stay out of every graph and run in order.
  Status capture() {
    std::unique_lock<std::recursive_mutex> lock = capture_lock();
    const auto& steps = e_->plan.steps;
    for (size_t i = 0; i < steps.size();) {
      if (steps[i].host) {
        segments_.push_back({i, i + 1, nullptr});
        ++i;
        continue;
      }
      size_t end = i;
      while (end < steps.size() && !steps[end].host) ++end;
      Segment seg{i, end, nullptr};
      cudaGraph_t graph = nullptr;
      KILN_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      Status st;
      for (size_t k = i; st && k < end; ++k) st = run_step(k);
      cudaError_t e = cudaStreamEndCapture(stream_, &graph);
      if ((!st || e != cudaSuccess) && graph) cudaGraphDestroy(graph);
      KILN_RETURN_IF_ERROR(st);
      KILN_CUDA_TRY(e);
      cudaError_t inst = cudaGraphInstantiate(&seg.exec, graph, 0);
      cudaGraphDestroy(graph);
      KILN_CUDA_TRY(inst);
      segments_.push_back(seg);
      i = end;
    }
    return Status::ok();
  }

  // The forward: the captured segments replayed and the host steps run between them, or every
  // step launched one by one when nothing was captured.
  Status forward() {
    if (segments_.empty()) return lanes_ > 1 ? enqueue_lanes() : run_steps();
    for (const Segment& g : segments_) {
      if (g.exec) {
        KILN_CUDA_TRY(cudaGraphLaunch(g.exec, stream_));
      } else {
        KILN_RETURN_IF_ERROR(run_step(g.begin));
      }
    }
    return Status::ok();
  }

  Status stage_inputs(const std::vector<Data>& inputs) {
    if (lanes_ == 1) {
      KILN_RETURN_IF_ERROR(check_inputs(*e_->graph, inputs));
    } else if (inputs.size() != e_->plan.inputs.size()) {
      return KILN_ERROR(kInvalidArgument, "expected {} inputs, got {}", e_->plan.inputs.size(), inputs.size());
    }
    for (size_t i = 0; i < e_->plan.inputs.size(); ++i) {
      const DeviceIo& d = e_->plan.inputs[i];
      if (!inputs[i].is_tensor()) return KILN_ERROR(kInvalidArgument, "input '{}' is not a tensor", e_->graph->inputs[i]->name);
      const Tensor& t = inputs[i].tensor;
      if (t.dims() != lane_dims(d, batched_[i]) || DType(d.ir_dtype) != t.dtype()) {
        return KILN_ERROR(kInvalidArgument, "input '{}': {} does not match the engine's {}", e_->graph->inputs[i]->name,
                          t.summary(), dims_to_string(lane_dims(d, batched_[i])));
      }
      std::memcpy(in_host_[i], t.raw(), t.nbytes());
    }
    return Status::ok();
  }

  // with_io: copy staged inputs in and outputs out around the forward.
  Status enqueue(bool with_io) {
    const DevicePlan& P = e_->plan;
    // Lane k reads and writes its rows of the batched inputs and of every output.
    const size_t slots = size_t(P.bad_index_slots);
    for (int k = 0; with_io && k < lanes_; ++k) {
      const RunCtx& c = lane(k);
      for (size_t i = 0; i < P.inputs.size(); ++i) {
        const DeviceIo& d = P.inputs[i];
        const size_t at = batched_[i] ? size_t(k) * io_bytes(d) : 0;
        KILN_CUDA_TRY(cudaMemcpyAsync(c.ptr(d.ref), in_host_[i] + at, io_bytes(d), cudaMemcpyHostToDevice, stream_));
      }
      if (slots) KILN_CUDA_TRY(cudaMemsetAsync(c.bad_index, 0, sizeof(int) * slots, stream_));
    }
    KILN_RETURN_IF_ERROR(forward());
    for (int k = 0; with_io && k < lanes_; ++k) {
      const RunCtx& c = lane(k);
      for (size_t i = 0; i < P.outputs.size(); ++i) {
        const DeviceIo& d = P.outputs[i];
        KILN_CUDA_TRY(cudaMemcpyAsync(out_host_[i] + size_t(k) * io_bytes(d), c.ptr(d.ref), io_bytes(d),
                                      cudaMemcpyDeviceToHost, stream_));
      }
      if (slots) {
        KILN_CUDA_TRY(cudaMemcpyAsync(bad_host_ + size_t(k) * slots, c.bad_index, sizeof(int) * slots,
                                      cudaMemcpyDeviceToHost, stream_));
      }
    }
    return Status::ok();
  }

  // `lanes`: how many lanes' counts the last copy brought back.
  Status check_bad_indices(int lanes = 0) {
    const DevicePlan& P = e_->plan;
    if (!P.bad_index_slots) return Status::ok();
    for (const DeviceStep& s : P.steps) {
      if (s.bad_index_slot < 0) continue;
      int bad = 0;
      for (int k = 0; k < (lanes ? lanes : lanes_); ++k) bad += bad_host_[size_t(k) * size_t(P.bad_index_slots) + size_t(s.bad_index_slot)];
      if (bad > 0) {
        // What the step's kernel counted: out-of-range indices, or the values its kind refuses.
        const StepOp kind = StepOp(s.kind);
        const char* what = kind == StepOp::kRoiAlign       ? "roi(s) with a batch index out of range or not finite"
                           : kind == StepOp::kDropoutTrain ? "run(s) with a training ratio outside [0, 1)"
                                                           : "index value(s) out of range";
        return KILN_ERROR(kInvalidArgument, "{}: {} {}", s.node.empty() ? s.label : s.node, bad, what);
      }
    }
    return Status::ok();
  }

  std::shared_ptr<EngineImpl> e_;
  int lanes_ = 1;              // micro-batches run at once (new_lanes_session), 1 otherwise
  std::vector<bool> batched_;  // per input: lanes take their rows of it (else all read it whole)
  struct Lane {
    RunCtx ctx;                   // its stream and its block of mem_
    cudnnHandle_t dnn = nullptr;  // its own, on its stream, where steps use cuDNN
  };
  std::vector<Lane> lanes_extra_;        // lanes 1.. (lane 0 is ctx_ on stream_)
  cudaStream_t comm_stream_ = nullptr;   // every lane's collectives, in one order
  std::vector<cudaEvent_t> lane_events_; // per lane: ready for its collective, collective done; one to fork and join
  size_t lane_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t io_event_ = nullptr;    // orders run_buffers after the caller's stream
  cudaEvent_t done_event_ = nullptr;  // and the caller's stream after a queued run_buffers
  cublasLtHandle_t lt_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  struct Segment {
    size_t begin = 0, end = 0;        // steps [begin, end)
    cudaGraphExec_t exec = nullptr;   // null: a host step, run eagerly
  };
  std::vector<Segment> segments_;
  SharedSessionMemory* shared_ = nullptr;         // set: arena, workspace and staging placed there (init)
  std::shared_ptr<void> shared_dev_, shared_host_;  // the shared blocks this session is placed in
  DeviceMem mem_;
  PinnedMem pinned_;
  size_t bytes_ = 0;
  RunCtx ctx_;
  std::vector<char*> in_host_, out_host_;
  int* bad_host_ = nullptr;
};

}  // namespace

EngineImpl::~EngineImpl() {
  std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
  fns.clear();
  keep_alive.clear();  // descriptors and libraries before the handles that made them
  if (weight_block) cudaFree(weight_block);
  if (dnn) DnnPool::get().give_back(dnn);
  if (lt) cublasLtDestroy(lt);
}

Status EngineImpl::finish() {
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t) { return std::chrono::duration<double, std::milli>(clock::now() - t).count(); };
  auto t0 = clock::now();
  size_t weights = 0;
  if (!plan.pooled.empty()) {
    // A shape plan of a dynamic engine: its weights are the pool's, uploaded once for every plan.
    for (int32_t id : plan.pooled) weight_sizes.push_back(opt.weight_pool->size(id));
    for (size_t n : weight_sizes) weights += align_up(n);
  } else {
    for (std::string_view w : plan.weights) weights += align_up(w.size());
  }
  if (opt.memory_budget_bytes) {
    size_t need = weights + plan.arena_peak + opt.workspace_bytes;
    if (need > opt.memory_budget_bytes) {
      return KILN_ERROR(kOutOfMemory,
                        "the engine needs {:.1f} MiB of GPU memory per session (weights {:.1f}, arena {:.1f}, workspace "
                        "{:.1f}), over the memory budget of {:.1f} MiB",
                        double(need) / (1 << 20), double(weights) / (1 << 20), double(plan.arena_peak) / (1 << 20),
                        double(opt.workspace_bytes) / (1 << 20), double(opt.memory_budget_bytes) / (1 << 20));
    }
  }
  if (!plan.pooled.empty()) {
    if (!opt.weight_pool) return KILN_ERROR(kInternal, "a pooled device plan without its weight pool");
    for (int32_t id : plan.pooled) {
      KILN_ASSIGN_OR_RETURN(void* p, opt.weight_pool->device(id));
      weight_ptrs.push_back(p);
    }
  } else {
    if (weights > 0) {
      Status st = cuda_status(cudaMalloc(&weight_block, weights), "cudaMalloc (weights)");
      if (!st) {
        weight_block = nullptr;
        return Status(st.code(), fmt::format("uploading {:.1f} MiB of weights: {}", double(weights) / (1 << 20), st.message()));
      }
    }
    // The padding between weights is zeroed too: serialize() writes the block out as it is, and an
    // engine file's bytes must not depend on what the allocation held before (compute-sanitizer's
    // initcheck found them uninitialized).
    if (weights > 0) KILN_CUDA_TRY(cudaMemset(weight_block, 0, weights));
    char* p = static_cast<char*>(weight_block);
    for (std::string_view w : plan.weights) {
      weight_ptrs.push_back(p);
      if (!w.empty()) KILN_CUDA_TRY(cudaMemcpy(p, w.data(), w.size(), cudaMemcpyHostToDevice));
      p += align_up(w.size());
    }
    // The device holds the weights now: a build drops its host copies, a load stops viewing its
    // file (serialize() reads them back from the device). Binding checks references against the count.
    for (std::string_view w : plan.weights) weight_sizes.push_back(w.size());
  }
  plan.weight_store.clear();
  plan.weight_store.shrink_to_fit();
  for (std::string_view& w : plan.weights) w = std::string_view();
  const double upload_ms = ms_since(t0);
  auto t1 = clock::now();
  for (const DeviceStep& st : plan.steps) {
    uses_dnn = uses_dnn || st.kind == uint16_t(StepOp::kCudnnConv) || st.kind == uint16_t(StepOp::kCudnnPool) ||
               st.kind == uint16_t(StepOp::kCudnnConvTranspose) || st.kind == uint16_t(StepOp::kCudnnLrn) ||
               st.kind == uint16_t(StepOp::kCudnnConvNd) || st.kind == uint16_t(StepOp::kCudnnConvTransposeNd) ||
               st.kind == uint16_t(StepOp::kCudnnGraphConv);
    uses_lt = uses_lt || st.kind == uint16_t(StepOp::kLtMatmul) || st.kind == uint16_t(StepOp::kLtMatmulQuant);
    uses_comm = uses_comm || st.kind == uint16_t(StepOp::kAllReduce) || st.kind == uint16_t(StepOp::kAllGather);
  }
  if (uses_dnn) {
    KILN_ASSIGN_OR_RETURN(dnn, DnnPool::get().take());
  }
  if (uses_lt) KILN_CUDA_TRY(cublasLtCreate(&lt));
  const double handles_ms = ms_since(t1);
  auto t2 = clock::now();
  BindCtx bc{plan, graph, opt, dnn, lt, keep_alive};
  KILN_ASSIGN_OR_RETURN(fns, bind_plan(bc));
  const double bind_ms = ms_since(t2);

  const std::string context = rep.load_phases;  // set by Engine::load before finish()
  rep = BuildReport{};
  rep.load_phases = fmt::format("{}weights {:.1f} MiB uploaded in {:.1f} ms, cuDNN and cuBLASLt handles {:.1f} ms, {} steps "
                                "bound in {:.1f} ms", context, double(weights) / (1 << 20), upload_ms, handles_ms,
                                plan.steps.size(), bind_ms);
  for (const DevicePlacement& d : plan.placements) {
    rep.nodes.push_back(NodePlacement{d.node, Placement(d.placement), d.impl, d.why});
  }
  rep.precision = std::string(precision_name(opt.precision));
  rep.weight_bytes = weights;
  rep.arena_peak = plan.arena_peak;
  rep.arena_naive = plan.arena_naive;
  rep.arena_lower_bound = plan.arena_lower_bound;
  rep.workspace_bytes = opt.workspace_bytes;
  for (const DeviceIo& d : plan.inputs) rep.staging_bytes += align_up(io_bytes(d));
  for (const DeviceIo& d : plan.outputs) rep.staging_bytes += align_up(io_bytes(d));
  rep.staging_bytes += align_up(sizeof(int) * size_t(std::max(1, plan.bad_index_slots)));  // the bad-index counts read back
  rep.steps = int(plan.steps.size());
  for (const DeviceStep& s : plan.steps) rep.cpu_steps += s.host;
  // Sessions capture each run of device steps between host steps as a graph of its own.
  int runs = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) runs += !plan.steps[i].host && (i == 0 || plan.steps[i - 1].host);
  rep.cuda_graph = opt.cuda_graph;
  if (!opt.cuda_graph) rep.graph_note = "disabled";
  else if (rep.cpu_steps) rep.graph_note = fmt::format("{} graph(s) around {} host step(s)", runs, rep.cpu_steps);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) rep.device_name = prop.name;
  return Status::ok();
}

Expected<std::pair<std::string, std::string>> EngineImpl::serialize() const {
  if (!plan.pooled.empty()) {
    return KILN_ERROR(kUnsupported, "a shape plan of a dynamic engine is saved with its engine, not on its own");
  }
  DevicePlan copy = plan;
  size_t total = 0;
  for (size_t n : weight_sizes) total += align_up(n);
  std::string host(total, '\0');
  if (total) KILN_CUDA_TRY(cudaMemcpy(host.data(), weight_block, total, cudaMemcpyDeviceToHost));
  // The device block is laid out as DWGT is (each weight at a multiple of kDeviceWeightAlign):
  // written out as it is, up to the last weight's end.
  static_assert(kAlign == kDeviceWeightAlign);
  size_t at = 0, end = 0;
  for (size_t i = 0; i < weight_sizes.size(); ++i) {
    copy.weights[i] = std::string_view(host).substr(at, weight_sizes[i]);
    end = at + weight_sizes[i];
    at += align_up(weight_sizes[i]);
  }
  std::string dpln = write_device_plan(copy);
  host.resize(end);
  return std::make_pair(std::move(dpln), std::move(host));
}

Expected<std::unique_ptr<Session>> EngineImpl::new_session(void* comm, SharedSessionMemory* shared) {
  auto s = std::make_unique<CudaSession>(shared_from_this(), comm, 1, std::vector<bool>{}, shared);
  KILN_RETURN_IF_ERROR(s->init());
  return std::unique_ptr<Session>(std::move(s));
}

Expected<std::unique_ptr<Session>> EngineImpl::new_lanes_session(void* comm, int micro_batches, std::vector<bool> batched) {
  if (micro_batches < 1 || micro_batches > 64 || batched.size() != plan.inputs.size()) {
    return KILN_ERROR(kInvalidArgument, "micro-batches: {} lanes over {} batch flags for {} inputs", micro_batches,
                      batched.size(), plan.inputs.size());
  }
  // Lanes join their rows along axis 0: every output, and every input flagged, must have one.
  for (size_t i = 0; i < plan.inputs.size(); ++i) {
    if (batched[i] && plan.inputs[i].dims.empty()) return KILN_ERROR(kInvalidArgument, "micro-batches: input {} has no rows", i);
  }
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    if (plan.outputs[i].dims.empty()) return KILN_ERROR(kInvalidArgument, "micro-batches: output {} has no rows", i);
  }
  // The memory budget holds for the whole session: every lane's arena and workspace.
  const size_t lane = align_up(plan.arena_peak) + align_up(opt.workspace_bytes);
  if (opt.memory_budget_bytes && rep.weight_bytes + lane * size_t(micro_batches) > opt.memory_budget_bytes) {
    return KILN_ERROR(kOutOfMemory, "{} micro-batches need {:.1f} MiB of GPU memory per session, over the memory budget "
                      "of {:.1f} MiB", micro_batches, double(rep.weight_bytes + lane * size_t(micro_batches)) / (1 << 20),
                      double(opt.memory_budget_bytes) / (1 << 20));
  }
  auto s = std::make_unique<CudaSession>(shared_from_this(), comm, micro_batches, std::move(batched));
  KILN_RETURN_IF_ERROR(s->init());
  return std::unique_ptr<Session>(std::move(s));
}

Status ensure_shared(SharedSessionMemory& m, size_t device, size_t host) {
  std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
  // A block of `need` bytes (or the reserve) made current unless the current one holds that.
  auto ensure = [](std::shared_ptr<void>& block, size_t& bytes, size_t need, size_t reserve, bool pinned) -> Status {
    if (block && bytes >= need) return Status::ok();
    const size_t want = std::max({need, reserve, size_t(1)});
    void* p = nullptr;
    if (pinned) {
      KILN_CUDA_TRY(cudaMallocHost(&p, want));
      block = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    } else {
      KILN_CUDA_TRY(cudaMalloc(&p, want));
      block = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    }
    bytes = want;
    return Status::ok();
  };
  KILN_RETURN_IF_ERROR(ensure(m.device, m.device_bytes, device, m.reserve_device, false));
  return ensure(m.host, m.host_bytes, host, m.reserve_host, true);
}

SessionInitStats session_init_stats() {
  std::lock_guard<std::mutex> l(g_init_stats_mu);
  return g_init_stats;
}

std::string BuildReport::to_text() const {
  std::string out;
  out += fmt::format("device: {}\nprecision: {}\n", device_name, precision);
  int gpu = 0, cpu = 0, folded = 0, pass = 0;
  for (const NodePlacement& n : nodes) {
    switch (n.placement) {
      case Placement::kDevice:
      case Placement::kAlias: ++gpu; break;
      case Placement::kHost: ++cpu; break;
      case Placement::kFolded: ++folded; break;
      case Placement::kPass: ++pass; break;
    }
  }
  out += fmt::format("nodes: {} on cuda, {} on cpu, {} folded at build time, {} removed or fused by graph passes\n", gpu,
                     cpu, folded, pass);
  out += fmt::format("steps per forward: {} ({} on the host); cuda graph: {}{}\n", steps, cpu_steps,
                     cuda_graph ? "yes" : "no", graph_note.empty() ? "" : " (" + graph_note + ")");
  auto mib = [](size_t b) { return double(b) / (1 << 20); };
  out += fmt::format("weights: {:.2f} MiB; activation arena: {:.2f} MiB planned (naive sum {:.2f} MiB, liveness lower "
                     "bound {:.2f} MiB); workspace {:.1f} MiB\n",
                     mib(weight_bytes), mib(arena_peak), mib(arena_naive), mib(arena_lower_bound), mib(workspace_bytes));
  out += fmt::format("build: {:.1f} ms\n", build_ms);
  out += "placement:\n";
  for (const NodePlacement& n : nodes) {
    out += fmt::format("  {:<7} {}  {}{}\n", placement_name(n.placement), n.node, n.impl,
                       n.why.empty() ? "" : "  [" + n.why + "]");
  }
  return out;
}

}  // namespace kiln::cuda
