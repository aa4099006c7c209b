// The IR verifier: a valid graph passes, and each invariant, broken on purpose, is reported with
// the node it concerns.
#include <gtest/gtest.h>

#include "ir/text.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

Status ok_infer(InferCtx&) { return Status::ok(); }

// Schemas of our own, so these tests do not depend on which ops are declared so far.
const OpRegistry& test_registry() {
  static const OpRegistry r = [] {
    OpRegistry reg;
    reg.def(OpKind::kRelu, {.inputs = {1, 1}, .infer = ok_infer});
    reg.def(OpKind::kAdd, {.inputs = {2, 2}, .infer = ok_infer});
    reg.def(OpKind::kConv, {.inputs = {2, 3},
                            .attrs = {{"strides", Attribute::Kind::kInts}, {"group", Attribute::Kind::kInt}},
                            .infer = ok_infer});
    reg.def(OpKind::kDropout, {.inputs = {1, 3}, .outputs = {1, 2}, .infer = ok_infer});
    reg.def(OpKind::kLeakyRelu, {.inputs = {1, 1}, .attrs = {{"alpha", Attribute::Kind::kFloat}}, .infer = ok_infer});
    reg.def(OpKind::kIf, {.inputs = {1, 1}, .outputs = {1, kVariadic},
                          .attrs = {{"then_branch", Attribute::Kind::kGraph, true},
                                    {"else_branch", Attribute::Kind::kGraph, true}},
                          .infer = ok_infer});
    return reg;
  }();
  return r;
}

const char* kGood = R"(graph main(%c: bool[], %x: f32[N,4]) {
  %w = const dense<f32[4,4]> [0.0]
  %a = Relu(%x) : f32[N,4] @relu
  %y = If(%c) {else_branch = graph e() {
    return %a
  }, then_branch = graph t() {
    %t = Add(%a, %x) : f32[N,4] @inner_add
    return %t
  }} : f32[N,4] @if1
  %z = Conv(%y, %w) {group = 1, strides = [1, 1]} : f32[N,4] @conv
  %d, _ = Dropout(%z, _, _) : f32[N,4] @drop
  %l = LeakyRelu(%d) {alpha = 1} : f32[N,4] @leaky
  return %l
}
)";

std::unique_ptr<Graph> good() {
  Expected<std::unique_ptr<Graph>> g = parse_graph(kGood);
  EXPECT_TRUE(g) << g.status().message();
  return std::move(*g);
}

std::string verify(const Graph& g) {
  Status s = verify_graph(g, test_registry());
  return s.is_ok() ? "ok" : s.message();
}

Node* node_named(Graph& g, const std::string& name) {
  for (auto& n : g.nodes) if (n->name == name) return n.get();
  return nullptr;
}
Graph* then_branch(Graph& g) { return node_named(g, "if1")->attrs.at("then_branch").g.get(); }

TEST(Verifier, AcceptsValidGraph) {
  auto g = good();
  EXPECT_EQ(verify(*g), "ok");
  EXPECT_TRUE(verify_graph(*g).is_ok());  // against the real registry too
  EXPECT_EQ(verify(*then_branch(*g)), "ok");  // a subgraph on its own sees its enclosing values
}

TEST(Verifier, UseBeforeDefinition) {
  auto g = good();
  std::swap(g->nodes[0], g->nodes[1]);  // If now reads %a (in its branches) before Relu defines it
  EXPECT_EQ(verify(*g), "in attribute 'else_branch' of node 'if1' (If, #1): graph 'e': output 0 'a' is used before "
                        "it is defined (nodes out of order?)");
}

TEST(Verifier, InputFromAnotherGraph) {
  auto g = good();
  Graph other;
  Value* stray = other.add_input("stray", Type());
  node_named(*g, "relu")->inputs[0] = stray;
  EXPECT_EQ(verify(*g), "node 'relu' (Relu, #0): input 0 'stray' is not defined in this graph or an enclosing one");
}

TEST(Verifier, NodesOutOfOrder) {
  auto g = good();
  std::swap(g->nodes[2], g->nodes[3]);  // Dropout before the Conv that feeds it
  EXPECT_EQ(verify(*g), "node 'drop' (Dropout, #3): input 0 'z' is used before it is defined (nodes out of order?)");
}

TEST(Verifier, SubgraphReadsValueDefinedAfterItsNode) {
  auto g = good();
  then_branch(*g)->nodes[0]->inputs[1] = g->lookup("z");
  EXPECT_EQ(verify(*g), "in attribute 'then_branch' of node 'if1' (If, #1): node 'inner_add' (Add, #0): input 1 'z' "
                        "is used before it is defined (nodes out of order?)");
}

TEST(Verifier, ValueWithTwoProducers) {
  auto g = good();
  // Leaky claims %z as its output too, while %z still records Conv as its producer.
  Value* z = g->lookup("z");
  Value* l = g->lookup("l");
  node_named(*g, "leaky")->outputs[0] = z;
  g->outputs[0] = z;
  std::erase_if(g->values, [&](const std::unique_ptr<Value>& v) { return v.get() == l; });
  EXPECT_EQ(verify(*g), "node 'leaky' (LeakyRelu, #4): output 0 'z' records its producer as node 'conv' (Conv, #2) "
                        "output 0");
}

TEST(Verifier, ValueDefinedTwice) {
  auto g = good();
  g->inputs.push_back(g->inputs[1]);
  EXPECT_EQ(verify(*g), "value 'x' is defined twice (again as graph input 2)");
}

TEST(Verifier, ProducerOutsideTheGraph) {
  auto g = good();
  g->lookup("a")->producer = then_branch(*g)->nodes[0].get();
  EXPECT_EQ(verify(*g), "value 'a' names a producer that is not a node of graph 'main'");
}

TEST(Verifier, OutputNotListedByItsProducer) {
  auto g = good();
  g->lookup("z")->producer_output = 1;
  EXPECT_EQ(verify(*g), "value 'z' claims to be output 1 of node 'conv' (Conv, #2), which does not list it there");
}

TEST(Verifier, OutputRecordsAnotherProducer) {
  auto g = good();
  Node* relu = node_named(*g, "relu");
  Value* extra = g->add_value("extra", Type());
  extra->producer = node_named(*g, "conv");
  extra->producer_output = 0;
  relu->outputs.push_back(extra);
  EXPECT_EQ(verify(*g), "value 'extra' claims to be output 0 of node 'conv' (Conv, #2), which does not list it there");
}

TEST(Verifier, OwnerPointers) {
  {
    auto g = good();
    node_named(*g, "conv")->owner = nullptr;
    EXPECT_EQ(verify(*g), "node 'conv' (Conv, #2): its owner is not graph 'main', which holds it");
  }
  {
    auto g = good();
    g->lookup("a")->owner = then_branch(*g);
    EXPECT_EQ(verify(*g), "value 'a' is listed in graph 'main' but its owner is another graph");
  }
  {
    auto g = good();
    then_branch(*g)->parent = nullptr;
    EXPECT_EQ(verify(*g), "node 'if1' (If, #1): subgraph 't' of attribute 'then_branch' has parent/parent_node pointing "
                          "elsewhere");
  }
}

TEST(Verifier, GraphOutputUndefined) {
  auto g = good();
  Graph other;
  g->outputs.push_back(other.add_input("ghost", Type()));
  EXPECT_EQ(verify(*g), "graph 'main': output 1 'ghost' is not defined in this graph or an enclosing one");
  g->outputs.back() = nullptr;
  EXPECT_EQ(verify(*g), "graph 'main': output 1 is null");
}

TEST(Verifier, DuplicateNames) {
  {
    auto g = good();
    g->lookup("z")->name = "a";
    EXPECT_EQ(verify(*g), "output 0 of node 'conv' (Conv, #2) reuses the name 'a' of another value");
  }
  {
    auto g = good();
    then_branch(*g)->nodes[0]->outputs[0]->name = "x";  // shadows the outer %x
    EXPECT_EQ(verify(*g), "in attribute 'then_branch' of node 'if1' (If, #1): output 0 of node 'inner_add' (Add, #0) "
                          "reuses the name 'x' of another value in an enclosing graph");
  }
  {
    auto g = good();
    g->lookup("w")->name = "";
    EXPECT_EQ(verify(*g), "constant has an empty name");
  }
}

TEST(Verifier, Arity) {
  auto g = good();
  Node* relu = node_named(*g, "relu");
  relu->inputs.push_back(g->inputs[1]);
  EXPECT_EQ(verify(*g), "node 'relu' (Relu, #0): has 2 inputs, expected 1");
  relu->inputs.pop_back();
  node_named(*g, "drop")->inputs.push_back(nullptr);
  EXPECT_EQ(verify(*g), "node 'drop' (Dropout, #3): has 4 inputs, expected 1 to 3");
  node_named(*g, "drop")->inputs.resize(3);
  node_named(*g, "conv")->inputs[1] = nullptr;
  EXPECT_EQ(verify(*g), "node 'conv' (Conv, #2): required input 1 is omitted");
}

TEST(Verifier, Attributes) {
  {
    auto g = good();
    node_named(*g, "if1")->attrs.erase("else_branch");
    EXPECT_EQ(verify(*g), "node 'if1' (If, #1): missing required attribute 'else_branch' (graph)");
  }
  {
    auto g = good();
    node_named(*g, "conv")->attrs["strides"] = Attribute::of_int(1);
    EXPECT_EQ(verify(*g), "node 'conv' (Conv, #2): attribute 'strides' is int, expected ints");
  }
  {
    auto g = good();
    node_named(*g, "leaky")->attrs["alpha"] = Attribute::of_string("0.1");
    EXPECT_EQ(verify(*g), "node 'leaky' (LeakyRelu, #4): attribute 'alpha' is string, expected float");
  }
}

TEST(Verifier, ErrorsInsideSubgraphsCarryTheirPath) {
  auto g = good();
  then_branch(*g)->nodes[0]->inputs.pop_back();
  EXPECT_EQ(verify(*g), "in attribute 'then_branch' of node 'if1' (If, #1): node 'inner_add' (Add, #0): has 1 inputs, "
                        "expected 2");
}

}  // namespace
}  // namespace kiln
