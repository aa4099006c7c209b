// The fast CPU backend (src/backends/cpu/fast_plan.h, fast_session.h) against the reference
// kernels: every op it claims, at random shapes and geometries with random weights, runs as a
// oneDNN primitive (the plan is checked, so a case that silently stays on the reference kernels
// fails) and matches the reference within fp32 tolerance; epilogues fuse where they may and not
// where they may not; the CPU plan survives its engine-file section and damage to it is named.
// The steps beyond convolutions, products, pooling, binaries, concat and batch norm are tested in
// fast_cpu_steps_test.cc; the shared helpers are fast_cpu_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "fast_cpu_test_util.h"

namespace kiln {
namespace {

using namespace fast_cpu_test;

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
  std::optional<Planned> pl = plan_both(text, 31, 8);
  ASSERT_TRUE(pl);
  const std::vector<std::vector<Data>>& inputs = pl->inputs;
  ASSERT_EQ(primitives(*pl->cp, CpuStepKind::kConv), 1u);
  std::unique_ptr<CpuRunner> runner;
  std::thread([&] {  // made on a thread that then exits
    auto r = CpuRunner::create(pl->plan, pl->cp);
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

// A query row whose every key the mask sets to -inf (Log(Relu(x)) is -inf where x <= 0; with two
// keys a quarter of the rows) gives zeros, as the spec and the reference kernels have it, where
// oneDNN's softmax leaves 0 / 0 = NaN.
TEST(FastCpu, AttentionRowsWithEveryKeyMaskedAreZeros) {
  if (!have_onednn()) return;
  // Masks of every broadcast over [B, H, Sq] (the host pass walks the mask's own rows).
  for (const char* m : {"f32[4,1,5,2]", "f32[4,3,5,2]", "f32[1,3,5,2]", "f32[5,2]", "f32[4,1,1,2]"}) {
    const std::string text = fmt::format(R"(graph main(%q: f32[4,3,5,8], %k: f32[4,3,2,8], %v: f32[4,3,2,8], %x: {0}) {{
  %r = Relu(%x) : {0}
  %m = Log(%r) : {0}
  %y = Attention(%q, %k, %v, %m) : f32[4,3,5,8]
  return %y
}})",
                                         m);
    Result r = run_both(text, 500);
    ASSERT_EQ(primitives(r.cp, CpuStepKind::kAttention), 1u) << text;
    ASSERT_FALSE(r.ref.empty()) << text;
    int64_t zero_rows = 0;  // the case is what it claims: some rows fully masked
    const Tensor& ref = r.ref[0].tensor;
    for (int64_t row = 0; row < ref.numel() / 8; ++row) {
      bool zero = true;
      for (int64_t e = 0; e < 8; ++e) zero = zero && ref.data<float>()[row * 8 + e] == 0.f;
      zero_rows += zero;
    }
    EXPECT_GT(zero_rows, 0) << text;
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

// The steps' intermediate results share one arena: %a's bytes are free once the host Reshape has
// read it, and %b (the same size, written later) is placed on them. The Reshape's result is a view
// of %a, read by the Add after %b was written: it must have been copied out of the arena (else the
// Add sees %b twice). A second run on other inputs leaves the first run's outputs, still held, as
// they were.
TEST(FastCpu, IntermediatesShareAnArenaAndViewsOfItSurvive) {
  if (!have_onednn()) return;
  const char* text = R"(graph main(%x: f32[1,4,6,6]) {
  %w = const dense<f32[4,4,3,3]> [0.5]
  %w2 = const dense<f32[4,4,3,3]> [0.25]
  %s = const dense<i64[2]> [1, 144]
  %a = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,4,6,6]
  %r = Reshape(%a, %s) : f32[1,144]
  %b = Conv(%x, %w2) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[1,4,6,6]
  %f = Reshape(%b, %s) : f32[1,144]
  %y = Add(%r, %f) : f32[1,144]
  return %y
})";
  std::optional<Planned> pl = plan_both(text, 700, 2);
  ASSERT_TRUE(pl);
  ASSERT_EQ(primitives(*pl->cp, CpuStepKind::kConv), 2u);
  auto runner = CpuRunner::create(pl->plan, pl->cp);
  ASSERT_TRUE(runner) << runner.status().message();
  // %a and %b (row-major: a host step reads each) share their 576 bytes.
  EXPECT_EQ((*runner)->arena_bytes(), 576u);
  Result first, second;
  for (int k = 0; k < 2; ++k) {
    Result* r = k == 0 ? &first : &second;
    const std::vector<Data>& in = pl->inputs[size_t(k)];
    auto fast = (*runner)->run(in);
    ASSERT_TRUE(fast) << fast.status().message();
    auto ref = run_plan(*pl->plan, in);
    ASSERT_TRUE(ref) << ref.status().message();
    r->fast = std::move(*fast);
    r->ref = std::move(*ref);
  }
  expect_close(first, "first run, checked after the second");
  expect_close(second, "second run");
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
