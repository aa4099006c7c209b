// The profiler's work estimate (src/runtime/node_cost.h) on nodes of known arithmetic.
#include <gtest/gtest.h>

#include "ir/text.h"
#include "runtime/node_cost.h"

namespace kiln {
namespace {

std::unique_ptr<Graph> parse(const char* text) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message();
  return g ? std::move(*g) : nullptr;
}

TEST(NodeCost, MatMulCountsMultiplyAddsAsTwoAndBytesAtTheBuildsFloatSize) {
  auto g = parse(R"(graph g(%a: f32[2,64,768], %b: f32[768,3072]) {
  %y = MatMul(%a, %b) : f32[2,64,3072]
  return %y
})");
  ASSERT_TRUE(g);
  const NodeCost c = node_cost(*g->nodes[0], 2);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 2 * 64 * 768 * 3072);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * (2 * 64 * 768 + 768 * 3072 + 2 * 64 * 3072));
  EXPECT_DOUBLE_EQ(node_cost(*g->nodes[0], 4).bytes, 2 * c.bytes);
}

TEST(NodeCost, ConvolutionsCountTheirWindowsAndGroups) {
  auto g = parse(R"(graph g(%x: f32[1,8,10,10], %w: f32[16,4,3,3], %t: f32[8,2,4,4]) {
  %y = Conv(%x, %w) {group = 2, pads = [1, 1, 1, 1]} : f32[1,16,10,10]
  %z = ConvTranspose(%x, %t) {strides = [2, 2]} : f32[1,2,22,22]
  return %y, %z
})");
  ASSERT_TRUE(g);
  EXPECT_DOUBLE_EQ(node_cost(*g->nodes[0], 4).flops, 2.0 * 16 * 10 * 10 * 4 * 3 * 3);
  EXPECT_DOUBLE_EQ(node_cost(*g->nodes[1], 4).flops, 2.0 * 8 * 10 * 10 * 2 * 4 * 4);
}

TEST(NodeCost, GemmWithTransposedAAndElementwiseOps) {
  auto g = parse(R"(graph g(%a: f32[32,8], %b: f32[32,16], %c: f32[16], %i: i64[5]) {
  %y = Gemm(%a, %b, %c) {transA = 1} : f32[8,16]
  %r = Relu(%y) : f32[8,16]
  %j = Add(%i, %i) : i64[5]
  return %r, %j
})");
  ASSERT_TRUE(g);
  EXPECT_DOUBLE_EQ(node_cost(*g->nodes[0], 4).flops, 2.0 * 8 * 16 * 32 + 8 * 16);
  EXPECT_DOUBLE_EQ(node_cost(*g->nodes[1], 4).flops, 8 * 16);
  // One input read once however often it is named; integers at their own size.
  EXPECT_DOUBLE_EQ(node_cost(*g->nodes[2], 2).bytes, 8.0 * 5 + 8.0 * 5);
}

TEST(NodeCost, AGroupCountsOnlyTheBytesCrossingItsEdge) {
  auto g = parse(R"(graph g(%x: f32[4,8], %w: f32[8,16], %r: f32[4,16]) {
  %m = MatMul(%x, %w) : f32[4,16]
  %a = Add(%m, %r) : f32[4,16]
  %y = Relu(%a) : f32[4,16]
  %z = Neg(%a) : f32[4,16]
  return %y, %z
})");
  ASSERT_TRUE(g);
  // MatMul + Add + Relu as one kernel: x, w and r read; a (Neg reads it) and y (returned) written; m stays inside.
  const std::vector<const Node*> group{g->nodes[0].get(), g->nodes[1].get(), g->nodes[2].get()};
  const NodeCost c = group_cost(group, value_readers(*g), 4);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4 * 16 * 8 + 4 * 16 + 4 * 16);
  EXPECT_DOUBLE_EQ(c.bytes, 4.0 * (4 * 8 + 8 * 16 + 4 * 16) + 4.0 * (4 * 16 + 4 * 16));
}

TEST(NodeCost, GathersReadTheirOutputsWorthAndRecurrencesCountTheirProducts) {
  auto g = parse(R"(graph g(%table: f32[30000,768], %ids: i64[4,16], %x: f32[10,2,8], %w: f32[1,64,8], %r: f32[1,64,16]) {
  %e = Gather(%table, %ids) : f32[4,16,768]
  %y, %h, %c = LSTM(%x, %w, %r) {hidden_size = 16} : f32[10,1,2,16], f32[1,2,16], f32[1,2,16]
  return %e, %y
})");
  ASSERT_TRUE(g);
  // The embedding rows gathered, not the table: 4*16*768 floats read, as many written, and the ids.
  EXPECT_DOUBLE_EQ(node_cost(*g->nodes[0], 2).bytes, 2.0 * 4 * 16 * 768 * 2 + 8.0 * 4 * 16);
  // 10 steps x batch 2, each through W (64x8) and R (64x16).
  EXPECT_DOUBLE_EQ(node_cost(*g->nodes[1], 4).flops, 2.0 * 10 * 2 * (64 * 8 + 64 * 16));
}

}  // namespace
}  // namespace kiln
