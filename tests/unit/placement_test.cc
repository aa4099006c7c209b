// The placer (src/runtime/placement.h) against a scripted device backend: known inputs fold, the
// device's lowerings and declines are recorded with their reasons, declined nodes become host
// steps when the CPU backend runs them, fused nodes name their target, and a node nobody runs is
// an error naming both reasons.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "backends/backend.h"
#include "ir/text.h"
#include "runtime/placement.h"

namespace kiln {
namespace {

class FakeDevice : public StepBackend {
 public:
  std::set<OpKind> lowers;                  // ops it lowers (Identity as an alias)
  std::map<std::string, std::string> fused;  // node name -> name of the node that covers it
  std::vector<std::string> lowered, host;   // node names, in the order they came
  const Graph* g = nullptr;

  std::string_view name() const override { return "fake"; }
  const Node* fused_into(const Node& n) const override {
    auto it = fused.find(n.name);
    if (it == fused.end()) return nullptr;
    for (const auto& m : g->nodes) {
      if (m->name == it->second) return m.get();
    }
    return nullptr;
  }
  const Tensor* constant(const Value* v) const override {
    auto it = known.find(v);
    if (it != known.end()) return &it->second;
    return v->constant ? &*v->constant : nullptr;
  }
  void set_constant(const Value* v, Tensor t) override { known[v] = std::move(t); }
  Expected<Lowered> lower(const Node& n) override {
    if (!lowers.count(n.op)) return KILN_ERROR(kUnsupported, "no fake lowering for {}", op_name(n.op));
    lowered.push_back(n.name);
    return Lowered{n.op == OpKind::kIdentity, n.op == OpKind::kIdentity ? "no work" : "fake kernel"};
  }
  Status lower_host(const Node& n) override {
    host.push_back(n.name);
    return Status::ok();
  }

 private:
  std::map<const Value*, Tensor> known;
};

std::unique_ptr<Graph> parse(const char* text) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message();
  return std::move(*g);
}

TEST(Placement, FoldsLowersFallsBackAndNamesWhy) {
  auto g = parse(R"(graph main(%x: f32[4]) {
  %c = const dense<f32[4]> [1.0, 2.0, 3.0, 4.0]
  %k = Neg(%c) : f32[4]
  %a = Add(%x, %k) : f32[4]
  %r = Relu(%a) : f32[4]
  %i = Identity(%r) : f32[4]
  %s = Sigmoid(%i) : f32[4]
  return %s
})");
  FakeDevice dev;
  dev.g = g.get();
  dev.lowers = {OpKind::kAdd, OpKind::kIdentity, OpKind::kSigmoid};
  // Name the nodes so the fake can refer to them.
  const char* names[] = {"neg", "add", "relu", "id", "sig"};
  for (size_t i = 0; i < g->nodes.size(); ++i) g->nodes[i]->name = names[i];
  dev.fused = {{"sig", "add"}};
  auto cpu = make_cpu_backend();
  auto rows = place_nodes(*g, dev, *cpu);
  ASSERT_TRUE(rows) << rows.status().message();
  ASSERT_EQ(rows->size(), 5u);
  EXPECT_EQ((*rows)[0].placement, Placement::kFolded);  // Neg of a constant
  ASSERT_TRUE(dev.constant(g->nodes[0]->outputs[0]));
  EXPECT_EQ(dev.constant(g->nodes[0]->outputs[0])->data<float>()[2], -3.0f);
  EXPECT_EQ((*rows)[1].placement, Placement::kDevice);
  EXPECT_EQ((*rows)[1].impl, "fake kernel");
  EXPECT_EQ((*rows)[2].placement, Placement::kHost);  // Relu: declined, the CPU backend runs it
  EXPECT_EQ((*rows)[2].why, "no fake lowering for Relu");
  EXPECT_EQ((*rows)[3].placement, Placement::kAlias);
  EXPECT_EQ((*rows)[4].impl, "fused");
  EXPECT_EQ((*rows)[4].why, "into " + g->nodes[1]->describe());
  EXPECT_EQ(fused_into((*rows)[4]), g->nodes[1]->describe());
  EXPECT_EQ(fused_into((*rows)[1]), std::nullopt);
  EXPECT_EQ(dev.lowered, (std::vector<std::string>{"add", "id"}));
  EXPECT_EQ(dev.host, (std::vector<std::string>{"relu"}));
  EXPECT_EQ(placement_name(Placement::kDevice, "fake"), "fake");
  EXPECT_EQ(placement_name(Placement::kHost), "cpu");
  // The fused row takes its target's kernel in the report.
  add_provenance(*g, *rows);
  EXPECT_EQ((*rows)[4].impl, "fake kernel");
  EXPECT_EQ((*rows)[4].why, "fused into " + g->nodes[1]->describe());
  EXPECT_EQ(fused_into((*rows)[4]), g->nodes[1]->describe());  // read the same after provenance
}

// A host backend that runs nothing.
class NoHost : public Backend {
 public:
  std::string_view name() const override { return "nohost"; }
  bool supports(const Node& n, std::string* reason) const override {
    *reason = "runs nothing";
    return false;
  }
  Expected<std::unique_ptr<Executable>> compile(const Graph&) override { return KILN_ERROR(kUnsupported, "no"); }
};

// A Transpose of a constant over the fold bound folds when only GEMM weights read it (the dynamo
// exporter's tied LM head), and stays a device step when anything else reads it too.
TEST(Placement, ATransposedWeightFoldsWhateverItsSize) {
  for (bool other_reader : {false, true}) {
    auto g = parse(R"(graph main(%x: f32[2,2]) {
  %w = const dense<f32[2,2]> [1.0, 2.0, 3.0, 4.0]
  %t = Transpose(%w) {perm = [1, 0]} : f32[2,2]
  %y = MatMul(%x, %t) : f32[2,2]
  %r = Relu(%t) : f32[2,2]
  return %y, %r
})");
    if (!other_reader) {  // the Relu and its output go
      g->outputs.pop_back();
      g->nodes.pop_back();
    }
    // Over 2^24 elements: [4097, 4096], the last row 1..4096, the rest zeros.
    const int64_t rows = 4097, cols = 4096;
    auto w = Tensor::create(DType::kFloat32, {rows, cols});
    ASSERT_TRUE(w);
    for (int64_t j = 0; j < cols; ++j) w->data<float>()[(rows - 1) * cols + j] = float(j + 1);
    Value* wv = g->nodes[0]->inputs[0];
    wv->constant = std::move(*w);
    wv->type.shape = Shape({Dim(rows), Dim(cols)});
    g->nodes[0]->outputs[0]->type.shape = Shape({Dim(cols), Dim(rows)});
    FakeDevice dev;
    dev.g = g.get();
    dev.lowers = {OpKind::kTranspose, OpKind::kMatMul, OpKind::kRelu};
    auto cpu = make_cpu_backend();
    auto rows_or = place_nodes(*g, dev, *cpu);
    ASSERT_TRUE(rows_or) << rows_or.status().message();
    const Tensor* t = dev.constant(g->nodes[0]->outputs[0]);
    if (other_reader) {
      EXPECT_EQ((*rows_or)[0].placement, Placement::kDevice);
      EXPECT_EQ(t, nullptr);
      continue;
    }
    EXPECT_EQ((*rows_or)[0].placement, Placement::kFolded);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->dims(), (std::vector<int64_t>{cols, rows}));
    EXPECT_EQ(t->data<float>()[5 * rows + rows - 1], 6.0f);  // t[5][4096] = w[4096][5]
    EXPECT_EQ(t->data<float>()[5 * rows + 3], 0.0f);
  }
}

TEST(Placement, ANodeNoBackendRunsIsAnErrorWithBothReasons) {
  auto g = parse(R"(graph main(%x: f32[4]) {
  %r = Relu(%x) : f32[4]
  return %r
})");
  FakeDevice dev;
  dev.g = g.get();
  NoHost none;
  auto rows = place_nodes(*g, dev, none);
  ASSERT_FALSE(rows);
  EXPECT_NE(rows.status().message().find("no backend can run it (fake: no fake lowering for Relu; nohost: runs nothing)"),
            std::string::npos)
      << rows.status().message();
  EXPECT_TRUE(dev.host.empty());
}

}  // namespace
}  // namespace kiln
