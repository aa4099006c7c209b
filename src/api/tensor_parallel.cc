// Tensor-parallel engines (BuildConfig::tensor_parallel): one engine per rank, each built from the
// model's graph split by the tensor-parallel pass (passes/tensor_parallel.h), behind one Engine.
// One process drives every rank: rank r runs on GPU r, on a thread of its own, with an NCCL
// communicator per GPU made when a session starts (its collectives are captured in the rank's
// CUDA graph); on the CPU the ranks are threads joined by the reference collective
// (ops/collective.h). Every rank computes the whole output; a session returns rank 0's.
//
// Micro-batches (BuildConfig::micro_batches): where the graph computes each batch row on its own
// (passes/batch_rows.h), the ranks are built for batch / M rows and each rank's GPU session runs the
// M micro-batches at once, as lanes of one CUDA graph with a stream and an arena each, so the GPU
// runs one micro-batch's products while another's all-reduce is in flight; every lane's collectives
// go through the rank's one communicator on one stream, in the same order on every rank.
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
// The default turns micro-batches on where a micro-batch's largest all-reduce carries at least this
// many bytes: below it the lanes' smaller products and the collectives' share of the SMs cost more
// than the overlap saves (bench/RESULTS.md, twenty-ninth session: Llama-7B-shaped layers on 4 GPUs
// lost at 4 MiB, tied at 8, won by 1-8% at 16).
constexpr size_t kMicroAllReduceBytes = size_t(16) << 20;

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

// One thread per rank. With micro-batches, a GPU rank's session runs them itself, as lanes of one
// CUDA graph over the rank's one communicator (cuda::Engine::new_lanes_session), while a CPU rank
// runs them one after another (its collectives in the same order as its peers').
class TensorParallelSession : public Session::Impl {
 public:
  TensorParallelSession(int n, int micro, bool gpu, std::vector<bool> batched, std::vector<TensorInfo> whole,
                        std::vector<std::shared_ptr<void>> comms)
      : micro_(micro), gpu_(gpu), batched_(std::move(batched)), whole_(std::move(whole)), comms_(std::move(comms)),
        threads_(n) {}
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

  // Each micro-batch's inputs: its rows of the inputs that carry the batch, the others whole.
  Expected<std::vector<std::vector<Data>>> parts(const std::vector<Data>& inputs) const {
    std::vector<std::vector<Data>> p(static_cast<size_t>(micro_));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const bool split = i < batched_.size() && batched_[i];
      if (split && !inputs[i].is_tensor()) return KILN_ERROR(kInvalidArgument, "input {} is not a tensor", i);
      if (split && (i >= whole_.size() || inputs[i].tensor.dims() != whole_[i].shape)) {
        return KILN_ERROR(kInvalidArgument, "input '{}': {} does not match the engine's {}",
                          i < whole_.size() ? whole_[i].name : std::to_string(i), inputs[i].tensor.summary(),
                          i < whole_.size() ? dims_to_string(whole_[i].shape) : std::string("inputs"));
      }
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

  // Whether the ranks' sessions take the whole batch (one batch, or GPU lanes).
  bool whole() const { return gpu_ || micro_ == 1; }

  Expected<std::vector<Data>> run(std::vector<Data> inputs) override {
    if (whole()) return on_ranks<std::vector<Data>>([&](int r) { return ranks[size_t(r)]->run(inputs); });
    KILN_ASSIGN_OR_RETURN(auto p, parts(inputs));
    using Outs = std::vector<std::vector<Data>>;
    KILN_ASSIGN_OR_RETURN(Outs outs, on_ranks<Outs>([&](int r) -> Expected<Outs> {
                            Outs o;
                            for (const auto& in : p) {
                              KILN_ASSIGN_OR_RETURN(auto out, ranks[size_t(r)]->run(in));
                              o.push_back(std::move(out));
                            }
                            return o;
                          }));
    std::vector<Data> joined;
    for (size_t o = 0; o < outs[0].size(); ++o) {
      std::vector<const Tensor*> rows;
      for (const auto& out : outs) {
        if (o >= out.size() || !out[o].is_tensor()) return KILN_ERROR(kInternal, "micro-batch output {} is not a tensor", o);
        rows.push_back(&out[o].tensor);
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, stack_rows(rows));
      joined.push_back(Data(std::move(t)));
    }
    return joined;
  }
  Status run_device(const std::vector<TensorView>&, const std::vector<TensorView>&, void*, bool) override {
    return KILN_ERROR(kUnsupported, "a tensor-parallel engine takes host tensors (Session::run(inputs)): its ranks "
                      "each read them on their own GPU");
  }
  Expected<std::vector<double>> benchmark(const std::vector<Data>& inputs, int warmup, int iterations) override {
    if (whole()) {
      return on_ranks<std::vector<double>>([&](int r) { return ranks[size_t(r)]->benchmark(inputs, warmup, iterations); });
    }
    std::vector<double> t;
    for (int i = 0; i < warmup + iterations; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      KILN_RETURN_IF_ERROR(run(inputs).status());
      if (i >= warmup) t.push_back(ms_since(t0));
    }
    return t;
  }
  // With micro-batches, the first one's steps.
  Expected<std::vector<StepTime>> profile(const std::vector<Data>& inputs) override {
    if (whole()) return on_ranks<std::vector<StepTime>>([&](int r) { return ranks[size_t(r)]->profile(inputs); });
    KILN_ASSIGN_OR_RETURN(auto p, parts(inputs));
    return on_ranks<std::vector<StepTime>>([&](int r) { return ranks[size_t(r)]->profile(p[0]); });
  }
  // With micro-batches, the first one's values.
  Expected<std::vector<NonFiniteStep>> check_finite(const std::vector<Data>& inputs) override {
    if (whole()) return on_ranks<std::vector<NonFiniteStep>>([&](int r) { return ranks[size_t(r)]->check_finite(inputs); });
    KILN_ASSIGN_OR_RETURN(auto p, parts(inputs));
    return on_ranks<std::vector<NonFiniteStep>>([&](int r) { return ranks[size_t(r)]->check_finite(p[0]); });
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
  int micro_;
  bool gpu_;
  std::vector<bool> batched_;
  std::vector<TensorInfo> whole_;             // the engine's inputs (every micro-batch's rows)
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
  // Rank r's share: the split and the passes after it, on a copy of the graph.
  auto split_rank = [&](const Graph& whole, int r, TensorParallelReport* rep) -> Expected<std::unique_ptr<Graph>> {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> rg, clone_graph(whole));
    std::vector<Pass> all = tensor_parallel_pipeline(n, r, rep);
    std::vector<Pass> suffix(std::find_if(all.begin(), all.end(), [](const Pass& p) { return p.name == "tensor-parallel"; }),
                             all.end());
    // Rank 0's IR stands for every rank's.
    KILN_ASSIGN_OR_RETURN(PassReport pr, run_passes(*rg, suffix, part_options(config, suffix, r == 0)));
    if (config.print_pass_report && r == 0) std::fprintf(stderr, "%s", pr.to_text().c_str());
    return rg;
  };
  // Micro-batches: the ranks are built for batch / micro from the unbound graph, when the whole
  // batch's graph computes each row on its own (asked for explicitly, a graph that does not is an
  // error). By default (micro_batches 0) two micro-batches where their all-reduces are large enough
  // for the overlap to pay (kMicroAllReduceBytes), else one batch; the report says which and why.
  int micro = 1;
  std::string micro_note;
  std::unique_ptr<Graph> rank0;  // rank 0's share of the whole batch, when the default looked at it
  TensorParallelReport rep0;
  double rank0_ms = 0;
  if (unbound) {
    const int want = config.micro_batches > 1 ? config.micro_batches : 2;
    std::map<std::string, int64_t> axes;
    Status ok = config.batch % want ? KILN_ERROR(kUnsupported, "batch {} does not divide into {} micro-batches",
                                                 config.batch, want)
                                    : check_rows_independent(*g, batched, &axes);
    // On the CPU the ranks run micro-batches one after another: nothing overlaps.
    if (ok && config.micro_batches == 0 && device != Device::kCuda) {
      ok = KILN_ERROR(kUnsupported, "the ranks run on the CPU, where micro-batches would run one after another");
    }
    if (ok && config.micro_batches == 0) {
      auto t0 = std::chrono::steady_clock::now();
      KILN_ASSIGN_OR_RETURN(rank0, split_rank(*g, 0, &rep0));
      rank0_ms = ms_since(t0);
      // The split's sizes are the graph's (float values in fp32); a 16-bit build carries half.
      const bool half = config.precision == Precision::kFp16 || config.precision == Precision::kBf16;
      const size_t each = rep0.max_all_reduce_bytes / size_t(want) / (half ? 2 : 1);
      if (each < kMicroAllReduceBytes) {
        ok = KILN_ERROR(kUnsupported, "a micro-batch's largest all-reduce would carry {:.1f} MiB, under the {} MiB where "
                        "overlapping them pays; --micro-batches {} asks anyway", double(each) / (1 << 20),
                        kMicroAllReduceBytes >> 20, want);
      }
    }
    if (ok) {
      // The graph bound for a micro-batch, checked value by value against the whole batch's.
      BuildConfig mc = config;
      mc.batch = config.batch / want;
      ok = bind_config_shapes(*unbound, mc).status();
      if (ok) ok = run_passes(*unbound, prefix, part_options(config, prefix, false)).status();
      if (ok) ok = check_micro_shapes(*g, *unbound, axes, want);
    }
    if (ok) {
      g = std::move(unbound);
      rank0.reset();
      micro = want;
      micro_note = fmt::format("micro-batches: {} of {} rows, run at once\n", micro, config.batch / micro);
    } else if (config.micro_batches > 1) {
      return make_error(ok.code(), "micro_batches {}: {}", config.micro_batches, ok.message());
    } else {
      micro_note = fmt::format("micro-batches: 1 ({})\n", ok.message());
    }
  }
  double passes_total = ms_since(t_prefix) - rank0_ms;
  for (int r = 0; r < n; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    TensorParallelReport rep;
    std::unique_ptr<Graph> rg;
    if (r == 0 && rank0) {
      rg = std::move(rank0);
      rep = rep0;
    } else {
      KILN_ASSIGN_OR_RETURN(rg, split_rank(*g, r, &rep));
    }
    if (r == 0) report = rep.to_text();
    const double passes_ms = ms_since(t0) + (r == 0 ? rank0_ms : 0);
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
  if (gpu) {
    KILN_ASSIGN_OR_RETURN(comms, gpu_communicators(n));
  }
  auto s = std::make_unique<TensorParallelSession>(n, micro, gpu, e.batched, e.inputs, comms);
  s->ranks.resize(size_t(n));
  // GPU ranks start together: each session's first forward (before its graph capture) already
  // runs the collectives, which wait for every rank.
  Expected<bool> made = s->on_ranks<bool>([&](int r) -> Expected<bool> {
    const Engine::Impl& ri = *e.ranks[size_t(r)].impl();
    if (ri.gpu && micro > 1) {
      KILN_ASSIGN_OR_RETURN(s->ranks[size_t(r)], ri.gpu->create_lanes_session(comms[size_t(r)].get(), micro, e.batched));
    } else if (ri.gpu) {
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
    if (e->device() != (cuda ? Device::kCuda : Device::kCpuRef)) {
      return KILN_ERROR(kInvalidModel, "{}: rank {} runs on {}, the engine on {}", name, r, device_name(e->device()),
                        cuda ? "cuda" : "cpu-ref");
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
