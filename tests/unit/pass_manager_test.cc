// The pass manager: option checking, the verifier between passes naming the pass that broke the
// graph, IR dumps, the report, disabled passes, and that the default pipeline reaches a fixpoint
// (a second run changes nothing).
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "ir/text.h"
#include "ir/verifier.h"
#include "passes/pipeline.h"

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

}  // namespace
}  // namespace kiln
