// specialize_graph (src/api/shape_ranges.cc): a dynamic GPU engine's shape plans are lowered from a
// copy of the optimized graph bound to one exact shape. The copy must compute what the graph with
// ranged dims computes at that shape, bit for bit on the CPU reference; its shape arithmetic must
// fold to constants (the GPU lowering needs static shapes); its weights must be the original's
// storage (every shape plan shares one upload), and the original must not change.
#include <gtest/gtest.h>

#include <random>

#include "api/engine_impl.h"
#include "ir/text.h"
#include "passes/derived_constants.h"
#include "passes/pipeline.h"
#include "passes/value_inputs.h"

namespace kiln {
namespace {

// The batch and sequence dims flow into a Reshape target through Shape -> Gather -> Concat, as
// exporters write `x.view(x.size(0), -1)`.
constexpr const char* kModel = R"(graph main(%x: f32[N,S,8]) {
  %w = const dense<f32[8,4]> [0.25]
  %y = MatMul(%x, %w) : f32[N,S,4]
  %sh = Shape(%x) : i64[3]
  %i0 = const dense<i64[1]> [0]
  %n = Gather(%sh, %i0) {axis = 0} : i64[1]
  %m1 = const dense<i64[1]> [-1]
  %t = Concat(%n, %m1) {axis = 0} : i64[2]
  %r = Reshape(%y, %t) : f32[N,?]
  %s = Softmax(%r) {axis = 1} : f32[N,?]
  return %s
})";

Tensor random_x(int64_t n, int64_t s, uint32_t seed) {
  Tensor t = *Tensor::create(DType::kFloat32, {n, s, 8});
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2, 2);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

std::vector<Data> run(std::unique_ptr<Graph> g, const Tensor& x) {
  auto plan = plan_host(std::move(g));
  EXPECT_TRUE(plan) << plan.status().message();
  auto out = run_plan(*plan, {Data(x)});
  EXPECT_TRUE(out) << out.status().message();
  return out ? *out : std::vector<Data>{};
}

TEST(Specialize, MatchesTheRangedGraphAtEachShapeAndFoldsShapeArithmetic) {
  auto g = parse_graph(kModel);
  ASSERT_TRUE(g) << g.status().message();
  const Graph& ranged = **g;
  const Value* w = nullptr;
  for (const auto& v : ranged.values) {
    if (v->name == "w") w = v.get();
  }
  ASSERT_NE(w, nullptr);
  const std::string before = print_graph(ranged);
  for (auto [n, s] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 7}, {8, 16}}) {
    SCOPED_TRACE(fmt::format("shape {}x{}x8", n, s));
    auto sg = specialize_graph(ranged, {{n, s, 8}}, BuildConfig{});
    ASSERT_TRUE(sg) << sg.status().message();
    for (const auto& v : (*sg)->values) {
      if (v->type.is_tensor()) {
        ASSERT_TRUE(v->type.shape && v->type.shape->is_static()) << v->name << " is " << v->type.to_string();
      }
    }
    for (const auto& node : (*sg)->nodes) EXPECT_NE(node->op, OpKind::kShape) << "shape arithmetic was not folded";
    bool shared = false;
    for (const auto& v : (*sg)->values) shared = shared || (v->constant && v->constant->raw() == w->constant->raw());
    EXPECT_TRUE(shared) << "the copy's weight is not the original's storage";

    const Tensor x = random_x(n, s, uint32_t(n * 100 + s));
    auto copy = parse_graph(kModel);
    ASSERT_TRUE(copy);
    std::vector<Data> want = run(std::move(*copy), x), got = run(std::move(*sg), x);
    ASSERT_EQ(want.size(), 1u);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_EQ(got[0].tensor.dims(), (std::vector<int64_t>{n, 4 * s}));
    ASSERT_EQ(want[0].tensor.dims(), got[0].tensor.dims());
    EXPECT_EQ(std::memcmp(want[0].tensor.raw(), got[0].tensor.raw(), got[0].tensor.nbytes()), 0);
  }
  EXPECT_EQ(print_graph(ranged), before) << "specializing changed the ranged graph";
}

// Two projections of one input with their biases: merge-sibling-matmuls concatenates the weights
// (and the biases) in every copy. With one DerivedConstants across the copies, the second copy gets
// the first's concatenations (the same storage, which the GPU weight pool then finds without
// converting or hashing them) and computes the same values.
constexpr const char* kSiblings = R"(graph main(%x: f32[N,8]) {
  %wq = const dense<f32[8,24]> [0.25]
  %wk = const dense<f32[8,24]> [-0.5]
  %bq = const dense<f32[24]> [1.0]
  %bk = const dense<f32[24]> [2.0]
  %q = MatMul(%x, %wq) : f32[N,24]
  %qb = Add(%q, %bq) : f32[N,24]
  %k = MatMul(%x, %wk) : f32[N,24]
  %kb = Add(%k, %bk) : f32[N,24]
  %o = Mul(%qb, %kb) : f32[N,24]
  return %o
})";

// The storage of the copy's constants of `dims` (the merged weight [8,48], the merged bias [48]).
std::vector<const void*> storage_of(const Graph& g, const std::vector<int64_t>& dims) {
  std::vector<const void*> out;
  for (const auto& v : g.values) {
    if (v->constant && v->constant->dims() == dims) out.push_back(v->constant->raw());
  }
  return out;
}

TEST(Specialize, DerivedWeightsAreMadeOnceAcrossCopies) {
  auto g = parse_graph(kSiblings);
  ASSERT_TRUE(g) << g.status().message();
  DerivedConstants memo;
  std::vector<const void*> first_w, first_b;
  for (int64_t n : {2, 5, 2}) {
    SCOPED_TRACE(fmt::format("batch {}", n));
    auto with = specialize_graph(**g, {{n, 8}}, BuildConfig{}, {}, &memo);
    auto without = specialize_graph(**g, {{n, 8}}, BuildConfig{});
    ASSERT_TRUE(with) << with.status().message();
    ASSERT_TRUE(without) << without.status().message();
    const std::vector<const void*> w = storage_of(**with, {8, 48}), b = storage_of(**with, {48});
    ASSERT_EQ(w.size(), 1u) << "the projections were not merged";
    ASSERT_EQ(b.size(), 1u);
    ASSERT_EQ(storage_of(**without, {8, 48}).size(), 1u);
    EXPECT_NE(storage_of(**without, {8, 48})[0], w[0]) << "without a memo each copy makes its own";
    if (first_w.empty()) {
      first_w = w;
      first_b = b;
    } else {
      EXPECT_EQ(w, first_w) << "the second copy made the merged weight again";
      EXPECT_EQ(b, first_b);
    }
    const Tensor x = random_x(n, 1, uint32_t(n)).reshaped({n, 8});
    std::vector<Data> want = run(std::move(*without), x), got = run(std::move(*with), x);
    ASSERT_EQ(want.size(), 1u);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_EQ(got[0].tensor.dims(), (std::vector<int64_t>{n, 24}));
    EXPECT_EQ(std::memcmp(want[0].tensor.raw(), got[0].tensor.raw(), got[0].tensor.nbytes()), 0);
  }
  EXPECT_EQ(memo.made(), 2u);    // the weight and the bias
  EXPECT_EQ(memo.reused(), 4u);  // by the second and third copies
}

TEST(Specialize, DerivedConstantsOfUnsharedInputsAreNotRemembered) {
  DerivedConstants memo;
  Tensor mine = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  Tensor shared = *Tensor::create(DType::kFloat32, {64});
  memo.share(shared);
  int made = 0;
  auto make = [&]() -> Expected<Tensor> {
    ++made;
    return Tensor::from_vector<float>({7}, {1});
  };
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(memo.get("r", {&mine}, make));
    ASSERT_TRUE(memo.get("r", {&shared}, make));
    ASSERT_TRUE(memo.get("other", {&shared}, make));
    ASSERT_TRUE(memo.get("r", {&shared, &mine}, make));
  }
  EXPECT_EQ(made, 6);  // the unshared input's recipes each time; the shared one once per recipe
  EXPECT_EQ(memo.made(), 2u);
  EXPECT_EQ(memo.reused(), 2u);
}

// Weights each copy makes itself (fold-constants transposes them in every copy, at a new address):
// merging them is not remembered, so a stream of new shapes does not grow the memo.
constexpr const char* kTransposedSiblings = R"(graph main(%x: f32[N,8]) {
  %wq = const dense<f32[24,8]> [0.25]
  %wk = const dense<f32[24,8]> [-0.5]
  %tq = Transpose(%wq) {perm = [1, 0]} : f32[8,24]
  %tk = Transpose(%wk) {perm = [1, 0]} : f32[8,24]
  %q = MatMul(%x, %tq) : f32[N,24]
  %k = MatMul(%x, %tk) : f32[N,24]
  %o = Mul(%q, %k) : f32[N,24]
  return %o
})";

TEST(Specialize, WeightsACopyMakesItselfAreNotRemembered) {
  auto g = parse_graph(kTransposedSiblings);
  ASSERT_TRUE(g) << g.status().message();
  DerivedConstants memo;
  for (int64_t n : {1, 2, 3, 4}) {
    auto sg = specialize_graph(**g, {{n, 8}}, BuildConfig{}, {}, &memo);
    ASSERT_TRUE(sg) << sg.status().message();
    ASSERT_EQ(storage_of(**sg, {8, 48}).size(), 1u) << "the projections were not merged";
  }
  EXPECT_EQ(memo.made(), 0u);
  EXPECT_EQ(memo.reused(), 0u);
}

// BERT's token types as transformers exports them: a buffer sliced to the sequence length and
// expanded to [batch, seq] by a target computed from Shape (through the exporter's Where for -1). The ranged graph's passes leave the
// Expand's output [?,?] and fuse the target's Equal and Where into one FusedElementwise; once bound,
// the slice and the fused target must fold, and the Expand's output come out static (inferred again
// after the passes).
constexpr const char* kTokenTypes = R"(graph main(%ids: i64[B,S]) {
  %tt = const dense<i64[1,512]> [0]
  %sh = Shape(%ids) : i64[2]
  %i1 = const dense<i64[1]> [1]
  %s = Gather(%sh, %i1) {axis = 0} : i64[1]
  %z = const dense<i64[1]> [0]
  %sl = Slice(%tt, %z, %s, %i1) : i64[1,?]
  %m1 = const dense<i64[2]> [-1]
  %one = const dense<i64[2]> [1]
  %isneg = Equal(%sh, %m1) : bool[2]
  %target = Where(%isneg, %one, %sh) : i64[2]
  %e = Expand(%sl, %target) : i64[?,?]
  %emb = const dense<f32[2,4]> [0.5]
  %g = Gather(%emb, %e) {axis = 0} : f32[?,?,4]
  %y = Add(%g, %g) : f32[?,?,4]
  return %y
})";

TEST(Specialize, FoldedShapeTargetsGiveStaticShapes) {
  auto g = parse_graph(kTokenTypes);
  ASSERT_TRUE(g) << g.status().message();
  PassOptions po;
  ASSERT_TRUE(run_passes(**g, default_pipeline(), po));  // as the engine's ranged graph is
  auto sg = specialize_graph(**g, {{3, 7}}, BuildConfig{});
  ASSERT_TRUE(sg) << sg.status().message();
  for (const auto& v : (*sg)->values) {
    if (v->type.is_tensor()) {
      EXPECT_TRUE(v->type.shape && v->type.shape->is_static()) << v->name << " is " << v->type.to_string();
    }
  }
  ASSERT_EQ((*sg)->outputs[0]->type.shape->dims[1].value(), 7);
}

TEST(Specialize, ShapesThatDoNotFitAreErrors) {
  auto g = parse_graph(kModel);
  ASSERT_TRUE(g);
  auto two = specialize_graph(**g, {{1, 2, 8}, {1}}, BuildConfig{});
  ASSERT_FALSE(two);
  EXPECT_NE(two.status().message().find("expected 1 input shapes, got 2"), std::string::npos) << two.status().message();
  auto rank = specialize_graph(**g, {{1, 8}}, BuildConfig{});
  ASSERT_FALSE(rank);
  auto fixed = specialize_graph(**g, {{1, 2, 9}}, BuildConfig{});
  ASSERT_FALSE(fixed) << "a fixed dim bound to another value";
}

// Value inputs: a TopK's k fed by the caller through a Cast, and a Slice end through arithmetic,
// are values the plan needs; the data they act on, a Gather's indices and anything read only
// through Shape are not. Bound, the graph computes what it computes with those values fed, and
// every shape is static.
constexpr const char* kValueInputs = R"(graph main(%x: f32[4,10], %k: i32[1], %idx: i64[2], %end: i64[1], %y: f32[4,10]) {
  %k64 = Cast(%k) {to = 7} : i64[1]
  %v, %i = TopK(%x, %k64) {axis = 1} : f32[4,?], i64[4,?]
  %g = Gather(%x, %idx) {axis = 0} : f32[2,10]
  %one = const dense<i64[1]> [1]
  %e = Add(%end, %one) : i64[1]
  %z = const dense<i64[1]> [0]
  %sh = Shape(%y) : i64[2]
  %ax = const dense<i64[1]> [1]
  %s = Slice(%x, %z, %e, %ax) : f32[4,?]
  %r = Reshape(%y, %sh) : f32[4,10]
  return %v, %g, %s, %r
})";

TEST(Specialize, ValueInputsAreFoundAndBound) {
  auto g = parse_graph(kValueInputs);
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_EQ(value_inputs(**g), (std::vector<size_t>{1, 3}));  // k and end; not idx, not y (Shape)

  Tensor x = *Tensor::create(DType::kFloat32, {4, 10});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float((i * 7) % 13) - 6.0f;
  Tensor k = Tensor::from_vector<int32_t>({3}, {1}), idx = Tensor::from_vector<int64_t>({2, 0}, {2});
  Tensor end = Tensor::from_vector<int64_t>({4}, {1});
  const std::vector<Data> in = {Data(x), Data(k), Data(idx), Data(end), Data(x)};
  auto copy = parse_graph(kValueInputs);
  ASSERT_TRUE(copy);
  std::vector<Data> want;
  {
    auto plan = plan_host(std::move(*copy));
    ASSERT_TRUE(plan) << plan.status().message();
    auto out = run_plan(*plan, in);
    ASSERT_TRUE(out) << out.status().message();
    want = *out;
  }
  auto sg = specialize_graph(**g, {{4, 10}, {1}, {2}, {1}, {4, 10}}, BuildConfig{}, {{1, k}, {3, end}});
  ASSERT_TRUE(sg) << sg.status().message();
  for (const auto& v : (*sg)->values) {
    if (v->type.is_tensor()) {
      EXPECT_TRUE(v->type.shape && v->type.shape->is_static()) << v->name << " is " << v->type.to_string();
    }
  }
  ASSERT_EQ((*sg)->inputs.size(), 5u) << "bound inputs stay inputs";
  auto plan = plan_host(std::move(*sg));
  ASSERT_TRUE(plan) << plan.status().message();
  auto got = run_plan(*plan, in);
  ASSERT_TRUE(got) << got.status().message();
  ASSERT_EQ(got->size(), want.size());
  EXPECT_EQ((*got)[0].tensor.dims(), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ((*got)[2].tensor.dims(), (std::vector<int64_t>{4, 5}));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].tensor.dims(), (*got)[i].tensor.dims()) << "output " << i;
    EXPECT_EQ(std::memcmp(want[i].tensor.raw(), (*got)[i].tensor.raw(), want[i].tensor.nbytes()), 0) << "output " << i;
  }

  // A value of another dtype or shape than the input's is refused, naming the input.
  auto bad = specialize_graph(**g, {{4, 10}, {1}, {2}, {1}, {4, 10}}, BuildConfig{}, {{1, end}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("input 'k'"), std::string::npos) << bad.status().message();
}

// A float input is a value input only where a parameter reads it directly (Resize's scales); a
// float that reaches one through arithmetic (a condition computed from it) stays data.
TEST(Specialize, FloatInputsQualifyOnlyWhenReadDirectly) {
  auto g = parse_graph(R"(graph main(%x: f32[1,1,2,2], %s: f32[4], %t: f32[2]) {
  %r = Resize(%x, _, %s) {mode = "nearest"} : f32[1,1,?,?]
  %zero = const dense<f32[]> [0.0]
  %m = ReduceMax(%t) {keepdims = 0} : f32[]
  %c = Greater(%m, %zero) : bool[]
  %y = If(%c) {else_branch = graph else_g() {
    return %x
  }, then_branch = graph then_g() {
    %a = Abs(%x) : f32[1,1,2,2]
    return %a
  }} : f32[1,1,2,2]
  return %r, %y
})");
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_EQ(value_inputs(**g), (std::vector<size_t>{1}));  // s, not t
}

// A value input larger than kMaxValueInputElements is data, however it is read.
TEST(Specialize, LargeInputsAreNeverValueInputs) {
  auto g = parse_graph(R"(graph main(%x: f32[2,100], %p: i64[65]) {
  %m = ReduceMax(%p) {keepdims = 1} : i64[1]
  %z = const dense<i64[1]> [0]
  %ax = const dense<i64[1]> [1]
  %s = Slice(%x, %z, %m, %ax) : f32[2,?]
  return %s
})");
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_TRUE(value_inputs(**g).empty());
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Warm shapes (BuildConfig::warm_shapes) travel in the engine file's record of the build and need
// shape ranges to be warm within.
TEST(BuildConfigRecord, WarmShapesRoundTripAndNeedRanges) {
  BuildConfig c;
  c.shape_ranges["ids"] = {DimRange{1, 64, 0}, DimRange{16, 512, 128}};
  c.warm_shapes = {{{"ids", {8, 128}}}, {{"ids", {1, 16}}, {"mask", {1, 16}}}};
  ASSERT_TRUE(validate_config(c));
  auto back = config_from_json(config_to_json(c));
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->warm_shapes, c.warm_shapes);
  EXPECT_EQ(back->shape_ranges, c.shape_ranges);
  BuildConfig none;  // a record written before warm shapes existed has none
  nlohmann::json j = config_to_json(none);
  EXPECT_FALSE(j.contains("warm_shapes"));
  EXPECT_TRUE(config_from_json(j)->warm_shapes.empty());
  c.shape_ranges.clear();
  Status st = validate_config(c);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("warm shapes need shape ranges"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kiln
