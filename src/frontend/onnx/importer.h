// ONNX -> kiln IR. Parses the protobuf with ONNX's own onnx.proto, converts every graph (and
// subgraph), loads initializers (external data only from inside the model's folder), rewrites
// every older opset to kiln's canonical op set (normalize.cc), and infers types and shapes.
//
//   KILN_ASSIGN_OR_RETURN(Model m, import_onnx_file("resnet50.onnx"));
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln {

struct ImportOptions {
  int max_subgraph_depth = 32;   // deeper nesting is refused (protects the stack)
  bool infer = true;             // run shape/type inference after import
  // Concrete shapes for graph inputs (`--shapes x:1x3x224x224`), applied before inference so
  // every symbolic dim they bind becomes static downstream. A symbol bound here (N = 1) is
  // bound in every other input that uses it too.
  std::map<std::string, std::vector<int64_t>> input_shapes;
};

// Applies ImportOptions::input_shapes to g's inputs; errors name the input and both shapes.
Status bind_input_shapes(Graph& g, const std::map<std::string, std::vector<int64_t>>& shapes);
// The tensor input of g named `name`; `who` ("--shapes", "shape_ranges") starts the error that lists
// the model's inputs when there is none, or says what the input is when it is not a tensor.
Expected<Value*> find_tensor_input(Graph& g, const std::string& name, std::string_view who);

Expected<Model> import_onnx_file(const std::string& path, const ImportOptions& opt = {});
// base_dir: folder for external data ("" refuses external data).
Expected<Model> import_onnx_bytes(const void* data, size_t size, const std::string& base_dir,
                                  const ImportOptions& opt = {});

// The newest versions kiln reads.
inline constexpr int64_t kMaxIrVersion = 14;
inline constexpr int64_t kMaxOnnxOpset = 28;
inline constexpr int64_t kMaxOnnxMlOpset = 5;

}  // namespace kiln
