// Generated elementwise kernels (backends/cuda/codegen_elementwise.h): the source for a body is
// produced and compiled by NVRTC here, without a GPU (the op harness runs them on one and checks
// their results against the CPU reference).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "backends/cuda/codegen_elementwise.h"
#include "backends/cuda/nvrtc.h"
#include "ir/text.h"

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Graph> body_of(const std::string& text) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message();
  return g ? std::move(*g) : nullptr;
}

class Codegen : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln-codegen-test-" + std::to_string(getpid()));
    opt_.cache_dir = dir_.string();
    std::string why;
    ASSERT_TRUE(nvrtc_available(&why)) << why;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void expect_compiles(const std::string& src) {
    auto k = compile_cached(src, opt_);
    ASSERT_TRUE(k) << k.status().message() << "\n" << src;
    EXPECT_GT(k->cubin.size(), 100u);
  }
  fs::path dir_;
  NvrtcOptions opt_;
};

TEST_F(Codegen, BertMaskChainReadsInt64WritesHalf) {
  auto body = body_of(R"(graph b(%mask: i64[2,1,1,8]) {
    %one = const dense<f32[]> [1]
    %big = const dense<f32[]> [-3.4028235e38]
    %m = Cast(%mask) {to = 1} : f32[2,1,1,8]
    %s = Sub(%one, %m) : f32[2,1,1,8]
    %y = Mul(%s, %big) : f32[2,1,1,8]
    return %y
  })");
  ASSERT_TRUE(body);
  EwKernelSpec spec{"kiln_ew", {2, 1, 1, 8}, {{k::DT::kI64, {8, 8, 8, 1}}}, k::DT::kF16};
  auto src = generate_elementwise(*body, spec);
  ASSERT_TRUE(src) << src.status().message();
  EXPECT_NE(src->find("const long long v0 = in0[i];"), std::string::npos) << *src;  // contiguous: no index math
  EXPECT_NE(src->find("0xff7fffff"), std::string::npos) << *src;  // the constant, bit-exact
  EXPECT_NE(src->find("out[i] = kf2h("), std::string::npos) << *src;
  expect_compiles(*src);
}

TEST_F(Codegen, BroadcastOperandsIndexThroughCoordinates) {
  auto body = body_of(R"(graph b(%x: f32[4,8], %w: f32[8], %n: i64[4,1]) {
    %zero = const dense<i64[]> [0]
    %c = Greater(%n, %zero) : bool[4,1]
    %t = Mul(%x, %w) : f32[4,8]
    %y = Where(%c, %t, %x) : f32[4,8]
    return %y
  })");
  ASSERT_TRUE(body);
  EwKernelSpec spec{"kiln_ew", {4, 8}, {{k::DT::kBF16, {8, 1}}, {k::DT::kBF16, {0, 1}}, {k::DT::kI64, {1, 0}}}, k::DT::kBF16};
  auto src = generate_elementwise(*body, spec);
  ASSERT_TRUE(src) << src.status().message();
  EXPECT_NE(src->find("const unsigned c1 = rem % 8u"), std::string::npos) << *src;  // 32-bit index math
  EXPECT_NE(src->find("in1[c1 * 1LL]"), std::string::npos) << *src;  // w: broadcast over rows
  EXPECT_NE(src->find("in2[c0 * 1LL]"), std::string::npos) << *src;  // n: broadcast over columns
  expect_compiles(*src);
}

// The packed variant: BERT's embedding sum (a contiguous operand and one broadcast over the batch)
// over packs of 8 halves, and an operand broadcast along the last dim read once per pack.
TEST_F(Codegen, PackedVariantReadsContiguousOperandsAsVectors) {
  auto body = body_of(R"(graph b(%x: f16[2,4,16], %p: f16[4,16], %s: f16[2,4,1]) {
    %a = Add(%x, %p) : f16[2,4,16]
    %y = Mul(%a, %s) : f16[2,4,16]
    return %y
  })");
  ASSERT_TRUE(body);
  EwKernelSpec spec{"kiln_ew", {2, 4, 16}, {{k::DT::kF16, {64, 16, 1}}, {k::DT::kF16, {0, 16, 1}}, {k::DT::kF16, {4, 1, 0}}},
                    k::DT::kF16};
  EXPECT_EQ(ew_vector_width(spec), 8);
  auto src = generate_elementwise(*body, spec);
  ASSERT_TRUE(src) << src.status().message();
  EXPECT_NE(src->find("kiln_ew_v("), std::string::npos) << *src;
  EXPECT_NE(src->find("const P0 p0 = *reinterpret_cast<const P0*>(in0 + i);"), std::string::npos) << *src;
  EXPECT_NE(src->find("const P1 p1 = *reinterpret_cast<const P1*>(in1 + c1 * 16LL + c2 * 1LL);"), std::string::npos) << *src;
  EXPECT_NE(src->find("const unsigned short s2 = in2[c0 * 4LL + c1 * 1LL];"), std::string::npos) << *src;
  EXPECT_NE(src->find("struct __align__(16) PO { unsigned short v[8]; };"), std::string::npos) << *src;
  expect_compiles(*src);

  // Not packed: a last dim that 8 does not divide, or an operand strided along it.
  EwKernelSpec ragged{"kiln_ew", {2, 4, 12}, {{k::DT::kF16, {48, 12, 1}}, {k::DT::kF16, {0, 12, 1}}, {k::DT::kF16, {4, 1, 0}}},
                      k::DT::kF16};
  EXPECT_EQ(ew_vector_width(ragged), 1);
  auto scalar = generate_elementwise(*body_of(R"(graph b(%x: f16[2,4,12], %p: f16[4,12], %s: f16[2,4,1]) {
    %a = Add(%x, %p) : f16[2,4,12]
    %y = Mul(%a, %s) : f16[2,4,12]
    return %y
  })"), ragged);
  ASSERT_TRUE(scalar) << scalar.status().message();
  EXPECT_EQ(scalar->find("kiln_ew_v("), std::string::npos) << *scalar;
  EwKernelSpec strided = spec;
  strided.inputs[0].strides = {64, 1, 4};  // a transposed operand
  EXPECT_EQ(ew_vector_width(strided), 1);
  EwKernelSpec f32out = spec;
  f32out.out_dt = k::DT::kF32;
  EXPECT_EQ(ew_vector_width(f32out), 4);
}

// runtime_dims (a dynamic engine's shape plans): BERT's embedding sum at two batch x sequence shapes
// gives one source, which compiles, with the dims and strides in the shape argument instead.
TEST_F(Codegen, RuntimeDimsShareOneSourceAcrossShapes) {
  auto body = body_of(R"(graph b(%x: f16[N,S,16], %p: f16[S,16]) {
    %y = Add(%x, %p) : f16[N,S,16]
    return %y
  })");
  ASSERT_TRUE(body);
  auto spec_at = [](int64_t n, int64_t s) {
    EwKernelSpec spec{"kiln_ew", {n, s, 16}, {{k::DT::kF16, {s * 16, 16, 1}}, {k::DT::kF16, {0, 16, 1}}}, k::DT::kF16};
    spec.runtime_dims = true;
    return spec;
  };
  auto a = generate_elementwise(*body, spec_at(2, 5)), b = generate_elementwise(*body, spec_at(7, 33));
  ASSERT_TRUE(a) << a.status().message();
  ASSERT_TRUE(b) << b.status().message();
  EXPECT_EQ(*a, *b) << "the shape is in the source";
  EXPECT_NE(a->find("struct kiln_shape { unsigned n; unsigned d[3]; unsigned st[2][3]; };"), std::string::npos) << *a;
  EXPECT_NE(a->find("i < s.n;"), std::string::npos) << *a;
  EXPECT_NE(a->find("rem % s.d[2]"), std::string::npos) << *a;
  EXPECT_NE(a->find("in1 + c0 * s.st[1][0] + c1 * s.st[1][1] + c2 * s.st[1][2]"), std::string::npos) << *a;  // packed load of p
  EXPECT_NE(a->find("p < s.n / 8u;"), std::string::npos) << *a;
  expect_compiles(*a);
  // Baked, the two shapes differ.
  EwKernelSpec baked = spec_at(2, 5);
  baked.runtime_dims = false;
  EXPECT_TRUE(ew_shape_arg(baked).empty());
  auto c = generate_elementwise(*body, baked);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->find("kiln_shape"), std::string::npos);
  // The argument: count, dims, then each input's strides, as 32-bit words.
  const std::string arg = ew_shape_arg(spec_at(7, 33));
  std::vector<uint32_t> words(arg.size() / 4);
  std::memcpy(words.data(), arg.data(), arg.size());
  EXPECT_EQ(words, (std::vector<uint32_t>{7 * 33 * 16, 7, 33, 16, 33 * 16, 16, 1, 0, 16, 1}));
}

TEST_F(Codegen, EveryGeneratedOpCompiles) {
  auto body = body_of(R"(graph b(%x: f32[16], %z: f32[16]) {
    %lo = const dense<f32[]> [-2]
    %a = Sigmoid(%x) : f32[16]
    %b = Tanh(%a) : f32[16]
    %c = Gelu(%b) : f32[16]
    %d = Gelu(%c) {approximate = "tanh"} : f32[16]
    %e = LeakyRelu(%d) {alpha = 0.1} : f32[16]
    %f = HardSwish(%e) : f32[16]
    %g = HardSigmoid(%f) {alpha = 0.3, beta = 0.4} : f32[16]
    %h = Clip(%g, %lo, _) : f32[16]
    %i = Max(%h, %z) : f32[16]
    %j = Min(%i, %x) : f32[16]
    %k = Pow(%j, %z) : f32[16]
    %l = Softplus(%k) : f32[16]
    %m = Erf(%l) : f32[16]
    %n = Elu(%m) : f32[16]
    %o = Abs(%n) : f32[16]
    %p = Sqrt(%o) : f32[16]
    %q = Log(%p) : f32[16]
    %r = Exp(%q) : f32[16]
    %s = Reciprocal(%r) : f32[16]
    %t = Floor(%s) : f32[16]
    %u = Ceil(%t) : f32[16]
    %v = Sin(%u) : f32[16]
    %w = Cos(%v) : f32[16]
    %ww = Relu(%w) : f32[16]
    %sg = Sign(%ww) : f32[16]
    %h16 = Cast(%sg) {to = 10} : f16[16]
    %back = Cast(%h16) {to = 1} : f32[16]
    %i64 = Cast(%back) {to = 7} : i64[16]
    %i64n = Neg(%i64) : i64[16]
    %eq = Equal(%i64n, %i64) : bool[16]
    %le = LessOrEqual(%x, %z) : bool[16]
    %an = And(%eq, %le) : bool[16]
    %no = Not(%an) : bool[16]
    %xo = Xor(%no, %eq) : bool[16]
    %y = Where(%xo, %x, %back) : f32[16]
    return %y
  })");
  ASSERT_TRUE(body);
  EwKernelSpec spec{"kiln_ew", {16}, {{k::DT::kF32, {1}}, {k::DT::kF16, {1}}}, k::DT::kF32};
  auto src = generate_elementwise(*body, spec);
  ASSERT_TRUE(src) << src.status().message();
  expect_compiles(*src);
}

// What the CPU reference does at the edges: integer +, -, * and Neg wrap (no signed-overflow
// folding), INT64_MIN is a signed literal, float -> int32 goes through int64, Sign keeps NaN, and
// a float16 value rounds where the unfused graph would store it.
TEST_F(Codegen, EdgeSemanticsOfTheReferenceAreSpelledOut) {
  auto body = body_of(R"(graph b(%i: i64[4], %j: i32[4], %h: f16[4], %f: f32[4]) {
    %lo = const dense<i64[]> [-9223372036854775808]
    %one = const dense<i32[]> [1]
    %a = Add(%i, %lo) : i64[4]
    %n = Neg(%a) : i64[4]
    %ja = Add(%j, %one) : i32[4]
    %gt = Greater(%ja, %j) : bool[4]
    %hs = Add(%h, %h) : f16[4]
    %heq = Equal(%hs, %h) : bool[4]
    %sg = Sign(%f) : f32[4]
    %ci = Cast(%sg) {to = 6} : i32[4]
    %both = And(%gt, %heq) : bool[4]
    %z = Cast(%n) {to = 6} : i32[4]
    %s = Add(%z, %ci) : i32[4]
    %y = Where(%both, %s, %j) : i32[4]
    return %y
  })");
  ASSERT_TRUE(body);
  EwKernelSpec spec{"kiln_ew", {4}, {{k::DT::kI64, {1}}, {k::DT::kI32, {1}}, {k::DT::kF16, {1}}, {k::DT::kF32, {1}}},
                    k::DT::kI32};
  auto src = generate_elementwise(*body, spec);
  ASSERT_TRUE(src) << src.status().message();
  EXPECT_NE(src->find("(-9223372036854775807LL - 1)"), std::string::npos) << *src;
  EXPECT_NE(src->find("(unsigned long long)(v0) + (unsigned long long)((-9223372036854775807LL - 1))"), std::string::npos) << *src;
  EXPECT_NE(src->find("(unsigned)(v1) + (unsigned)((1))"), std::string::npos) << *src;
  EXPECT_NE(src->find("kh2f(kf2h((v2 + v2)))"), std::string::npos) << *src;  // the f16 sum rounds
  EXPECT_NE(src->find("v3 < 0.0f ? -1.0f : v3"), std::string::npos) << *src;  // Sign(NaN) = NaN
  EXPECT_NE(src->find("(int)(long long)"), std::string::npos) << *src;
  expect_compiles(*src);
}

TEST(CodegenErrors, AnOpItDoesNotGenerateIsNamed) {
  auto body = body_of(R"(graph b(%x: f32[4], %z: f32[4]) {
    %a = Mod(%x, %z) {fmod = 1} : f32[4]
    %y = Neg(%a) : f32[4]
    return %y
  })");
  ASSERT_TRUE(body);
  EwKernelSpec spec{"kiln_ew", {4}, {{k::DT::kF32, {1}}, {k::DT::kF32, {1}}}, k::DT::kF32};
  auto src = generate_elementwise(*body, spec);
  ASSERT_FALSE(src);
  EXPECT_NE(src.status().message().find("Mod"), std::string::npos) << src.status().message();
}

TEST(CodegenErrors, AnUnsupportedStorageDtypeIsAnError) {
  auto body = body_of(R"(graph b(%x: f64[4]) {
    %y = Neg(%x) : f64[4]
    return %y
  })");
  ASSERT_TRUE(body);
  EwKernelSpec spec{"kiln_ew", {4}, {{k::DT::kF64, {1}}}, k::DT::kF64};
  EXPECT_FALSE(generate_elementwise(*body, spec));
}

}  // namespace
}  // namespace kiln::cuda
