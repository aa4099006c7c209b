// fold-constants (src/passes/fold_constants.h) on embedding lookups of constant indices: one table
// row repeated over the batch and sequence stays a Gather node (folded, it would be a weight as large
// as the activations, made again for every input shape of a dynamic engine), while a lookup by
// varied indices of the same size (T5's relative position buckets) folds, its values the table's
// rows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ir/text.h"
#include "passes/fold_constants.h"

namespace kiln {
namespace {

std::unique_ptr<Graph> lookup_graph() {
  auto g = parse_graph(R"(graph main(%x: f32[16,128,64]) {
  %t = const dense<f32[2,64]> [0.5]
  %z = const dense<i64[16,128]> [0]
  %e = Gather(%t, %z) {axis = 0} : f32[16,128,64]
  %y = Add(%x, %e) : f32[16,128,64]
  return %y
})");
  EXPECT_TRUE(g) << g.status().message();
  if (!g) return nullptr;
  // Distinct rows: row r of the table holds r + column / 64.
  Value* t = (*g)->lookup("t");
  Tensor table = Tensor::create(DType::kFloat32, {2, 64}).value();
  for (int64_t i = 0; i < table.numel(); ++i) table.data<float>()[i] = float(i / 64) + float(i % 64) / 64.f;
  t->constant = table;
  return std::move(*g);
}

const Node* gather_of(const Graph& g) {
  for (const auto& n : g.nodes) {
    if (n->op == OpKind::kGather) return n.get();
  }
  return nullptr;
}

TEST(FoldConstants, OneRowRepeatedOverBatchAndSequenceStaysAGather) {
  auto g = lookup_graph();
  ASSERT_TRUE(g);
  ASSERT_TRUE(fold_constants(*g)) << "fold-constants failed";
  EXPECT_NE(gather_of(*g), nullptr) << print_graph(*g);
  EXPECT_FALSE(g->lookup("e")->constant.has_value());
}

TEST(FoldConstants, VariedIndicesOfTheSameSizeFold) {
  auto g = lookup_graph();
  ASSERT_TRUE(g);
  Tensor idx = Tensor::create(DType::kInt64, {16, 128}).value();
  for (int64_t i = 0; i < idx.numel(); ++i) idx.data<int64_t>()[i] = i % 2;
  g->lookup("z")->constant = idx;
  ASSERT_TRUE(fold_constants(*g)) << "fold-constants failed";
  EXPECT_EQ(gather_of(*g), nullptr) << "a lookup by varied indices folds";
  const Value* e = g->lookup("e");
  ASSERT_TRUE(e->constant.has_value());
  const Tensor& c = *e->constant;
  ASSERT_EQ(c.dims(), (std::vector<int64_t>{16, 128, 64}));
  for (int64_t pos : {int64_t(0), int64_t(1), int64_t(2047)}) {  // position pos reads row pos % 2
    for (int64_t col : {int64_t(0), int64_t(63)}) {
      EXPECT_EQ(c.data<float>()[pos * 64 + col], float(pos % 2) + float(col) / 64.f) << pos << "," << col;
    }
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A float tensor read as integers (a fuzzed Pad whose pads are floats, folded): values past int64's
// range saturate and NaN reads as 0, never an undefined conversion (UBSan: the import fuzzer's
// input tests/fuzz/corpus/pad-float-pads-huge-value.onnx).
TEST(TensorValues, FloatsReadAsIntegersSaturate) {
  Tensor t = *Tensor::create(DType::kFloat32, {5});
  float* p = t.data<float>();
  p[0] = 1.6e32f;
  p[1] = -1.6e32f;
  p[2] = std::nanf("");
  p[3] = -7.9f;
  p[4] = 3.0f;
  EXPECT_EQ(t.to_int_vector(), (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                                                    0, -7, 3}));
}

}  // namespace
}  // namespace kiln
