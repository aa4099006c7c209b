// Plans and engine files (src/runtime/plan.h, engine_file.h): a plan written and read back runs
// bit-identically to the plan it came from; every kind of damage to the file is an error that says
// which; plans that do not hold together are rejected by verify_plan.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "ir/text.h"
#include "ir/verifier.h"
#include "runtime/engine_file.h"

namespace kiln {
namespace {

// A graph with a weight over the inline limit (it travels in WGHT), a small inline one, an If whose
// branches read a top-level value by reference (outer scope), an unused second output of a node,
// and a graph output that is a constant.
constexpr const char* kModel = R"(graph main(%x: f32[2,20], %c: bool[]) {
  %w = const dense<f32[20]> [0.5]
  %b = const dense<f32[2]> [1.0, -2.0]
  %k = const dense<i64[1]> [3]
  %m = Mul(%x, %w) : f32[2,20]
  %r = Relu(%m) : f32[2,20]
  %y = If(%c) {else_branch = graph else_g() {
    %n = Neg(%r) : f32[2,20]
    return %n
  }, then_branch = graph then_g() {
    return %r
  }} : f32[2,20]
  %v, %i = TopK(%y, %k) {axis = 1} : f32[2,3], i64[2,3]
  %s = ReduceSum(%v) {keepdims = 0} : f32[]
  return %s, %y, %b
})";

std::unique_ptr<Graph> parse(const char* text) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message();
  return std::move(*g);
}

std::vector<Data> inputs(bool cond) {
  Tensor x = Tensor::create(DType::kFloat32, {2, 20}).value();
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float((i * 37) % 23) - 11.0f;
  return {Data(x), Data(Tensor::scalar<bool>(cond))};
}

void expect_identical(const std::vector<Data>& a, const std::vector<Data>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].is_tensor() && b[i].is_tensor());
    ASSERT_EQ(a[i].tensor.summary(), b[i].tensor.summary());
    EXPECT_EQ(std::memcmp(a[i].tensor.raw(), b[i].tensor.raw(), a[i].tensor.nbytes()), 0) << "output " << i;
  }
}

std::shared_ptr<const std::string> written(const Plan& p) {
  nlohmann::json meta = {{"device", "cpu"}};
  auto bytes = write_engine_file(meta, p);
  EXPECT_TRUE(bytes) << bytes.status().message();
  return std::make_shared<const std::string>(*bytes);
}

std::string load_error(std::string bytes) {
  auto f = read_engine_file(std::make_shared<const std::string>(std::move(bytes)), "m.kiln");
  return f ? "" : f.status().message();
}

TEST(Plan, RunsLikeTheGraphAndFreesAfterTheLastReader) {
  auto plan = plan_host(parse(kModel));
  ASSERT_TRUE(plan) << plan.status().message();
  // Mul, Relu, If, TopK, ReduceSum; %m is freed after Relu, %r only after the If that reads it
  // from inside its branches.
  ASSERT_EQ(plan->steps.size(), 5u);
  const Graph& g = *plan->graph;
  auto slot_of = [&](const char* name) {
    for (const PlanStep& s : plan->steps) {
      const Node& n = *g.nodes[s.node];
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (n.outputs[k] && n.outputs[k]->name == name) return s.outputs[k].index;
      }
    }
    return UINT32_MAX;
  };
  auto freed_at = [&](uint32_t slot) {
    for (size_t i = 0; i < plan->steps.size(); ++i) {
      for (uint32_t f : plan->steps[i].frees) {
        if (f == slot) return int(i);
      }
    }
    return -1;
  };
  EXPECT_EQ(freed_at(slot_of("m")), 1);
  EXPECT_EQ(freed_at(slot_of("r")), 2);
  EXPECT_EQ(freed_at(slot_of("i")), 3);   // written, never read
  EXPECT_EQ(freed_at(slot_of("y")), -1);  // a graph output
  for (bool c : {true, false}) {
    auto out = run_plan(*plan, inputs(c));
    ASSERT_TRUE(out) << out.status().message();
    ASSERT_EQ(out->size(), 3u);
    float y0 = out->at(1).tensor.data<float>()[0];
    EXPECT_EQ(y0, c ? 0.0f : -0.0f);  // x[0] = -11: Relu gives 0, the else branch negates it
    EXPECT_EQ(out->at(2).tensor.data<float>()[1], -2.0f);
  }
}

TEST(EngineFile, RoundTripIsBitIdentical) {
  auto plan = plan_host(parse(kModel));
  ASSERT_TRUE(plan);
  auto bytes = written(*plan);
  auto f = read_engine_file(bytes, "m.kiln");
  ASSERT_TRUE(f) << f.status().message();
  EXPECT_EQ(f->meta.value("device", ""), "cpu");
  EXPECT_EQ(f->plan.steps.size(), plan->steps.size());
  // The weight over the inline limit came back from WGHT, as a view into the file's bytes.
  const Value* w = nullptr;
  for (const auto& v : f->plan.graph->values) {
    if (v->name == "w") w = v.get();
  }
  ASSERT_TRUE(w && w->constant);
  const char* at = static_cast<const char*>(w->constant->raw());
  EXPECT_TRUE(at >= bytes->data() && at < bytes->data() + bytes->size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % 16, 0u);
  for (bool c : {true, false}) {
    auto a = run_plan(*plan, inputs(c));
    auto b = run_plan(f->plan, inputs(c));
    ASSERT_TRUE(a && b);
    expect_identical(*a, *b);
  }
  // Written again from what was read: the same bytes.
  EXPECT_EQ(*written(f->plan), *bytes);
}

// Two subgraphs may each hold a constant of one name (passes build bodies independently); WTAB finds
// weights by name, so such constants travel inline and the file still reads back and runs the same.
TEST(EngineFile, SameNamedConstantsInTwoSubgraphs) {
  const char* text = R"(graph g(%x: f32[2,20], %c: bool[]) {
  %y = If(%c) {else_branch = graph else_g() {
    %w = const dense<f32[20]> [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    %n = Mul(%x, %w) : f32[2,20]
    return %n
  }, then_branch = graph then_g() {
    %w = const dense<f32[20]> [-1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -11, -12, -13, -14, -15, -16, -17, -18, -19, -20]
    %p = Mul(%x, %w) : f32[2,20]
    return %p
  }} : f32[2,20]
  return %y
})";
  auto plan = plan_host(parse(text));
  ASSERT_TRUE(plan) << plan.status().message();
  auto bytes = written(*plan);
  auto f = read_engine_file(bytes, "m.kiln");
  ASSERT_TRUE(f) << f.status().message();
  for (bool c : {true, false}) {
    auto a = run_plan(*plan, inputs(c));
    auto b = run_plan(f->plan, inputs(c));
    ASSERT_TRUE(a && b);
    expect_identical(*a, *b);
    EXPECT_EQ(b->at(0).tensor.data<float>()[1], c ? -6.0f : 6.0f);  // x[1] = 3 times -2 (then) or 2 (else)
  }
}

// clone_graph copies structure by structure: the copy prints as the original does, verifies, runs
// the same, reads outer values from its own copies inside the If's branches, shares the large
// constant's storage and owns its small ones.
TEST(EngineFile, CloneGraphIsATrueCopy) {
  auto g = parse(kModel);
  g->nodes[1]->name = "the relu";  // a node's name travels with it
  auto c = clone_graph(*g);
  ASSERT_TRUE(c) << c.status().message();
  const Graph& k = **c;
  EXPECT_EQ(print_graph(k), print_graph(*g));
  EXPECT_TRUE(verify_graph(k).ok()) << verify_graph(k).message();
  std::set<const Value*> original;
  for (const auto& v : g->values) original.insert(v.get());
  for (const auto& n : k.nodes) {
    EXPECT_EQ(n->owner, &k);
    for (size_t i = 0; i < n->outputs.size(); ++i) {
      if (!n->outputs[i]) continue;
      EXPECT_EQ(n->outputs[i]->producer, n.get());
      EXPECT_EQ(n->outputs[i]->owner, &k);
    }
    for (const auto& [key, a] : n->attrs) {
      if (!a.g) continue;
      EXPECT_EQ(a.g->parent, &k);
      EXPECT_EQ(a.g->parent_node, n.get());
      for (const auto& sn : a.g->nodes) {
        for (const Value* v : sn->inputs) EXPECT_FALSE(original.count(v)) << key << " reads the original's " << v->name;
      }
      for (const Value* v : a.g->outputs) EXPECT_FALSE(original.count(v)) << key << " returns the original's " << v->name;
    }
  }
  const Value* w = k.lookup("w");
  const Value* b = k.lookup("b");
  ASSERT_TRUE(w && b && w->constant && b->constant);
  EXPECT_EQ(w->constant->raw(), g->lookup("w")->constant->raw()) << "20 elements: shared";
  EXPECT_NE(b->constant->raw(), g->lookup("b")->constant->raw()) << "2 elements: copied";
  auto p1 = plan_host(std::move(g));
  auto p2 = plan_host(std::move(*c));
  ASSERT_TRUE(p1 && p2);
  for (bool cond : {true, false}) {
    auto r1 = run_plan(*p1, inputs(cond));
    auto r2 = run_plan(*p2, inputs(cond));
    ASSERT_TRUE(r1 && r2);
    expect_identical(*r1, *r2);
  }
}

TEST(EngineFile, DamageIsNamed) {
  auto plan = plan_host(parse(kModel));
  ASSERT_TRUE(plan);
  const std::string good = *written(*plan);
  EXPECT_EQ(load_error(good), "");

  EXPECT_NE(load_error("").find("not a kiln engine file"), std::string::npos);
  EXPECT_NE(load_error("PK\x03\x04 a zip file, not an engine").find("not a kiln engine file"), std::string::npos);
  EXPECT_NE(load_error(R"({"format": "kiln-artifact-0", "onnx": "m.onnx"})").find("older kiln"), std::string::npos);

  std::string v2 = good;
  v2[8] = 2;
  EXPECT_NE(load_error(v2).find("format version 2, this kiln reads version 1"), std::string::npos);

  for (size_t cut : {size_t(10), size_t(40), good.size() / 2, good.size() - 1}) {
    EXPECT_NE(load_error(good.substr(0, cut)).find("truncated"), std::string::npos) << "cut at " << cut;
  }
  EXPECT_NE(load_error(good + "xx").find("oversized"), std::string::npos);

  // Any one byte changed after the magic and version: the checksum says so.
  for (size_t at = 16; at < good.size(); at += 97) {
    std::string bad = good;
    bad[at] = char(bad[at] ^ 0x20);
    std::string e = load_error(bad);
    EXPECT_TRUE(e.find("checksum mismatch") != std::string::npos || e.find("bytes, its header says") != std::string::npos)
        << "byte " << at << ": " << e;
  }
}

TEST(EngineFile, InconsistentPlansAreRejected) {
  auto plan = plan_host(parse(kModel));
  ASSERT_TRUE(plan);
  // A step reading a slot nothing wrote, a step pointing past the graph's nodes, a freed slot
  // that does not exist: verify_plan names each, whether the plan came from a file or not.
  {
    auto p = plan_host(parse(kModel));
    p->steps[1].inputs[0].index = p->slots + 5;
    EXPECT_NE(verify_plan(*p).message().find("reads a slot"), std::string::npos);
  }
  {
    auto p = plan_host(parse(kModel));
    p->steps[0].node = 999;
    EXPECT_NE(verify_plan(*p).message().find("node out of range"), std::string::npos);
  }
  {
    auto p = plan_host(parse(kModel));
    p->steps[0].frees.push_back(p->slots);
    EXPECT_NE(verify_plan(*p).message().find("frees a slot"), std::string::npos);
    // Written to a file with a valid checksum, the reader runs the same check.
    auto bytes = write_engine_file(nlohmann::json::object(), *p);
    ASSERT_TRUE(bytes);
    EXPECT_NE(load_error(*bytes).find("frees a slot"), std::string::npos);
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A GPU engine's file leaves its graph's weights out (its device plan carries them): the file is
// smaller by the weights and reads back with the large constants declared but empty.
TEST(EngineFile, WithoutGraphWeights) {
  auto plan = plan_host(parse(kModel));
  ASSERT_TRUE(plan);
  nlohmann::json meta = {{"device", "cpu"}, {"graph_weights", false}};
  auto bytes = write_engine_file(meta, *plan);
  ASSERT_TRUE(bytes) << bytes.status().message();
  auto with = written(*plan);
  EXPECT_LT(bytes->size() + 20 * sizeof(float), with->size() + 64);  // %w's 80 bytes are gone
  auto f = read_engine_file(std::make_shared<const std::string>(*bytes), "m.kiln");
  ASSERT_TRUE(f) << f.status().message();
  bool found = false;
  for (const auto& v : f->plan.graph->values) {
    if (v->name == "w") {
      found = true;
      ASSERT_TRUE(v->constant);
      EXPECT_EQ(v->constant->raw(), nullptr);
      EXPECT_EQ(v->constant->dims(), (std::vector<int64_t>{20}));
    }
    if (v->name == "b") {
      EXPECT_NE(v->constant->raw(), nullptr);  // inline constants stay
    }
  }
  EXPECT_TRUE(found);
  // Saved again from what was read: still no weights, still readable.
  auto again = write_engine_file(f->meta, f->plan);
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_TRUE(read_engine_file(std::make_shared<const std::string>(*again), "m.kiln"));
}

}  // namespace
}  // namespace kiln
