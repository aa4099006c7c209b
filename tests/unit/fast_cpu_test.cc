// The fast CPU backend (src/backends/cpu/fast_plan.h, fast_session.h) against the reference
// kernels: every op it claims, at random shapes and geometries with random weights, runs as a
// oneDNN primitive (the plan is checked, so a case that silently stays on the reference kernels
// fails) and matches the reference within fp32 tolerance; epilogues fuse where they may and not
// where they may not; the CPU plan survives its engine-file section and damage to it is named.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "api/engine_impl.h"
#include "backends/cpu/fast_fused.h"
#include "backends/cpu/fast_session.h"
#include "ir/text.h"

namespace kiln {
namespace {

std::unique_ptr<Graph> parse(const std::string& text) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message() << "\n" << text;
  return g ? std::move(*g) : nullptr;
}

// Every constant of more than one element gets random values (the text form splats one).
void randomize_constants(Graph& g, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const auto& v : g.values) {
    // A constant named keep... (a Resize's scales) stays as written.
    if (v->constant && v->constant->dtype() == DType::kFloat32 && v->constant->numel() > 1 && v->name.rfind("keep", 0) != 0) {
      Tensor t = Tensor::create(DType::kFloat32, v->constant->dims()).value();
      // A variance (a constant named var...) stays positive.
      const bool positive = v->name.rfind("var", 0) == 0;
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = positive ? 0.1f + std::fabs(u(rng)) : u(rng);
      v->constant = std::move(t);
    }
  }
}

std::vector<Data> random_inputs(const Graph& g, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<Data> in;
  for (const Value* v : g.inputs) {
    if (v->type.dtype == DType::kBool) {  // a condition: take the branch that reads the outer value
      in.emplace_back(Tensor::scalar<bool>(false));
      continue;
    }
    Tensor t = Tensor::create(DType::kFloat32, *v->type.shape->static_dims()).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    in.emplace_back(std::move(t));
  }
  return in;
}

struct Result {
  CpuPlan cp;
  std::vector<Data> fast, ref;
};

// Plans `text` both ways and runs both on the same random inputs.
Result run_both(const std::string& text, uint32_t seed) {
  Result r;
  std::mt19937 rng(seed);
  auto g = parse(text);
  if (!g) return r;
  randomize_constants(*g, rng);
  std::vector<Data> in = random_inputs(*g, rng);
  auto plan = plan_host(std::move(g));
  EXPECT_TRUE(plan) << plan.status().message();
  if (!plan) return r;
  auto p = std::make_shared<const Plan>(std::move(*plan));
  auto cp = plan_fast_cpu(*p);
  EXPECT_TRUE(cp) << cp.status().message();
  if (!cp) return r;
  r.cp = *cp;
  auto runner = CpuRunner::create(p, std::make_shared<const CpuPlan>(*cp));
  EXPECT_TRUE(runner) << runner.status().message() << "\n" << text;
  if (!runner) return r;
  auto fast = (*runner)->run(in);
  EXPECT_TRUE(fast) << fast.status().message();
  auto ref = run_plan(*p, in);
  EXPECT_TRUE(ref) << ref.status().message();
  if (fast && ref) {
    r.fast = std::move(*fast);
    r.ref = std::move(*ref);
  }
  return r;
}

// |fast - ref| <= atol + rtol * |ref| everywhere, and the same NaN/Inf.
void expect_close(const Result& r, const std::string& what, float atol = 1e-4f, float rtol = 1e-4f) {
  ASSERT_EQ(r.fast.size(), r.ref.size()) << what;
  ASSERT_FALSE(r.ref.empty()) << what;
  for (size_t i = 0; i < r.ref.size(); ++i) {
    const Tensor& a = r.fast[i].tensor;
    const Tensor& b = r.ref[i].tensor;
    ASSERT_EQ(a.summary(), b.summary()) << what;
    int bad = 0;
    for (int64_t k = 0; k < a.numel() && bad < 5; ++k) {
      const float x = a.data<float>()[k], y = b.data<float>()[k];
      if (!(std::fabs(x - y) <= atol + rtol * std::fabs(y))) {
        ADD_FAILURE() << what << ": output " << i << " element " << k << ": fast " << x << ", reference " << y;
        ++bad;
      }
    }
  }
}

size_t primitives(const CpuPlan& cp, CpuStepKind k) {
  size_t n = 0;
  for (const CpuStep& s : cp.steps) n += s.kind == k;
  return n;
}

bool have_onednn() {
  std::string why;
  if (fast_cpu_available(&why)) return true;
  ADD_FAILURE() << "the fast CPU backend needs oneDNN (scripts/install-deps.sh): " << why;
  return false;
}

TEST(FastCpu, ConvolutionsOfEveryGeometry) {
  if (!have_onednn()) return;
  std::mt19937 shapes(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(shapes); };
  for (int c = 0; c < 24; ++c) {
    const int sp = c % 6 == 5 ? 3 : (c % 6 == 4 ? 1 : 2);  // mostly 2-D, some 1-D and 3-D
    const int batch = pick(1, 2), group = c % 3 == 0 ? 1 : (c % 3 == 1 ? 2 : 0);  // 0: depthwise
    const int cin = group == 0 ? pick(3, 12) : pick(1, 6) * (group ? group : 1);
    const int g = group == 0 ? cin : group;
    const int cout = group == 0 ? cin : pick(1, 6) * g;
    std::string xs = fmt::format("{},{}", batch, cin), ks, attrs_k, strides, dil, pads_b, pads_e;
    std::vector<int> kernel, in;
    for (int d = 0; d < sp; ++d) {
      kernel.push_back(pick(1, 3 + (sp < 3)));
      in.push_back(pick(kernel.back() + 2, sp == 3 ? 7 : 13));
      xs += fmt::format(",{}", in.back());
      ks += fmt::format(",{}", kernel.back());
      attrs_k += fmt::format("{}{}", d ? ", " : "", kernel.back());
      strides += fmt::format("{}{}", d ? ", " : "", pick(1, 2));
      dil += fmt::format("{}{}", d ? ", " : "", c % 4 == 3 ? 2 : 1);
      pads_b += fmt::format("{}{}", d ? ", " : "", pick(0, 2));
      pads_e += fmt::format(", {}", pick(0, 2));
    }
    const std::string auto_pad = c % 7 == 6 ? "SAME_UPPER" : (c % 7 == 5 ? "SAME_LOWER" : "NOTSET");
    const bool bias = c % 2 == 0;
    // The output shape comes from inference: the text leaves it to the parser's checker, so build
    // it with the reference's shape rule by parsing without an annotation is not possible; compute.
    std::string ys = fmt::format("{},{}", batch, cout);
    {
      std::vector<int> st, dl, pb, pe;
      auto ints = [](const std::string& s) {
        std::vector<int> v;
        for (size_t i = 0; i < s.size();) {
          size_t j = s.find_first_of("0123456789", i);
          if (j == std::string::npos) break;
          size_t e = s.find_first_not_of("0123456789", j);
          v.push_back(std::stoi(s.substr(j, e - j)));
          i = e == std::string::npos ? s.size() : e;
        }
        return v;
      };
      st = ints(strides), dl = ints(dil), pb = ints(pads_b), pe = ints(pads_e);
      for (int d = 0; d < sp; ++d) {
        const int ext = (kernel[d] - 1) * dl[d] + 1;
        int out = auto_pad == "NOTSET" ? (in[d] + pb[d] + pe[d] - ext) / st[d] + 1 : (in[d] + st[d] - 1) / st[d];
        ys += fmt::format(",{}", out);
      }
    }
    const std::string text = fmt::format(
        "graph main(%x: f32[{}]) {{\n  %w = const dense<f32[{},{}{}]> [0.5]\n  %b = const dense<f32[{}]> [0.5]\n"
        "  %y = Conv(%x, %w{}) {{auto_pad = \"{}\", dilations = [{}], group = {}, kernel_shape = [{}], pads = [{}{}], "
        "strides = [{}]}} : f32[{}]\n  return %y\n}}",
        xs, cout, cin / g, ks, cout, bias ? ", %b" : "", auto_pad, dil, g, attrs_k, pads_b, pads_e, strides, ys);
    Result r = run_both(text, 100 + c);
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kConv), 1u) << text;
    expect_close(r, text, 1e-4f, 1e-4f);
  }
}

TEST(FastCpu, MatMulAndGemmWithBiasAndTransposedWeights) {
  if (!have_onednn()) return;
  const char* cases[] = {
      // 3-D activations by a 2-D weight (transformer projections), bias added after.
      R"(graph main(%x: f32[2,7,12]) {
  %w = const dense<f32[12,9]> [0.5]
  %b = const dense<f32[9]> [0.5]
  %m = MatMul(%x, %w) : f32[2,7,9]
  %y = Add(%m, %b) : f32[2,7,9]
  return %y
})",
      R"(graph main(%x: f32[5,16]) {
  %w = const dense<f32[16,3]> [0.5]
  %y = MatMul(%x, %w) : f32[5,3]
  return %y
})",
      R"(graph main(%x: f32[4,10]) {
  %w = const dense<f32[6,10]> [0.5]
  %c = const dense<f32[6]> [0.5]
  %y = Gemm(%x, %w, %c) {transB = 1} : f32[4,6]
  return %y
})",
      R"(graph main(%x: f32[3,8]) {
  %w = const dense<f32[8,5]> [0.5]
  %c = const dense<f32[1,5]> [0.5]
  %g = Gemm(%x, %w, %c) : f32[3,5]
  %y = Gelu(%g) : f32[3,5]
  return %y
})",
  };
  int i = 0;
  for (const char* t : cases) {
    Result r = run_both(t, 200 + i++);
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kMatMul), 1u) << t;
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kHost), 0u) << t;
    expect_close(r, t);
  }
}

TEST(FastCpu, TransposesAsReorders) {
  if (!have_onednn()) return;
  const char* cases[] = {
      R"(graph main(%x: f32[2,5,3,4]) {
  %y = Transpose(%x) {perm = [0, 2, 1, 3]} : f32[2,3,5,4]
  return %y
})",
      R"(graph main(%x: f32[2,5,3,4]) {
  %y = Transpose(%x) {perm = [3, 1, 0, 2]} : f32[4,5,2,3]
  return %y
})",
      R"(graph main(%x: f32[6,7]) {
  %y = Transpose(%x) : f32[7,6]
  return %y
})",
      R"(graph main(%x: f32[2,3,4,5,6]) {
  %y = Transpose(%x) {perm = [4, 0, 3, 1, 2]} : f32[6,2,5,3,4]
  return %y
})",
  };
  int i = 0;
  for (const char* t : cases) {
    Result r = run_both(t, 250 + i++);
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kTranspose), 1u) << t;
    expect_close(r, t, 0.f, 0.f);  // a copy: exact
  }
}

TEST(FastCpu, Pooling) {
  if (!have_onednn()) return;
  const char* cases[] = {
      R"(graph main(%x: f32[2,5,11,9]) {
  %y = MaxPool(%x) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : f32[2,5,6,5]
  return %y
})",
      R"(graph main(%x: f32[1,4,10,10]) {
  %y = MaxPool(%x) {ceil_mode = 1, kernel_shape = [3, 3], strides = [2, 2]} : f32[1,4,5,5]
  return %y
})",
      R"(graph main(%x: f32[1,3,9,8]) {
  %y = AveragePool(%x) {count_include_pad = 1, kernel_shape = [3, 2], pads = [1, 0, 1, 1], strides = [2, 2]} : f32[1,3,5,4]
  return %y
})",
      R"(graph main(%x: f32[1,3,9,8]) {
  %y = AveragePool(%x) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [1, 1]} : f32[1,3,9,8]
  return %y
})",
      R"(graph main(%x: f32[2,6,7,5]) {
  %y = GlobalAveragePool(%x) : f32[2,6,1,1]
  return %y
})",
      R"(graph main(%x: f32[2,6,4,3,5]) {
  %y = GlobalMaxPool(%x) : f32[2,6,1,1,1]
  return %y
})",
  };
  int i = 0;
  for (const char* t : cases) {
    Result r = run_both(t, 300 + i++);
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kPool), 1u) << t;
    expect_close(r, t);
  }
}

// Conv -> activation -> Add(skip) -> activation fuses into one step; the activations of every
// kind oneDNN has agree with the reference kernels.
TEST(FastCpu, EpiloguesFuseAndAgree) {
  if (!have_onednn()) return;
  const char* acts[] = {"Relu(%c)", "LeakyRelu(%c) {alpha = 0.2}", "Clip(%c, %lo, %hi)", "Sigmoid(%c)", "Tanh(%c)",
                        "Elu(%c) {alpha = 0.7}", "HardSigmoid(%c) {alpha = 0.3, beta = 0.4}", "HardSwish(%c)",
                        "Gelu(%c)", "Gelu(%c) {approximate = \"tanh\"}", "Softplus(%c)", "Mish(%c)"};
  int i = 0;
  for (const char* a : acts) {
    const std::string text = fmt::format(R"(graph main(%x: f32[1,8,9,9]) {{
  %lo = const dense<f32[]> [0.0]
  %hi = const dense<f32[]> [0.5]
  %w1 = const dense<f32[8,8,3,3]> [0.5]
  %w2 = const dense<f32[8,8,1,1]> [0.5]
  %s = Conv(%x, %w1) {{kernel_shape = [3, 3], pads = [1, 1, 1, 1]}} : f32[1,8,9,9]
  %c = Conv(%s, %w2) {{kernel_shape = [1, 1]}} : f32[1,8,9,9]
  %a = {} : f32[1,8,9,9]
  %r = Add(%s, %a) : f32[1,8,9,9]
  %y = Relu(%r) : f32[1,8,9,9]
  return %y
}})",
                                         a);
    Result r = run_both(text, 400 + i++);
    ASSERT_EQ(r.cp.steps.size(), 2u) << text;
    EXPECT_EQ(r.cp.steps[0].out_layout, CpuLayout::kLibrary) << "read only by a convolution and as an operand";
    ASSERT_EQ(r.cp.steps[1].post.size(), 3u) << text;
    EXPECT_EQ(r.cp.steps[1].post[1].kind, CpuPostKind::kAdd);
    EXPECT_EQ(r.cp.steps[1].out_layout, CpuLayout::kPlain) << "a graph output";
    expect_close(r, text, 2e-4f, 2e-4f);
  }
}

// A runner made on one thread and run from several at once (a server's workers, Python threads):
// every run goes through the compute thread, and each caller gets the outputs of its own inputs,
// bit for bit those of running them one by one.
TEST(FastCpu, RunsFromManyThreadsGetTheirOwnResults) {
  if (!have_onednn()) return;
  const std::string text = R"(graph main(%x: f32[2,8,12,12]) {
  %w = const dense<f32[8,8,3,3]> [0.5]
  %c = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[2,8,12,12]
  %y = Relu(%c) : f32[2,8,12,12]
  return %y
})";
  std::mt19937 rng(31);
  auto g = parse(text);
  ASSERT_TRUE(g);
  randomize_constants(*g, rng);
  std::vector<std::vector<Data>> inputs;
  for (int i = 0; i < 8; ++i) inputs.push_back(random_inputs(*g, rng));
  auto plan = plan_host(std::move(g));
  ASSERT_TRUE(plan) << plan.status().message();
  auto p = std::make_shared<const Plan>(std::move(*plan));
  auto cp = plan_fast_cpu(*p);
  ASSERT_TRUE(cp) << cp.status().message();
  ASSERT_EQ(primitives(*cp, CpuStepKind::kConv), 1u);
  std::unique_ptr<CpuRunner> runner;
  std::thread([&] {  // made on a thread that then exits
    auto r = CpuRunner::create(p, std::make_shared<const CpuPlan>(*cp));
    ASSERT_TRUE(r) << r.status().message();
    runner = std::move(*r);
  }).join();
  ASSERT_TRUE(runner);
  std::vector<std::vector<float>> alone(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto out = runner->run(inputs[i]);
    ASSERT_TRUE(out) << out.status().message();
    const Tensor& t = (*out)[0].tensor;
    alone[i].resize(size_t(t.numel()));
    std::memcpy(alone[i].data(), t.data<float>(), alone[i].size() * sizeof(float));
  }
  std::vector<std::thread> callers;
  std::atomic<int> mismatches{0}, failures{0};
  for (size_t i = 0; i < inputs.size(); ++i) {
    callers.emplace_back([&, i] {
      for (int k = 0; k < 5; ++k) {
        auto out = runner->run(inputs[i]);
        if (!out) {
          ++failures;
          continue;
        }
        const Tensor& t = (*out)[0].tensor;
        if (size_t(t.numel()) != alone[i].size() ||
            std::memcmp(t.data<float>(), alone[i].data(), alone[i].size() * sizeof(float)) != 0) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

// SiLU as exporters write it, Mul(x, Sigmoid(x)) in either operand order, is one swish post-op
// followed by the residual Add; a Sigmoid with another reader keeps both nodes on the host.
TEST(FastCpu, SiluOfMulAndSigmoidFuses) {
  if (!have_onednn()) return;
  for (const char* mul : {"Mul(%c, %g)", "Mul(%g, %c)"}) {
    const std::string text = fmt::format(R"(graph main(%x: f32[1,8,7,7]) {{
  %w = const dense<f32[8,8,3,3]> [0.5]
  %c = Conv(%x, %w) {{kernel_shape = [3, 3], pads = [1, 1, 1, 1]}} : f32[1,8,7,7]
  %g = Sigmoid(%c) : f32[1,8,7,7]
  %m = {} : f32[1,8,7,7]
  %y = Add(%m, %x) : f32[1,8,7,7]
  return %y
}})",
                                         mul);
    Result r = run_both(text, 450);
    ASSERT_EQ(r.cp.steps.size(), 1u) << text;
    ASSERT_EQ(r.cp.steps[0].post.size(), 2u) << text;
    EXPECT_EQ(r.cp.steps[0].post[0].kind, CpuPostKind::kSwish);
    EXPECT_EQ(r.cp.steps[0].post[0].alpha, 1.f);
    EXPECT_EQ(r.cp.steps[0].post[1].kind, CpuPostKind::kAdd);
    expect_close(r, text, 2e-4f, 2e-4f);
  }
  const char* shared = R"(graph main(%x: f32[1,8,7,7]) {
  %w = const dense<f32[8,8,3,3]> [0.5]
  %c = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,8,7,7]
  %g = Sigmoid(%c) : f32[1,8,7,7]
  %m = Mul(%c, %g) : f32[1,8,7,7]
  return %m, %g
})";
  Result r = run_both(shared, 451);
  ASSERT_EQ(primitives(r.cp, CpuStepKind::kConv), 1u);
  for (const CpuStep& s : r.cp.steps) {
    if (s.kind == CpuStepKind::kConv) {
      EXPECT_TRUE(s.post.empty()) << "the Sigmoid is a graph output too";
    }
  }
  expect_close(r, shared);
}

// A squeeze-excite scale, Mul(scale[1,C,1,1], x), is a oneDNN binary step reading x in the
// convolution's own layout and writing the next convolution's; Sub and Div take the broadcast input
// only second (Sub(scale, x) stays on the host).
TEST(FastCpu, BroadcastBinaryKeepsTheLibraryLayout) {
  if (!have_onednn()) return;
  for (const char* op : {"Mul(%s, %c)", "Add(%c, %s)", "Sub(%c, %s)", "Div(%c, %s)", "Sub(%s, %c)"}) {
    const std::string text = fmt::format(R"(graph main(%x: f32[1,16,7,7]) {{
  %w = const dense<f32[16,16,3,3]> [0.5]
  %w1 = const dense<f32[16,16,1,1]> [0.5]
  %c = Conv(%x, %w) {{kernel_shape = [3, 3], pads = [1, 1, 1, 1]}} : f32[1,16,7,7]
  %p = GlobalAveragePool(%c) : f32[1,16,1,1]
  %s = Sigmoid(%p) : f32[1,16,1,1]
  %m = {} : f32[1,16,7,7]
  %y = Conv(%m, %w1) {{kernel_shape = [1, 1]}} : f32[1,16,7,7]
  return %y
}})",
                                         op);
    Result r = run_both(text, 470);
    const bool fast = std::string_view(op) != "Sub(%s, %c)";
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kBinary), fast ? 1u : 0u) << text;
    bool first_conv = true;
    for (const CpuStep& s : r.cp.steps) {
      if (s.kind == CpuStepKind::kBinary) {
        EXPECT_EQ(s.out_layout, CpuLayout::kLibrary) << text;
      }
      if (s.kind == CpuStepKind::kConv && first_conv) {  // %c: read by the pooling and the binary
        EXPECT_EQ(s.out_layout, fast ? CpuLayout::kLibrary : CpuLayout::kPlain) << text;
        first_conv = false;
      }
    }
    EXPECT_FALSE(first_conv) << text;
    expect_close(r, text, 2e-4f, 2e-4f);
  }
}

// Attention of 4-D Q/K/V as two oneDNN products and a softmax, with masks of every broadcast
// (none, full, over the batch as Swin's windows, a padding row, a 2-D [L, S]); whichever way the
// mask is added (a post-op of the product, or a binary step of its own) the result agrees.
TEST(FastCpu, AttentionWithMasksOfEveryBroadcast) {
  if (!have_onednn()) return;
  const char* masks[] = {"", ", %m", ", %m", ", %m", ", %m"};
  const char* mask_types[] = {"f32[1]", "f32[4,3,5,6]", "f32[1,3,5,6]", "f32[4,1,1,6]", "f32[5,6]"};
  for (int c = 0; c < 5; ++c) {
    const std::string text = fmt::format(R"(graph main(%q: f32[4,3,5,8], %k: f32[4,3,6,8], %v: f32[4,3,6,8], %m: {}) {{
  %y = Attention(%q, %k, %v{}) : f32[4,3,5,8]
  return %y
}})",
                                         mask_types[c], masks[c]);
    Result r = run_both(text, 480 + c);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kAttention), 1u) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
  }
}

// MatMul of two computed operands (an unfused attention's Q K^T and P V), batch dims broadcast
// where one side has 1 or fewer dims, and a constant operand of rank 3: a oneDNN batched product.
TEST(FastCpu, BatchMatMulOfComputedOperands) {
  if (!have_onednn()) return;
  const char* cases[][3] = {{"f32[2,3,5,8]", "f32[2,3,8,6]", "f32[2,3,5,6]"},
                            {"f32[2,1,5,8]", "f32[3,8,6]", "f32[2,3,5,6]"},
                            {"f32[7,8]", "f32[4,8,6]", "f32[4,7,6]"}};
  int c = 0;
  for (const auto& t : cases) {
    const std::string text = fmt::format(R"(graph main(%a: {}, %b: {}) {{
  %ra = Relu(%a) : {}
  %y = MatMul(%ra, %b) : {}
  return %y
}})",
                                         t[0], t[1], t[0], t[2]);
    Result r = run_both(text, 490 + c++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kBatchMatMul), 1u) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
  }
  const char* constant = R"(graph main(%a: f32[4,5,8]) {
  %w = const dense<f32[4,8,3]> [0.5]
  %y = MatMul(%a, %w) : f32[4,5,3]
  return %y
})";
  Result r = run_both(constant, 495);
  ASSERT_EQ(primitives(r.cp, CpuStepKind::kBatchMatMul), 1u);
  expect_close(r, constant, 1e-5f, 1e-4f);
}

// STFT as a strided convolution by the DFT basis: one- and two-sided, with a window and without,
// frames overlapping or not, a [batch, length, 1] signal, an odd frame length, a Pow after it fused;
// the reference is kiln's direct DFT. A window the graph computes stays on the reference kernels.
TEST(FastCpu, StftAsAStridedConvolution) {
  if (!have_onednn()) return;
  struct Case {
    const char* x;
    int64_t step, flen;
    bool window, onesided;
  };
  const Case cases[] = {{"f32[2,64]", 12, 16, true, true},  {"f32[1,400]", 160, 400, true, true},
                        {"f32[3,50]", 7, 9, false, true},   {"f32[2,64,1]", 16, 16, true, false},
                        {"f32[1,1000]", 10, 100, true, true}};
  int c = 0;
  for (const Case& k : cases) {
    const bool rank3 = std::string(k.x).find(",1]") != std::string::npos;
    const int64_t len = rank3 ? 64 : std::stoll(std::string(k.x).substr(std::string(k.x).find(',') + 1));
    const int64_t batch = std::stoll(std::string(k.x).substr(4));
    const int64_t frames = (len - k.flen) / k.step + 1, bins = k.onesided ? k.flen / 2 + 1 : k.flen;
    const std::string text = fmt::format(R"(graph main(%x: {}) {{
  %s = const dense<i64[]> [{}]
  %n = const dense<i64[]> [{}]
  %w = const dense<f32[{}]> [0.5]
  %y = STFT(%x, %s, {}, %n) {{onesided = {}}} : f32[{},{},{},2]
  return %y
}})",
                                         k.x, k.step, k.flen, k.flen, k.window ? "%w" : "_", k.onesided ? 1 : 0, batch,
                                         frames, bins);
    Result r = run_both(text, 700 + c++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kStft), 1u) << text;
    expect_close(r, text, 2e-4f, 1e-4f);
  }
  // A power spectrum's square is the convolution's epilogue.
  const char* power = R"(graph main(%x: f32[2,64]) {
  %s = const dense<i64[]> [12]
  %w = const dense<f32[16]> [0.5]
  %e = const dense<f32[]> [2]
  %y = STFT(%x, %s, %w) : f32[2,5,9,2]
  %p = Pow(%y, %e) : f32[2,5,9,2]
  return %p
})";
  Result pr = run_both(power, 710);
  ASSERT_EQ(primitives(pr.cp, CpuStepKind::kStft), 1u);
  ASSERT_EQ(pr.cp.steps.size(), 1u);
  EXPECT_EQ(pr.cp.steps[0].post.size(), 1u);
  expect_close(pr, power, 2e-4f, 1e-4f);
  const char* computed = R"(graph main(%x: f32[2,64]) {
  %s = const dense<i64[]> [12]
  %n = const dense<i64[]> [16]
  %w = HannWindow(%n) : f32[16]
  %y = STFT(%x, %s, %w) : f32[2,5,9,2]
  return %y
})";
  Result r = run_both(computed, 720);
  EXPECT_EQ(primitives(r.cp, CpuStepKind::kStft), 0u);
  expect_close(r, computed, 1e-5f, 1e-5f);
}

// A unary elementwise op on its own (after a host step) is oneDNN's eltwise, each op oneDNN has, and
// the elementwise ops after it are its post-ops; so is a FusedElementwise chain of them (SiLU).
TEST(FastCpu, ElementwiseOpsOnTheirOwn) {
  if (!have_onednn()) return;
  const char* ops[] = {"Relu(%a)", "LeakyRelu(%a) {alpha = 0.2}", "Clip(%a, %lo, %hi)", "Sigmoid(%a)", "Tanh(%a)",
                       "Elu(%a) {alpha = 0.7}", "HardSigmoid(%a) {alpha = 0.3, beta = 0.4}", "HardSwish(%a)", "Gelu(%a)",
                       "Gelu(%a) {approximate = \"tanh\"}", "Softplus(%a)", "Mish(%a)", "Pow(%a, %three)"};
  int c = 0;
  for (const char* op : ops) {
    const std::string text = fmt::format(R"(graph main(%x: f32[2,3,17]) {{
  %lo = const dense<f32[]> [-0.5]
  %hi = const dense<f32[]> [0.8]
  %three = const dense<f32[]> [3]
  %a = Neg(%x) : f32[2,3,17]
  %y = {} : f32[2,3,17]
  return %y
}})",
                                         op);
    Result r = run_both(text, 730 + c++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kEltwise), 1u) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
  }
  const char* chain = R"(graph main(%x: f32[4,33]) {
  %two = const dense<f32[]> [2]
  %a = Neg(%x) : f32[4,33]
  %s = Sigmoid(%a) : f32[4,33]
  %t = Tanh(%s) : f32[4,33]
  %y = Pow(%t, %two) : f32[4,33]
  return %y
})";
  // SiLU as fuse-elementwise leaves it (a FusedElementwise of Mul(x, Sigmoid(x))) is one swish, with a
  // Tanh chained in the body after it; a body that is not a chain (two inputs) stays on the host.
  const char* fused = R"(graph main(%x: f32[2,8,5,5]) {
  %a = Neg(%x) : f32[2,8,5,5]
  %y = ai.kiln.FusedElementwise(%a) {body = graph b(%v: f32[2,8,5,5]) {
    %s = Sigmoid(%v) : f32[2,8,5,5]
    %m = Mul(%v, %s) : f32[2,8,5,5]
    %t = Tanh(%m) : f32[2,8,5,5]
    return %t
  }} : f32[2,8,5,5]
  return %y
})";
  Result fr = run_both(fused, 751);
  ASSERT_EQ(primitives(fr.cp, CpuStepKind::kEltwise), 1u);
  expect_close(fr, fused, 1e-5f, 1e-4f);
  const char* two = R"(graph main(%x: f32[4,6], %z: f32[4,6]) {
  %y = ai.kiln.FusedElementwise(%x, %z) {body = graph b(%v: f32[4,6], %w: f32[4,6]) {
    %s = Sigmoid(%v) : f32[4,6]
    %m = Mul(%w, %s) : f32[4,6]
    return %m
  }} : f32[4,6]
  return %y
})";
  Result tr = run_both(two, 752);
  EXPECT_EQ(primitives(tr.cp, CpuStepKind::kEltwise), 0u);
  expect_close(tr, two, 1e-6f, 1e-6f);
  Result r = run_both(chain, 750);
  ASSERT_EQ(primitives(r.cp, CpuStepKind::kEltwise), 1u);
  for (const CpuStep& st : r.cp.steps) {
    if (st.kind == CpuStepKind::kEltwise) {
      EXPECT_EQ(st.post.size(), 2u);
    }
  }
  expect_close(r, chain, 1e-5f, 1e-4f);
}

// LSTM as oneDNN's: forward, reverse and bidirectional, with and without biases and initial
// states; the reference is kiln's own recurrence. An LSTM whose Y_h is read stays on the reference
// kernels (oneDNN's step writes Y alone), as does one with clip.
TEST(FastCpu, LstmAsOneDnnsLstm) {
  if (!have_onednn()) return;
  struct Case {
    const char* dir;
    int dirs;
    bool bias, states;
  };
  const Case cases[] = {{"forward", 1, true, true}, {"reverse", 1, false, true}, {"bidirectional", 2, true, true},
                        {"bidirectional", 2, true, false}, {"forward", 1, false, false}};
  int c = 0;
  for (const Case& k : cases) {
    const int T = 5, N = 3, I = 7, H = 6;
    const std::string text = fmt::format(R"(graph main(%x: f32[{T},{N},{I}], %h0: f32[{D},{N},{H}], %c0: f32[{D},{N},{H}]) {{
  %w = const dense<f32[{D},{G},{I}]> [0.1]
  %r = const dense<f32[{D},{G},{H}]> [0.1]
  %b = const dense<f32[{D},{B}]> [0.1]
  %y, _, _ = LSTM(%x, %w, %r, {bias}, _, {h0}, {c0}) {{direction = "{dir}", hidden_size = {H}}} : f32[{T},{D},{N},{H}]
  return %y
}})",
                                         fmt::arg("T", T), fmt::arg("N", N), fmt::arg("I", I), fmt::arg("H", H),
                                         fmt::arg("D", k.dirs), fmt::arg("G", 4 * H), fmt::arg("B", 8 * H),
                                         fmt::arg("bias", k.bias ? "%b" : "_"), fmt::arg("h0", k.states ? "%h0" : "_"),
                                         fmt::arg("c0", k.states ? "%c0" : "_"), fmt::arg("dir", k.dir));
    Result r = run_both(text, 760 + c++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kLstm), 1u) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
  }
  for (const char* extra : {"", ", clip = 0.5"}) {
    const std::string text = fmt::format(R"(graph main(%x: f32[4,2,3]) {{
  %w = const dense<f32[1,8,3]> [0.1]
  %r = const dense<f32[1,8,2]> [0.1]
  %y, %yh, _ = LSTM(%x, %w, %r) {{hidden_size = 2{}}} : f32[4,1,2,2], f32[1,2,2]
  return {}
}})",
                                         extra, *extra ? "%y" : "%y, %yh");
    Result r = run_both(text, 770);
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kLstm), 0u) << text;
    expect_close(r, text, 1e-6f, 1e-6f);
  }
}

// GroupNormalization (per-channel or per-group scale) and InstanceNormalization as batch norm
// statistics and a binary affine, a SiLU after them as post-ops (raw Mul(x, Sigmoid(x)) or fused).
TEST(FastCpu, GroupAndInstanceNormalization) {
  if (!have_onednn()) return;
  const char* cases[] = {
      R"(graph main(%x: f32[2,12,5,7]) {
  %s = const dense<f32[12]> [0.5]
  %b = const dense<f32[12]> [0.5]
  %y = GroupNormalization(%x, %s, %b) {num_groups = 3, epsilon = 0.001} : f32[2,12,5,7]
  return %y
})",
      R"(graph main(%x: f32[1,8,33]) {
  %s = const dense<f32[4]> [0.5]
  %b = const dense<f32[4]> [0.5]
  %y = GroupNormalization(%x, %s, %b) {num_groups = 4} : f32[1,8,33]
  return %y
})",
      R"(graph main(%x: f32[2,6,4,4]) {
  %s = const dense<f32[6]> [0.5]
  %b = const dense<f32[6]> [0.5]
  %n = InstanceNormalization(%x, %s, %b) : f32[2,6,4,4]
  %g = Sigmoid(%n) : f32[2,6,4,4]
  %y = Mul(%n, %g) : f32[2,6,4,4]
  return %y
})",
      R"(graph main(%x: f32[1,16,8,8]) {
  %s = const dense<f32[16]> [0.5]
  %b = const dense<f32[16]> [0.5]
  %n = GroupNormalization(%x, %s, %b) {num_groups = 4} : f32[1,16,8,8]
  %y = ai.kiln.FusedElementwise(%n) {body = graph b(%v: f32[1,16,8,8]) {
    %t = Sigmoid(%v) : f32[1,16,8,8]
    %m = Mul(%v, %t) : f32[1,16,8,8]
    return %m
  }} : f32[1,16,8,8]
  return %y
})"};
  int c = 0;
  for (const char* text : cases) {
    Result r = run_both(text, 780 + c++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kGroupNorm), 1u) << text;
    ASSERT_EQ(r.cp.steps.size(), 1u) << text;  // the SiLU is the step's post-op
    expect_close(r, text, 1e-4f, 1e-4f);
  }
}

// Resize as oneDNN resampling: linear with half-pixel centres by scales (up, down, not whole) or
// by sizes, 1-D and 3-D spatial, nearest by whole factors with asymmetric floor; align_corners,
// nearest by a factor that is not whole, and a scale whose product with the input is not the
// output (ONNX maps back through the scale, oneDNN through the dims) stay on the reference kernels.
TEST(FastCpu, ResizeAsResampling) {
  if (!have_onednn()) return;
  struct Case {
    const char* x;
    const char* y;
    const char* scales;  // "" for sizes
    const char* sizes;
    const char* attrs;
    bool fast;
  };
  const Case cases[] = {
      {"f32[1,3,8,8]", "f32[1,3,16,16]", "[1, 1, 2, 2]", "", R"(mode = "linear")", true},
      {"f32[2,2,8,6]", "f32[2,2,12,9]", "[1, 1, 1.5, 1.5]", "", R"(mode = "linear", coordinate_transformation_mode = "pytorch_half_pixel")", true},
      {"f32[2,2,9,7]", "f32[2,2,13,10]", "[1, 1, 1.5, 1.5]", "", R"(mode = "linear")", false},
      {"f32[1,4,10,10]", "f32[1,4,5,5]", "[1, 1, 0.5, 0.5]", "", R"(mode = "linear")", true},
      {"f32[1,2,6,5]", "f32[1,2,11,7]", "", "[1, 2, 11, 7]", R"(mode = "linear")", true},
      {"f32[1,3,17]", "f32[1,3,34]", "[1, 1, 2]", "", R"(mode = "linear")", true},
      {"f32[1,2,4,4,4]", "f32[1,2,8,8,8]", "[1, 1, 2, 2, 2]", "", R"(mode = "linear")", true},
      {"f32[1,3,5,6]", "f32[1,3,10,18]", "[1, 1, 2, 3]", "", R"(mode = "nearest", coordinate_transformation_mode = "asymmetric", nearest_mode = "floor")", true},
      {"f32[1,3,8,8]", "f32[1,3,16,16]", "[1, 1, 2, 2]", "", R"(mode = "linear", coordinate_transformation_mode = "align_corners")", false},
      {"f32[1,3,6,6]", "f32[1,3,9,9]", "[1, 1, 1.5, 1.5]", "", R"(mode = "nearest", coordinate_transformation_mode = "asymmetric", nearest_mode = "floor")", false},
  };
  int c = 0;
  for (const Case& k : cases) {
    const bool by_sizes = *k.scales == 0;
    const std::string rank = std::to_string(std::count(k.x, k.x + std::strlen(k.x), ',') + 1);
    const std::string text = fmt::format(R"(graph main(%x: {}) {{
  %keep = const dense<{}> {}
  %y = Resize(%x, _, {}) {{{}}} : {}
  return %y
}})",
                                         k.x, by_sizes ? "i64[" + rank + "]" : "f32[" + rank + "]",
                                         by_sizes ? k.sizes : k.scales, by_sizes ? "_, %keep" : "%keep", k.attrs, k.y);
    Result r = run_both(text, 790 + c++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kResample), k.fast ? 1u : 0u) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
  }
}

// A FusedElementwise that is no chain of eltwise ops runs as kiln's blocked loop: rotary embedding
// (four inputs, broadcast), SwiGLU (two inputs), GELU's erf form with scalar constants, a clip and
// a power, a last dim longer than one block and one of 1; a body with a bool stays on the host.
TEST(FastCpu, FusedElementwiseAsOneLoop) {
  if (!have_onednn()) return;
  const char* cases[] = {
      R"(graph main(%x: f32[1,4,6,8], %c: f32[1,1,6,8], %r: f32[1,4,6,8], %s: f32[1,1,6,8]) {
  %y = ai.kiln.FusedElementwise(%x, %c, %r, %s) {body = graph b(%a: f32[1,4,6,8], %b: f32[1,1,6,8], %d: f32[1,4,6,8], %e: f32[1,1,6,8]) {
    %m = Mul(%a, %b) : f32[1,4,6,8]
    %n = Mul(%d, %e) : f32[1,4,6,8]
    %o = Add(%m, %n) : f32[1,4,6,8]
    return %o
  }} : f32[1,4,6,8]
  return %y
})",
      R"(graph main(%g: f32[2,3,700], %u: f32[2,3,700]) {
  %y = ai.kiln.FusedElementwise(%g, %u) {body = graph b(%a: f32[2,3,700], %b: f32[2,3,700]) {
    %s = Sigmoid(%a) : f32[2,3,700]
    %m = Mul(%a, %s) : f32[2,3,700]
    %o = Mul(%m, %b) : f32[2,3,700]
    return %o
  }} : f32[2,3,700]
  return %y
})",
      R"(graph main(%x: f32[3,5,1], %z: f32[5,1]) {
  %y = ai.kiln.FusedElementwise(%x, %z) {body = graph b(%a: f32[3,5,1], %w: f32[5,1]) {
    %k = const dense<f32[]> [1.4142135]
    %one = const dense<f32[]> [1]
    %half = const dense<f32[]> [0.5]
    %lo = const dense<f32[]> [-0.3]
    %two = const dense<f32[]> [2]
    %d = Div(%a, %k) : f32[3,5,1]
    %e = Erf(%d) : f32[3,5,1]
    %p = Add(%e, %one) : f32[3,5,1]
    %q = Mul(%a, %p) : f32[3,5,1]
    %h = Mul(%q, %half) : f32[3,5,1]
    %c = Clip(%h, %lo, _) : f32[3,5,1]
    %s = Sub(%c, %w) : f32[3,5,1]
    %o = Pow(%s, %two) : f32[3,5,1]
    return %o
  }} : f32[3,5,1]
  return %y
})"};
  int c = 0;
  for (const char* text : cases) {
    Result r = run_both(text, 800 + c++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kFused), 1u) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
  }
  const char* boolean = R"(graph main(%x: f32[4,4], %m: bool[4,4]) {
  %y = ai.kiln.FusedElementwise(%x, %m) {body = graph b(%a: f32[4,4], %k: bool[4,4]) {
    %z = const dense<f32[]> [0]
    %o = Where(%k, %a, %z) : f32[4,4]
    return %o
  }} : f32[4,4]
  return %y
})";
  auto g = parse(boolean);
  ASSERT_TRUE(g);
  EXPECT_FALSE(FusedKernel::supported(*g->nodes[0]));
}

// RMSNormalization over the last axis as kiln's row loop, a [hidden] and a [1, hidden] scale; over
// another axis it stays on the reference kernels.
TEST(FastCpu, RmsNormalizationAsARowLoop) {
  if (!have_onednn()) return;
  const char* cases[][3] = {{"f32[2,5,64]", "f32[64]", ""}, {"f32[3,1000]", "f32[1,1000]", "{epsilon = 0.001}"},
                            {"f32[4,6]", "f32[4,6]", "{axis = 0}"}};
  int c = 0;
  for (const auto& k : cases) {
    const std::string text = fmt::format(R"(graph main(%x: {}) {{
  %s = const dense<{}> [0.5]
  %y = RMSNormalization(%x, %s) {} : {}
  return %y
}})",
                                         k[0], k[1], k[2], k[0]);
    Result r = run_both(text, 820 + c);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kRmsNorm), c < 2 ? 1u : 0u) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
    ++c;
  }
}

// Softmax and LogSoftmax on their own as oneDNN softmax over any axis; Slice with steps of 1 as a
// reorder of the sub-block (negative and clamped starts, listed and default axes); a Slice with a
// step of 2 stays on the reference kernels.
TEST(FastCpu, SoftmaxAndSlice) {
  if (!have_onednn()) return;
  const char* cases[][2] = {
      {R"(graph main(%x: f32[2,3,7]) {
  %y = Softmax(%x) : f32[2,3,7]
  return %y
})", "softmax"},
      {R"(graph main(%x: f32[2,3,7]) {
  %y = LogSoftmax(%x) {axis = 1} : f32[2,3,7]
  return %y
})", "softmax"},
      {R"(graph main(%x: f32[4,10,6]) {
  %s = const dense<i64[2]> [1, -4]
  %e = const dense<i64[2]> [3, 100]
  %a = const dense<i64[2]> [0, -2]
  %y = Slice(%x, %s, %e, %a) : f32[2,4,6]
  return %y
})", "slice"},
      {R"(graph main(%x: f32[5,8]) {
  %s = const dense<i64[1]> [-100]
  %e = const dense<i64[1]> [2]
  %y = Slice(%x, %s, %e) : f32[2,8]
  return %y
})", "slice"},
      {R"(graph main(%x: f32[5,8]) {
  %s = const dense<i64[1]> [0]
  %e = const dense<i64[1]> [8]
  %a = const dense<i64[1]> [1]
  %t = const dense<i64[1]> [2]
  %y = Slice(%x, %s, %e, %a, %t) : f32[5,4]
  return %y
})", "none"}};
  int c = 0;
  for (const auto& k : cases) {
    Result r = run_both(k[0], 840 + c++);
    const std::string want = k[1];
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kSoftmax), want == "softmax" ? 1u : 0u) << k[0];
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kSlice), want == "slice" ? 1u : 0u) << k[0];
    expect_close(r, k[0], 1e-6f, 1e-5f);
  }
}

// Empty tensors, and the Resize forms oneDNN's pixel mapping does not share, stay on the reference
// kernels (a zero dim once divided by zero while planning).
TEST(FastCpu, EmptyTensorsAndOtherResizesStayOnTheReference) {
  if (!have_onednn()) return;
  const char* cases[] = {R"(graph main(%x: f32[1,3,0,4]) {
  %keep = const dense<f32[4]> [1, 1, 2, 2]
  %y = Resize(%x, _, %keep) {mode = "nearest", coordinate_transformation_mode = "asymmetric", nearest_mode = "floor"} : f32[1,3,0,8]
  return %y
})",
                         R"(graph main(%a: f32[4,1], %b: f32[4,0]) {
  %y = ai.kiln.FusedElementwise(%a, %b) {body = graph g(%p: f32[4,1], %q: f32[4,0]) {
    %m = Mul(%p, %q) : f32[4,0]
    %o = Add(%m, %p) : f32[4,0]
    return %o
  }} : f32[4,0]
  return %y
})"};
  int c = 0;
  for (const char* text : cases) {
    Result r = run_both(text, 860 + c++);
    EXPECT_EQ(primitives(r.cp, CpuStepKind::kResample) + primitives(r.cp, CpuStepKind::kFused), 0u) << text;
    ASSERT_EQ(r.fast.size(), r.ref.size()) << text;
    for (size_t k = 0; k < r.ref.size(); ++k) EXPECT_EQ(r.fast[k].tensor.summary(), r.ref[k].tensor.summary()) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
  }
  // keep_aspect_ratio_policy maps every axis through one shared scale: planned for the host.
  auto g = parse(R"(graph main(%x: f32[1,2,6,4]) {
  %keep = const dense<i64[4]> [1, 2, 12, 12]
  %y = Resize(%x, _, _, %keep) {mode = "linear", keep_aspect_ratio_policy = "not_larger"} : f32[1,2,12,8]
  return %y
})");
  ASSERT_TRUE(g);
  auto plan = plan_host(std::move(g));
  ASSERT_TRUE(plan) << plan.status().message();
  auto cp = plan_fast_cpu(*plan);
  ASSERT_TRUE(cp);
  EXPECT_EQ(primitives(*cp, CpuStepKind::kResample), 0u);
}

// GRU as oneDNN's: both linear_before_reset forms, every direction, with and without biases and an
// initial state; one whose Y_h is read stays on the reference kernels.
TEST(FastCpu, GruAsOneDnnsGru) {
  if (!have_onednn()) return;
  struct Case {
    const char* dir;
    int dirs, lbr;
    bool bias, state;
  };
  const Case cases[] = {{"forward", 1, 0, true, true},        {"forward", 1, 1, true, true},
                        {"reverse", 1, 1, false, true},       {"bidirectional", 2, 1, true, false},
                        {"bidirectional", 2, 0, true, true}, {"forward", 1, 0, false, false}};
  int c = 0;
  for (const Case& k : cases) {
    const int T = 4, N = 3, I = 5, H = 6;
    const std::string text = fmt::format(R"(graph main(%x: f32[{T},{N},{I}], %h0: f32[{D},{N},{H}]) {{
  %w = const dense<f32[{D},{G},{I}]> [0.1]
  %r = const dense<f32[{D},{G},{H}]> [0.1]
  %b = const dense<f32[{D},{B}]> [0.1]
  %y, _ = GRU(%x, %w, %r, {bias}, _, {h0}) {{direction = "{dir}", hidden_size = {H}, linear_before_reset = {lbr}}} : f32[{T},{D},{N},{H}]
  return %y
}})",
                                         fmt::arg("T", T), fmt::arg("N", N), fmt::arg("I", I), fmt::arg("H", H),
                                         fmt::arg("D", k.dirs), fmt::arg("G", 3 * H), fmt::arg("B", 6 * H),
                                         fmt::arg("bias", k.bias ? "%b" : "_"), fmt::arg("h0", k.state ? "%h0" : "_"),
                                         fmt::arg("dir", k.dir), fmt::arg("lbr", k.lbr));
    Result r = run_both(text, 870 + c++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kGru), 1u) << text;
    expect_close(r, text, 1e-5f, 1e-4f);
  }
  const char* read_state = R"(graph main(%x: f32[4,2,3]) {
  %w = const dense<f32[1,6,3]> [0.1]
  %r = const dense<f32[1,6,2]> [0.1]
  %y, %yh = GRU(%x, %w, %r) {hidden_size = 2} : f32[4,1,2,2], f32[1,2,2]
  return %y, %yh
})";
  Result r = run_both(read_state, 880);
  EXPECT_EQ(primitives(r.cp, CpuStepKind::kGru), 0u);
  expect_close(r, read_state, 1e-6f, 1e-6f);
}

// An engine file whose CPU plan is not the one this kiln makes for its graph (a file from a kiln
// whose fast backend claimed other ops) loads with the plan made again, and the report says so.
TEST(FastCpu, AForeignCpuPlanIsMadeAgainAtLoad) {
  if (!have_onednn()) return;
  auto g = parse(R"(graph main(%x: f32[2,8]) {
  %a = Neg(%x) : f32[2,8]
  %y = Sigmoid(%a) : f32[2,8]
  return %y
})");
  ASSERT_TRUE(g);
  auto plan = plan_host(std::move(g));
  ASSERT_TRUE(plan);
  auto p = std::make_shared<const Plan>(std::move(*plan));
  CpuPlan all_host;  // what a kiln without the eltwise step planned: every step on the host
  for (size_t i = 0; i < p->steps.size(); ++i) {
    CpuStep st;
    st.index = uint32_t(i);
    all_host.steps.push_back(st);
  }
  EXPECT_FALSE(read_cpu_plan(write_cpu_plan(all_host), *p, "m.kiln"));
  auto e = load_fast_cpu_engine(p, BuildConfig{}, write_cpu_plan(all_host), "m.kiln");
  ASSERT_TRUE(e) << e.status().message();
  EXPECT_NE((*e)->report().find("CPU plan made again at load"), std::string::npos) << (*e)->report();
  EXPECT_NE((*e)->report().find("1 oneDNN primitives"), std::string::npos) << (*e)->report();  // the Sigmoid
}

// Concat of convolutions' blocked results is a oneDNN concat that keeps the layout for the next
// convolution; a graph input (row-major) among its parts, a part twice, an odd channel count, and
// 20 parts (more arguments than one fixed list holds) all agree with the reference.
TEST(FastCpu, ConcatKeepsTheLibraryLayout) {
  if (!have_onednn()) return;
  const char* text = R"(graph main(%x: f32[1,8,6,6]) {
  %w1 = const dense<f32[16,8,3,3]> [0.5]
  %w2 = const dense<f32[5,8,1,1]> [0.5]
  %w3 = const dense<f32[8,45,1,1]> [0.5]
  %a = Conv(%x, %w1) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,16,6,6]
  %b = Conv(%x, %w2) {kernel_shape = [1, 1]} : f32[1,5,6,6]
  %c = Concat(%a, %b, %a, %x) {axis = 1} : f32[1,45,6,6]
  %y = Conv(%c, %w3) {kernel_shape = [1, 1]} : f32[1,8,6,6]
  return %y
})";
  Result r = run_both(text, 510);
  ASSERT_EQ(primitives(r.cp, CpuStepKind::kConcat), 1u);
  for (const CpuStep& s : r.cp.steps) {
    if (s.kind == CpuStepKind::kConcat) {
      EXPECT_EQ(s.out_layout, CpuLayout::kLibrary) << "read only by a convolution";
    }
  }
  expect_close(r, text, 2e-4f, 2e-4f);
  std::string names;
  for (int k = 0; k < 20; ++k) names += fmt::format("{}%x{}", k ? ", " : "", k % 3);
  const std::string many = fmt::format(R"(graph main(%x0: f32[2,3,4], %x1: f32[2,1,4], %x2: f32[2,2,4]) {{
  %y = Concat({}) {{axis = 1}} : f32[2,40,4]
  return %y
}})",
                                       names);
  Result m = run_both(many, 511);
  ASSERT_EQ(primitives(m.cp, CpuStepKind::kConcat), 1u) << many;
  expect_close(m, many, 0.f, 0.f);
}

// BatchNormalization that no convolution absorbs (a DenseNet's pre-activation after a Concat) is a
// oneDNN batch norm with its Relu fused, in the layout of its source; read on the host, its result
// comes back row-major; a Relu read twice stays its own step.
TEST(FastCpu, BatchNormWithItsRelu) {
  if (!have_onednn()) return;
  const char* text = R"(graph main(%x: f32[1,16,6,6]) {
  %w = const dense<f32[16,16,3,3]> [0.5]
  %w2 = const dense<f32[8,32,1,1]> [0.5]
  %s = const dense<f32[32]> [1.5]
  %b = const dense<f32[32]> [0.1]
  %m = const dense<f32[32]> [0.2]
  %var = const dense<f32[32]> [0.7]
  %c = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,16,6,6]
  %k = Concat(%x, %c) {axis = 1} : f32[1,32,6,6]
  %n = BatchNormalization(%k, %s, %b, %m, %var) {epsilon = 0.001} : f32[1,32,6,6]
  %r = Relu(%n) : f32[1,32,6,6]
  %y = Conv(%r, %w2) {kernel_shape = [1, 1]} : f32[1,8,6,6]
  %n2 = BatchNormalization(%c, %s2, %b2, %m2, %var2) : f32[1,16,6,6]
  %e = Neg(%n2) : f32[1,16,6,6]
  return %y, %e
})";
  const std::string t = std::string(text).replace(std::string(text).find("  %c = Conv"), 0,
                                                   "  %s2 = const dense<f32[16]> [1.5]\n  %b2 = const dense<f32[16]> [0.1]\n"
                                                   "  %m2 = const dense<f32[16]> [0.2]\n  %var2 = const dense<f32[16]> [0.7]\n");
  Result r = run_both(t, 520);
  ASSERT_EQ(primitives(r.cp, CpuStepKind::kBatchNorm), 2u) << t;
  for (const CpuStep& s : r.cp.steps) {
    if (s.kind != CpuStepKind::kBatchNorm) continue;
    if (s.post.empty()) {
      EXPECT_EQ(s.out_layout, CpuLayout::kPlain) << "Neg reads it on the host";
    } else {
      EXPECT_EQ(s.post[0].kind, CpuPostKind::kRelu);
      EXPECT_EQ(s.out_layout, CpuLayout::kLibrary) << "read only by a convolution";
    }
  }
  expect_close(r, t, 2e-4f, 2e-4f);
}

// ConvTranspose as oneDNN's deconvolution: ONNX's [C_in, C_out / group, k...] weight read through
// strides, grouped, with bias, output_padding, dilation, 1-D and 3-D, and a fused Relu.
TEST(FastCpu, ConvTransposeAsDeconvolution) {
  if (!have_onednn()) return;
  struct C {
    const char *x, *w, *attrs, *y;
    int c_out;  // 0: no bias
  };
  const C cases[] = {
      {"f32[1,8,5,5]", "f32[8,4,4,4]", "kernel_shape = [4, 4], pads = [1, 1, 1, 1], strides = [2, 2]", "f32[1,4,10,10]", 0},
      {"f32[2,6,4,5]", "f32[6,2,3,3]", "group = 3, strides = [2, 1], output_padding = [1, 0]", "f32[2,6,10,7]", 6},
      {"f32[1,4,7]", "f32[4,3,3]", "dilations = [2], pads = [1, 2], strides = [3]", "f32[1,3,20]", 3},
      {"f32[1,2,3,3,3]", "f32[2,2,2,2,2]", "strides = [2, 2, 2]", "f32[1,2,6,6,6]", 0},
  };
  int k = 0;
  for (const C& c : cases) {
    const std::string text = fmt::format(R"(graph main(%x: {}) {{
  %w = const dense<{}> [0.5]
  %b = const dense<f32[{}]> [0.5]
  %t = ConvTranspose(%x, %w{}) {{{}}} : {}
  %y = Relu(%t) : {}
  return %y
}})",
                                         c.x, c.w, std::max(c.c_out, 1), c.c_out ? ", %b" : "", c.attrs, c.y, c.y);
    Result r = run_both(text, 530 + k++);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kDeconv), 1u) << text;
    for (const CpuStep& s : r.cp.steps) {
      if (s.kind == CpuStepKind::kDeconv) {
        EXPECT_EQ(s.post.size(), 1u) << text;
      }
    }
    expect_close(r, text, 2e-4f, 2e-4f);
  }
}

// An intermediate read twice, or a graph output, is not absorbed; a value a host step reads stays
// row-major.
TEST(FastCpu, FusionStopsWhereAValueIsShared) {
  if (!have_onednn()) return;
  const char* text = R"(graph main(%x: f32[1,4,6,6]) {
  %w = const dense<f32[4,4,3,3]> [0.5]
  %c = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,4,6,6]
  %r = Relu(%c) : f32[1,4,6,6]
  %n = Neg(%c) : f32[1,4,6,6]
  %p = MaxPool(%r) {kernel_shape = [2, 2], strides = [2, 2]} : f32[1,4,3,3]
  %q = Sigmoid(%p) : f32[1,4,3,3]
  return %n, %q, %r
})";
  Result r = run_both(text, 500);
  ASSERT_EQ(primitives(r.cp, CpuStepKind::kConv), 1u);
  for (const CpuStep& s : r.cp.steps) {
    if (s.kind == CpuStepKind::kConv) {
      EXPECT_TRUE(s.post.empty()) << "%c has two readers";
      EXPECT_EQ(s.out_layout, CpuLayout::kPlain) << "Neg reads it on the host";
    }
    if (s.kind == CpuStepKind::kPool) {
      EXPECT_EQ(s.post.size(), 1u) << "Sigmoid fuses into the pooling";
    }
  }
  expect_close(r, text);
}

// What must not fuse or change layout: a constant added to a bias-less Conv is a post-op, not its
// bias; a Gemm's C that is a column stays on the host; a value a subgraph body reads stays
// row-major even when its other readers are convolutions.
TEST(FastCpu, OperandsThatLookLikeBiasesAndSubgraphReads) {
  if (!have_onednn()) return;
  const char* conv_add = R"(graph main(%x: f32[1,4,6,6]) {
  %w = const dense<f32[4,4,3,3]> [0.5]
  %c = const dense<f32[4,1,1]> [0.5]
  %a = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,4,6,6]
  %y = Add(%a, %c) : f32[1,4,6,6]
  return %y
})";
  Result r = run_both(conv_add, 600);
  ASSERT_EQ(r.cp.steps.size(), 1u);
  EXPECT_EQ(r.cp.steps[0].post.size(), 1u);
  expect_close(r, conv_add);

  const char* gemm_column = R"(graph main(%x: f32[4,8]) {
  %w = const dense<f32[8,4]> [0.5]
  %c = const dense<f32[4,1]> [0.5]
  %y = Gemm(%x, %w, %c) : f32[4,4]
  return %y
})";
  r = run_both(gemm_column, 601);
  EXPECT_EQ(primitives(r.cp, CpuStepKind::kMatMul), 0u) << "C [M,1] adds per row, not per column";
  expect_close(r, gemm_column);

  const char* subgraph = R"(graph main(%x: f32[1,4,6,6], %c: bool[]) {
  %w = const dense<f32[4,4,3,3]> [0.5]
  %a = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,4,6,6]
  %y = If(%c) {else_branch = graph else_g() {
    %n = Neg(%a) : f32[1,4,6,6]
    return %n
  }, then_branch = graph then_g() {
    return %a
  }} : f32[1,4,6,6]
  %b = Conv(%a, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,4,6,6]
  return %y, %b
})";
  r = run_both(subgraph, 602);
  int first_conv = 0;
  for (const CpuStep& s : r.cp.steps) {
    if (s.kind == CpuStepKind::kConv && s.index == 0) {
      ++first_conv;
      EXPECT_EQ(s.out_layout, CpuLayout::kPlain) << "the If's branch reads %a";
    }
  }
  EXPECT_EQ(first_conv, 1) << "%a's Conv runs as a oneDNN step";
  expect_close(r, subgraph);
}

TEST(FastCpu, PlanSectionRoundTripsAndDamageIsNamed) {
  const char* text = R"(graph main(%x: f32[1,4,6,6]) {
  %w = const dense<f32[4,4,3,3]> [0.5]
  %c = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,4,6,6]
  %r = Relu(%c) : f32[1,4,6,6]
  %s = ReduceSum(%r) {keepdims = 0} : f32[]
  return %s
})";
  auto plan = plan_host(parse(text));
  ASSERT_TRUE(plan) << plan.status().message();
  auto cp = plan_fast_cpu(*plan);
  ASSERT_TRUE(cp) << cp.status().message();
  ASSERT_EQ(cp->steps.size(), 2u);
  const std::string bytes = write_cpu_plan(*cp);
  auto back = read_cpu_plan(bytes, *plan, "m.kiln");
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(write_cpu_plan(*back), bytes);
  auto err = [&](std::string b) {
    auto r = read_cpu_plan(b, *plan, "m.kiln");
    return r ? std::string() : r.status().message();
  };
  EXPECT_NE(err(bytes.substr(0, bytes.size() - 3)).find("m.kiln: CPUF section"), std::string::npos);
  EXPECT_NE(err(bytes + "x").find("bytes after the last step"), std::string::npos);
  std::string kind = bytes;
  kind[4] = char(99);  // the first step's kind
  EXPECT_NE(err(kind).find("a step kind is out of range"), std::string::npos);
  std::string node = bytes;
  node[5] = char(1);  // the conv step now claims the Relu node
  EXPECT_NE(err(node).find("step 0 (conv) is not the plan of this graph"), std::string::npos);
  // Any other change that still parses (here the last byte: the host step's released slot) is
  // caught the same way, before a runner could bind a wrong operand.
  std::string freed = bytes;
  freed.back() = char(freed.back() + 1);
  EXPECT_NE(err(freed).find("step 1 (host) is not the plan of this graph"), std::string::npos);
  CpuPlan fewer = *cp;
  fewer.steps.pop_back();
  EXPECT_NE(err(write_cpu_plan(fewer)).find("1 steps where this graph's plan has 2"), std::string::npos);
}

}  // namespace
}  // namespace kiln
