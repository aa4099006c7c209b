// Which engine runs a model: the CUDA engine when a usable GPU is present (and the model's shapes
// are static), otherwise the CPU reference backend, announced with one warning line. Either way
// the graph first goes through the default pass pipeline (src/passes/pipeline.cc).
#include <chrono>

#include "backends/backend.h"
#include "cli.h"
#include "passes/pipeline.h"

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/engine.h"
#endif

namespace kiln::cli {

namespace {

class CpuRunner : public Runner {
 public:
  explicit CpuRunner(std::unique_ptr<Executable> exe) : exe_(std::move(exe)) {}
  Expected<std::vector<Data>> run(const std::vector<Data>& inputs) override { return exe_->run(inputs); }
  Expected<std::vector<double>> bench(const std::vector<Data>& inputs, int warmup, int iterations) override {
    std::vector<double> t;
    for (int i = 0; i < warmup + iterations; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      KILN_ASSIGN_OR_RETURN(auto out, exe_->run(inputs));
      auto t1 = std::chrono::steady_clock::now();
      if (i >= warmup) t.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return t;
  }
  std::string name() const override { return "cpu"; }

 private:
  std::unique_ptr<Executable> exe_;
};

#ifdef KILN_HAVE_CUDA
class GpuRunner : public Runner {
 public:
  GpuRunner(std::shared_ptr<cuda::Engine> e, std::unique_ptr<cuda::Session> s) : e_(std::move(e)), s_(std::move(s)) {}
  Expected<std::vector<Data>> run(const std::vector<Data>& inputs) override { return s_->run(inputs); }
  Expected<std::vector<double>> bench(const std::vector<Data>& inputs, int warmup, int iterations) override {
    return s_->benchmark(inputs, warmup, iterations);
  }
  std::string name() const override { return "cuda"; }
  std::string report() const override { return e_->report().to_text(); }
  size_t device_bytes() const override { return e_->report().weight_bytes + s_->device_bytes(); }
  double build_ms() const override { return e_->report().build_ms; }
  Expected<std::vector<std::pair<std::string, double>>> profile(const std::vector<Data>& in) override {
    return s_->profile(in);
  }

 private:
  std::shared_ptr<cuda::Engine> e_;
  std::unique_ptr<cuda::Session> s_;
};

Expected<cuda::Precision> parse_precision(const std::string& p) {
  if (p == "fp32") return cuda::Precision::kFp32;
  if (p == "tf32") return cuda::Precision::kTf32;
  if (p == "fp16") return cuda::Precision::kFp16;
  if (p == "bf16") return cuda::Precision::kBf16;
  return KILN_ERROR(kInvalidArgument, "unknown precision '{}' (fp32, tf32, fp16, bf16)", p);
}
#endif

#ifdef KILN_HAVE_CUDA
// Nodes the CUDA backend declined run on the host, which at large batch can be orders of magnitude
// slower and always stops graph capture: say so once, naming the first few and why.
void warn_cpu_nodes(const cuda::BuildReport& r) {
  std::vector<const cuda::NodePlacement*> cpu;
  for (const auto& n : r.nodes) {
    if (n.device == "cpu") cpu.push_back(&n);
  }
  if (cpu.empty()) return;
  std::string list;
  for (size_t i = 0; i < cpu.size() && i < 3; ++i) list += fmt::format("{}{} [{}]", i ? "; " : "", cpu[i]->node, cpu[i]->why);
  std::fprintf(stderr, "kiln: warning: %zu node(s) fall back to the CPU (%s%s); `kiln build --report` lists them\n",
               cpu.size(), list.c_str(), cpu.size() > 3 ? "; ..." : "");
}
#endif

// The default pipeline, for every engine: the CPU reference gains as much as the GPU from fewer
// nodes, and both then run the same graph.
Status optimize(Graph& g, const OptimizeOptions& o) {
  PassOptions po;
  po.disabled = o.disabled;
  po.dump_ir_after = o.dump_ir_after;
  KILN_ASSIGN_OR_RETURN(PassReport r, run_passes(g, default_pipeline(), po));
  if (o.report) std::fprintf(stderr, "%s", r.to_text().c_str());
  return Status::ok();
}

Expected<std::unique_ptr<Runner>> cpu_runner(const Graph& g) {
  auto backend = make_cpu_backend();
  KILN_ASSIGN_OR_RETURN(auto exe, backend->compile(g));
  return std::unique_ptr<Runner>(new CpuRunner(std::move(exe)));
}

}  // namespace

Expected<std::unique_ptr<Runner>> make_runner(Graph& g, const EngineOptions& opt) {
  if (opt.device != "auto" && opt.device != "cpu" && opt.device != "cuda") {
    return KILN_ERROR(kInvalidArgument, "--device '{}': expected auto, cpu or cuda", opt.device);
  }
  KILN_RETURN_IF_ERROR(optimize(g, opt.optimize));
  if (opt.device == "cpu") return cpu_runner(g);
#ifdef KILN_HAVE_CUDA
  KILN_ASSIGN_OR_RETURN(cuda::Precision prec, parse_precision(opt.precision));
  std::string why;
  if (cuda::gpu_available(&why)) {
    cuda::BuildOptions bo;
    bo.precision = prec;
    bo.cuda_graph = !opt.no_cuda_graph;
    bo.autotune = !opt.no_autotune;
    auto e = cuda::Engine::build(g, bo);
    if (e) {
      warn_cpu_nodes((*e)->report());
      KILN_ASSIGN_OR_RETURN(auto s, (*e)->new_session());
      return std::unique_ptr<Runner>(new GpuRunner(std::move(*e), std::move(s)));
    }
    // Only "cannot run this here" falls back; a GPU fault (out of memory...) is the answer.
    if (e.status().code() != ErrorCode::kUnsupported || opt.device == "cuda") return e.status();
    why = e.status().message();
  }
  if (opt.device == "cuda") return KILN_ERROR(kUnsupported, "--device cuda: no usable GPU: {}", why);
  std::fprintf(stderr, "kiln: warning: running on the CPU reference backend: %s\n", why.c_str());
#else
  if (opt.device == "cuda") return KILN_ERROR(kUnsupported, "--device cuda: this kiln was built without CUDA");
  if (opt.precision != "fp32") {
    std::fprintf(stderr, "kiln: warning: --%s ignored: this kiln was built without CUDA\n", opt.precision.c_str());
  }
#endif
  return cpu_runner(g);
}

}  // namespace kiln::cli
