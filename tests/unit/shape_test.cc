// Dim arithmetic and its canonical text: the text IR and shape inference both rely on equal
// expressions printing equally and parsing back to the same Dim.
#include <gtest/gtest.h>

#include <limits>

#include "ir/shape.h"
#include "ir/text.h"
#include "ops/infer.h"

namespace kiln {
namespace {

const Dim N = Dim::symbol("N");
const Dim M = Dim::symbol("M");

TEST(Dim, Kinds) {
  EXPECT_TRUE(Dim(3).is_static());
  EXPECT_EQ(Dim(3).value(), 3);
  EXPECT_TRUE(N.is_symbolic());
  EXPECT_TRUE(Dim().is_unknown());
  EXPECT_EQ(Dim().to_string(), "?");
  EXPECT_EQ(N.to_string(), "N");
}

TEST(Dim, ArithmeticSimplifies) {
  EXPECT_EQ(N * Dim(2) / Dim(2), N);
  EXPECT_EQ((N + Dim(1)) - Dim(1), N);
  EXPECT_TRUE(((N + Dim(1)) - Dim(1)).same_as(N));
  EXPECT_EQ(N * Dim(2), Dim(2) * N);
  EXPECT_EQ(N - N, Dim(0));
  EXPECT_TRUE((N - N).is_static());
  EXPECT_EQ(N / N, Dim(1));
  EXPECT_EQ((Dim(2) * N + Dim(4)) / Dim(2), N + Dim(2));
  EXPECT_EQ(N * M, M * N);
  EXPECT_EQ(Dim(7) / Dim(2), Dim(3));
  EXPECT_EQ(Dim(-7) / Dim(2), Dim(-4));  // floor division
  EXPECT_EQ(ceil_div(Dim(7), Dim(2)), Dim(4));
  EXPECT_EQ(dim_max(Dim(3), Dim(5)), Dim(5));
  EXPECT_EQ(dim_min(Dim(3), Dim(5)), Dim(3));
  EXPECT_EQ(dim_max(N, N), N);
  EXPECT_NE(N + Dim(1), N);
  EXPECT_FALSE(N.same_as(M));
}

TEST(Dim, CanonicalText) {
  EXPECT_EQ((N * Dim(2) + Dim(1)).to_string(), "2*N+1");
  EXPECT_EQ((Dim(1) + Dim(2) * N).to_string(), "2*N+1");
  EXPECT_EQ((N * M * Dim(2) + N + Dim(1)).to_string(), "2*M*N+N+1");
  EXPECT_EQ((Dim(3) - N).to_string(), "-N+3");
  EXPECT_EQ((N * N).to_string(), "N*N");
  EXPECT_EQ(((N + Dim(1)) / Dim(2)).to_string(), "(N+1)/(2)");
  EXPECT_EQ(ceil_div(N, Dim(2)).to_string(), "(N+1)/(2)");
  EXPECT_EQ((Dim(2) * ((N + Dim(1)) / Dim(2))).to_string(), "2*(N+1)/(2)");
  EXPECT_EQ(dim_max(N, M).to_string(), "max(N,M)");
  EXPECT_EQ(dim_min(N, Dim(4)).to_string(), "min(N,4)");
  EXPECT_EQ(Dim::symbol("batch size").to_string(), "\"batch size\"");
  EXPECT_EQ(Shape({N, 3, Dim()}).to_string(), "[N,3,?]");
}

TEST(Dim, OverflowBecomesUnknown) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE((Dim(big) + Dim(1)).is_unknown());
  EXPECT_TRUE((Dim(big) * Dim(2)).is_unknown());
  EXPECT_TRUE((N * Dim(big) * Dim(2)).is_unknown());
  EXPECT_TRUE((N * Dim(big) + N).is_unknown());
  EXPECT_TRUE((Dim(1) / Dim(0)).is_unknown());
  EXPECT_TRUE((N + Dim()).is_unknown());
  EXPECT_EQ(Dim() * Dim(0), Dim(0));  // 0 * anything is 0
  EXPECT_EQ(Shape({Dim(big), Dim(2)}).numel().to_string(), "?");
}

TEST(Dim, Evaluate) {
  std::map<std::string, int64_t> b{{"N", 4}, {"M", 3}};
  EXPECT_EQ((N * Dim(2) + Dim(1)).evaluate(b), 9);
  EXPECT_EQ((N * M - N).evaluate(b), 8);
  EXPECT_EQ(Dim(5).evaluate({}), 5);
  EXPECT_EQ(Dim::symbol("K").evaluate(b), std::nullopt);
  EXPECT_EQ(Dim().evaluate(b), std::nullopt);
  std::map<std::string, int64_t> huge{{"N", std::numeric_limits<int64_t>::max()}};
  EXPECT_EQ((N * Dim(2)).evaluate(huge), std::nullopt);
}

TEST(Dim, Compatible) {
  EXPECT_TRUE(N.compatible(Dim(3)));
  EXPECT_TRUE(Dim(3).compatible(Dim(3)));
  EXPECT_FALSE(Dim(3).compatible(Dim(4)));
  EXPECT_TRUE(Dim().compatible(Dim(4)));
  EXPECT_EQ(Dim(), Dim());  // unknowns compare equal for shape equality, but are not same_as
  EXPECT_FALSE(Dim().same_as(Dim()));
}

// parse_dim goes through Dim arithmetic, so any spelling prints canonically.
TEST(DimText, ParseThroughArithmetic) {
  auto canon = [](std::string_view s) {
    Expected<Dim> d = parse_dim(s);
    return d ? d->to_string() : "error: " + d.status().message();
  };
  EXPECT_EQ(canon("N"), "N");
  EXPECT_EQ(canon("1 + N*2"), "2*N+1");
  EXPECT_EQ(canon("N*2/2"), "N");
  EXPECT_EQ(canon("(N+1)-1"), "N");
  EXPECT_EQ(canon("2*(N+3)"), "2*N+6");
  EXPECT_EQ(canon("-N + 3"), "-N+3");
  EXPECT_EQ(canon("(N+1)/2"), "(N+1)/(2)");
  EXPECT_EQ(canon("max(N, M)"), "max(N,M)");
  EXPECT_EQ(canon("min(3, 5)"), "3");
  EXPECT_EQ(canon("\"batch size\" * 2"), "2*\"batch size\"");
  EXPECT_EQ(canon("?"), "?");
  EXPECT_EQ(canon("9223372036854775807 + 1"), "?");
  EXPECT_EQ(parse_dim("N*2").value(), N * Dim(2));
  EXPECT_EQ(canon("N +"), "error: 1:4: expected a dimension (integer, name, '(' or '?'), got end of input");
  EXPECT_EQ(canon("N/0"), "error: 1:2: division by zero");
  EXPECT_EQ(canon("max(N)"), "error: 1:6: expected ',', got ')'");
}

// Every printed form reads back to an equal Dim with the same text, derived atoms included.
TEST(DimText, RoundTrip) {
  std::vector<Dim> dims = {
      N, Dim(0), Dim(-3), N * Dim(2) + Dim(1), Dim(3) - N, N * N * M,
      (N + Dim(1)) / Dim(2), Dim(2) * ((N + Dim(1)) / Dim(2)), ceil_div(N * M, Dim(8)) * N + Dim(1),
      dim_max(N, M), dim_min(N + Dim(1), M) * Dim(3), Dim::symbol("a-b") + Dim::symbol("x\"y"),
      (dim_max(N, Dim(2)) + Dim(1)) / (M + Dim(1)), Dim(6) / N, Dim::symbol("max") + Dim(1)};
  for (const Dim& d : dims) {
    std::string s = d.to_string();
    Expected<Dim> back = parse_dim(s);
    ASSERT_TRUE(back) << s << ": " << back.status().message();
    EXPECT_EQ(back->to_string(), s);
    EXPECT_TRUE(back->same_as(d)) << s;
  }
}

// The error shape inference gives the graph `ir` (which must parse, and must not infer).
std::string inference_error(const char* ir) {
  auto g = parse_graph(ir);
  if (!g) return "does not parse: " + g.status().message();
  Status s = infer_types(**g);
  return s ? "inferred without an error" : s.message();
}

// A Pad whose pads are near int64's limit (a fuzzer's model, tests/fuzz/corpus/
// pad-pads-near-int64-max.onnx) is an error naming the pads, not an overflowing sum.
TEST(PadInference, HugePadsAreAnErrorNotAnOverflow) {
  const std::string e = inference_error(
      "graph g(%x: f32[2,3]) {\n %p = const dense<i64[4]> [0, 2, 0, 9223372036854775806]\n"
      " %y = Pad(%x, %p) : f32[2,5]\n return %y\n}");
  EXPECT_NE(e.find("beyond any tensor's size"), std::string::npos) << e;
}

// A pad within the bound on a static dim already near int64's limit: the sum would overflow, and is
// an error naming the dim instead.
TEST(PadInference, PadGrowingADimPastInt64IsAnError) {
  const std::string e = inference_error(
      "graph g(%x: f32[9223372036854775000,3]) {\n %p = const dense<i64[4]> [0, 0, 1099511627776, 0]\n"
      " %y = Pad(%x, %p) : f32[1,3]\n return %y\n}");
  EXPECT_NE(e.find("past int64"), std::string::npos) << e;
}

}  // namespace
}  // namespace kiln
