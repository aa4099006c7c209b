// Tensor-parallel engines (BuildConfig::tensor_parallel): one engine per rank, each built from the
// model's graph split by the tensor-parallel pass (passes/tensor_parallel.h), behind one Engine.
// One process drives every rank: rank r runs on GPU r, on a thread of its own, with an NCCL
// communicator per GPU made when a session starts (its collectives are captured in the rank's
// CUDA graph); on the CPU the ranks are threads joined by the reference collective
// (ops/collective.h). Every rank computes the whole output; a session returns rank 0's.
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
  if (!is_cpu(c.device) && gpu_usable(&why)) {
    if (gpu_count() >= n) return Device::kCuda;
    why = fmt::format("{} ranks need {} GPUs; this machine has {}", n, n, gpu_count());
  }
  if (c.device == Device::kCuda) return KILN_ERROR(kUnsupported, "device cuda, tensor_parallel {}: {}", n, why);
  if (c.device == Device::kAuto) {
    std::fprintf(stderr, "kiln: warning: tensor-parallel ranks run on the CPU reference backend: %s\n", why.c_str());
  }
  // On the CPU the ranks are a correctness reference (threads and a reference all-reduce).
  return Device::kCpuRef;
}

Engine::Impl whole_of(const std::vector<Engine>& ranks, const BuildConfig& config) {
  Engine::Impl w;
  w.config = config;
  w.device = ranks[0].device();
  w.inputs = ranks[0].inputs();
  w.outputs = ranks[0].outputs();
  w.plan = ranks[0].impl()->plan;
  w.ranks = ranks;
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

class TensorParallelSession : public Session::Impl {
 public:
  TensorParallelSession(int n, bool gpu, std::vector<std::shared_ptr<void>> comms)
      : gpu_(gpu), comms_(std::move(comms)), threads_(n) {}
  std::vector<std::unique_ptr<Session::Impl>> ranks;

  // Runs f(r) on every rank at once, rank 0 on the calling thread; the first rank's error (in rank
  // order) is the answer, else rank 0's result. On the CPU a fresh communicator serves each call,
  // so a rank that fails releases its peers and the next call starts clean. On the GPU a rank that
  // fails aborts the NCCL communicators, which releases peers waiting in a collective; the session
  // cannot run again (its CUDA graphs hold them) and says so.
  template <typename T, typename F>
  Expected<T> on_ranks(F&& f) {
    const int n = int(ranks.size());
    if (broken_) {
      return KILN_ERROR(kInvalidArgument, "this tensor-parallel session stopped when a rank failed ({}); create a new "
                        "session", broken_why_);
    }
    auto comm = gpu_ ? nullptr : std::make_shared<ThreadComm>(n);
    std::vector<std::optional<Expected<T>>> res(static_cast<size_t>(n));
    auto one = [&](int r) {
      if (gpu_) {
        if (Status s = gpu_select(r); !s) {
          res[size_t(r)].emplace(s);
          return;
        }
      }
      ScopedComm scope(comm.get(), r);
      res[size_t(r)].emplace(f(r));
      if (!*res[size_t(r)] && comm) comm->abort();
      if (!*res[size_t(r)] && gpu_) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!broken_) {
          broken_ = true;
          broken_why_ = fmt::format("rank {}: {}", r, res[size_t(r)]->status().message());
          gpu_abort_communicators(comms_);
        }
      }
    };
    threads_.run(one);
    if (gpu_) (void)gpu_select(0);
    for (int r = 0; r < n; ++r) {
      if (!*res[size_t(r)]) return make_error(res[size_t(r)]->status().code(), "rank {}: {}", r, res[size_t(r)]->status().message());
    }
    return std::move(*res[0]);
  }

  Expected<std::vector<Data>> run(std::vector<Data> inputs) override {
    return on_ranks<std::vector<Data>>([&](int r) { return ranks[size_t(r)]->run(inputs); });
  }
  Status run_device(const std::vector<TensorView>&, const std::vector<TensorView>&, void*) override {
    return KILN_ERROR(kUnsupported, "a tensor-parallel engine takes host tensors (Session::run(inputs)): its ranks "
                      "each read them on their own GPU");
  }
  Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) override {
    return on_ranks<std::vector<double>>([&](int r) { return ranks[size_t(r)]->benchmark(inputs, warmup, iterations); });
  }
  Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) override {
    return on_ranks<std::vector<StepTime>>([&](int r) { return ranks[size_t(r)]->profile(inputs); });
  }
  Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<Data>& inputs) override {
    return on_ranks<std::vector<NonFiniteStep>>([&](int r) { return ranks[size_t(r)]->check_finite(inputs); });
  }
  size_t device_bytes() const override {
    size_t b = 0;
    for (const auto& r : ranks) b += r->device_bytes();
    return b;
  }

  ~TensorParallelSession() override {
    // Each rank's session ends on its own GPU, before the communicators it used.
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (gpu_) (void)gpu_select(int(r));
      ranks[r].reset();
    }
    if (gpu_) (void)gpu_select(0);
  }

 private:
  bool gpu_;
  std::vector<std::shared_ptr<void>> comms_;  // one NCCL communicator per GPU (GPU sessions)
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

Expected<Engine> build_tensor_parallel(std::unique_ptr<Graph> g, const BuildConfig& config, double import_ms) {
  const int n = config.tensor_parallel;
  KILN_ASSIGN_OR_RETURN(Device device, rank_device(config));
  BuildConfig rc = config;
  rc.device = device;
  std::vector<Engine> ranks;
  std::string report;
  auto t_prefix = std::chrono::steady_clock::now();
  {
    std::vector<Pass> all = tensor_parallel_pipeline(n, 0, nullptr);
    auto split = std::find_if(all.begin(), all.end(), [](const Pass& p) { return p.name == "tensor-parallel"; });
    std::vector<Pass> prefix(all.begin(), split);
    KILN_ASSIGN_OR_RETURN(PassReport pr, run_passes(*g, prefix, part_options(config, prefix, true)));
    if (config.print_pass_report) std::fprintf(stderr, "%s", pr.to_text().c_str());
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
  auto impl = std::make_shared<Engine::Impl>(whole_of(ranks, config));
  impl->tp_report = report;
  for (const Engine& e : ranks) impl->build_ms += e.build_ms();
  impl->build_note = fmt::format("build: {} ranks on {} in {:.1f} ms (graph passes {:.1f})\n", n, device_name(device),
                                 impl->build_ms, passes_total);
  return Engine(std::move(impl));
}

Expected<std::unique_ptr<Session::Impl>> tensor_parallel_session(const Engine::Impl& e) {
  const int n = int(e.ranks.size());
  const bool gpu = e.device == Device::kCuda;
  std::vector<std::shared_ptr<void>> comms;
  if (gpu) {
    KILN_ASSIGN_OR_RETURN(comms, gpu_communicators(n));
  }
  auto s = std::make_unique<TensorParallelSession>(n, gpu, comms);
  s->ranks.resize(size_t(n));
  // GPU ranks start together: each session's first forward (before its graph capture) already
  // runs the collectives, which wait for every rank.
  Expected<bool> made = s->on_ranks<bool>([&](int r) -> Expected<bool> {
    const Engine::Impl& ri = *e.ranks[size_t(r)].impl();
    if (ri.gpu) {
      KILN_ASSIGN_OR_RETURN(s->ranks[size_t(r)], ri.gpu->create_session(comms[size_t(r)].get()));
    } else {
      KILN_RETURN_IF_ERROR(verify_cpu_kernels(*ri.plan));
      s->ranks[size_t(r)] = cpu_session(ri.plan);
    }
    return true;
  });
  if (!made) return made.status();
  return std::unique_ptr<Session::Impl>(std::move(s));
}

Expected<std::string> serialize_tensor_parallel(const Engine::Impl& e) {
  nlohmann::json meta = {{"config", config_to_json(e.config)}, {"report", e.tp_report},
                         {"device", std::string(device_name(e.device))}};
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
    if (e->device() != (cuda ? Device::kCuda : Device::kCpuRef)) {
      return KILN_ERROR(kInvalidModel, "{}: rank {} runs on {}, the engine on {}", name, r, device_name(e->device()),
                        cuda ? "cuda" : "cpu-ref");
    }
    ranks.push_back(std::move(*e));
  }
  auto impl = std::make_shared<Engine::Impl>(whole_of(ranks, config));
  impl->tp_report = meta.value("report", "");
  impl->load_note = fmt::format("loaded {} ranks in {:.1f} ms\n", n, ms_since(t0));
  return Engine(std::move(impl));
}

}  // namespace kiln
