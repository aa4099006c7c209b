// NonMaxSuppression's CPU kernel (src/ops/image.cc) compares a candidate only with kept boxes whose
// x ranges reach its own. It must select exactly what comparing every pair selects: checked here
// against a plain every-pair implementation of the ONNX definition on random boxes, batched the way
// exporters write it (every class in one call, each class's boxes offset far apart), with flipped
// corners, empty boxes, ties, a score threshold, a per-class limit, and a NaN coordinate.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

#include "api/engine_impl.h"
#include "ir/text.h"
#include "ops/infer.h"

namespace kiln {
namespace {

struct Case {
  int64_t batches, classes, boxes;
  std::vector<float> box;    // [batches, boxes, 4] as y1, x1, y2, x2
  std::vector<float> score;  // [batches, classes, boxes]
  int64_t max_out;
  float iou, threshold;
  bool center = false;  // boxes as x_center, y_center, width, height (center_point_box = 1)
};

// The ONNX definition, comparing every candidate with every box kept before it.
std::vector<int64_t> every_pair(const Case& c) {
  std::vector<int64_t> out;
  auto corners = [&](int64_t b, int64_t s) {
    const float* p = &c.box[size_t((b * c.boxes + s) * 4)];
    if (c.center) return std::array<float, 4>{p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
    return std::array<float, 4>{std::min(p[0], p[2]), std::min(p[1], p[3]), std::max(p[0], p[2]), std::max(p[1], p[3])};
  };
  for (int64_t b = 0; b < c.batches; ++b) {
    for (int64_t cl = 0; cl < c.classes; ++cl) {
      const float* sc = &c.score[size_t((b * c.classes + cl) * c.boxes)];
      std::vector<int64_t> cand;
      for (int64_t s = 0; s < c.boxes; ++s) {
        if (sc[s] > c.threshold) cand.push_back(s);
      }
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t i, int64_t j) { return sc[i] > sc[j]; });
      std::vector<int64_t> kept;
      for (int64_t s : cand) {
        if (int64_t(kept.size()) >= c.max_out) break;
        const auto a = corners(b, s);
        bool drop = false;
        for (int64_t k : kept) {
          const auto o = corners(b, k);
          const float ih = std::min(a[2], o[2]) - std::max(a[0], o[0]), iw = std::min(a[3], o[3]) - std::max(a[1], o[1]);
          if (ih <= 0 || iw <= 0) continue;
          const float inter = ih * iw, aa = (a[2] - a[0]) * (a[3] - a[1]), ao = (o[2] - o[0]) * (o[3] - o[1]);
          if (aa <= 0 || ao <= 0 || aa + ao - inter <= 0) continue;
          drop = drop || inter / (aa + ao - inter) > c.iou;
        }
        if (drop) continue;
        kept.push_back(s);
        out.insert(out.end(), {b, cl, s});
      }
    }
  }
  return out;
}

std::vector<int64_t> kiln_nms(const Case& c) {
  auto g = parse_graph(fmt::format(R"(graph main(%boxes: f32[{0},{2},4], %scores: f32[{0},{1},{2}]) {{
  %m = const dense<i64[1]> [{3}]
  %iou = const dense<f32[1]> [{4}]
  %thr = const dense<f32[1]> [{5}]
  %sel = NonMaxSuppression(%boxes, %scores, %m, %iou, %thr) {{center_point_box = {6}}} : i64[?,3]
  return %sel
}})", c.batches, c.classes, c.boxes, c.max_out, c.iou, c.threshold, c.center ? 1 : 0));
  EXPECT_TRUE(g) << g.status().message();
  if (!g) return {};
  EXPECT_TRUE(infer_types(**g));
  auto plan = plan_host(std::move(*g));
  EXPECT_TRUE(plan) << plan.status().message();
  Tensor boxes = *Tensor::create(DType::kFloat32, {c.batches, c.boxes, 4});
  Tensor scores = *Tensor::create(DType::kFloat32, {c.batches, c.classes, c.boxes});
  std::copy(c.box.begin(), c.box.end(), boxes.data<float>());
  std::copy(c.score.begin(), c.score.end(), scores.data<float>());
  auto out = run_plan(*plan, {Data(boxes), Data(scores)});
  EXPECT_TRUE(out) << out.status().message();
  if (!out) return {};
  const Tensor& t = (*out)[0].tensor;
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

// Boxes of `groups` groups, each group's offset by 1000 along x and y (batched NMS), some with
// corners flipped, some empty; scores in steps of 1/64 so that ties occur.
Case random_case(uint32_t seed, int64_t batches, int64_t classes, int64_t boxes, int groups) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  Case c{batches, classes, boxes, {}, {}, 1 << 20, 0.5f, 0.1f};
  for (int64_t i = 0; i < batches * boxes; ++i) {
    const float off = 1000.0f * float(rng() % uint32_t(groups));
    float y = off + 300 * u(rng), x = off + 300 * u(rng), h = 5 + 60 * u(rng), w = 5 + 60 * u(rng);
    if (i % 17 == 0) h = 0;  // empty: never suppresses, is never suppressed
    if (i % 5 == 0) {
      c.box.insert(c.box.end(), {y + h, x + w, y, x});
    } else {
      c.box.insert(c.box.end(), {y, x, y + h, x + w});
    }
  }
  for (int64_t i = 0; i < batches * classes * boxes; ++i) c.score.push_back(float(rng() % 64) / 64.0f);
  return c;
}

TEST(NonMaxSuppression, BatchedClassesMatchEveryPair) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    Case c = random_case(seed, 1, 1, 3000, 40);
    const auto want = every_pair(c);
    EXPECT_GT(want.size(), 300u);  // enough kept for the buckets to matter
    EXPECT_EQ(kiln_nms(c), want) << "seed " << seed;
  }
}

TEST(NonMaxSuppression, SeveralBatchesClassesAndLimits) {
  Case c = random_case(7, 2, 3, 500, 1);
  EXPECT_EQ(kiln_nms(c), every_pair(c));
  c.max_out = 7;
  c.iou = 0.2f;
  c.threshold = 0.5f;
  EXPECT_EQ(kiln_nms(c), every_pair(c));
}

// Center-point boxes, some with negative widths or heights (x0 > x1: they overlap nothing).
TEST(NonMaxSuppression, CenterPointBoxesWithNegativeSizes) {
  Case c = random_case(11, 1, 2, 800, 8);
  c.center = true;
  for (size_t i = 0; i < c.box.size(); i += 4) {
    c.box[i + 2] = (i % 28 == 0 ? -1.0f : 1.0f) * (5 + float(i % 50));
    c.box[i + 3] = (i % 36 == 0 ? -1.0f : 1.0f) * (5 + float(i % 40));
  }
  EXPECT_EQ(kiln_nms(c), every_pair(c));
}

TEST(NonMaxSuppression, NoBoxesAskedFor) {
  Case c = random_case(12, 1, 2, 100, 2);
  c.max_out = 0;
  EXPECT_TRUE(kiln_nms(c).empty());
}

// Coordinates near the float range: the span between them is not finite (one bucket).
TEST(NonMaxSuppression, CoordinatesNearTheFloatRange) {
  Case c = random_case(13, 1, 1, 300, 4);
  for (size_t i = 0; i < 8; ++i) c.box[i] = (i % 2 ? 3e38f : -3e38f);
  EXPECT_EQ(kiln_nms(c), every_pair(c));
}

TEST(NonMaxSuppression, NonFiniteCoordinatesCompareEveryPair) {
  // The reference reads corners and overlaps with the same std::min/std::max calls as the kernel, so
  // a NaN or an infinity decides the same way in both.
  Case c = random_case(9, 1, 1, 200, 3);
  c.box[4 * 10 + 1] = std::nanf("");
  c.box[4 * 20 + 3] = INFINITY;
  EXPECT_EQ(kiln_nms(c), every_pair(c));
}

}  // namespace
}  // namespace kiln
