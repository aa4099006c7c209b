// Micro-batching's precondition (src/passes/batch_rows.h): which graphs compute each batch row on
// its own, and which node says otherwise.
#include <gtest/gtest.h>

#include "ir/text.h"
#include "passes/batch_rows.h"

namespace kiln {
namespace {

Status check(const char* text, std::vector<bool> batched = {true}) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message();
  if (!g) return g.status();
  return check_rows_independent(**g, batched);
}

TEST(BatchRows, ATransformerBlockKeepsItsRowsApart) {
  // Projection, heads, attention per (row, head) with a causal mask the same for every row,
  // merge, MLP, layer norm over the features: every row on its own.
  const Status s = check(R"(graph g(%x: f32[2,8,16]) {
  %w = const dense<f32[16,48]> [0.5]
  %qkv = MatMul(%x, %w) : f32[2,8,48]
  %q, %k, %v = Split(%qkv) {axis = 2, num_outputs = 3} : f32[2,8,16], f32[2,8,16], f32[2,8,16]
  %hs = const dense<i64[4]> [2, 8, 4, 4]
  %qh = Reshape(%q, %hs) : f32[2,8,4,4]
  %kh = Reshape(%k, %hs) : f32[2,8,4,4]
  %vh = Reshape(%v, %hs) : f32[2,8,4,4]
  %qt = Transpose(%qh) {perm = [0, 2, 1, 3]} : f32[2,4,8,4]
  %kt = Transpose(%kh) {perm = [0, 2, 3, 1]} : f32[2,4,4,8]
  %vt = Transpose(%vh) {perm = [0, 2, 1, 3]} : f32[2,4,8,4]
  %s = MatMul(%qt, %kt) : f32[2,4,8,8]
  %mask = const dense<f32[1,1,8,8]> [0.0]
  %sm = Add(%s, %mask) : f32[2,4,8,8]
  %p = Softmax(%sm) {axis = -1} : f32[2,4,8,8]
  %o = MatMul(%p, %vt) : f32[2,4,8,4]
  %ot = Transpose(%o) {perm = [0, 2, 1, 3]} : f32[2,8,4,4]
  %ms = const dense<i64[2]> [16, 16]
  %m = Reshape(%ot, %ms) : f32[16,16]
  %w2 = const dense<f32[16,16]> [0.25]
  %b2 = const dense<f32[16]> [0.1]
  %h = Gemm(%m, %w2, %b2) : f32[16,16]
  %os = const dense<i64[3]> [2, 8, 16]
  %y = Reshape(%h, %os) : f32[2,8,16]
  %g = const dense<f32[16]> [1.0]
  %n = LayerNormalization(%y, %g) {axis = -1} : f32[2,8,16]
  return %n
})");
  EXPECT_TRUE(s) << s.message();
}

TEST(BatchRows, AnEmbeddingLookupCarriesTheIdsRows) {
  const Status s = check(R"(graph g(%ids: i64[4,8]) {
  %table = const dense<f32[50,16]> [0.5]
  %e = Gather(%table, %ids) {axis = 0} : f32[4,8,16]
  %w = const dense<f32[16,50]> [0.5]
  %logits = MatMul(%e, %w) : f32[4,8,50]
  return %logits
})");
  EXPECT_TRUE(s) << s.message();
}

TEST(BatchRows, WhatReadsAcrossRowsIsNamed) {
  struct Case {
    const char* body;
    const char* want;
  } cases[] = {
      {"%r = ReduceMean(%x, %ax) {keepdims = 1} : f32[1,8]\n  %y = Add(%x, %r) : f32[2,8]", "reduces over the batch axis"},
      {"%y = Softmax(%x) {axis = 0} : f32[2,8]", "works across the batch axis"},
      {"%y = Gather(%x, %i0) {axis = 0} : f32[2,8]", "gathers along the batch axis"},
      {"%t = Transpose(%x) : f32[8,2]\n  %y = MatMul(%t, %x) : f32[8,8]", "contracts over the batch axis"},
      {"%s = const dense<i64[2]> [4, 4]\n  %t = Transpose(%x) : f32[8,2]\n  %y0 = Reshape(%t, %s) : f32[4,4]\n"
       "  %y = Reshape(%y0, %s2) : f32[2,8]",
       "merges it with an outer"},
      // A constant whose two rows differ, added along the batch axis: each micro-batch would read row 0.
      {"%c = const dense<f32[2,1]> [1.0, 2.0]\n  %y = Add(%x, %c) : f32[2,8]", "differs along the batch axis"},
  };
  for (const Case& c : cases) {
    const std::string text = std::string("graph g(%x: f32[2,8]) {\n  %ax = const dense<i64[1]> [0]\n"
                                         "  %i0 = const dense<i64[2]> [1, 0]\n  %s2 = const dense<i64[2]> [2, 8]\n  ") +
                             c.body + "\n  return %y\n}";
    const Status s = check(text.c_str());
    EXPECT_FALSE(s) << c.body;
    EXPECT_NE(s.message().find(c.want), std::string::npos) << c.body << ": " << s.message();
  }
}

TEST(BatchRows, AConstantWithEqualRowsIsTheSameForEveryRow) {
  // (As a shape computation folded at the whole batch leaves it: Expand(ones, Shape(x)).)
  const Status s = check(R"(graph g(%x: f32[2,8]) {
  %c = const dense<f32[2,8]> [1.5]
  %y = Add(%x, %c) : f32[2,8]
  return %y
})");
  EXPECT_TRUE(s) << s.message();
}

TEST(BatchRows, OutputsAndInputsMustCarryTheBatchOnAxisZero) {
  Status s = check(R"(graph g(%x: f32[2,8]) {
  %y = Transpose(%x) : f32[8,2]
  return %y
})");
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("output 'y'"), std::string::npos) << s.message();
  // An input the same for every row (a scalar), beside the batched one.
  s = check(R"(graph g(%x: f32[2,8], %t: f32[]) {
  %y = Mul(%x, %t) : f32[2,8]
  return %y
})", {true, false});
  EXPECT_TRUE(s) << s.message();
  s = check(R"(graph g(%x: f32[1,8]) {
  %y = Relu(%x) : f32[1,8]
  return %y
})");
  EXPECT_FALSE(s);  // one row: nothing to split
}

TEST(BatchRows, RandomOpsAndPoolIndicesAreRefused) {
  // Each micro-batch would draw the same numbers; MaxPool's indices count across the whole batch.
  Status s = check(R"(graph g(%x: f32[2,8]) {
  %r = RandomUniformLike(%x) : f32[2,8]
  %y = Add(%x, %r) : f32[2,8]
  return %y
})");
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("random"), std::string::npos) << s.message();
  s = check(R"(graph g(%x: f32[2,1,4,4]) {
  %y, %i = MaxPool(%x) {kernel_shape = [2, 2], strides = [2, 2]} : f32[2,1,2,2], i64[2,1,2,2]
  return %y, %i
})");
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("indices"), std::string::npos) << s.message();
}

TEST(BatchRows, AMicroBatchWhoseShapesDoNotFollowTheBatchIsNamed) {
  // A reshape to a literal [2, -1] looks batched at 2 rows, but a 1-row micro-batch makes it [2, 8]:
  // the softmax would run over 8 values instead of 16.
  const char* whole = R"(graph g(%x: f32[2,16]) {
  %s = const dense<i64[2]> [2, -1]
  %r = Reshape(%x, %s) : f32[2,16]
  %y = Softmax(%r) {axis = 1} : f32[2,16]
  return %y
})";
  const char* micro = R"(graph g(%x: f32[1,16]) {
  %s = const dense<i64[2]> [2, -1]
  %r = Reshape(%x, %s) : f32[2,8]
  %y = Softmax(%r) {axis = 1} : f32[2,8]
  return %y
})";
  auto w = parse_graph(whole);
  auto m = parse_graph(micro);
  ASSERT_TRUE(w && m);
  std::map<std::string, int64_t> axes;
  ASSERT_TRUE(check_rows_independent(**w, {true}, &axes));
  EXPECT_EQ(axes["r"], 0);
  Status s = check_micro_shapes(**w, **m, axes, 2);
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("'r'"), std::string::npos) << s.message();
  // The same model with the batch followed (-1 first) passes.
  auto w2 = parse_graph(R"(graph g(%x: f32[2,16]) {
  %s = const dense<i64[2]> [-1, 16]
  %r = Reshape(%x, %s) : f32[2,16]
  return %r
})");
  auto m2 = parse_graph(R"(graph g(%x: f32[1,16]) {
  %s = const dense<i64[2]> [-1, 16]
  %r = Reshape(%x, %s) : f32[1,16]
  return %r
})");
  ASSERT_TRUE(w2 && m2);
  axes.clear();
  ASSERT_TRUE(check_rows_independent(**w2, {true}, &axes));
  EXPECT_TRUE(check_micro_shapes(**w2, **m2, axes, 2));
}

}  // namespace
}  // namespace kiln
