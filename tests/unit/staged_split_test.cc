// split_at_open_shapes (src/api/staged_split.cc): a graph whose shapes depend on values computed
// inside it is cut into the nodes before the data-dependent ones, those nodes, and the nodes after.
// The three stages run one after another (values passed by name, `after` specialized to the exact
// shapes the host nodes produced, as the staged GPU engine does) must compute what the whole graph
// computes on the CPU reference, bit for bit.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "api/engine_impl.h"
#include "api/staged_split.h"
#include "ir/text.h"
#include "ops/infer.h"
#include "runtime/engine_file.h"

namespace kiln {
namespace {

// NonZero of a computed tensor, its indices used to gather (a detector's score filter); a graph
// output before the cut, one of the host node, and one after.
constexpr const char* kNonZero = R"(graph main(%x: f32[4,5]) {
  %r = Relu(%x) : f32[4,5]
  %nz = NonZero(%r) : i64[2,?]
  %t = Transpose(%nz) {perm = [1, 0]} : i64[?,2]
  %v = GatherND(%r, %t) : f32[?]
  %s = ReduceSum(%v) {keepdims = 0} : f32[]
  %y = Mul(%r, %s) : f32[4,5]
  return %y, %nz, %r
})";

// TopK whose k is computed from the data (how many scores clear a threshold), then more work on
// the selected values; a second input read only after the cut.
constexpr const char* kTopK = R"(graph main(%x: f32[3,16], %b: f32[3,1]) {
  %z = const dense<f32[]> [0.5]
  %g = Greater(%x, %z) : bool[3,16]
  %c = Cast(%g) {to = 7} : i64[3,16]
  %n = ReduceMax(%c) {keepdims = 0} : i64[]
  %one = const dense<i64[1]> [1]
  %k0 = Reshape(%n, %one) : i64[1]
  %k = Add(%k0, %one) : i64[1]
  %val, %idx = TopK(%x, %k) {axis = 1} : f32[3,?], i64[3,?]
  %w = Add(%val, %b) : f32[3,?]
  %e = Exp(%w) : f32[3,?]
  return %e, %idx
})";

Tensor random_tensor(std::vector<int64_t> dims, uint32_t seed) {
  Tensor t = *Tensor::create(DType::kFloat32, dims);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

std::unique_ptr<Graph> parsed(const char* text) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message();
  if (!g) return nullptr;
  Status st = infer_types(**g);
  EXPECT_TRUE(st) << st.message();
  return std::move(*g);
}

std::vector<Data> run_graph(std::unique_ptr<Graph> g, std::vector<Data> in) {
  auto plan = plan_host(std::move(g));
  EXPECT_TRUE(plan) << plan.status().message();
  if (!plan) return {};
  auto out = run_plan(*plan, std::move(in));
  EXPECT_TRUE(out) << out.status().message();
  return out ? *out : std::vector<Data>{};
}

// Runs one stage graph on values looked up by name in `env`, adding its outputs to `env`.
// `specialize`: bind its inputs to the shapes they have now first (the `after` stage).
void run_stage(const Graph& stage, std::map<std::string, Data>& env, bool specialize) {
  std::vector<Data> in;
  std::vector<std::vector<int64_t>> shapes;
  for (const Value* v : stage.inputs) {
    ASSERT_TRUE(env.count(v->name)) << "stage input '" << v->name << "' was not computed before it";
    in.push_back(env.at(v->name));
    shapes.push_back(env.at(v->name).tensor.dims());
  }
  std::unique_ptr<Graph> g;
  if (specialize) {
    auto s = specialize_graph(stage, shapes, BuildConfig{});
    ASSERT_TRUE(s) << s.status().message();
    EXPECT_FALSE(has_open_shapes(**s)) << "the after stage at exact shapes still has open shapes";
    g = std::move(*s);
  } else {  // the extracted graph as the engine plans it
    auto c = clone_graph(stage);
    ASSERT_TRUE(c) << c.status().message();
    g = std::move(*c);
  }
  std::vector<std::string> names;
  for (const Value* v : stage.outputs) names.push_back(v->name);
  std::vector<Data> out = run_graph(std::move(g), std::move(in));
  ASSERT_EQ(out.size(), names.size());
  for (size_t i = 0; i < out.size(); ++i) env[names[i]] = out[i];
}

void expect_same(const std::vector<Data>& want, const std::vector<Data>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(fmt::format("output {}", i));
    ASSERT_EQ(want[i].tensor.dims(), got[i].tensor.dims());
    ASSERT_EQ(want[i].tensor.dtype(), got[i].tensor.dtype());
    EXPECT_EQ(0, std::memcmp(want[i].tensor.raw(), got[i].tensor.raw(), want[i].tensor.nbytes()));
  }
}

std::vector<std::string> names_of(const std::vector<Value*>& vs) {
  std::vector<std::string> out;
  for (const Value* v : vs) out.push_back(v->name);
  return out;
}

// The whole graph and its three stages, on inputs `in`.
void check_stages_compose(const char* text, const std::vector<Data>& in) {
  auto whole = parsed(text);
  ASSERT_TRUE(whole);
  ASSERT_TRUE(has_open_shapes(*whole));
  auto split = split_at_open_shapes(*whole);
  ASSERT_TRUE(split) << split.status().message();
  std::map<std::string, Data> env;
  for (size_t i = 0; i < in.size(); ++i) env[whole->inputs[i]->name] = in[i];
  if (split->before) {
    EXPECT_FALSE(has_open_shapes(*split->before));
    run_stage(*split->before, env, false);
  }
  run_stage(*split->host, env, false);
  if (split->after) run_stage(*split->after, env, true);
  std::vector<Data> got;
  for (const Value* v : whole->outputs) {
    ASSERT_TRUE(env.count(v->name)) << "output '" << v->name << "' was computed by no stage";
    got.push_back(env.at(v->name));
  }
  expect_same(run_graph(parsed(text), in), got);
}

// A graph the cut refuses: kUnsupported, the message naming `what`.
void expect_refused(const char* text, const std::string& what) {
  auto g = parsed(text);
  ASSERT_TRUE(g);
  auto split = split_at_open_shapes(*g);
  ASSERT_FALSE(split);
  EXPECT_EQ(split.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(split.status().message().find(what), std::string::npos) << split.status().message();
}

TEST(StagedSplit, NonZeroCutsBeforeAndAfter) {
  auto g = parsed(kNonZero);
  ASSERT_TRUE(g);
  auto split = split_at_open_shapes(*g);
  ASSERT_TRUE(split) << split.status().message();
  ASSERT_TRUE(split->before && split->host && split->after);
  EXPECT_EQ(names_of(split->before->inputs), (std::vector<std::string>{"x"}));
  EXPECT_EQ(names_of(split->before->outputs), (std::vector<std::string>{"r"}));
  EXPECT_EQ(names_of(split->host->inputs), (std::vector<std::string>{"r"}));
  EXPECT_EQ(names_of(split->host->outputs), (std::vector<std::string>{"nz"}));
  EXPECT_EQ(names_of(split->after->inputs), (std::vector<std::string>{"nz", "r"}));  // in the order the nodes read them
  EXPECT_EQ(names_of(split->after->outputs), (std::vector<std::string>{"y"}));
  ASSERT_EQ(split->host_nodes.size(), 1u);
  EXPECT_NE(split->host_nodes[0].find("NonZero"), std::string::npos) << split->host_nodes[0];
  EXPECT_EQ(split->host->nodes.size(), 1u);
  EXPECT_EQ(split->after->nodes.size(), 4u);
}

TEST(StagedSplit, NonZeroStagesComputeTheWholeGraph) {
  for (uint32_t seed : {1u, 2u, 3u}) check_stages_compose(kNonZero, {Data(random_tensor({4, 5}, seed))});
}

TEST(StagedSplit, NonZeroFindingNothing) {
  Tensor x = random_tensor({4, 5}, 7);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = -std::abs(x.data<float>()[i]) - 1;
  check_stages_compose(kNonZero, {Data(x)});
}

TEST(StagedSplit, ComputedTopKStagesComputeTheWholeGraph) {
  auto g = parsed(kTopK);
  ASSERT_TRUE(g);
  auto split = split_at_open_shapes(*g);
  ASSERT_TRUE(split) << split.status().message();
  ASSERT_TRUE(split->before && split->after);
  EXPECT_EQ(names_of(split->host->outputs), (std::vector<std::string>{"val", "idx"}));
  EXPECT_EQ(names_of(split->after->inputs), (std::vector<std::string>{"b", "val"}));
  for (uint32_t seed : {4u, 5u}) {
    check_stages_compose(kTopK, {Data(random_tensor({3, 16}, seed)), Data(random_tensor({3, 1}, seed + 10))});
  }
}

TEST(StagedSplit, StaticGraphsAndRangedInputs) {
  auto g = parsed(R"(graph main(%x: f32[4,5]) {
  %r = Relu(%x) : f32[4,5]
  return %r
})");
  ASSERT_TRUE(g);
  EXPECT_FALSE(has_open_shapes(*g));
  expect_refused(R"(graph main(%x: f32[N,5]) {
  %nz = NonZero(%x) : i64[2,?]
  return %nz
})", "input 'x'");
}

// After the cut, an If whose branches read a value made before the cut (outer-scope reads) and a
// graph input; the caller reads a graph input, one value twice, and the host node's output.
TEST(StagedSplit, SubgraphReadsAndOddOutputs) {
  constexpr const char* kIf = R"(graph main(%x: f32[6], %c: bool[]) {
  %r = Relu(%x) : f32[6]
  %nz = NonZero(%r) : i64[1,?]
  %f = Cast(%nz) {to = 1} : f32[1,?]
  %s = ReduceSum(%f) {keepdims = 0} : f32[]
  %y = If(%c) {else_branch = graph else_g() {
    %e = Mul(%r, %s) : f32[6]
    return %e
  }, then_branch = graph then_g() {
    %t = Add(%r, %s) : f32[6]
    return %t
  }} : f32[6]
  return %y, %x, %y, %nz
})";
  auto g = parsed(kIf);
  ASSERT_TRUE(g);
  auto split = split_at_open_shapes(*g);
  ASSERT_TRUE(split) << split.status().message();
  ASSERT_TRUE(split->before && split->after);
  EXPECT_EQ(names_of(split->before->outputs), (std::vector<std::string>{"r"}));
  EXPECT_EQ(names_of(split->after->inputs), (std::vector<std::string>{"c", "nz", "r"}));
  for (bool c : {true, false}) {
    Tensor x = random_tensor({6}, 21), cond = *Tensor::create(DType::kBool, {});
    x.data<float>()[1] = -1;
    cond.data<bool>()[0] = c;
    check_stages_compose(kIf, {Data(x), Data(cond)});
  }
}

// A sequence crossing into the nodes after the cut: they are planned per tensor shape.
TEST(StagedSplit, ASequenceCrossingTheCutIsUnsupported) {
  expect_refused(R"(graph main(%x: f32[6]) {
  %q = SequenceConstruct(%x, %x) : seq<f32[6]>
  %nz = NonZero(%x) : i64[1,?]
  %i = ReduceMin(%nz) {keepdims = 0} : i64[]
  %e = SequenceAt(%q, %i) : f32[6]
  return %e
})", "'q'");
}

// The data-dependent node first: nothing before the cut, the host stage reads the graph's input.
TEST(StagedSplit, NothingBeforeTheCut) {
  constexpr const char* kFirst = R"(graph main(%x: f32[6]) {
  %nz = NonZero(%x) : i64[1,?]
  %f = Cast(%nz) {to = 1} : f32[1,?]
  %y = Neg(%f) : f32[1,?]
  return %y
})";
  auto g = parsed(kFirst);
  ASSERT_TRUE(g);
  auto split = split_at_open_shapes(*g);
  ASSERT_TRUE(split) << split.status().message();
  EXPECT_EQ(split->before, nullptr);
  EXPECT_EQ(names_of(split->host->inputs), (std::vector<std::string>{"x"}));
  Tensor x = random_tensor({6}, 9);
  x.data<float>()[2] = 0;
  check_stages_compose(kFirst, {Data(x)});
}

}  // namespace
}  // namespace kiln
