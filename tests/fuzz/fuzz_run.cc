// libFuzzer target for running a model on the CPU backends (`kiln run --random-inputs` without a
// GPU): bytes -> import (every symbolic input dim bound to 2) -> the default pass pipeline -> CPU
// compile -> run on deterministic small inputs, on the reference kernels and then on the fast
// backend (oneDNN) twice. The op kernels meet shapes and attributes no test
// wrote; an error Status is a fine answer, a crash, sanitizer report or hang is a finding.
//
//   bash tests/fuzz/run.sh build-fuzz 60        (or: make fuzz; this target gets a quarter of the time)
//   build-fuzz/tests/kiln_fuzz_run build-fuzz/artifacts-run/crash-...   (replay one input)
//
// Tensors are capped at 1 MB so that each run stays fast under the sanitizers, graphs with a Loop
// are skipped (a loop's trip count is an input, and a model that loops for an hour is not a bug),
// and so are graphs whose convolutions and products add up to more than 2e7 multiply-adds: a
// ConvTranspose with a 60x74 kernel over a 48x63 image is 216 ms of honest work in a release build
// and over libFuzzer's 10 s timeout under the sanitizers (fuzz-long, 2026-11-25).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "backends/backend.h"
#include "backends/cpu/fast_session.h"
#include "frontend/onnx/importer.h"
#include "ir/tensor.h"
#include "ir/verifier.h"
#include "passes/pipeline.h"
#include "runtime/engine_file.h"

namespace {

void ignore_protobuf_log(google::protobuf::LogLevel, const char*, int, const std::string&) {}

bool has_loop(const kiln::Graph& g) {
  for (const auto& n : g.nodes) {
    if (n->op == kiln::OpKind::kLoop) return true;
    for (const auto& [name, a] : n->attrs) {
      if (a.g && has_loop(*a.g)) return true;
      for (const auto& sub : a.graphs) {
        if (sub && has_loop(*sub)) return true;
      }
    }
  }
  return false;
}

// Small values: floats in [-2, 2], integers in [0, 3) (valid indices along most axes), strings "s0".."s2".
kiln::Expected<kiln::Tensor> input_for(const kiln::Value& v) {
  if (!v.type.is_tensor() || !v.type.shape) return KILN_ERROR(kUnsupported, "input of unknown rank");
  std::vector<int64_t> dims;
  for (const kiln::Dim& d : v.type.shape->dims) {
    if (!d.is_static()) return KILN_ERROR(kUnsupported, "symbolic dim");
    dims.push_back(d.value());
  }
  KILN_ASSIGN_OR_RETURN(kiln::Tensor t, kiln::Tensor::create(v.type.dtype, dims));
  kiln::visit_dtype(t.dtype(), [&]<typename T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, std::string>) p[i] = "s" + std::to_string(i % 3);
      else if constexpr (std::is_same_v<T, bool>) p[i] = (i % 2) != 0;
      else if constexpr (kiln::is_float_v<T>) p[i] = T(kiln::compute_t<T>(double(i % 9) * 0.5 - 2.0));
      else p[i] = T(i % 3);
    }
  });
  return t;
}

// Multiply-adds of the graph's Conv, ConvTranspose, MatMul and Gemm nodes, from their shapes
// (unknown dims counted as 2): convolutions as (output or input elements) x (weight elements per
// output or input channel), products as output elements x the contracted length.
double estimated_macs(const kiln::Graph& g) {
  auto dims = [](const kiln::Value* v) {
    std::vector<double> d;
    if (v && v->type.is_tensor() && v->type.shape) {
      for (const kiln::Dim& x : v->type.shape->dims) d.push_back(x.is_static() ? double(x.value()) : 2.0);
    }
    return d;
  };
  auto prod = [](const std::vector<double>& d) {
    double p = 1;
    for (double x : d) p *= x;
    return p;
  };
  double macs = 0;
  for (const auto& n : g.nodes) {
    if (n->inputs.size() < 2 || !n->inputs[0] || !n->inputs[1] || n->outputs.empty() || !n->outputs[0]) continue;
    const std::vector<double> x = dims(n->inputs[0]), w = dims(n->inputs[1]), y = dims(n->outputs[0]);
    const double per_channel = w.empty() ? 1 : prod(w) / std::max(1.0, w[0]);
    switch (n->op) {
      case kiln::OpKind::kConv: macs += prod(y) * per_channel; break;
      case kiln::OpKind::kConvTranspose: macs += prod(x) * per_channel; break;
      case kiln::OpKind::kMatMul:
      case kiln::OpKind::kGemm: macs += prod(y) * (x.empty() ? 1 : x.back()); break;
      default: break;
    }
  }
  return macs;
}

// The largest value the graph computes whose shape is known (inputs and constants are capped at
// kMaxValueBytes on their own): a ConvTranspose of a 1 MB input into an 8 MB output (stride 1, 65
// channels) is 53 ms of honest work in a release build and 22 s under the sanitizers (make test,
// 2026-11-27), under the multiply-add bound above.
constexpr int64_t kMaxValueBytes = int64_t{1} << 20;
double largest_value_bytes(const kiln::Graph& g) {
  double most = 0;
  for (const auto& v : g.values) {
    if (!v || !v->type.is_tensor() || !v->type.shape || !v->type.shape->is_static()) continue;
    double bytes = double(kiln::dtype_size(v->type.dtype));
    for (const kiln::Dim& d : v->type.shape->dims) bytes *= double(d.value());
    most = std::max(most, bytes);
  }
  return most;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  kiln::set_max_tensor_bytes(kMaxValueBytes);
  google::protobuf::SetLogHandler(&ignore_protobuf_log);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::ImportOptions opts;
  kiln::Expected<kiln::Model> probe = kiln::import_onnx_bytes(data, size, /*base_dir=*/"", opts);
  if (!probe || !kiln::verify_graph(*probe->graph)) return 0;
  for (const kiln::Value* v : probe->graph->inputs) {  // bind every symbolic dim to 2
    if (v->constant || !v->type.is_tensor() || !v->type.shape) continue;
    std::vector<int64_t> dims;
    for (const kiln::Dim& d : v->type.shape->dims) dims.push_back(d.is_static() ? d.value() : 2);
    opts.input_shapes[v->name] = dims;
  }
  kiln::Expected<kiln::Model> model = kiln::import_onnx_bytes(data, size, /*base_dir=*/"", opts);
  if (!model || !kiln::verify_graph(*model->graph) || has_loop(*model->graph)) return 0;
  if (estimated_macs(*model->graph) > 2e7 || largest_value_bytes(*model->graph) > kMaxValueBytes) return 0;
  kiln::Graph& g = *model->graph;
  if (!kiln::run_passes(g, kiln::default_pipeline())) return 0;
  std::vector<kiln::Data> inputs;
  for (const kiln::Value* v : g.inputs) {
    if (v->constant) {  // an initializer listed as an input: its value, as kiln run does
      inputs.emplace_back(*v->constant);
      continue;
    }
    kiln::Expected<kiln::Tensor> t = input_for(*v);
    if (!t) return 0;
    inputs.emplace_back(std::move(*t));
  }
  auto cpu = kiln::make_cpu_backend();
  auto exe = cpu->compile(g);
  if (!exe) return 0;
  (void)(*exe)->run(inputs);
  // The fast CPU backend (oneDNN steps, their arena, the reference kernels between them) on a copy
  // of the same graph, twice: the second run reuses the arena the first one wrote.
  kiln::Expected<std::unique_ptr<kiln::Graph>> copy = kiln::clone_graph(g);
  if (!copy) return 0;
  kiln::Expected<kiln::Plan> plan = kiln::plan_host(std::move(*copy));
  if (!plan) return 0;
  auto p = std::make_shared<const kiln::Plan>(std::move(*plan));
  kiln::Expected<kiln::CpuPlan> cp = kiln::plan_fast_cpu(*p);
  if (!cp) return 0;
  auto runner = kiln::CpuRunner::create(p, std::make_shared<const kiln::CpuPlan>(std::move(*cp)));
  if (!runner) return 0;
  for (int k = 0; k < 2; ++k) (void)(*runner)->run(inputs);
  return 0;
}
