// libFuzzer target for the ONNX importer and the graph passes: bytes -> import_onnx_bytes ->
// verify_graph -> print_graph -> the default pass pipeline -> verify_graph.
//
//   bash tests/fuzz/run.sh build-fuzz 60        (or: make fuzz)
//   build-fuzz/tests/kiln_fuzz_import build-fuzz/artifacts/crash-...   (replay one input)
//
// Any Status error is an expected outcome for malformed input; the findings are crashes, sanitizer
// reports (ASan, UBSan, LeakSanitizer), KILN_CHECK aborts, timeouts and out-of-memory. The model
// is never run: only imported, verified, printed and optimized (fold-constants does evaluate the
// nodes whose inputs are all constant, under its size cap). A graph the verifier accepted that the
// pipeline turns into one it rejects is a finding: every pass must keep a valid graph valid.
//
// KILN_FUZZ_STRICT=1 (environment) also treats "imported, but verify_graph rejects the graph" and
// "print_graph -> parse_graph -> print_graph is not the identity" as findings (abort), since the
// importer should only hand out graphs the verifier accepts and the text form claims to round-trip.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "frontend/onnx/importer.h"
#include "ir/tensor.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "passes/pipeline.h"

namespace {

bool g_strict = false;

void ignore_protobuf_log(google::protobuf::LogLevel, const char*, int, const std::string&) {}

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "kiln_fuzz_import: %s\n%s\n", what, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Legitimately huge tensors are refused with kOutOfMemory; keep the cap well under -rss_limit_mb.
  kiln::set_max_tensor_bytes(int64_t{64} << 20);
  // Parse failures of random bytes would otherwise flood stderr (and slow the fuzzer down).
  google::protobuf::SetLogHandler(&ignore_protobuf_log);
  const char* strict = std::getenv("KILN_FUZZ_STRICT");
  g_strict = strict != nullptr && std::strcmp(strict, "0") != 0 && std::strcmp(strict, "") != 0;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::ImportOptions opts;  // defaults: subgraph depth 32, shape inference on
  kiln::Expected<kiln::Model> model = kiln::import_onnx_bytes(data, size, /*base_dir=*/"", opts);
  if (!model) return 0;
  if (!model->graph) finding("import succeeded with a null graph", "");

  const kiln::Graph& g = *model->graph;
  kiln::Status verified = kiln::verify_graph(g);
  if (!verified.is_ok() && g_strict) {
    finding("import succeeded but verify_graph rejects the graph", verified.message());
  }

  std::string text = kiln::print_graph(g);
  if (g_strict && verified.is_ok()) {
    kiln::Expected<std::unique_ptr<kiln::Graph>> reparsed = kiln::parse_graph(text);
    if (!reparsed) finding("parse_graph(print_graph(g)) fails", reparsed.status().message() + "\n" + text);
    std::string again = kiln::print_graph(**reparsed);
    if (again != text) finding("print -> parse -> print is not the identity", text + "\n----\n" + again);
  }
  if (!verified.is_ok()) return 0;
  kiln::PassOptions popt;
  popt.verify = true;  // between passes too: names the pass that broke the graph
  kiln::Expected<kiln::PassReport> optimized = kiln::run_passes(*model->graph, kiln::default_pipeline(), popt);
  // kInternal: a pass left a graph the verifier rejects (run_passes names the pass). Other errors
  // (a constant too large to fold, an op whose evaluation fails) are answers, not findings.
  if (!optimized && optimized.status().code() == kiln::ErrorCode::kInternal) {
    finding("a graph pass turned a valid graph into an invalid one", optimized.status().message() + "\n" + text);
  }
  if (optimized) {
    kiln::Status after = kiln::verify_graph(*model->graph);
    if (!after.is_ok()) finding("the pass pipeline left an invalid graph", after.message() + "\n" + text);
  }
  return 0;
}
