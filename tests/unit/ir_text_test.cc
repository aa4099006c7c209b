// The text IR: exact canonical output, print -> parse -> print identity, structural equality of
// the parsed graph, parse errors with positions, and the Graphviz writer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <regex>
#include <sstream>

#include "ir/dot.h"
#include "ir/text.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

const Dim N = Dim::symbol("N");

// ---- structural comparison ------------------------------------------------------------------

void expect_same_graph(const Graph& a, const Graph& b, const std::string& where);

void expect_same_tensor(const Tensor& a, const Tensor& b, const std::string& where) {
  ASSERT_EQ(a.dtype(), b.dtype()) << where;
  ASSERT_EQ(a.dims(), b.dims()) << where;
  if (a.dtype() == DType::kString) {
    for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.data<std::string>()[i], b.data<std::string>()[i]) << where;
  } else {
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << where << ": tensor bytes differ";
  }
}

bool same_float(float x, float y) { return std::memcmp(&x, &y, 4) == 0 || (std::isnan(x) && std::isnan(y)); }

void expect_same_attr(const Attribute& a, const Attribute& b, const std::string& where) {
  ASSERT_EQ(attr_kind_name(a.kind), attr_kind_name(b.kind)) << where;
  switch (a.kind) {
    case Attribute::Kind::kFloat: EXPECT_TRUE(same_float(a.f, b.f)) << where << ": " << a.f << " vs " << b.f; break;
    case Attribute::Kind::kInt: EXPECT_EQ(a.i, b.i) << where; break;
    case Attribute::Kind::kString: EXPECT_EQ(a.s, b.s) << where; break;
    case Attribute::Kind::kTensor: expect_same_tensor(a.t, b.t, where); break;
    case Attribute::Kind::kGraph: expect_same_graph(*a.g, *b.g, where); break;
    case Attribute::Kind::kFloats:
      ASSERT_EQ(a.floats.size(), b.floats.size()) << where;
      for (size_t i = 0; i < a.floats.size(); ++i) EXPECT_TRUE(same_float(a.floats[i], b.floats[i])) << where;
      break;
    case Attribute::Kind::kInts: EXPECT_EQ(a.ints, b.ints) << where; break;
    case Attribute::Kind::kStrings: EXPECT_EQ(a.strings, b.strings) << where; break;
    case Attribute::Kind::kTensors:
      ASSERT_EQ(a.tensors.size(), b.tensors.size()) << where;
      for (size_t i = 0; i < a.tensors.size(); ++i) expect_same_tensor(a.tensors[i], b.tensors[i], where);
      break;
    case Attribute::Kind::kGraphs:
      ASSERT_EQ(a.graphs.size(), b.graphs.size()) << where;
      for (size_t i = 0; i < a.graphs.size(); ++i) expect_same_graph(*a.graphs[i], *b.graphs[i], where);
      break;
    case Attribute::Kind::kType:
    case Attribute::Kind::kTypes: EXPECT_EQ(a.types, b.types) << where; break;
  }
}

std::string name_of(const Value* v) { return v ? v->name : "<omitted>"; }

void expect_same_graph(const Graph& a, const Graph& b, const std::string& where) {
  std::string w = where + "/" + a.name;
  EXPECT_EQ(a.name, b.name) << w;
  ASSERT_EQ(a.inputs.size(), b.inputs.size()) << w;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    EXPECT_EQ(a.inputs[i]->name, b.inputs[i]->name) << w;
    EXPECT_EQ(a.inputs[i]->type, b.inputs[i]->type) << w << " input " << i;
    ASSERT_EQ(a.inputs[i]->constant.has_value(), b.inputs[i]->constant.has_value()) << w;
    if (a.inputs[i]->constant) expect_same_tensor(*a.inputs[i]->constant, *b.inputs[i]->constant, w);
  }
  auto constants = [](const Graph& g) {
    std::vector<const Value*> c;
    for (const auto& v : g.values) {
      bool input = std::find(g.inputs.begin(), g.inputs.end(), v.get()) != g.inputs.end();
      if (v->constant && !v->producer && !input) c.push_back(v.get());
    }
    return c;
  };
  auto ca = constants(a), cb = constants(b);
  ASSERT_EQ(ca.size(), cb.size()) << w;
  for (size_t i = 0; i < ca.size(); ++i) {
    EXPECT_EQ(ca[i]->name, cb[i]->name) << w;
    EXPECT_EQ(ca[i]->type, cb[i]->type) << w;
    expect_same_tensor(*ca[i]->constant, *cb[i]->constant, w + " constant " + ca[i]->name);
  }
  ASSERT_EQ(a.nodes.size(), b.nodes.size()) << w;
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const Node &x = *a.nodes[i], &y = *b.nodes[i];
    std::string nw = w + " " + x.describe();
    EXPECT_EQ(x.op, y.op) << nw;
    EXPECT_EQ(x.name, y.name) << nw;
    ASSERT_EQ(x.inputs.size(), y.inputs.size()) << nw;
    for (size_t j = 0; j < x.inputs.size(); ++j) EXPECT_EQ(name_of(x.inputs[j]), name_of(y.inputs[j])) << nw;
    ASSERT_EQ(x.outputs.size(), y.outputs.size()) << nw;
    for (size_t j = 0; j < x.outputs.size(); ++j) {
      EXPECT_EQ(name_of(x.outputs[j]), name_of(y.outputs[j])) << nw;
      if (x.outputs[j] && y.outputs[j]) {
        EXPECT_EQ(x.outputs[j]->type, y.outputs[j]->type) << nw;
      }
    }
    ASSERT_EQ(x.attrs.size(), y.attrs.size()) << nw;
    for (const auto& [k, at] : x.attrs) {
      ASSERT_TRUE(y.attrs.count(k)) << nw << " lacks " << k;
      expect_same_attr(at, y.attrs.at(k), nw + " attr " + k);
    }
  }
  ASSERT_EQ(a.outputs.size(), b.outputs.size()) << w;
  for (size_t i = 0; i < a.outputs.size(); ++i) EXPECT_EQ(a.outputs[i]->name, b.outputs[i]->name) << w;
}

// Prints, parses, prints again: the texts must match and the graphs agree structurally.
std::unique_ptr<Graph> round_trip(const Graph& g, const PrintOptions& o = {}) {
  std::string text = print_graph(g, o);
  Expected<std::unique_ptr<Graph>> back = parse_graph(text);
  EXPECT_TRUE(back) << back.status().message() << "\n" << text;
  if (!back) return nullptr;
  EXPECT_EQ(print_graph(**back, o), text);
  return std::move(*back);
}

// Parses text that is already canonical: it must print back exactly and pass the verifier.
std::unique_ptr<Graph> parse_canonical(const char* text) {
  Expected<std::unique_ptr<Graph>> g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message();
  if (!g) return nullptr;
  EXPECT_EQ(print_graph(**g), text);
  EXPECT_TRUE(verify_graph(**g).is_ok()) << verify_graph(**g).message();
  return std::move(*g);
}

// Printing and parsing again gives the same graph.
void expect_round_trips(const Graph& g) {
  std::unique_ptr<Graph> again = round_trip(g);
  ASSERT_NE(again, nullptr);
  expect_same_graph(g, *again, "");
}

// A node with named outputs ("" = omitted), typed in order.
Node* add(Graph& g, OpKind op, std::vector<Value*> ins, std::vector<std::pair<std::string, Type>> outs,
          std::string name = "") {
  Node* n = g.add_node(op, std::move(ins), 0, std::move(name));
  for (auto& [oname, type] : outs) {
    if (oname.empty()) { n->outputs.push_back(nullptr); continue; }
    Value* v = g.add_value(oname, type);
    v->producer = n;
    v->producer_output = int(n->outputs.size());
    n->outputs.push_back(v);
  }
  return n;
}

Type f32(Shape s) { return Type::tensor(DType::kFloat32, std::move(s)); }

// ---- exact text -----------------------------------------------------------------------------

const char* kConvText = R"(graph main(%x: f32[N,3,224,224], %w: f32[2,2] = dense<f32[2,2]> [1.0, -0.5, 0.1, 1e+30]) {
  %b = const dense<f32[4]> [0.0, -0.0, inf, nan]
  %big = const dense<i32[5]> 0x0100000002000000030000000400000005000000
  %y = Conv(%x, %w, _) {pads = [3, 3, 3, 3], strides = [2, 2]} : f32[N,64,(N+1)/(2),112] @conv1
  %z = Relu(%y) : f32[N,64,(N+1)/(2),112]
  return %z, %w
}
)";

TEST(IrText, ExactCanonicalText) {
  PrintOptions o;
  o.max_inline_elements = 4;
  Expected<std::unique_ptr<Graph>> g = parse_graph(kConvText);
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_EQ(print_graph(**g, o), kConvText);
  const Graph& G = **g;
  ASSERT_EQ(G.inputs.size(), 2u);
  EXPECT_EQ(G.inputs[0]->type.to_string(), "f32[N,3,224,224]");
  ASSERT_TRUE(G.inputs[1]->constant.has_value());
  EXPECT_EQ(G.inputs[1]->constant->data<float>()[1], -0.5f);
  EXPECT_EQ(G.inputs[1]->constant->data<float>()[3], 1e30f);
  Value* b = G.lookup("b");
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(std::signbit(b->constant->data<float>()[1]));
  EXPECT_TRUE(std::isinf(b->constant->data<float>()[2]));
  EXPECT_TRUE(std::isnan(b->constant->data<float>()[3]));
  EXPECT_EQ(G.lookup("big")->constant->data<int32_t>()[4], 5);
  ASSERT_EQ(G.nodes.size(), 2u);
  const Node& conv = *G.nodes[0];
  EXPECT_EQ(conv.op, OpKind::kConv);
  EXPECT_EQ(conv.name, "conv1");
  EXPECT_EQ(conv.index, 0);
  ASSERT_EQ(conv.inputs.size(), 3u);
  EXPECT_EQ(conv.inputs[0], G.inputs[0]);
  EXPECT_EQ(conv.inputs[2], nullptr);
  EXPECT_EQ(conv.attr_ints("strides"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(conv.outputs[0]->producer, &conv);
  EXPECT_EQ(conv.outputs[0]->type.shape->dims[2], (N + Dim(1)) / Dim(2));
  EXPECT_EQ(G.nodes[1]->name, "");
  EXPECT_EQ(G.nodes[1]->inputs[0], conv.outputs[0]);
  EXPECT_EQ(G.outputs[1], G.inputs[1]);
  EXPECT_TRUE(verify_graph(G).is_ok()) << verify_graph(G).message();
}

TEST(IrText, CommentsWhitespaceAndSplat) {
  auto g = parse_graph(
      "# leading comment\ngraph g ( %x : f32 [ 2 * N ] ) {  // trailing\n"
      "  %c = const dense<i64[3]> [7]\n  %y = Add(%x,%c):f32[N*2]\n  return %y }");
  ASSERT_TRUE(g) << g.status().message();
  EXPECT_EQ(print_graph(**g), "graph g(%x: f32[2*N]) {\n  %c = const dense<i64[3]> [7, 7, 7]\n"
                              "  %y = Add(%x, %c) : f32[2*N]\n  return %y\n}\n");
}

// ---- round trips ----------------------------------------------------------------------------

TEST(IrText, RoundTripEveryAttributeKindAndOddNames) {
  Graph g;
  g.name = "all kinds";
  Value* x = g.add_input("0", f32({Dim::symbol("batch size"), 3}));
  Value* w = g.add_input("onnx::Conv_1/w:0", f32({3}));
  w->constant = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f}, {3});
  std::vector<float> iota(40);
  for (size_t i = 0; i < iota.size(); ++i) iota[i] = float(i) * 0.25f;
  g.add_constant("big weight", Tensor::from_vector<float>(iota, {5, 8}));
  Tensor labels = Tensor::create(DType::kString, {2}).value();
  labels.data<std::string>()[0] = "a\"b\\c";
  labels.data<std::string>()[1] = "tab\there\x01";
  g.add_constant("labels", labels);
  Value* ints = g.add_constant("u64", Tensor::from_vector<uint64_t>({18446744073709551615ull, 0}, {2}));
  ints->type = Type::tensor(DType::kUInt64, Shape({Dim::symbol("K")}));  // differs from the tensor's own
  g.add_constant("half", Tensor::from_vector<half>({half(0.1f), half(-65504.0f)}, {2}));
  g.add_constant("bf16", Tensor::from_vector<bfloat16>({bfloat16(3.0e38f)}, {}));
  g.add_constant("f8", Tensor::from_vector<f8e4m3fn>({f8e4m3fn(-448.0f), f8e4m3fn(0.015625f)}, {2}));
  g.add_constant("f64", Tensor::from_vector<double>({0.1, 1e-310}, {2}));
  g.add_constant("i8", Tensor::from_vector<int8_t>({-128, 127}, {2}));
  g.add_constant("flags", Tensor::from_vector<bool>({true, false}, {2}));
  g.add_constant("empty", Tensor::create(DType::kInt64, {0, 3}).value());

  Graph* sub = nullptr;
  Node* n = add(g, OpKind::kIdentity, {x}, {{"y", f32({Dim::symbol("batch size"), 3})}}, "odd node/name 1");
  n->attrs["f"] = Attribute::of_float(0.5f);
  n->attrs["f_whole"] = Attribute::of_float(2.0f);
  n->attrs["f_nan"] = Attribute::of_float(std::nanf(""));
  n->attrs["f_neg_inf"] = Attribute::of_float(-INFINITY);
  n->attrs["i"] = Attribute::of_int(-7);
  n->attrs["i_min"] = Attribute::of_int(std::numeric_limits<int64_t>::min());
  n->attrs["s"] = Attribute::of_string("hello\nworld \"q\"");
  n->attrs["t"] = Attribute::of_tensor(Tensor::from_vector<int64_t>({1, -2}, {2}));
  n->attrs["floats"] = Attribute::of_floats({1.5f, -0.0f, 1e-30f, 3.0f});
  n->attrs["floats_empty"] = Attribute::of_floats({});
  n->attrs["ints"] = Attribute::of_ints({1, 2, -3});
  n->attrs["ints_empty"] = Attribute::of_ints({});
  Attribute strs;
  strs.kind = Attribute::Kind::kStrings;
  strs.strings = {"a", "b c", ""};
  n->attrs["strings"] = strs;
  Attribute no_strs;
  no_strs.kind = Attribute::Kind::kStrings;
  n->attrs["strings_empty"] = no_strs;
  Attribute tensors;
  tensors.kind = Attribute::Kind::kTensors;
  tensors.tensors = {Tensor::scalar<float>(1.0f), Tensor::from_vector<int32_t>({4, 5}, {1, 2})};
  n->attrs["tensors"] = tensors;
  Attribute type;
  type.kind = Attribute::Kind::kType;
  type.types = {Type::tensor(DType::kFloat16, Shape({N}))};
  n->attrs["type"] = type;
  Attribute types;
  types.kind = Attribute::Kind::kTypes;
  types.types = {Type::sequence(f32({2})), Type::optional(Type::tensor(DType::kInt64)), Type()};
  n->attrs["types"] = types;
  Attribute graphs;
  graphs.kind = Attribute::Kind::kGraphs;
  auto sg = std::make_shared<Graph>();
  sg->name = "body";
  sg->parent = &g;
  sg->parent_node = n;
  Value* si = sg->add_input("s_in", f32({3}));
  Node* sn = add(*sg, OpKind::kMul, {si, w}, {{"s_out", f32({3})}});
  sg->outputs = {sn->outputs[0]};
  graphs.graphs = {sg};
  sub = sg.get();
  n->attrs["graphs"] = graphs;
  Attribute no_graphs;
  no_graphs.kind = Attribute::Kind::kGraphs;
  n->attrs["graphs_empty"] = no_graphs;
  n->attrs["odd key"] = Attribute::of_int(1);

  Node* le = add(g, OpKind::kLabelEncoder, {n->outputs[0]}, {{"enc", Type::tensor(DType::kInt64, Shape({N}))}});
  le->attrs["keys_strings"] = strs;
  // Dropout's mask output is optional: omitted here, with omitted optional inputs in the middle too.
  Node* drop = add(g, OpKind::kDropout, {le->outputs[0], nullptr, nullptr}, {{"dropped", Type()}, {"", Type()}});
  g.outputs = {n->outputs[0], drop->outputs[0]};
  ASSERT_TRUE(verify_graph(g).is_ok()) << verify_graph(g).message();
  ASSERT_NE(sub, nullptr);

  std::unique_ptr<Graph> back = round_trip(g);
  ASSERT_NE(back, nullptr);
  expect_same_graph(g, *back, "");
  EXPECT_TRUE(verify_graph(*back).is_ok()) << verify_graph(*back).message();
  // Spot checks on the text itself.
  std::string text = print_graph(g);
  EXPECT_NE(text.find("graph \"all kinds\"(%0: f32[\"batch size\",3]"), std::string::npos) << text;
  EXPECT_NE(text.find("%\"onnx::Conv_1/w:0\": f32[3] = dense<f32[3]> [1.5, -2.0, 3.25]"), std::string::npos);
  EXPECT_NE(text.find("%\"big weight\" = const dense<f32[5,8]> 0x000000000000803e"), std::string::npos);
  EXPECT_NE(text.find("%u64 = const dense<u64[2]> [18446744073709551615, 0] : u64[K]"), std::string::npos);
    EXPECT_NE(text.find("f_whole = 2.0, floats = [1.5, -0.0, 1e-30, 3.0], floats_empty = floats[]"), std::string::npos);
  EXPECT_NE(text.find("i = -7, i_min = -9223372036854775808, ints = [1, 2, -3], ints_empty = ints[]"), std::string::npos);
  EXPECT_NE(text.find("\"odd key\" = 1"), std::string::npos);
  EXPECT_NE(text.find("@\"odd node/name 1\""), std::string::npos);
  EXPECT_NE(text.find("%enc = ai.onnx.ml.LabelEncoder(%y)"), std::string::npos);
  EXPECT_NE(text.find("%dropped, _ = Dropout(%enc, _, _) : ? @Dropout\n"), std::string::npos) << text;
  EXPECT_NE(text.find("types = [type<seq<f32[2]>>, type<opt<i64[*]>>, type<?>]"), std::string::npos);
  // The parsed subgraph reads the outer %w through the same Value object.
  const Graph* psub = back->nodes[0]->attrs.at("graphs").graphs[0].get();
  EXPECT_EQ(psub->parent, back.get());
  EXPECT_EQ(psub->parent_node, back->nodes[0].get());
  EXPECT_EQ(psub->nodes[0]->inputs[1], back->inputs[1]);
  EXPECT_EQ(back->lookup("half")->constant->data<half>()[0].bits, half(0.1f).bits);
  EXPECT_EQ(back->lookup("f64")->constant->data<double>()[1], 1e-310);
}

TEST(IrText, RoundTripControlFlowAndSequences) {
  const char* text = R"(graph cf(%c: bool[], %x: f32[N,4], %n: i64[]) {
  %one = const dense<i64[]> [1]
  %y = If(%c) {else_branch = graph else_g() {
    return %x
  }, then_branch = graph then_g() {
    %t = Relu(%x) : f32[N,4]
    %u = Add(%t, %x) : f32[N,4]
    return %u
  }} : f32[N,4] @if1
  %r = Loop(%n, %c, %y) {body = graph body(%i: i64[], %cond: bool[], %acc: f32[N,4]) {
    %acc2 = Add(%acc, %y) : f32[N,4]
    %more = Identity(%cond) : bool[]
    return %more, %acc2
  }} : f32[N,4]
  %s = SequenceConstruct(%x, %r) : seq<f32[N,4]>
  %e = SequenceAt(%s, %one) : f32[N,4]
  %o = Optional(%e) : opt<f32[N,4]>
  %h = OptionalHasElement(%o) : bool[]
  return %s, %h
}
)";
  std::unique_ptr<Graph> g = parse_canonical(text);
  ASSERT_NE(g, nullptr);
  const Graph& G = *g;
  const Node& iff = *G.nodes[0];
  const Graph* then_g = iff.attr_graph("then_branch");
  const Graph* else_g = iff.attr_graph("else_branch");
  ASSERT_TRUE(then_g && else_g);
  EXPECT_EQ(then_g->parent, &G);
  EXPECT_EQ(then_g->nodes[0]->inputs[0], G.inputs[1]);  // reads the outer %x
  EXPECT_EQ(then_g->nodes[1]->inputs[1], G.inputs[1]);
  EXPECT_EQ(else_g->outputs[0], G.inputs[1]);            // returns it directly
  const Graph* body = G.nodes[1]->attr_graph("body");
  EXPECT_EQ(body->nodes[0]->inputs[1], iff.outputs[0]);  // reads %y of the outer graph
  EXPECT_EQ(G.lookup("s")->type.kind, Type::Kind::kSequence);
  EXPECT_EQ(G.lookup("o")->type.to_string(), "opt<f32[N,4]>");
  expect_round_trips(G);
}

// kiln's own domain (ai.kiln), as fuse-elementwise writes it: the op name carries the domain and
// the body is a self-contained graph attribute.
TEST(IrText, RoundTripFusedElementwise) {
  const char* text = R"(graph f(%mask: i64[N,1,1,8], %w: f32[8]) {
  %b = ai.kiln.FusedElementwise(%mask, %w) {body = graph b_body(%mask_in: i64[N,1,1,8], %w_in: f32[8]) {
    %one = const dense<f32[]> [1.0]
    %m = Cast(%mask_in) {to = 1} : f32[N,1,1,8]
    %s = Sub(%one, %m) : f32[N,1,1,8]
    %r = Mul(%s, %w_in) : f32[N,1,1,8]
    return %r
  }} : f32[N,1,1,8] @ext_mask
  return %b
}
)";
  std::unique_ptr<Graph> g = parse_canonical(text);
  ASSERT_NE(g, nullptr);
  const Graph& G = *g;
  EXPECT_EQ(G.nodes[0]->op, OpKind::kFusedElementwise);
  EXPECT_EQ(op_domain(OpKind::kFusedElementwise), "ai.kiln");
  const Graph* body = G.nodes[0]->attr_graph("body");
  ASSERT_NE(body, nullptr);
  EXPECT_EQ(body->inputs.size(), 2u);
  EXPECT_EQ(body->nodes[0]->inputs[0], body->inputs[0]);  // reads its own input, not the outer %mask
  expect_round_trips(G);
}

TEST(IrText, ProgrammaticGraphRoundTrips) {
  Graph g;
  g.name = "main";
  Value* x = g.add_input("x", f32({N, 4}));
  Node* r = g.add_node(OpKind::kRelu, {x}, 1);
  r->outputs[0]->type = f32({N, 4});
  Node* m = g.add_node(OpKind::kMatMul, {r->outputs[0], g.add_constant("w", Tensor::create(DType::kFloat32, {4, 2}).value())}, 1);
  g.outputs = {m->outputs[0]};
  std::unique_ptr<Graph> back = round_trip(g);
  ASSERT_NE(back, nullptr);
  expect_same_graph(g, *back, "");
  EXPECT_EQ(back->nodes[1]->name, "MatMul");
  EXPECT_EQ(back->nodes[1]->outputs[0]->name, "MatMul_out0");
  EXPECT_EQ(back->nodes[1]->outputs[0]->type.kind, Type::Kind::kUnknown);
}

TEST(IrText, PrintOptions) {
  auto g = parse_graph("graph g(%x: f32[8]) {\n  %w = const dense<f32[8]> [1.0]\n  %y = Mul(%x, %w) : f32[8] @mul\n  return %y\n}");
  ASSERT_TRUE(g) << g.status().message();
  PrintOptions elide;
  elide.max_inline_elements = 4;
  elide.elide_large_tensors = true;
  elide.print_node_names = false;
  std::string text = print_graph(**g, elide);
  EXPECT_EQ(text, "graph g(%x: f32[8]) {\n  %w = const dense<f32[8]> ...\n  %y = Mul(%x, %w) : f32[8]\n  return %y\n}\n");
  auto back = parse_graph(text);
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(print_graph(**back, elide), text);
  EXPECT_EQ((*back)->lookup("w")->constant->data<float>()[7], 0.0f);  // elided data reads as zeros
  EXPECT_EQ((*back)->nodes[0]->name, "");
  PrintOptions hex;
  hex.max_inline_elements = 2;
  EXPECT_NE(print_graph(**g, hex).find("dense<f32[8]> 0x0000803f0000803f"), std::string::npos);
}

TEST(IrText, ParseTypeAndTensor) {
  EXPECT_EQ(parse_type("f32[*]")->to_string(), "f32[*]");
  EXPECT_EQ(parse_type("seq<opt<i64[N+1,?]>>")->to_string(), "seq<opt<i64[N+1,?]>>");
  EXPECT_EQ(parse_type("bool[]")->shape->rank(), 0u);
  EXPECT_EQ(parse_type("?")->kind, Type::Kind::kUnknown);
  Expected<Tensor> t = parse_tensor("dense<i16[2,2]> [1, -2, 3, 32767]");
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_EQ(t->data<int16_t>()[3], 32767);
  EXPECT_EQ(print_tensor(*t), "dense<i16[2,2]> [1, -2, 3, 32767]");
}

// ---- errors ---------------------------------------------------------------------------------

std::string parse_error(std::string_view text) {
  Expected<std::unique_ptr<Graph>> g = parse_graph(text);
  return g ? "parsed" : g.status().message();
}

TEST(IrText, ParseErrorsNamePositionAndExpectation) {
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %y = Foo(%x) : f32[N]\n  return %y\n}"), "2:8: unknown op 'Foo'");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %y = Relu(%z)\n  return %y\n}"), "2:13: use of undefined value %z");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %x = Relu(%x)\n  return %x\n}"), "2:3: value %x is already defined");
  EXPECT_EQ(parse_error("graph g(%x: f33[N]) {}"), "1:13: expected a dtype (f32, i64, ...), 'seq', 'opt' or '?', got 'f33'");
  EXPECT_EQ(parse_error("graph g(%x: f32[N] {}"), "1:20: expected ',', got '{'");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %y = Relu(%x : f32[N]\n}"), "2:16: expected ',', got ':'");
  EXPECT_EQ(parse_error("graph g() {\n  %c = const dense<f32[3]> [1.0, 2.0]\n  return %c\n}"),
            "2:28: expected 3 elements for f32[3], got 2");
  EXPECT_EQ(parse_error("graph g() {\n  %c = const dense<u8[2]> [1, 256]\n  return %c\n}"),
            "2:31: expected an integer that fits u8");
  EXPECT_EQ(parse_error("graph g() {\n  %c = const dense<f32[1]> 0xabcd\n  return %c\n}"),
            "2:28: expected 8 hex digits for f32[1], got 4");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %y = Relu(%x) {a = []}\n  return %y\n}"),
            "2:22: an empty list needs its kind, e.g. ints[]");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %y = Relu(%x) {a = [1, \"s\"]}\n  return %y\n}"),
            "2:26: expected an element of ints");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %y = Relu(%x) : f32[N], f32[N]\n  return %y\n}"),
            "2:32: 2 types for 1 outputs");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %y = Relu(%x) {s = \"abc}\n  return %y\n}"), "2:22: unterminated string");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  %y = Relu(%x)\n}"), "3:1: expected 'return', got '}'");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  return %x\n} extra"), "3:3: expected end of input, got 'extra'");
  EXPECT_EQ(parse_error("graph g(%x: f32[N]) {\n  return %x $\n}"), "2:13: unexpected character '$'");
  EXPECT_EQ(parse_error("grph g() {}"), "1:1: expected 'graph', got 'grph'");
  // A subgraph sees outer values defined before its node only.
  EXPECT_EQ(parse_error("graph g(%c: bool[]) {\n  %y = If(%c) {then_branch = graph t() {\n    return %late\n  }}\n"
                        "  %late = Identity(%c)\n  return %y\n}"),
            "3:12: use of undefined value %late");
  // Names are SSA across nested graphs, as in ONNX.
  EXPECT_EQ(parse_error("graph g(%c: bool[]) {\n  %y = If(%c) {then_branch = graph t() {\n    %c = Not(%c)\n"
                        "    return %c\n  }}\n  return %y\n}"),
            "3:5: value %c is already defined");
}

// Every truncation of valid text fails with a positioned message, never crashes or succeeds.
TEST(IrText, TruncatedInputsFailCleanly) {
  std::string text = kConvText;
  for (size_t n = 0; n + 2 < text.size(); ++n) {
    Expected<std::unique_ptr<Graph>> g = parse_graph(std::string_view(text).substr(0, n));
    ASSERT_FALSE(g) << "prefix of " << n << " chars parsed";
    EXPECT_TRUE(std::regex_search(g.status().message(), std::regex("^[0-9]+:[0-9]+: "))) << g.status().message();
  }
}

// ---- graphviz -------------------------------------------------------------------------------

TEST(IrDot, ClustersLabelsAndEdges) {
  auto g = parse_graph(R"(graph main(%c: bool[], %x: f32[N,4]) {
  %y = If(%c) {then_branch = graph then_g() {
    %t = Relu(%x) : f32[N,4] @inner
    return %t
  }} : f32[N,4] @"my \"if\""
  return %y
})");
  ASSERT_TRUE(g) << g.status().message();
  std::ostringstream os;
  ASSERT_TRUE(write_dot(**g, os).is_ok());
  std::string dot = os.str();
  EXPECT_EQ(dot.rfind("digraph \"main\" {\n", 0), 0u) << dot;
  EXPECT_NE(dot.find("v1 [label=\"x\\nf32[N,4]\", shape=ellipse];"), std::string::npos) << dot;
  EXPECT_NE(dot.find("n2 [label=\"If\\nmy \\\"if\\\"\"];"), std::string::npos) << dot;
  EXPECT_NE(dot.find("v0 -> n2 [label=\"c\\nbool[]\"];"), std::string::npos) << dot;
  EXPECT_NE(dot.find("subgraph cluster_3 {"), std::string::npos) << dot;
  EXPECT_NE(dot.find("label=\"then_branch: then_g\";"), std::string::npos) << dot;
  // The inner Relu reads the outer %x: the edge crosses into the cluster.
  EXPECT_NE(dot.find("n4 [label=\"Relu\\ninner\"];"), std::string::npos) << dot;
  EXPECT_NE(dot.find("v1 -> n4 [label=\"x\\nf32[N,4]\"];"), std::string::npos) << dot;
  EXPECT_NE(dot.find("r5 -> n2 [ltail=cluster_3, style=dashed, label=\"then_branch\"];"), std::string::npos) << dot;
  EXPECT_NE(dot.find("n2 -> r6 [label=\"y\\nf32[N,4]\"];"), std::string::npos) << dot;
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Nesting without bound is an error, not a stack overflow (found by the IR text fuzzer: a dim of
// thousands of '(').
TEST(IrText, DeepNestingIsAnError) {
  for (const std::string& deep : {std::string(5000, '(') + "1", std::string(5000, '-') + "1"}) {
    auto g = parse_graph("graph main(%x: f32[" + deep + "]) {\n  return %x\n}");
    ASSERT_FALSE(g);
    EXPECT_NE(g.status().message().find("nested more than 100 deep"), std::string::npos) << g.status().message();
  }
  std::string types;
  for (int i = 0; i < 2000; ++i) types += "seq<";
  auto g = parse_graph("graph main(%x: " + types + "f32[1]) {\n  return %x\n}");
  ASSERT_FALSE(g);
  EXPECT_NE(g.status().message().find("nested more than 100 deep"), std::string::npos) << g.status().message();
  // Ordinary nesting still parses.
  EXPECT_TRUE(parse_graph("graph main(%x: f32[((((N+1))))]) {\n  return %x\n}"));
}

}  // namespace
}  // namespace kiln
