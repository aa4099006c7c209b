// The text form of the IR: print a Graph as readable, MLIR-like text and parse it back. Pass tests
// are written in it (input IR + expected IR, DESIGN.md rule 10), and `kiln` dumps IR with it.
//
//   graph main(%x: f32[N,3,224,224]) {
//     %w = const dense<f32[64,3,7,7]> 0x3f800000...
//     %y = Conv(%x, %w, _) {pads = [3,3,3,3], strides = [2,2]} : f32[N,64,112,112] @conv1
//     return %y
//   }
//
//   std::string s = print_graph(g);
//   KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g2, parse_graph(s));   // print(*g2) == s
//
// print -> parse -> print is the identity. The full grammar, with an example, is in docs/ir.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>

#include "ir/graph.h"
#include "support/status.h"

namespace kiln {

struct PrintOptions {
  // Tensors with more elements than this print as raw bytes in hex (`dense<f32[64]> 0x...`).
  int64_t max_inline_elements = 16;
  // Print tensors over max_inline_elements as `dense<f32[64]> ...`; they parse back as zeros.
  bool elide_large_tensors = false;
  // Print `@name` after each node. Off for goldens that should not depend on generated names;
  // nodes then parse back with empty names.
  bool print_node_names = true;
  // Constants whose data travels elsewhere (an engine file's weights): printed as `...` whatever
  // their size. Tensor-valued attributes are not affected.
  const std::unordered_set<const Value*>* elided_constants = nullptr;
};

struct ParseOptions {
  // `...` data reads back as zeros; false leaves such tensors without storage (Tensor::defined()
  // is false) for a caller that fills them in (the engine-file reader).
  bool zero_elided_tensors = true;
};

std::string print_graph(const Graph& g, const PrintOptions& options = {});
// "f32[N,3]", "seq<i64[*]>", "opt<f16[2*N+1]>", "?": Type::to_string, which parse_type reads.
std::string print_type(const Type& t);
// `dense<f32[2]> [1.0, 2.5]` (or hex, or elided, per options).
std::string print_tensor(const Tensor& t, const PrintOptions& options = {});

// Errors are kInvalidModel with "line:column: expected ..., got ...".
Expected<std::unique_ptr<Graph>> parse_graph(std::string_view text, const ParseOptions& options = {});
Expected<Type> parse_type(std::string_view text);
// A dimension expression through Dim arithmetic: "2*N+1", "(N+1)/(2)", "max(N,M)", "\"odd name\"",
// "?" (unknown). Printing the result gives the canonical form of the expression.
Expected<Dim> parse_dim(std::string_view text);
Expected<Tensor> parse_tensor(std::string_view text);

// Name quoting shared by printer, dot writer and messages: bare if [A-Za-z0-9_.]+, else "quoted"
// with \" \\ \n \t \xHH escapes.
std::string quote_string(std::string_view s);

}  // namespace kiln
