// The CUDA backend's op harness (DESIGN.md rule 10): every op the CUDA backend claims, run on the
// GPU and on the CPU reference with the same fresh random inputs, compared with a per-op
// tolerance. The session's arena is poisoned (NaN bytes) before the checked run, so an output
// element a kernel forgets to write shows up as a mismatch. A case also fails when its op did
// not actually run on the GPU (a silent CPU fallback would test nothing), and when the same case
// built again from an engine file (graph, weights and autotuned choices written and read back)
// does not give bit-identical outputs.
//
//   kiln_gpu_op_check [--seed S] [--filter SUBSTRING[,SUBSTRING...]] [--precision fp32|fp16|bf16|all]
// Prints one line per (case, precision) and then `N passed, M failed`; exit 1 on any failure.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <random>
#include <set>
#include <thread>

#include "backends/backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/engine.h"
#include "backends/cuda/timing_cache.h"
#include "ir/text.h"
#include "ops/infer.h"
#include "passes/pipeline.h"
#include "runtime/engine_file.h"

using namespace kiln;

namespace {

struct Case {
  const char* name;
  const char* ir;
  std::vector<std::string> consts;  // graph inputs turned into random constants (weights)
  double tol32 = 1e-4, tol16 = 1e-2;  // max |gpu - cpu| / max(1, max |cpu|)
  bool half = true;                   // also check fp16/bf16 builds
  int64_t int_hi = 4;                 // integer inputs drawn from [0, int_hi)
  const char* half_impl = nullptr;    // half builds must place some node on an impl containing this
  bool autotune = true;               // false: heuristics, so that a timing-guarded lowering is taken
  bool fp32_on_cpu = false;           // fp32 builds may run the op on the CPU (its kernel is half-only)
  int gemm_sm90 = 0;                  // BuildOptions::gemm_sm90 (1: the Hopper GEMM wherever it applies)
  int gemm_sm90_tile = 0;             // BuildOptions::gemm_sm90_tile (> 0: that tile width only)
  int graph_conv = 0;                 // BuildOptions::graph_conv (1: cuDNN operation graphs wherever they apply)
  int quant_form = 0;                 // BuildOptions::quant_form (8 / 16: quantized products in that form)
  const char* half_impl_16 = "fake_quant";  // half_impl of a quantized case's 16-bit form
  int group_norm_one = 0;             // BuildOptions::group_norm_one (1: one-launch GroupNorm wherever it applies)
};

#include "op_cases.inc"

struct Rng {
  std::mt19937_64 g;
  Tensor random(DType dt, const std::vector<int64_t>& dims, int64_t int_hi) {
    Tensor t = Tensor::create(dt, dims).value();
    std::uniform_real_distribution<double> real(-2.0, 2.0);
    std::uniform_int_distribution<int64_t> ints(0, std::max<int64_t>(int_hi - 1, 0));
    for (int64_t i = 0; i < t.numel(); ++i) {
      switch (dt) {
        case DType::kFloat32: t.data<float>()[i] = float(real(g)); break;
        case DType::kInt64: t.data<int64_t>()[i] = ints(g); break;
        case DType::kInt32: t.data<int32_t>()[i] = int32_t(ints(g)); break;
        case DType::kBool: t.data<bool>()[i] = (ints(g) & 1) != 0; break;
        case DType::kFloat64: t.data<double>()[i] = real(g); break;
        case DType::kInt8: t.data<int8_t>()[i] = int8_t(ints(g) - int_hi / 2); break;  // negatives too
        case DType::kUInt8: t.data<uint8_t>()[i] = uint8_t(ints(g)); break;
        case DType::kInt16: t.data<int16_t>()[i] = int16_t(ints(g) - int_hi / 2); break;
        case DType::kUInt16: t.data<uint16_t>()[i] = uint16_t(ints(g)); break;
        case DType::kUInt32: t.data<uint32_t>()[i] = uint32_t(ints(g)); break;
        case DType::kUInt64: t.data<uint64_t>()[i] = uint64_t(ints(g)) * 0x100000001ull; break;  // past 2^32
        case DType::kFloat8E4M3FN: {  // +-[0.25, 7.5]: exponent field 5..9, any mantissa (no NaN)
          const uint64_t sign = g() & 1, exponent = 5 + g() % 5, mantissa = g() & 7;
          static_cast<uint8_t*>(t.raw())[i] = uint8_t(sign << 7 | exponent << 3 | mantissa);
          break;
        }
        default: break;
      }
    }
    return t;
  }
};

std::vector<int64_t> static_dims(const Value* v) {
  std::vector<int64_t> d;
  for (const Dim& x : v->type.shape->dims) d.push_back(x.value());
  return d;
}

// err = max |g - c| / max(1, max |c|); NaN anywhere (unwritten, poisoned) is infinite error.
double compare(const Tensor& gpu, const Tensor& cpu, std::string* why) {
  if (gpu.dtype() != cpu.dtype() || gpu.dims() != cpu.dims()) {
    *why = "got " + gpu.summary() + ", want " + cpu.summary();
    return INFINITY;
  }
  double scale = 1, worst = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) scale = std::max(scale, std::fabs(cpu.as_double(i)));
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    double g = gpu.as_double(i), c = cpu.as_double(i);
    if (std::isnan(g) != std::isnan(c)) {
      *why = fmt::format("element {}: gpu {} cpu {}", i, g, c);
      return INFINITY;
    }
    if (!std::isnan(c)) worst = std::max(worst, std::fabs(g - c) / scale);
  }
  return worst;
}

// The case's graph (its `consts` inputs made random constants), its random inputs and the CPU
// reference's outputs.
struct Reference {
  std::unique_ptr<Graph> g;
  std::vector<Data> inputs, want;
};

// Cases written as the decomposed forms exporters emit (Softmax(MatMul) attention chains, erf and
// tanh GELU): the default pass pipeline fuses them (fuse-attention, fuse-gelu) before the GPU build,
// as in every real build. The lowering no longer matches them itself: fusion is the passes' call.
const std::set<std::string> kThroughPasses = {
    "gelu_erf_pattern", "gelu_tanh_pattern", "attention_bert", "attention_bert_rowmask", "attention_cross",
    "attention_causal", "attention_vit_packed", "attention_transposed_pv", "gemm_tanh_gelu", "linear_erf_gelu", "group_norm_silu", "conv1d_speech",
    "conv1d_strided_grouped", "convtranspose1d", "einsum_scores", "einsum_projection", "conv_group_norm_silu_nhwc",
    "groupnorm_export_form", "conv_group_norm_silu_nhwc_wide", "qmatmul_u8s8_per_channel_bias", "qmatmul_s8s8_zero_point", "qmatmul_fp8_per_channel_bias",
    "qmatmul_fp8_per_tensor", "qmatmul_s8s8_residual_gelu", "qmatmul_u8s8_multi_tile", "qmatmul_fp8_multi_tile",
    "qmatmul_u8_zero_point_37", "qmatmul_s8s8_bias_through_cast",
    "attention_swin_windows", "attention_sdpa_guarded", "conv_group_norm_silu_one_launch", "conv_group_norm_silu_three_launches",
    "conv_add_emb_group_norm_silu_one_launch", "conv_add_emb_group_norm_three_launches", "conv_add_shared_bias_group_norm",
    "conv_add_emb_group_norm_walked"};

Expected<Reference> cpu_reference(const Case& c, uint64_t seed) {
  Reference r;
  KILN_ASSIGN_OR_RETURN(r.g, parse_graph(c.ir));
  Graph* g = r.g.get();
  Rng rng{std::mt19937_64(seed)};
  std::vector<Value*> keep;
  for (Value* v : g->inputs) {
    bool is_const = std::find(c.consts.begin(), c.consts.end(), v->name) != c.consts.end();
    if (is_const) v->constant = rng.random(v->type.dtype, static_dims(v), c.int_hi);
    else keep.push_back(v);
  }
  g->inputs = keep;
  KILN_RETURN_IF_ERROR(infer_types(*g));
  for (Value* v : g->inputs) r.inputs.emplace_back(rng.random(v->type.dtype, static_dims(v), c.int_hi));
  auto cpu = make_cpu_backend();
  KILN_ASSIGN_OR_RETURN(auto exe, cpu->compile(*g));
  KILN_ASSIGN_OR_RETURN(r.want, exe->run(r.inputs));
  // The reference above ran the graph as written. A case's variants ("name/16-bit") share its passes.
  if (const std::string base(c.name); kThroughPasses.count(base.substr(0, base.find('/')))) {
    KILN_RETURN_IF_ERROR(run_passes(*g, default_pipeline(), {}).status());
  }
  return r;
}

// The case again through an engine file (src/runtime/engine_file.h): the graph, its weights and
// the direct build's device plan (DPLN, DWGT) written and read back, and the engine bound from what
// was read, with no lowering and no timing cache. Its outputs must equal the direct build's bit
// for bit.
Status check_through_engine_file(const Case& c, const Graph& g, cuda::BuildOptions bo, const cuda::Engine& built,
                                 const std::vector<Data>& inputs, const std::vector<Data>& direct) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> copy, parse_graph(print_graph(g)));
  KILN_ASSIGN_OR_RETURN(Plan plan, plan_host(std::move(copy), /*require_cpu_kernels=*/false));
  KILN_ASSIGN_OR_RETURN(auto sections, built.serialize());
  KILN_ASSIGN_OR_RETURN(std::string bytes, write_engine_file(nlohmann::json::object(), plan,
                                                             {{"DPLN", sections.first}, {"DWGT", sections.second}}));
  auto held = std::make_shared<const std::string>(std::move(bytes));
  KILN_ASSIGN_OR_RETURN(EngineFile f, read_engine_file(held, c.name));
  bo.timing_cache = nullptr;
  KILN_ASSIGN_OR_RETURN(auto engine, cuda::Engine::load(f.plan.graph.get(), bo, f.extra["DPLN"], f.extra["DWGT"], c.name));
  KILN_ASSIGN_OR_RETURN(auto session, engine->new_session());
  KILN_ASSIGN_OR_RETURN(auto got, session->run(inputs));
  for (size_t i = 0; i < got.size(); ++i) {
    const Tensor& a = got[i].tensor;
    const Tensor& b = direct[i].tensor;
    if (a.summary() != b.summary() || std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0) {
      return KILN_ERROR(kInternal, "engine file: output {} differs from the direct build's", i);
    }
  }
  return Status::ok();
}

Status run_case(const Case& c, cuda::Precision prec, uint64_t seed, double* err, std::string* note) {
  KILN_ASSIGN_OR_RETURN(Reference ref, cpu_reference(c, seed));
  const Graph* g = ref.g.get();
  const std::vector<Data>& inputs = ref.inputs;
  const std::vector<Data>& want = ref.want;
  cuda::BuildOptions bo;
  bo.precision = prec;
  bo.poison = true;
  bo.autotune = c.autotune;
  bo.gemm_sm90 = c.gemm_sm90;
  bo.gemm_sm90_tile = c.gemm_sm90_tile;
  bo.graph_conv = c.graph_conv;
  bo.group_norm_one = c.group_norm_one;
  bo.quant_form = c.quant_form;
  auto tuning = std::make_shared<cuda::TimingCache>("op-check");
  bo.timing_cache = tuning;
  KILN_ASSIGN_OR_RETURN(auto engine, cuda::Engine::build(*g, bo));
  // half_impl: every '|'-separated piece must appear in some node's implementation.
  std::vector<std::string> impls;
  for (std::string rest = c.half_impl ? c.half_impl : ""; !rest.empty();) {
    const size_t bar = rest.find('|');
    impls.push_back(rest.substr(0, bar));
    if (impls.back().empty()) return KILN_ERROR(kInternal, "case {}: an empty piece in half_impl", c.name);
    rest = bar == std::string::npos ? "" : rest.substr(bar + 1);
  }
  std::vector<bool> impl_seen(impls.size(), false);
  for (const auto& p : engine->report().nodes) {
    // Control flow runs whole on the host by design (lower_host.cc); anything else on the CPU is a failure.
    const bool control_flow = p.node.find("(If,") != std::string::npos || p.node.find("(Loop,") != std::string::npos ||
                              p.node.find("(Scan,") != std::string::npos;
    if (p.placement == cuda::Placement::kHost && !control_flow && !(c.fp32_on_cpu && prec == cuda::Precision::kFp32)) {
      return KILN_ERROR(kInternal, "{} ran on the CPU: {}", p.node, p.why);
    }
    for (size_t i = 0; i < impls.size(); ++i) impl_seen[i] = impl_seen[i] || p.impl.find(impls[i]) != std::string::npos;
  }
  // half_impl is asserted in half builds, and in fp32 for a case that has no half builds.
  for (size_t i = 0; i < impls.size() && (prec != cuda::Precision::kFp32 || !c.half); ++i) {
    if (!impl_seen[i]) return KILN_ERROR(kInternal, "no node was lowered to '{}'", impls[i]);
  }
  KILN_ASSIGN_OR_RETURN(auto session, engine->new_session());
  KILN_ASSIGN_OR_RETURN(auto got, session->run(inputs));
  *err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double e = compare(got[i].tensor, want[i].tensor, note);
    *err = std::max(*err, e);
  }
  return check_through_engine_file(c, *g, bo, *engine, inputs, got);
}

// Runtime checks beyond single ops (issue 3 item 4 and 8): several sessions of one engine running
// concurrently on their own threads, each checked against the CPU; and an engine build that
// cannot get its memory failing cleanly, after which the process still builds and runs.
const char* kMlp =
    "graph g(%x: f32[16,64], %w1: f32[64,128], %b1: f32[128], %w2: f32[128,32]) {\n %h = MatMul(%x, %w1) : f32[16,128]\n"
    " %hb = Add(%h, %b1) : f32[16,128]\n %r = Relu(%hb) : f32[16,128]\n %y = MatMul(%r, %w2) : f32[16,32]\n"
    " %s = Softmax(%y) {axis = -1} : f32[16,32]\n return %s\n}";

// A graph whose inputs other than %x become random weights.
Expected<std::unique_ptr<Graph>> graph_with_weights(const char* ir, Rng& rng) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, parse_graph(ir));
  std::vector<Value*> keep;
  for (Value* v : g->inputs) {
    if (v->name == "x") keep.push_back(v);
    else v->constant = rng.random(v->type.dtype, static_dims(v), 0);
  }
  g->inputs = keep;
  KILN_RETURN_IF_ERROR(infer_types(*g));
  return g;
}

Expected<std::unique_ptr<Graph>> mlp_graph(Rng& rng) { return graph_with_weights(kMlp, rng); }

Status check_concurrent_sessions(uint64_t seed) {
  Rng rng{std::mt19937_64(seed)};
  KILN_ASSIGN_OR_RETURN(auto g, mlp_graph(rng));
  KILN_ASSIGN_OR_RETURN(auto engine, cuda::Engine::build(*g, cuda::BuildOptions{}));
  auto cpu = make_cpu_backend();
  KILN_ASSIGN_OR_RETURN(auto exe, cpu->compile(*g));
  constexpr int kThreads = 4, kRuns = 20;
  std::vector<std::vector<Data>> inputs(kThreads), want(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    inputs[size_t(t)].emplace_back(rng.random(DType::kFloat32, {16, 64}, 0));
    KILN_ASSIGN_OR_RETURN(want[size_t(t)], exe->run(inputs[size_t(t)]));
  }
  std::vector<std::unique_ptr<cuda::Session>> sessions;
  for (int t = 0; t < kThreads; ++t) {
    KILN_ASSIGN_OR_RETURN(auto s, engine->new_session());
    sessions.push_back(std::move(s));
  }
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRuns; ++r) {
        auto got = sessions[size_t(t)]->run(inputs[size_t(t)]);
        if (!got) { errors[size_t(t)] = got.status().message(); return; }
        std::string why;
        double e = compare((*got)[0].tensor, want[size_t(t)][0].tensor, &why);
        if (e > 1e-4) { errors[size_t(t)] = fmt::format("thread {} run {}: err {} {}", t, r, e, why); return; }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& e : errors) {
    if (!e.empty()) return KILN_ERROR(kInternal, "{}", e);
  }
  return Status::ok();
}

// Sessions of one engine share its weights (issue 23 item 6): with 2 x 64 MiB of weights and an
// 8 MiB workspace, each session after the first must take about its own device_bytes() (arena,
// workspace, staging; 2 MiB allocation granularity aside), never another copy of the weights.
Status check_shared_weights(uint64_t seed) {
  Rng rng{std::mt19937_64(seed)};
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, graph_with_weights(
      "graph g(%x: f32[16,4096], %w1: f32[4096,4096], %w2: f32[4096,4096]) {\n %h = MatMul(%x, %w1) : f32[16,4096]\n"
      " %r = Relu(%h) : f32[16,4096]\n %y = MatMul(%r, %w2) : f32[16,4096]\n return %y\n}", rng));
  auto free_bytes = []() -> Expected<size_t> {
    size_t free = 0, total = 0;
    KILN_CUDA_TRY(cudaMemGetInfo(&free, &total));
    return free;
  };
  KILN_ASSIGN_OR_RETURN(size_t before, free_bytes());
  cuda::BuildOptions bo;
  bo.workspace_bytes = size_t(8) << 20;  // small beside the weights, so a copy of them would show
  KILN_ASSIGN_OR_RETURN(auto engine, cuda::Engine::build(*g, bo));
  KILN_ASSIGN_OR_RETURN(size_t built, free_bytes());
  std::vector<std::unique_ptr<cuda::Session>> sessions;
  std::vector<size_t> after;
  for (int i = 0; i < 4; ++i) {
    KILN_ASSIGN_OR_RETURN(auto s, engine->new_session());
    sessions.push_back(std::move(s));
    KILN_ASSIGN_OR_RETURN(size_t f, free_bytes());
    after.push_back(f);
  }
  const double mib = 1 << 20;
  const double weights = double(engine->report().weight_bytes) / mib;
  const double own = double(sessions[0]->device_bytes()) / mib;
  std::string per;
  for (int i = 1; i < 4; ++i) {
    const double took = double(after[size_t(i - 1)] - after[size_t(i)]) / mib;
    per += fmt::format("{}{:.1f}", i > 1 ? ", " : "", took);
    // Allocation granularity aside (2 MiB pages), a session costs what it says it holds.
    if (took > own + 8) {
      return KILN_ERROR(kInternal, "session {} took {:.1f} MiB; it holds {:.1f} MiB and the weights are {:.1f} MiB", i,
                        took, own, weights);
    }
  }
  std::printf("%s", fmt::format("     shared_weights: engine {:.1f} MiB (weights {:.1f}); sessions 2-4 took {} MiB each "
                                "(device_bytes {:.1f})\n", double(before - built) / mib, weights, per, own).c_str());
  return Status::ok();
}

// Resources are released (issue 30 item 4): 1,000 sessions created, run and destroyed, then 20
// engines (with convolutions, so cuDNN handles too) built and destroyed, leave the device's free
// memory and the process's resident host memory where they were after the first of each (a stream,
// event, handle, graph or arena kept alive per session or engine would show).
Status check_session_churn(uint64_t seed) {
  Rng rng{std::mt19937_64(seed)};
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, graph_with_weights(
      "graph g(%x: f32[2,8,16,16], %w: f32[8,8,3,3], %m: f32[256,64]) {\n"
      " %c = Conv(%x, %w) {pads = [1, 1, 1, 1]} : f32[2,8,16,16]\n %r = Relu(%c) : f32[2,8,16,16]\n"
      " %s = const dense<i64[2]> [16, 256]\n %f = Reshape(%r, %s) : f32[16,256]\n %y = MatMul(%f, %m) : f32[16,64]\n"
      " return %y\n}", rng));
  auto free_bytes = []() -> Expected<size_t> {
    size_t free = 0, total = 0;
    KILN_CUDA_TRY(cudaMemGetInfo(&free, &total));
    return free;
  };
  auto rss_mib = [] {
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    return double(resident) * double(sysconf(_SC_PAGESIZE)) / double(1 << 20);
  };
  std::vector<Data> inputs;
  for (const Value* v : g->inputs) inputs.emplace_back(rng.random(v->type.dtype, static_dims(v), 0));
  cuda::BuildOptions bo;
  bo.precision = cuda::Precision::kFp16;
  bo.workspace_bytes = size_t(4) << 20;
  KILN_ASSIGN_OR_RETURN(auto engine, cuda::Engine::build(*g, bo));
  size_t free0 = 0;
  double rss0 = 0;
  std::string trace;  // host RSS and device use after 100, 300 and 1,000 sessions: linear growth is a leak
  for (int i = 0; i < 1000; ++i) {
    KILN_ASSIGN_OR_RETURN(auto session, engine->new_session());
    KILN_ASSIGN_OR_RETURN(auto out, session->run(inputs));
    session.reset();
    if (i == 0) {
      KILN_ASSIGN_OR_RETURN(free0, free_bytes());
      rss0 = rss_mib();
    }
    if (i == 99 || i == 299 || i == 999) {
      KILN_ASSIGN_OR_RETURN(size_t f, free_bytes());
      trace += fmt::format(" {}: host {:+.1f} device {:+.1f};", i + 1, rss_mib() - rss0,
                           (double(free0) - double(f)) / double(1 << 20));
    }
  }
  KILN_ASSIGN_OR_RETURN(size_t free1, free_bytes());
  const double rss1 = rss_mib();
  engine.reset();
  // Which part grows, when something does: sessions without CUDA graphs, and of an engine with no
  // convolution (no cuDNN handle), 300 each.
  for (int variant = 0; variant < 2; ++variant) {
    cuda::BuildOptions vo = bo;
    vo.cuda_graph = variant != 0;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> vg, variant == 0 ? graph_with_weights(
        "graph g(%x: f32[2,8,16,16], %w: f32[8,8,3,3], %m: f32[256,64]) {\n"
        " %c = Conv(%x, %w) {pads = [1, 1, 1, 1]} : f32[2,8,16,16]\n %r = Relu(%c) : f32[2,8,16,16]\n"
        " %s = const dense<i64[2]> [16, 256]\n %f = Reshape(%r, %s) : f32[16,256]\n %y = MatMul(%f, %m) : f32[16,64]\n"
        " return %y\n}", rng) : mlp_graph(rng));
    std::vector<Data> vin;
    for (const Value* v : vg->inputs) vin.emplace_back(rng.random(v->type.dtype, static_dims(v), 0));
    KILN_ASSIGN_OR_RETURN(auto ve, cuda::Engine::build(*vg, vo));
    double r0 = 0;
    for (int i = 0; i < 300; ++i) {
      KILN_ASSIGN_OR_RETURN(auto session, ve->new_session());
      KILN_ASSIGN_OR_RETURN(auto out, session->run(vin));
      if (i == 0) r0 = rss_mib();
    }
    trace += fmt::format(" 300 sessions {}: host {:+.1f};", variant == 0 ? "without graphs" : "of an MLP (no cuDNN)",
                         rss_mib() - r0);
  }
  size_t free2 = 0;
  double rss2 = 0;
  for (int i = 0; i < 20; ++i) {
    KILN_ASSIGN_OR_RETURN(auto e, cuda::Engine::build(*g, bo));
    KILN_ASSIGN_OR_RETURN(auto session, e->new_session());
    KILN_ASSIGN_OR_RETURN(auto out, session->run(inputs));
    session.reset();
    e.reset();
    if (i == 0) {
      KILN_ASSIGN_OR_RETURN(free2, free_bytes());
      rss2 = rss_mib();
    }
  }
  KILN_ASSIGN_OR_RETURN(size_t free3, free_bytes());
  const double rss3 = rss_mib();
  const double mib = 1 << 20;
  const double dev_sessions = (double(free0) - double(free1)) / mib, dev_engines = (double(free2) - double(free3)) / mib;
  std::printf("%s", fmt::format("     session_churn: 999 sessions: device {:+.1f} MiB, host RSS {:+.1f} MiB (after{}); 19 "
                                "engines: device {:+.1f} MiB, host RSS {:+.1f} MiB\n",
                                dev_sessions, rss1 - rss0, trace, dev_engines, rss3 - rss2).c_str());
  if (dev_sessions > 4 || dev_engines > 4 || rss1 - rss0 > 32 || rss3 - rss2 > 32) {
    return KILN_ERROR(kInternal, "memory grew: sessions device {:.1f} MiB host {:.1f} MiB, engines device {:.1f} MiB "
                      "host {:.1f} MiB", dev_sessions, rss1 - rss0, dev_engines, rss3 - rss2);
  }
  return Status::ok();
}

// Session::run_buffers (the public API's device-pointer run): inputs and outputs in device memory,
// ordered after work on the caller's own stream, and host buffers through the same call; both
// bit-identical to Session::run; then two runs queued without waiting (Session::enqueue).
Status check_device_buffers(uint64_t seed) {
  Rng rng{std::mt19937_64(seed)};
  KILN_ASSIGN_OR_RETURN(auto g, mlp_graph(rng));
  KILN_ASSIGN_OR_RETURN(auto engine, cuda::Engine::build(*g, cuda::BuildOptions{}));
  KILN_ASSIGN_OR_RETURN(auto session, engine->new_session());
  std::vector<Data> in = {Data(rng.random(DType::kFloat32, {16, 64}, 0))};
  KILN_ASSIGN_OR_RETURN(auto want, session->run(in));
  std::vector<Data> in2 = {Data(rng.random(DType::kFloat32, {16, 64}, 0))};
  KILN_ASSIGN_OR_RETURN(auto want2, session->run(in2));
  const Tensor& x = in[0].tensor;
  const Tensor& y = want[0].tensor;
  const Tensor& x2 = in2[0].tensor;
  const Tensor& y2 = want2[0].tensor;
  void *dx = nullptr, *dy = nullptr, *dy2 = nullptr;
  cudaStream_t user = nullptr;
  auto release = [&] {
    if (dx) cudaFree(dx);
    if (dy) cudaFree(dy);
    if (dy2) cudaFree(dy2);
    if (user) cudaStreamDestroy(user);
  };
  auto run = [&]() -> Status {
    KILN_CUDA_TRY(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    KILN_CUDA_TRY(cudaMalloc(&dx, x.nbytes()));
    KILN_CUDA_TRY(cudaMalloc(&dy, y.nbytes()));
    KILN_CUDA_TRY(cudaMalloc(&dy2, y2.nbytes()));
    KILN_CUDA_TRY(cudaMemsetAsync(dy, 0xFF, y.nbytes(), user));
    // The input arrives on the caller's stream: run_buffers must wait for it.
    KILN_CUDA_TRY(cudaMemcpyAsync(dx, x.raw(), x.nbytes(), cudaMemcpyHostToDevice, user));
    KILN_RETURN_IF_ERROR(session->run_buffers({{x.dtype(), x.dims(), dx, true}}, {{y.dtype(), y.dims(), dy, true}}, user));
    KILN_ASSIGN_OR_RETURN(Tensor got, Tensor::create(y.dtype(), y.dims()));
    KILN_CUDA_TRY(cudaMemcpy(got.raw(), dy, y.nbytes(), cudaMemcpyDeviceToHost));
    if (std::memcmp(got.raw(), y.raw(), y.nbytes()) != 0) return KILN_ERROR(kInternal, "device buffers: output differs");
    KILN_ASSIGN_OR_RETURN(Tensor host, Tensor::create(y.dtype(), y.dims()));
    KILN_RETURN_IF_ERROR(session->run_buffers({{x.dtype(), x.dims(), const_cast<void*>(x.raw()), false}},
                                              {{y.dtype(), y.dims(), host.raw(), false}}, nullptr));
    if (std::memcmp(host.raw(), y.raw(), y.nbytes()) != 0) return KILN_ERROR(kInternal, "host buffers: output differs");
    // A wrong shape is an error naming the input, and the session still runs afterwards.
    Status bad = session->run_buffers({{x.dtype(), {8, 64}, dx, true}}, {{y.dtype(), y.dims(), dy, true}}, user);
    if (bad || bad.message().find("input 0") == std::string::npos) {
      return KILN_ERROR(kInternal, "a wrong input shape gave '{}'", bad.message());
    }
    KILN_ASSIGN_OR_RETURN(auto again, session->run(in));
    if (std::memcmp(again[0].tensor.raw(), y.raw(), y.nbytes()) != 0) return KILN_ERROR(kInternal, "run after an error differs");
    // Queued runs (wait false) back to back on the caller's stream, the second input written over
    // the first's once it is read: the stream alone orders them, and each output is read by work
    // queued after it there.
    KILN_CUDA_TRY(cudaMemsetAsync(dy, 0xFF, y.nbytes(), user));
    KILN_CUDA_TRY(cudaMemsetAsync(dy2, 0xFF, y2.nbytes(), user));
    KILN_RETURN_IF_ERROR(session->run_buffers({{x.dtype(), x.dims(), dx, true}}, {{y.dtype(), y.dims(), dy, true}}, user, false));
    KILN_CUDA_TRY(cudaMemcpyAsync(dx, x2.raw(), x2.nbytes(), cudaMemcpyHostToDevice, user));
    KILN_RETURN_IF_ERROR(session->run_buffers({{x.dtype(), x.dims(), dx, true}}, {{y.dtype(), y.dims(), dy2, true}}, user, false));
    KILN_ASSIGN_OR_RETURN(Tensor q1, Tensor::create(y.dtype(), y.dims()));
    KILN_ASSIGN_OR_RETURN(Tensor q2, Tensor::create(y.dtype(), y.dims()));
    KILN_CUDA_TRY(cudaMemcpyAsync(q1.raw(), dy, y.nbytes(), cudaMemcpyDeviceToHost, user));
    KILN_CUDA_TRY(cudaMemcpyAsync(q2.raw(), dy2, y.nbytes(), cudaMemcpyDeviceToHost, user));
    KILN_CUDA_TRY(cudaStreamSynchronize(user));
    if (std::memcmp(q1.raw(), y.raw(), y.nbytes()) != 0 || std::memcmp(q2.raw(), y2.raw(), y.nbytes()) != 0) {
      return KILN_ERROR(kInternal, "queued runs: an output differs");
    }
    return Status::ok();
  };
  Status st = run();
  release();
  return st;
}

Status check_out_of_memory(uint64_t seed) {
  Rng rng{std::mt19937_64(seed)};
  KILN_ASSIGN_OR_RETURN(auto g, mlp_graph(rng));
  cuda::BuildOptions huge;
  huge.workspace_bytes = size_t(1) << 42;  // 4 TiB of scratch: no GPU has it
  auto bad = cuda::Engine::build(*g, huge);
  if (bad) return KILN_ERROR(kInternal, "a 4 TiB workspace was granted?");
  if (bad.status().code() != ErrorCode::kOutOfMemory) {
    return KILN_ERROR(kInternal, "expected an out-of-memory error, got: {}", bad.status().message());
  }
  std::printf("     (out-of-memory build said: %s)\n", bad.status().message().c_str());
  // The process and the device keep working.
  KILN_ASSIGN_OR_RETURN(auto engine, cuda::Engine::build(*g, cuda::BuildOptions{}));
  KILN_ASSIGN_OR_RETURN(auto session, engine->new_session());
  std::vector<Data> in;
  in.emplace_back(rng.random(DType::kFloat32, {16, 64}, 0));
  KILN_ASSIGN_OR_RETURN(auto got, session->run(in));
  auto cpu = make_cpu_backend();
  KILN_ASSIGN_OR_RETURN(auto exe, cpu->compile(*g));
  KILN_ASSIGN_OR_RETURN(auto want, exe->run(in));
  std::string why;
  if (compare(got[0].tensor, want[0].tensor, &why) > 1e-4) return KILN_ERROR(kInternal, "wrong result after OOM: {}", why);
  return Status::ok();
}

// Session::check_finite (`kiln run --check-finite`): x * 300 * 300 for x = 1.5 is 135000, past
// fp16's 65504, so the fp16 build's second Mul writes Inf (its first, 450, does not) and the check
// names that step alone; the fp32 build finds nothing.
Status check_nonfinite_steps(uint64_t) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, parse_graph("graph g(%x: f32[4,8]) {\n %k = const dense<f32[]> [300.0]\n"
                                                              " %a = Mul(%x, %k) : f32[4,8] @scale1\n"
                                                              " %y = Mul(%a, %k) : f32[4,8] @scale2\n return %y\n}"));
  KILN_RETURN_IF_ERROR(infer_types(*g));
  KILN_ASSIGN_OR_RETURN(Tensor x, Tensor::create(DType::kFloat32, {4, 8}));
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 1.5f;
  std::vector<Data> in;
  in.emplace_back(x);
  for (cuda::Precision prec : {cuda::Precision::kFp16, cuda::Precision::kFp32}) {
    cuda::BuildOptions bo;
    bo.precision = prec;
    KILN_ASSIGN_OR_RETURN(auto engine, cuda::Engine::build(*g, bo));
    KILN_ASSIGN_OR_RETURN(auto session, engine->new_session());
    KILN_ASSIGN_OR_RETURN(auto steps, session->check_finite(in));
    if (prec == cuda::Precision::kFp32) {
      if (!steps.empty()) return KILN_ERROR(kInternal, "fp32: {} step(s) reported, first {}", steps.size(), steps[0].label);
      continue;
    }
    if (steps.size() != 1 || steps[0].label.find("scale2") == std::string::npos || steps[0].count != 32) {
      return KILN_ERROR(kInternal, "fp16: expected one step, scale2's 32 values, got {}: {}", steps.size(),
                        steps.empty() ? "" : fmt::format("{} ({} of {})", steps[0].label, steps[0].count, steps[0].numel));
    }
  }
  return Status::ok();
}

// --filter: comma-separated substrings, any of which selects a case; empty selects all.
bool matches_filter(const std::string& name, const std::string& filter) {
  if (filter.empty()) return true;
  size_t at = 0;
  while (at <= filter.size()) {
    size_t comma = filter.find(',', at);
    std::string part = filter.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = std::random_device{}();
  std::string filter, precision = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--seed") seed = std::stoull(argv[i + 1]);
    else if (a == "--filter") filter = argv[i + 1];
    else if (a == "--precision") precision = argv[i + 1];
  }
  // Without a GPU: every case's graph parses, infers and runs on the CPU reference (what CI can
  // check of the harness on a machine with no GPU).
  if (argc > 1 && std::string(argv[1]) == "--cpu-reference-only") {
    int bad = 0;
    for (const Case& c : kCases) {
      auto r = cpu_reference(c, seed);
      if (!r) std::printf("FAIL %-22s %s\n", c.name, r.status().message().c_str());
      bad += r ? 0 : 1;
    }
    std::printf("%zu cases, %d failed on the CPU reference\n", kCases.size(), bad);
    return bad ? 1 : 0;
  }
  std::string why;
  if (!cuda::gpu_available(&why)) {
    std::printf("kiln_gpu_op_check: no usable GPU (%s)\n", why.c_str());
    return 2;
  }
  std::printf("seed %llu (re-run with --seed to reproduce)\n", static_cast<unsigned long long>(seed));
  // A quantized product's case runs in each form: cuBLASLt's 8-bit kernels (half_impl), the Hopper
  // 8-bit kernel at each tile (its half builds; fp32 keeps cuBLASLt), the 16-bit form (x quantized
  // and dequantized, a 16-bit GEMM) and whichever the build's timing picks.
  std::vector<Case> cases;
  std::deque<std::string> names;
  for (const Case& c : kCases) {
    const std::string impl = c.half_impl ? c.half_impl : "";
    const bool quantized = impl.find("cublasLt int8") != std::string::npos || impl.find("cublasLt fp8") != std::string::npos;
    cases.push_back(c);
    if (!quantized) continue;
    cases.back().quant_form = 8;
    cases.back().gemm_sm90 = -1;
    for (int tile : {64, 128}) {
      Case v = c;
      names.push_back(fmt::format("{}/hopper-{}", c.name, tile));
      v.name = names.back().c_str();
      v.quant_form = 8;
      v.gemm_sm90 = 1;
      v.gemm_sm90_tile = tile;
      // What the 16-bit form's epilogue must take, the Hopper kernel's must too.
      std::string h = c.half_impl_16;
      h.replace(0, h.find('|') == std::string::npos ? h.size() : h.find('|'), "gemm_sm90_q8");
      names.push_back(h);
      v.half_impl = names.back().c_str();
      cases.push_back(v);
    }
    for (int form : {16, 0}) {
      Case v = c;
      names.push_back(fmt::format("{}/{}", c.name, form ? "16-bit" : "timed"));
      v.name = names.back().c_str();
      v.quant_form = form;
      v.half_impl = form ? c.half_impl_16 : nullptr;
      cases.push_back(v);
    }
  }
  int passed = 0, failed = 0;
  for (const Case& c : cases) {
    if (!matches_filter(c.name, filter)) continue;
    std::vector<std::pair<cuda::Precision, double>> runs;
    if (precision == "all" || precision == "fp32") runs.push_back({cuda::Precision::kFp32, c.tol32});
    if (c.half && (precision == "all" || precision == "fp16")) runs.push_back({cuda::Precision::kFp16, c.tol16});
    if (c.half && (precision == "all" || precision == "bf16")) runs.push_back({cuda::Precision::kBf16, c.tol16 * 4});
    for (auto [prec, tol] : runs) {
      double err = 0;
      std::string note;
      Status s = run_case(c, prec, seed, &err, &note);
      bool ok = s && err <= tol;
      (ok ? passed : failed)++;
      std::printf("%-4s %-22s %-5s err %.3g (tol %.3g)%s%s\n", ok ? "ok" : "FAIL", c.name,
                  std::string(cuda::precision_name(prec)).c_str(), err, tol, s ? "" : ("  " + s.message()).c_str(),
                  note.empty() ? "" : ("  " + note).c_str());
    }
  }
  if (filter.empty()) {
    for (auto [name, fn] : {std::pair<const char*, Status (*)(uint64_t)>{"concurrent_sessions", check_concurrent_sessions},
                            {"shared_weights", check_shared_weights},
                            {"device_buffers", check_device_buffers},
                            {"session_churn", check_session_churn},
                            {"out_of_memory", check_out_of_memory},
                            {"nonfinite_steps", check_nonfinite_steps}}) {
      Status s = fn(seed);
      (s ? passed : failed)++;
      std::printf("%-4s %-22s %s\n", s ? "ok" : "FAIL", name, s ? "" : s.message().c_str());
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
