// Post-training quantization pieces (src/quant): the observer's ranges, per-channel weight
// quantization, calibration sample loading and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "backends/backend.h"
#include "ir/text.h"
#include "ops/infer.h"
#include "quant/calibration.h"
#include "quant/fast_runner.h"
#include "quant/qdq_writer.h"
#include "support/npy.h"

namespace kiln::quant {
namespace {

namespace fs = std::filesystem;

Tensor floats(const std::vector<float>& v, std::vector<int64_t> dims) { return Tensor::from_vector(v, std::move(dims)); }

TEST(Observer, MinMaxIsTheLargestMagnitudeOverEverySample) {
  Observer o;
  o.add(floats({0.5f, -3.0f, 1.0f}, {3}));
  o.add(floats({2.0f, -0.25f}, {2}));
  EXPECT_DOUBLE_EQ(o.range(CalibMethod::kMinMax, 99.99, QuantType::kInt8), 3.0);
  EXPECT_EQ(o.count(), 5);
}

TEST(Observer, HistogramGrowsWithoutLosingCounts) {
  // 1000 values in [0, 1), then one at 100: the range doubles seven times, merging bins, and the
  // 99th percentile still lands near 0.99 (within one merged bin: 128/2048).
  Observer o;
  std::vector<float> v;
  for (int i = 0; i < 1000; ++i) v.push_back(float(i) / 1000.0f);
  o.add(floats(v, {1000}));
  o.add(floats({100.0f}, {1}));
  EXPECT_DOUBLE_EQ(o.amax(), 100.0);
  double p99 = o.range(CalibMethod::kPercentile, 99.0, QuantType::kInt8);
  EXPECT_GT(p99, 0.9);
  EXPECT_LT(p99, 0.99 + 128.0 / Observer::kBins + 1e-9);
  EXPECT_DOUBLE_EQ(o.range(CalibMethod::kPercentile, 100.0, QuantType::kInt8), 100.0);
}

TEST(Observer, EntropyClipsRareOutliersButNotTheBulk) {
  // A ReLU-like activation: half exact zeros, the rest |N(0, 1)|, plus 5 outliers at 50. Entropy
  // calibration keeps the bulk (threshold above 2.5 sigma) and clips the outliers (below 50); the
  // zeros must not drag it down (the reason bin 0 is discounted).
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(200000, 0.0f);
  for (size_t i = 0; i < v.size() / 2; ++i) v[i] = std::fabs(n(rng));
  for (int i = 0; i < 5; ++i) v[size_t(i)] = 50.0f;
  Observer o;
  o.add(floats(v, {int64_t(v.size())}));
  double t = o.range(CalibMethod::kEntropy, 99.99, QuantType::kInt8);
  EXPECT_GT(t, 2.5);
  EXPECT_LT(t, 25.0);
  // FP8 has no entropy calibration: the largest value is the range.
  EXPECT_DOUBLE_EQ(o.range(CalibMethod::kEntropy, 99.99, QuantType::kFp8E4M3), 50.0);
}

TEST(QuantizeWeight, PerOutputChannelInt8) {
  // [2, 3] along axis 1: channel scales max|column| / 127; values round half to even.
  Tensor w = floats({1.0f, -2.0f, 0.0f, -0.5f, 4.0f, 0.0f}, {2, 3});
  QuantizedWeight q = quantize_weight(w, 1, QuantType::kInt8);
  ASSERT_EQ(q.scales.size(), 3u);
  EXPECT_FLOAT_EQ(q.scales[0], 1.0f / 127);
  EXPECT_FLOAT_EQ(q.scales[1], 4.0f / 127);
  EXPECT_FLOAT_EQ(q.scales[2], 1.0f);  // an all-zero channel
  EXPECT_EQ(int8_t(q.bytes[0]), 127);
  EXPECT_EQ(int8_t(q.bytes[3]), -64);   // -0.5 / (1/127) = -63.5 -> -64 (half to even)
  EXPECT_EQ(int8_t(q.bytes[1]), -64);   // -2 / (4/127) = -63.5 -> -64
  EXPECT_EQ(int8_t(q.bytes[4]), 127);
  EXPECT_EQ(int8_t(q.bytes[2]), 0);
}

TEST(QuantizeWeight, Fp8ScalesToTheLargestFiniteValue) {
  Tensor w = floats({448.0f, -1.0f}, {2, 1});  // axis 0: one channel per row
  QuantizedWeight q = quantize_weight(w, 0, QuantType::kFp8E4M3);
  EXPECT_FLOAT_EQ(q.scales[0], 1.0f);
  EXPECT_FLOAT_EQ(q.scales[1], 1.0f / 448);
  EXPECT_EQ(uint8_t(q.bytes[0]), 0x7E);  // 448: E4M3FN's largest finite value
  EXPECT_EQ(uint8_t(q.bytes[1]), 0xFE);  // -448
}

class Samples : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_quant_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    x_ = g_.add_input("x:0", Type::tensor(DType::kFloat32, Shape({Dim::symbol("N"), Dim(2)})));
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& f) { return (dir_ / f).string(); }
  fs::path dir_;
  Graph g_;
  Value* x_ = nullptr;
};

TEST_F(Samples, StackedFileSplitsOnTheNewLeadingAxis) {
  ASSERT_TRUE(write_npy(path("x_0.npy"), floats({1, 2, 3, 4, 5, 6}, {3, 1, 2})));  // "x:0" -> x_0.npy
  auto s = load_samples(g_, dir_.string());
  ASSERT_TRUE(s) << s.status().message();
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ((*s)[2].inputs[0].dims(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ((*s)[2].inputs[0].data<float>()[1], 6.0f);
  auto two = load_samples(g_, dir_.string(), 2);
  ASSERT_TRUE(two);
  EXPECT_EQ(two->size(), 2u);
}

TEST_F(Samples, FolderPerSample) {
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  ASSERT_TRUE(write_npy(path("a/x_0.npy"), floats({1, 2}, {1, 2})));
  ASSERT_TRUE(write_npy(path("b/x_0.npy"), floats({3, 4, 5, 6}, {2, 2})));  // N is symbolic: any batch
  auto s = load_samples(g_, dir_.string());
  ASSERT_TRUE(s) << s.status().message();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[1].inputs[0].dim(0), 2);
}

TEST_F(Samples, ErrorsNameTheFile) {
  auto empty = load_samples(g_, dir_.string());
  ASSERT_FALSE(empty);
  EXPECT_NE(empty.status().message().find("no samples"), std::string::npos) << empty.status().message();
  ASSERT_TRUE(write_npy(path("one.npy"), floats({1, 2, 3}, {1, 3})));  // wrong fixed dim
  auto shape = load_samples(g_, dir_.string());
  ASSERT_FALSE(shape);
  EXPECT_NE(shape.status().message().find("one.npy"), std::string::npos) << shape.status().message();
  EXPECT_NE(shape.status().message().find("expects shape"), std::string::npos);
  ASSERT_TRUE(write_npy(path("one.npy"), Tensor::from_vector<int32_t>({1, 2}, {1, 2})));
  auto dtype = load_samples(g_, dir_.string());
  ASSERT_FALSE(dtype);
  EXPECT_NE(dtype.status().message().find("expects f32"), std::string::npos) << dtype.status().message();
  ASSERT_TRUE(write_npy(path("one.npy"), floats({1, NAN}, {1, 2})));
  auto nan = load_samples(g_, dir_.string());
  ASSERT_FALSE(nan);
  EXPECT_NE(nan.status().message().find("not finite"), std::string::npos) << nan.status().message();
}

TEST_F(Samples, ConstantDataIsRefused) {
  ASSERT_TRUE(write_npy(path("a.npy"), floats({0, 0}, {1, 2})));
  ASSERT_TRUE(write_npy(path("b.npy"), floats({0, 0}, {1, 2})));
  auto s = load_samples(g_, dir_.string());
  ASSERT_TRUE(s) << s.status().message();
  Status st = check_not_constant(g_, *s, dir_.string());
  ASSERT_FALSE(st);
  EXPECT_NE(st.message().find("constant"), std::string::npos) << st.message();
  ASSERT_TRUE(write_npy(path("b.npy"), floats({0, 1}, {1, 2})));
  auto varied = load_samples(g_, dir_.string());
  ASSERT_TRUE(varied);
  EXPECT_TRUE(check_not_constant(g_, *varied, dir_.string()));
}


// Calibration observes intermediate activations as extra graph outputs of the fast CPU backend's
// run: the passes must keep each one (here the Add's output, which a MatMul + Add + Relu fusion
// would otherwise take into one step) and the outputs' order, with the reference's values.
TEST(FastCalibrationRun, ObservedActivationsSurviveFusionInOrder) {
  auto g = parse_graph(
      "graph g(%x: f32[4,16], %w: f32[16,8], %b: f32[8]) {\n %m = MatMul(%x, %w) : f32[4,8]\n"
      " %a = Add(%m, %b) : f32[4,8]\n %y = Relu(%a) : f32[4,8]\n return %y, %a\n}");
  ASSERT_TRUE(g) << g.status().message();
  std::mt19937 rng(7);
  std::normal_distribution<float> n01;
  std::vector<Value*> keep;
  for (Value* v : (*g)->inputs) {
    if (v->name == "x") {
      keep.push_back(v);
      continue;
    }
    Tensor t = Tensor::create(DType::kFloat32, *v->type.shape->static_dims()).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = n01(rng);
    v->constant = std::move(t);
  }
  (*g)->inputs = keep;
  ASSERT_TRUE(infer_types(**g));
  Tensor x = Tensor::create(DType::kFloat32, {4, 16}).value();
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = n01(rng);
  auto fast = compile_fast_cpu(**g);
  ASSERT_TRUE(fast) << fast.status().message();
  auto ref = make_cpu_backend()->compile(**g);
  ASSERT_TRUE(ref) << ref.status().message();
  auto got = (*fast)->run({Data(x)});
  auto want = (*ref)->run({Data(x)});
  ASSERT_TRUE(got && want);
  ASSERT_EQ(got->size(), 2u);
  bool negative = false;  // the Add's output, not the Relu's: some values below zero
  for (size_t o = 0; o < 2; ++o) {
    const Tensor& a = (*got)[o].tensor;
    const Tensor& b = (*want)[o].tensor;
    ASSERT_EQ(a.dims(), b.dims());
    for (int64_t i = 0; i < a.numel(); ++i) {
      EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-4f) << "output " << o << " element " << i;
      negative = negative || (o == 1 && a.data<float>()[i] < 0);
    }
  }
  EXPECT_TRUE(negative);
}

}  // namespace
}  // namespace kiln::quant
