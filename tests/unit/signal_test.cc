// Signal ops on the reference kernels against a direct DFT: an STFT of a [batch, length] signal
// (what torch.onnx writes for torch.stft, and onnxruntime accepts) is the STFT of the real signal.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>

#include "ir/text.h"
#include "runtime/plan.h"

namespace kiln {
namespace {

TEST(Signal, StftOfARank2SignalIsTheStftOfTheRealSignal) {
  constexpr int64_t kBatch = 2, kLen = 64, kFrame = 16, kStep = 12, kBins = kFrame / 2 + 1;
  constexpr int64_t kFrames = (kLen - kFrame) / kStep + 1;
  const std::string text =
      "graph g(%x: f32[2,64]) {\n %s = const dense<i64[]> [12]\n %n = const dense<i64[]> [16]\n"
      " %w = HannWindow(%n) : f32[16]\n %y = STFT(%x, %s, %w) : f32[2,5,9,2]\n return %y\n}";
  auto g = parse_graph(text);
  ASSERT_TRUE(g) << g.status().message();
  auto plan = plan_host(std::move(*g));
  ASSERT_TRUE(plan) << plan.status().message();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Tensor x = Tensor::create(DType::kFloat32, {kBatch, kLen}).value();
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = u(rng);
  std::vector<Data> in;
  in.emplace_back(x.clone());
  auto out = run_plan(*plan, in);
  ASSERT_TRUE(out) << out.status().message();
  const Tensor& y = (*out)[0].tensor;
  ASSERT_EQ(y.dims(), (std::vector<int64_t>{kBatch, kFrames, kBins, 2}));
  for (int64_t b = 0; b < kBatch; ++b) {
    for (int64_t f = 0; f < kFrames; ++f) {
      for (int64_t k = 0; k < kBins; ++k) {
        double re = 0, im = 0;
        for (int64_t t = 0; t < kFrame; ++t) {
          const double w = 0.5 - 0.5 * std::cos(2 * std::numbers::pi * double(t) / kFrame);  // periodic Hann
          const double v = w * x.data<float>()[b * kLen + f * kStep + t];
          re += v * std::cos(2 * std::numbers::pi * double(k * t) / kFrame);
          im -= v * std::sin(2 * std::numbers::pi * double(k * t) / kFrame);
        }
        const float* got = y.data<float>() + ((b * kFrames + f) * kBins + k) * 2;
        EXPECT_NEAR(got[0], re, 1e-4) << "batch " << b << " frame " << f << " bin " << k;
        EXPECT_NEAR(got[1], im, 1e-4) << "batch " << b << " frame " << f << " bin " << k;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
