// The fast CPU backend's steps beyond convolutions, products, pooling, binaries, concat and batch
// norm (fast_cpu_test.cc has those), each against the reference kernels at random shapes with the
// plan checked: STFT, lone and fused elementwise ops, LSTM and GRU, group and instance norm,
// Resize, kiln's fused and RMS-norm loops, Softmax and Slice; what stays on the host (empty
// tensors, Resize forms oneDNN maps differently); a foreign CPU plan made again at load.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "fast_cpu_test_util.h"

namespace kiln {
namespace {

using namespace fast_cpu_test;

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
})",
      // QDQ models' fake-quantized activations: uint8 with its zero point mid-range, then int8 with a
      // scale small enough that most inputs saturate.
      R"(graph main(%x: f32[4,300]) {
  %y = ai.kiln.FusedElementwise(%x) {body = graph b(%a: f32[4,300]) {
    %s = const dense<f32[]> [0.05]
    %z = const dense<u8[]> [128]
    %q = QuantizeLinear(%a, %s, %z) : u8[4,300]
    %d = DequantizeLinear(%q, %s, %z) : f32[4,300]
    %t = const dense<f32[]> [0.01]
    %w = const dense<i8[]> [-3]
    %r = QuantizeLinear(%d, %t, %w) : i8[4,300]
    %o = DequantizeLinear(%r, %t, %w) : f32[4,300]
    return %o
  }} : f32[4,300]
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

// The fused loop's Relu and Q/DQ pair on values the random cases never draw: exact halves of a step
// (rounded to even), NaN (Relu keeps it; QuantizeLinear stores 0, so it dequantizes to -zp * scale),
// saturation at both ends, and a QuantizeLinear without a zero point (uint8, zero point 0).
// The fused loop's output on x for a one-input FusedElementwise; empty (the failure reported) when
// the text does not parse or the loop does not take the body.
std::vector<float> fused_loop(const char* text, const std::vector<float>& x) {
  auto g = parse(text);
  if (!g) {
    ADD_FAILURE() << "does not parse: " << text;
    return {};
  }
  auto k = FusedKernel::compile(*g->nodes[0]);
  if (!k) {
    ADD_FAILURE() << k.status().message();
    return {};
  }
  std::vector<float> y(x.size());
  k->run({x.data()}, y.data());
  return y;
}

TEST(FastCpu, FusedQuantizationRoundsHalvesToEvenAndKeepsNaNRules) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // x / 0.5: 0.5 -> 0 (even), 1.5 -> 2, -0.5 -> -0, -1.5 -> -2, 1000 -> 127 - 3 saturated, -1000 -> -128 - 3.
  const std::vector<float> x = {0.25f, 0.75f, -0.25f, -0.75f, 1000.f, -1000.f, nan, 1.f};
  const std::vector<float> y = fused_loop(R"(graph main(%x: f32[8]) {
  %y = ai.kiln.FusedElementwise(%x) {body = graph b(%a: f32[8]) {
    %s = const dense<f32[]> [0.5]
    %z = const dense<i8[]> [3]
    %q = QuantizeLinear(%a, %s, %z) : i8[8]
    %d = DequantizeLinear(%q, %s, %z) : f32[8]
    return %d
  }} : f32[8]
  return %y
})", x);
  const std::vector<float> want = {0.f, 1.f, 0.f, -1.f, 62.f, -65.5f, -1.5f, 1.f};
  ASSERT_EQ(y.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y[i], want[i]) << "x = " << x[i];

  const std::vector<float> yr = fused_loop(R"(graph main(%x: f32[3]) {
  %y = ai.kiln.FusedElementwise(%x) {body = graph b(%a: f32[3]) {
    %r = Relu(%a) : f32[3]
    %s = const dense<f32[]> [0.25]
    %q = QuantizeLinear(%r, %s) : u8[3]
    %d = DequantizeLinear(%q, %s) : f32[3]
    %e = Relu(%a) : f32[3]
    %o = Add(%d, %e) : f32[3]
    return %o
  }} : f32[3]
  return %y
})", {nan, -2.f, 100.f});
  ASSERT_EQ(yr.size(), 3u);
  EXPECT_TRUE(std::isnan(yr[0]));  // Relu(NaN) = NaN; its quantized copy is 0, and NaN + 0 is NaN
  EXPECT_EQ(yr[1], 0.f);
  EXPECT_EQ(yr[2], 63.75f + 100.f);  // 100 / 0.25 = 400 saturates at 255
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

}  // namespace
}  // namespace kiln
