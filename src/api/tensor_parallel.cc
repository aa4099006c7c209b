// Tensor-parallel engines (BuildConfig::tensor_parallel): one engine per rank, each built from the
// model's graph split by the tensor-parallel pass (passes/tensor_parallel.h), behind one Engine.
// One process drives every rank: rank r runs on GPU r, on a thread of its own, with an NCCL
// communicator per GPU made when a session starts (its collectives are captured in the rank's
// CUDA graph); on the CPU the ranks are threads joined by the reference collective
// (ops/collective.h). Every rank computes the whole output; a session returns rank 0's.
//
// Micro-batches (BuildConfig::micro_batches): where the graph computes each batch row on its own
// (passes/batch_rows.h), the ranks are built for batch / M rows and a session runs M micro-batches
// at once, each on its own threads, CUDA streams, arenas and communicators, so the GPU runs one
// micro-batch's products while another waits in an all-reduce; outputs are joined along axis 0.
//
// The engine file: "KILNTP01", the rank count, a JSON header (the build configuration and the
// split's report), then each rank's own engine file at a 4 KiB boundary, loaded as it is.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "api/engine_impl.h"
#include "ops/collective.h"
#include "passes/batch_rows.h"
#include "passes/pipeline.h"
#include "passes/tensor_parallel.h"
#include "runtime/engine_file.h"

namespace kiln {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'T', 'P', '0', '1'};
constexpr size_t kAlign = 4096;

// Where the ranks run: every rank on its own GPU, or every rank on the CPU.
Expected<Device> rank_device(const BuildConfig& c) {
  const int n = c.tensor_parallel;
  std::string why;
  if (c.device != Device::kCpu && gpu_usable(&why)) {
    if (gpu_count() >= n) return Device::kCuda;
    why = fmt::format("{} ranks need {} GPUs; this machine has {}", n, n, gpu_count());
  }
  if (c.device == Device::kCuda) return KILN_ERROR(kUnsupported, "device cuda, tensor_parallel {}: {}", n, why);
  if (c.device == Device::kAuto) {
    std::fprintf(stderr, "kiln: warning: tensor-parallel ranks run on the CPU reference backend: %s\n", why.c_str());
  }
  return Device::kCpu;
}

// The whole engine: its ranks' inputs and outputs, with `micro` times the rows of each that carries
// the batch (every output does).
Engine::Impl whole_of(const std::vector<Engine>& ranks, const BuildConfig& config, int micro, const std::vector<bool>& batched) {
  Engine::Impl w;
  w.config = config;
  w.device = ranks[0].device();
  w.inputs = ranks[0].inputs();
  w.outputs = ranks[0].outputs();
  w.plan = ranks[0].impl()->plan;
  w.ranks = ranks;
  w.micro_batches = micro;
  w.batched = batched;
  if (micro > 1) {
    for (size_t i = 0; i < w.inputs.size(); ++i) {
      if (i < batched.size() && batched[i] && !w.inputs[i].shape.empty()) w.inputs[i].shape[0] *= micro;
    }
    for (TensorInfo& t : w.outputs) {
      if (!t.shape.empty()) t.shape[0] *= micro;
    }
  }
  return w;
}

// Threads that live as long as a session, so a run starts none: run(f) calls f(r) for rank r > 0 on
// thread r - 1 and f(0) on the caller, and returns when every call has.
class RankThreads {
 public:
  explicit RankThreads(int n) : pending_(0) {
    for (int r = 1; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  void run(const std::function<void(int)>& f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &f;
      pending_ = int(threads_.size());
      ++generation_;
    }
    wake_.notify_all();
    f(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(int r) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* task = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        task = task_;
      }
      (*task)(r);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// Rows [k * rows, (k + 1) * rows) of a tensor's axis 0.
Expected<Tensor> rows_of(const Tensor& t, int64_t k, int64_t rows) {
  if (t.dtype() == DType::kString || t.rank() == 0 || t.dim(0) < (k + 1) * rows) {
    return KILN_ERROR(kInvalidArgument, "cannot take rows {}..{} of a {} input", k * rows, (k + 1) * rows, t.summary());
  }
  std::vector<int64_t> dims = t.dims();
  dims[0] = rows;
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::create(t.dtype(), dims));
  if (out.nbytes()) std::memcpy(out.raw(), static_cast<const char*>(t.raw()) + size_t(k) * out.nbytes(), out.nbytes());
  return out;
}

// The parts' tensors one after another along axis 0.
Expected<Tensor> stack_rows(const std::vector<const Tensor*>& parts) {
  std::vector<int64_t> dims = parts[0]->dims();
  if (parts[0]->dtype() == DType::kString || dims.empty()) {
    return KILN_ERROR(kInternal, "a micro-batched output {} has no rows to join", parts[0]->summary());
  }
  dims[0] *= int64_t(parts.size());
  KILN_ASSIGN_OR_RETURN(Tensor out, Tensor::create(parts[0]->dtype(), dims));
  size_t at = 0;
  for (const Tensor* p : parts) {
    if (p->dtype() != out.dtype() || p->nbytes() * parts.size() != out.nbytes()) {
      return KILN_ERROR(kInternal, "micro-batch outputs differ in type or size");
    }
    if (p->nbytes()) std::memcpy(static_cast<char*>(out.raw()) + at, p->raw(), p->nbytes());
    at += p->nbytes();
  }
  return out;
}

// Ranks x micro-batches workers: worker (k, r) runs micro-batch k on rank r, with micro-batch k's
// communicators (each micro-batch has its own, so their collectives never wait on each other).
class TensorParallelSession : public Session::Impl {
 public:
  TensorParallelSession(int n, int micro, bool gpu, std::vector<bool> batched, std::vector<std::shared_ptr<void>> comms)
      : n_(n), micro_(micro), gpu_(gpu), batched_(std::move(batched)), comms_(std::move(comms)), threads_(n * micro) {}
  std::vector<std::unique_ptr<Session::Impl>> ranks;  // worker k * n + r

  // Runs f(k, r) for every rank r of micro-batches k < `micro` at once, worker 0 on the calling
  // thread; the first worker's error (in order) is the answer, else each micro-batch's rank 0
  // result. On the CPU fresh communicators serve each call, so a rank that fails releases its
  // peers and the next call starts clean. On the GPU a rank that fails aborts the NCCL
  // communicators, which releases peers waiting in a collective; the session cannot run again (its
  // CUDA graphs hold them) and says so.
  template <typename T, typename F>
  Expected<std::vector<T>> on_workers(F&& f, int micro) {
    if (broken_) {
      return KILN_ERROR(kInvalidArgument, "this tensor-parallel session stopped when a rank failed ({}); create a new "
                        "session", broken_why_);
    }
    std::vector<std::shared_ptr<ThreadComm>> comm;
    for (int k = 0; !gpu_ && k < micro; ++k) comm.push_back(std::make_shared<ThreadComm>(n_));
    std::vector<std::optional<Expected<T>>> res(static_cast<size_t>(n_ * micro_));
    auto one = [&](int w) {
      const int k = w / n_, r = w % n_;
      if (k >= micro) return;
      if (gpu_) {
        if (Status s = gpu_select(r); !s) {
          res[size_t(w)].emplace(s);
          return;
        }
      }
      ScopedComm scope(gpu_ ? nullptr : comm[size_t(k)].get(), r);
      res[size_t(w)].emplace(f(k, r));
      if (*res[size_t(w)]) return;
      if (!gpu_) {
        comm[size_t(k)]->abort();
        return;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_) {
        broken_ = true;
        broken_why_ = fmt::format("rank {}: {}", r, res[size_t(w)]->status().message());
        gpu_abort_communicators(comms_);
      }
    };
    threads_.run(one);
    if (gpu_) (void)gpu_select(0);
    std::vector<T> out;
    for (int w = 0; w < n_ * micro; ++w) {
      Expected<T>& e = *res[size_t(w)];
      if (!e) {
        const std::string mb = micro_ > 1 ? fmt::format("micro-batch {}, ", w / n_) : "";
        return make_error(e.status().code(), "{}rank {}: {}", mb, w % n_, e.status().message());
      }
      if (w % n_ == 0) out.push_back(std::move(*e));
    }
    return out;
  }

  // Each micro-batch's inputs: its rows of the inputs that carry the batch, the others whole.
  Expected<std::vector<std::vector<Data>>> parts(const std::vector<Data>& inputs) const {
    std::vector<std::vector<Data>> p(static_cast<size_t>(micro_));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const bool split = micro_ > 1 && i < batched_.size() && batched_[i];
      if (split && !inputs[i].is_tensor()) return KILN_ERROR(kInvalidArgument, "input {} is not a tensor", i);
      const int64_t rows = split ? inputs[i].tensor.dim(0) / micro_ : 0;
      for (int k = 0; k < micro_; ++k) {
        if (!split) {
          p[size_t(k)].push_back(inputs[i]);
          continue;
        }
        KILN_ASSIGN_OR_RETURN(Tensor t, rows_of(inputs[i].tensor, k, rows));
        p[size_t(k)].push_back(Data(std::move(t)));
      }
    }
    return p;
  }

  Expected<std::vector<Data>> run(std::vector<Data> inputs) override {
    KILN_ASSIGN_OR_RETURN(auto p, parts(inputs));
    KILN_ASSIGN_OR_RETURN(auto outs, on_workers<std::vector<Data>>(
                                         [&](int k, int r) { return ranks[size_t(k * n_ + r)]->run(p[size_t(k)]); }, micro_));
    if (micro_ == 1) return std::move(outs[0]);
    std::vector<Data> whole;
    for (size_t o = 0; o < outs[0].size(); ++o) {
      std::vector<const Tensor*> rows;
      for (const auto& out : outs) {
        if (o >= out.size() || !out[o].is_tensor()) return KILN_ERROR(kInternal, "micro-batch output {} is not a tensor", o);
        rows.push_back(&out[o].tensor);
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, stack_rows(rows));
      whole.push_back(Data(std::move(t)));
    }
    return whole;
  }
  Status run_device(const std::vector<TensorView>&, const std::vector<TensorView>&, void*) override {
    return KILN_ERROR(kUnsupported, "a tensor-parallel engine takes host tensors (Session::run(inputs)): its ranks "
                      "each read them on their own GPU");
  }
  Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) override {
    KILN_ASSIGN_OR_RETURN(auto p, parts(inputs));
    auto timed = [&](int w, int i) {
      return on_workers<std::vector<double>>(
          [&](int k, int r) { return ranks[size_t(k * n_ + r)]->benchmark(p[size_t(k)], w, i); }, micro_);
    };
    if (micro_ == 1) {
      KILN_ASSIGN_OR_RETURN(auto times, timed(warmup, iterations));
      return std::move(times[0]);
    }
    // Micro-batches start each timed forward together (every worker returns between forwards): the
    // whole batch's forward is the slowest micro-batch's.
    KILN_RETURN_IF_ERROR(timed(warmup, 1).status());
    std::vector<double> whole;
    for (int i = 0; i < iterations; ++i) {
      KILN_ASSIGN_OR_RETURN(auto times, timed(0, 1));
      double t = 0;
      for (const auto& x : times) t = std::max(t, x.empty() ? 0.0 : x[0]);
      whole.push_back(t);
    }
    return whole;
  }
  // One micro-batch, step by step.
  Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) override {
    KILN_ASSIGN_OR_RETURN(auto p, parts(inputs));
    KILN_ASSIGN_OR_RETURN(auto steps, on_workers<std::vector<StepTime>>(
                                          [&](int k, int r) { return ranks[size_t(k * n_ + r)]->profile(p[size_t(k)]); }, 1));
    return std::move(steps[0]);
  }
  Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<Data>& inputs) override {
    KILN_ASSIGN_OR_RETURN(auto p, parts(inputs));
    KILN_ASSIGN_OR_RETURN(auto found, on_workers<std::vector<NonFiniteStep>>(
                                          [&](int k, int r) { return ranks[size_t(k * n_ + r)]->check_finite(p[size_t(k)]); },
                                          micro_));
    for (auto& f : found) {
      if (!f.empty()) return std::move(f);
    }
    return std::move(found[0]);
  }
  size_t device_bytes() const override {
    size_t b = 0;
    for (const auto& r : ranks) b += r->device_bytes();
    return b;
  }

  ~TensorParallelSession() override {
    // Each rank's session ends on its own GPU, before the communicators it used.
    for (size_t w = 0; w < ranks.size(); ++w) {
      if (gpu_) (void)gpu_select(int(w % size_t(n_)));
      ranks[w].reset();
    }
    if (gpu_) (void)gpu_select(0);
  }

 private:
  int n_, micro_;
  bool gpu_;
  std::vector<bool> batched_;
  std::vector<std::shared_ptr<void>> comms_;  // GPU sessions: micro-batch k's communicator on GPU r at k * n + r
  RankThreads threads_;
  std::mutex mu_;
  bool broken_ = false;     // a GPU rank failed and the communicators were aborted
  std::string broken_why_;
};

void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

// The passes before the split run once on the whole graph; each rank runs the split and the rest.
// Options are handed to each part as far as they name its passes.
PassOptions part_options(const BuildConfig& config, const std::vector<Pass>& part, bool dump) {
  auto has = [&](const std::string& name) {
    return std::any_of(part.begin(), part.end(), [&](const Pass& p) { return p.name == name; });
  };
  PassOptions po;
  for (const std::string& d : config.disabled_passes) {
    if (has(d)) po.disabled.push_back(d);
  }
  if (dump && (config.dump_ir_after == "all" || has(config.dump_ir_after))) po.dump_ir_after = config.dump_ir_after;
  return po;
}

}  // namespace

Expected<Engine> build_tensor_parallel(std::unique_ptr<Graph> g, std::unique_ptr<Graph> unbound, std::vector<bool> batched,
                                       const BuildConfig& config, double import_ms) {
  const int n = config.tensor_parallel;
  KILN_ASSIGN_OR_RETURN(Device device, rank_device(config));
  BuildConfig rc = config;
  rc.device = device;
  std::vector<Engine> ranks;
  std::string report;
  auto t_prefix = std::chrono::steady_clock::now();
  std::vector<Pass> prefix;
  {
    std::vector<Pass> all = tensor_parallel_pipeline(n, 0, nullptr);
    auto split = std::find_if(all.begin(), all.end(), [](const Pass& p) { return p.name == "tensor-parallel"; });
    prefix.assign(all.begin(), split);
    KILN_ASSIGN_OR_RETURN(PassReport pr, run_passes(*g, prefix, part_options(config, prefix, true)));
    if (config.print_pass_report) std::fprintf(stderr, "%s", pr.to_text().c_str());
  }
  // Micro-batches: the ranks are built for batch / micro from the unbound graph, when the whole
  // batch's graph computes each row on its own (asked for explicitly, a graph that does not is an
  // error; by default it runs as one batch and the report says why).
  int micro = 1;
  std::string micro_note;
  if (unbound) {
    const int want = config.micro_batches > 1 ? config.micro_batches : 2;
    Status ok = config.batch % want ? KILN_ERROR(kUnsupported, "batch {} does not divide into {} micro-batches",
                                                 config.batch, want)
                                    : check_rows_independent(*g, batched);
    if (ok) {
      BuildConfig mc = config;
      mc.batch = config.batch / want;
      KILN_RETURN_IF_ERROR(bind_config_shapes(*unbound, mc).status());
      KILN_RETURN_IF_ERROR(run_passes(*unbound, prefix, part_options(config, prefix, false)).status());
      g = std::move(unbound);
      micro = want;
      micro_note = fmt::format("micro-batches: {} of {} rows, run at once\n", micro, config.batch / micro);
    } else if (config.micro_batches > 1) {
      return make_error(ok.code(), "micro_batches {}: {}", config.micro_batches, ok.message());
    } else {
      micro_note = fmt::format("micro-batches: 1 ({})\n", ok.message());
    }
  }
  double passes_total = ms_since(t_prefix);
  for (int r = 0; r < n; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> rg, clone_graph(*g));
    TensorParallelReport rep;
    std::vector<Pass> all = tensor_parallel_pipeline(n, r, &rep);
    std::vector<Pass> suffix(std::find_if(all.begin(), all.end(), [](const Pass& p) { return p.name == "tensor-parallel"; }),
                             all.end());
    // Rank 0's IR stands for every rank's.
    KILN_ASSIGN_OR_RETURN(PassReport pr, run_passes(*rg, suffix, part_options(config, suffix, r == 0)));
    if (config.print_pass_report && r == 0) std::fprintf(stderr, "%s", pr.to_text().c_str());
    if (r == 0) report = rep.to_text();
    const double passes_ms = ms_since(t0);
    passes_total += passes_ms;
    if (device == Device::kCuda) KILN_RETURN_IF_ERROR(gpu_select(r));
    auto e = engine_from_graph(std::move(rg), rc, {}, nullptr, {r == 0 ? import_ms : 0, passes_ms});
    if (device == Device::kCuda) (void)gpu_select(0);
    if (!e) return make_error(e.status().code(), "rank {}: {}", r, e.status().message());
    ranks.push_back(std::move(*e));
  }
  auto impl = std::make_shared<Engine::Impl>(whole_of(ranks, config, micro, batched));
  impl->tp_report = report + micro_note;
  for (const Engine& e : ranks) impl->build_ms += e.build_ms();
  impl->build_note = fmt::format("build: {} ranks on {} in {:.1f} ms (graph passes {:.1f})\n", n, device_name(device),
                                 impl->build_ms, passes_total);
  return Engine(std::move(impl));
}

Expected<std::unique_ptr<Session::Impl>> tensor_parallel_session(const Engine::Impl& e) {
  const int n = int(e.ranks.size()), micro = std::max(1, e.micro_batches);
  const bool gpu = e.device == Device::kCuda;
  std::vector<std::shared_ptr<void>> comms;
  for (int k = 0; gpu && k < micro; ++k) {
    KILN_ASSIGN_OR_RETURN(auto c, gpu_communicators(n));
    comms.insert(comms.end(), c.begin(), c.end());
  }
  auto s = std::make_unique<TensorParallelSession>(n, micro, gpu, e.batched, comms);
  s->ranks.resize(size_t(n * micro));
  // GPU ranks start together: each session's first forward (before its graph capture) already
  // runs the collectives, which wait for every rank.
  auto made = s->on_workers<bool>(
      [&](int k, int r) -> Expected<bool> {
        const Engine::Impl& ri = *e.ranks[size_t(r)].impl();
        const size_t w = size_t(k * n + r);
        if (ri.gpu) {
          KILN_ASSIGN_OR_RETURN(s->ranks[w], ri.gpu->create_session(comms[w].get()));
        } else {
          KILN_RETURN_IF_ERROR(verify_cpu_kernels(*ri.plan));
          s->ranks[w] = cpu_session(ri.plan);
        }
        return true;
      },
      micro);
  if (!made) return made.status();
  return std::unique_ptr<Session::Impl>(std::move(s));
}

Expected<std::string> serialize_tensor_parallel(const Engine::Impl& e) {
  nlohmann::json meta = {{"config", config_to_json(e.config)}, {"report", e.tp_report},
                         {"device", std::string(device_name(e.device))}, {"micro_batches", e.micro_batches},
                         {"batched", e.batched}};
  std::string head = meta.dump();
  std::string out(kMagic, sizeof kMagic);
  put_u64(out, e.ranks.size());
  put_u64(out, head.size());
  out += head;
  for (const Engine& r : e.ranks) {
    KILN_ASSIGN_OR_RETURN(std::string bytes, r.serialize());
    out.resize((out.size() + 8 + kAlign - 1) / kAlign * kAlign - 8, '\0');
    put_u64(out, bytes.size());
    out += bytes;
  }
  return out;
}

bool is_tensor_parallel_file(std::string_view bytes) {
  return bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0;
}

Expected<std::vector<std::string_view>> tensor_parallel_ranks(std::string_view bytes, const std::string& name,
                                                              nlohmann::json* header) {
  size_t at = sizeof kMagic;
  auto u64 = [&](uint64_t& v) {
    if (bytes.size() - at < 8) return false;
    std::memcpy(&v, bytes.data() + at, 8);
    at += 8;
    return true;
  };
  uint64_t n = 0, head = 0;
  if (!u64(n) || !u64(head) || n < 2 || n > 64 || head > bytes.size() - at) {
    return KILN_ERROR(kInvalidModel, "{}: a truncated or corrupted tensor-parallel engine header", name);
  }
  nlohmann::json meta = nlohmann::json::parse(bytes.substr(at, head), nullptr, /*allow_exceptions=*/false);
  at += head;
  if (!meta.is_object() || !meta.contains("config")) return KILN_ERROR(kInvalidModel, "{}: a corrupted tensor-parallel header", name);
  std::vector<std::string_view> ranks;
  for (uint64_t r = 0; r < n; ++r) {
    at = (at + 8 + kAlign - 1) / kAlign * kAlign - 8;
    uint64_t size = 0;
    if (at > bytes.size() || !u64(size) || size > bytes.size() - at) {
      return KILN_ERROR(kInvalidModel, "{}: rank {} of {} is missing or truncated", name, r, n);
    }
    ranks.push_back(bytes.substr(at, size));
    at += size;
    if (is_tensor_parallel_file(ranks.back())) return KILN_ERROR(kInvalidModel, "{}: rank {} is itself split", name, r);
  }
  *header = std::move(meta);
  return ranks;
}

Expected<Engine> load_tensor_parallel(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& name) {
  auto t0 = std::chrono::steady_clock::now();
  nlohmann::json meta;
  KILN_ASSIGN_OR_RETURN(std::vector<std::string_view> files, tensor_parallel_ranks(bytes, name, &meta));
  const uint64_t n = files.size();
  KILN_ASSIGN_OR_RETURN(BuildConfig config, config_from_json(meta["config"]));
  if (config.tensor_parallel != int(n)) {
    return KILN_ERROR(kInvalidModel, "{}: holds {} ranks but was built for {}", name, n, config.tensor_parallel);
  }
  // GPU ranks load onto their own GPUs.
  const bool cuda = meta.value("device", "") == "cuda";
  if (cuda && gpu_count() < int(n)) {
    return KILN_ERROR(kUnsupported, "{}: {} ranks need {} GPUs; this machine has {}", name, n, n, gpu_count());
  }
  std::vector<Engine> ranks;
  for (uint64_t r = 0; r < n; ++r) {
    const std::string rank_name = fmt::format("{} (rank {})", name, r);
    std::string_view rb = files[r];
    if (cuda) KILN_RETURN_IF_ERROR(gpu_select(int(r)));
    auto e = load_engine_view(rb, owner, rank_name, 0);
    if (cuda) (void)gpu_select(0);
    if (!e) return e.status();
    if (e->device() != (cuda ? Device::kCuda : Device::kCpu)) {
      return KILN_ERROR(kInvalidModel, "{}: rank {} runs on {}, the engine on {}", name, r, device_name(e->device()),
                        cuda ? "cuda" : "cpu");
    }
    ranks.push_back(std::move(*e));
  }
  const nlohmann::json& mj = meta.contains("micro_batches") ? meta["micro_batches"] : nlohmann::json(1);
  const int micro = mj.is_number_integer() ? mj.get<int>() : 0;
  std::vector<bool> batched;
  if (meta.contains("batched") && meta["batched"].is_array()) {
    for (const auto& b : meta["batched"]) batched.push_back(b.is_boolean() && b.get<bool>());
  }
  if (micro < 1 || micro > 64 || (micro > 1 && batched.size() != ranks[0].inputs().size())) {
    return KILN_ERROR(kInvalidModel, "{}: a corrupted tensor-parallel header (micro-batches {}, {} batch flags for {} "
                      "inputs)", name, micro, batched.size(), ranks[0].inputs().size());
  }
  auto impl = std::make_shared<Engine::Impl>(whole_of(ranks, config, micro, batched));
  impl->tp_report = meta.value("report", "");
  impl->load_note = fmt::format("loaded {} ranks in {:.1f} ms\n", n, ms_since(t0));
  return Engine(std::move(impl));
}

}  // namespace kiln
