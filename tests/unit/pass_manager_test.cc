// The pass manager: option checking, the verifier between passes naming the pass that broke the
// graph, IR dumps, the report, disabled passes, and that the default pipeline reaches a fixpoint
// (a second run changes nothing), and the provenance of removed nodes (Graph::absorbed).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include "ir/text.h"
#include "ir/verifier.h"
#include "passes/pipeline.h"
#include "passes/rewrite.h"

namespace kiln {
namespace {

const char* kModel = R"(graph main(%x: f32[2,3]) {
  %c = const dense<f32[3]> [1.0, 2.0, 3.0]
  %i = Identity(%x) : f32[2,3]
  %a = Add(%i, %c) : f32[2,3] @add
  %d = Relu(%x) : f32[2,3] @unused
  return %a
}
)";

std::unique_ptr<Graph> model() {
  auto g = parse_graph(kModel);
  EXPECT_TRUE(g) << g.status().message();
  return std::move(*g);
}

Pass noop_pass(std::string name) {
  return {std::move(name), "test", [](Graph&) -> Expected<bool> { return false; }};
}

TEST(PassManager, UnknownDisabledPassIsAnErrorListingTheValidOnes) {
  auto g = model();
  PassOptions opt;
  opt.disabled = {"no-such-pass"};
  auto r = run_passes(*g, default_pipeline(), opt);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("unknown pass 'no-such-pass'"), std::string::npos) << r.status().message();
  for (const Pass& p : default_pipeline()) {
    EXPECT_NE(r.status().message().find(p.name), std::string::npos) << p.name;
  }
  opt.disabled.clear();
  opt.dump_ir_after = "nope";
  EXPECT_FALSE(run_passes(*g, default_pipeline(), opt));
}

TEST(PassManager, DisabledPassDoesNotRun) {
  auto g = model();
  bool ran = false;
  std::vector<Pass> passes = {{"mark", "test", [&](Graph&) -> Expected<bool> { ran = true; return true; }}};
  PassOptions opt;
  opt.disabled = {"mark"};
  auto r = run_passes(*g, passes, opt);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_FALSE(ran);
  ASSERT_EQ(r->passes.size(), 1u);
  EXPECT_TRUE(r->passes[0].skipped);
  EXPECT_NE(r->to_text().find("disabled"), std::string::npos);
}

TEST(PassManager, VerifierNamesThePassThatBrokeTheGraph) {
  auto g = model();
  // Makes the first node read the last node's output: a use before its definition.
  Pass broken{"break-ssa", "test", [](Graph& gr) -> Expected<bool> {
                gr.nodes.front()->inputs[0] = gr.nodes.back()->outputs[0];
                return true;
              }};
  PassOptions opt;
  opt.verify = true;
  auto r = run_passes(*g, {noop_pass("first"), broken, noop_pass("after")}, opt);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("pass 'break-ssa'"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find("'first'"), std::string::npos) << r.status().message();
}

TEST(PassManager, VerifyOffLetsABrokenPassThrough) {
  auto g = model();
  Pass broken{"break-ssa", "test", [](Graph& gr) -> Expected<bool> {
                gr.nodes.front()->inputs[0] = gr.nodes.back()->outputs[0];
                return true;
              }};
  PassOptions opt;
  opt.verify = false;
  EXPECT_TRUE(run_passes(*g, {broken}, opt));
}

TEST(PassManager, PassErrorsNameThePass) {
  auto g = model();
  Pass failing{"fails", "test", [](Graph&) -> Expected<bool> { return KILN_ERROR(kUnsupported, "cannot"); }};
  auto r = run_passes(*g, {failing});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.status().message(), "pass 'fails': cannot");
}

TEST(PassManager, DumpIrAfterOnePassOrAll) {
  auto g = model();
  std::ostringstream out;
  PassOptions opt;
  opt.dump_ir_after = "canonicalize";
  opt.dump_to = &out;
  ASSERT_TRUE(run_passes(*g, default_pipeline(), opt));
  std::string s = out.str();
  EXPECT_EQ(s.rfind("// IR after canonicalize\n", 0), 0u) << s;
  EXPECT_EQ(s.find("// IR after", 1), std::string::npos) << "dumped after other passes too:\n" << s;
  // The dump is the IR at that point: Identity gone, the dead Relu not yet (dce runs last).
  auto dumped = parse_graph(s.substr(s.find('\n') + 1));
  ASSERT_TRUE(dumped) << dumped.status().message();
  EXPECT_EQ(s.find("Identity"), std::string::npos) << s;
  EXPECT_NE(s.find("Relu"), std::string::npos) << s;

  auto g2 = model();
  std::ostringstream all;
  opt.dump_ir_after = "all";
  opt.dump_to = &all;
  ASSERT_TRUE(run_passes(*g2, default_pipeline(), opt));
  for (const Pass& p : default_pipeline()) {
    EXPECT_NE(all.str().find("// IR after " + p.name), std::string::npos) << p.name;
  }
}

TEST(PassManager, ReportCountsNodesAndChanges) {
  auto g = model();
  auto r = run_passes(*g, default_pipeline());
  ASSERT_TRUE(r) << r.status().message();
  ASSERT_EQ(r->passes.size(), default_pipeline().size());
  EXPECT_EQ(r->passes.front().nodes_before, 3u);
  EXPECT_EQ(r->passes.back().nodes_after, g->nodes.size());
  EXPECT_EQ(g->nodes.size(), 1u) << print_graph(*g);  // Identity and the unread Relu are gone
  bool any = false;
  for (const PassRecord& p : r->passes) any = any || p.changed;
  EXPECT_TRUE(any);
  std::string t = r->to_text();
  for (const Pass& p : default_pipeline()) EXPECT_NE(t.find(p.name), std::string::npos) << t;
  EXPECT_NE(t.find("total"), std::string::npos) << t;
  // Node names of survivors are kept.
  EXPECT_EQ(g->nodes[0]->name, "add");
  EXPECT_EQ(g->outputs[0]->name, "a");
}

TEST(PassManager, DefaultPipelineIsAFixpoint) {
  auto g = model();
  ASSERT_TRUE(run_passes(*g, default_pipeline()));
  std::string once = print_graph(*g);
  auto r = run_passes(*g, default_pipeline());
  ASSERT_TRUE(r);
  for (const PassRecord& p : r->passes) EXPECT_FALSE(p.changed) << p.name << " changed a second time";
  EXPECT_EQ(print_graph(*g), once);
}

TEST(PassManager, PipelineNamesAreKebabCaseAndUnique) {
  std::set<std::string> seen;
  for (const Pass& p : default_pipeline()) {
    EXPECT_TRUE(seen.insert(p.name).second) << p.name;
    EXPECT_FALSE(p.reason.empty()) << p.name;
    for (char c : p.name) EXPECT_TRUE((c >= 'a' && c <= 'z') || c == '-') << p.name;
  }
}

// A MatMul + bias Add that fuse into a Gemm, an Identity and a dead node.
constexpr const char* kFusedAndDeadNodes = R"(graph main(%a: f32[4,2]) {
  %w = const dense<f32[2,3]> [1.0, 2.0, 3.0, -1.0, 0.5, 0.25]
  %b = const dense<f32[3]> [0.5, -0.5, 1.0]
  %m = MatMul(%a, %w) : f32[4,3] @fc
  %y = Add(%m, %b) : f32[4,3] @fc_bias
  %i = Identity(%y) : f32[4,3] @id
  %d = Relu(%a) : f32[4,2] @dead
  return %i
}
)";

// Every node the pipeline removes is recorded with the pass that removed it and, for a fusion,
// the node that now does its work.
TEST(PassManager, RemovedNodesRecordWhereTheirWorkWent) {
  auto g = parse_graph(kFusedAndDeadNodes);
  ASSERT_TRUE(g) << g.status().message();
  ASSERT_TRUE(run_passes(**g, default_pipeline()));
  std::map<std::string, std::pair<std::string, std::string>> got;  // node -> (pass, into)
  for (const Absorbed& a : (*g)->absorbed) got[a.node] = {a.pass, a.into ? a.into->describe() : ""};
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ((*g)->nodes.size(), 1u);
  const std::string gemm = (*g)->nodes[0]->describe();
  EXPECT_NE(gemm.find("Gemm"), std::string::npos) << gemm;
  auto find = [&](const std::string& name) {
    for (const auto& [node, v] : got) {
      if (node.find("'" + name + "'") != std::string::npos) return v;
    }
    return std::pair<std::string, std::string>{"missing", ""};
  };
  EXPECT_EQ(find("fc_bias"), std::make_pair(std::string("fuse-matmul-add"), gemm));
  EXPECT_EQ(find("id"), std::make_pair(std::string("canonicalize"), std::string()));
  EXPECT_EQ(find("dead").second, "");
  EXPECT_NE(find("dead").first, "missing");
}

// Without provenance (a dynamic engine's shape plans made while serving) the pipeline makes the
// same graph and keeps no records, not even the ones passes note themselves, whose targets later
// passes may free.
TEST(PassManager, WithoutProvenanceTheGraphIsTheSameAndNothingIsRecorded) {
  auto with = parse_graph(kFusedAndDeadNodes);
  auto without = parse_graph(kFusedAndDeadNodes);
  ASSERT_TRUE(with && without);
  PassOptions off;
  off.track_provenance = false;
  ASSERT_TRUE(run_passes(**with, default_pipeline()));
  ASSERT_TRUE(run_passes(**without, default_pipeline(), off));
  EXPECT_EQ(print_graph(**without), print_graph(**with));
  EXPECT_FALSE((*with)->absorbed.empty());
  EXPECT_TRUE((*without)->absorbed.empty());
}

// A node fused into one that a later pass fuses in turn ends up pointing at the last one.
TEST(PassManager, ProvenanceFollowsLaterFusions) {
  auto g = parse_graph(R"(graph main(%x: f32[2]) {
  %p = Relu(%x) : f32[2] @a
  %q = Relu(%p) : f32[2] @b
  %r = Relu(%q) : f32[2] @c
  return %r
}
)");
  ASSERT_TRUE(g) << g.status().message();
  // Folds the producer of `victim`'s input into `victim` (rewiring it to the graph input).
  auto fold_into = [](std::string victim) {
    return [victim](Graph& gr) -> Expected<bool> {
      UseMap uses(gr);
      Node* keep = nullptr;
      for (const auto& n : gr.nodes) {
        if (n->name == victim) keep = n.get();
      }
      Node* gone = keep->inputs[0]->producer;
      gr.note_absorbed(*gone, *keep);
      uses.set_input(keep, 0, gr.inputs[0]);
      return erase_unused(uses, {gone}) > 0;
    };
  };
  std::vector<Pass> passes = {{"first", "test", fold_into("b")}, {"second", "test", fold_into("c")}};
  ASSERT_TRUE(run_passes(**g, passes));
  ASSERT_EQ((*g)->absorbed.size(), 2u);
  ASSERT_EQ((*g)->nodes.size(), 1u);
  const Node* c = (*g)->nodes[0].get();
  EXPECT_NE((*g)->absorbed[0].node.find("'a'"), std::string::npos);
  EXPECT_EQ((*g)->absorbed[0].pass, "first");
  EXPECT_EQ((*g)->absorbed[0].into, c);
  EXPECT_NE((*g)->absorbed[1].node.find("'b'"), std::string::npos);
  EXPECT_EQ((*g)->absorbed[1].pass, "second");
  EXPECT_EQ((*g)->absorbed[1].into, c);
}

}  // namespace
}  // namespace kiln
