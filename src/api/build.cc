// kiln::build: import, bind shapes, optimize, then plan for the chosen device. The CLI, the
// examples and (later) the Python package and the server all build through here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include "api/engine_impl.h"
#include "frontend/onnx/importer.h"
#include "ops/infer.h"
#include "passes/pipeline.h"
#include "passes/value_inputs.h"
#include "runtime/engine_file.h"

namespace kiln {

namespace {

// BuildConfig::batch: binds the leading dim of every input whose leading dim is symbolic (an input
// with a fixed, different batch, or with other symbolic dims, is an error naming it). An edge build
// with no batch, shapes ranges aside, binds what a batch of 1 can: the leading symbolic dim of each
// input whose other dims are fixed; the rest stays as the model has it.
Status add_batch_bindings(const Graph& g, const BuildConfig& c, std::map<std::string, std::vector<int64_t>>& shapes) {
  const bool edge = c.target == Target::kEdge && c.batch == 0 && c.shape_ranges.empty();
  const int64_t batch = edge ? 1 : c.batch;
  if (batch == 0) return Status::ok();
  if (batch < 0) return KILN_ERROR(kInvalidArgument, "batch {}: expected a positive number", batch);
  for (const Value* v : g.inputs) {
    if (shapes.count(v->name) || c.shape_ranges.count(v->name) || v->constant || !v->type.shape || v->type.shape->rank() == 0) continue;
    const auto& dims = v->type.shape->dims;
    if (edge && (dims[0].is_static() ||
                 std::any_of(dims.begin() + 1, dims.end(), [](const auto& d) { return !d.is_static(); }))) {
      continue;
    }
    if (dims[0].is_static()) {
      if (dims[0].value() != batch) {
        return KILN_ERROR(kInvalidArgument, "batch {}: input '{}' has a fixed batch of {} ({})", batch, v->name,
                          dims[0].value(), v->type.shape->to_string());
      }
      continue;
    }
    std::vector<int64_t> bound = {batch};
    for (size_t i = 1; i < dims.size(); ++i) {
      if (!dims[i].is_static()) {
        return KILN_ERROR(kInvalidArgument, "batch: input '{}' ({}) has other symbolic dims; give its whole shape",
                          v->name, v->type.shape->to_string());
      }
      bound.push_back(dims[i].value());
    }
    shapes[v->name] = bound;
  }
  return Status::ok();
}

}  // namespace

Expected<std::map<std::string, DimRange>> bind_config_shapes(Graph& g, const BuildConfig& config) {
  std::map<std::string, std::vector<int64_t>> shapes = config.shapes;
  KILN_RETURN_IF_ERROR(add_batch_bindings(g, config, shapes));
  KILN_RETURN_IF_ERROR(bind_input_shapes(g, shapes));
  KILN_ASSIGN_OR_RETURN(auto ranges, bind_shape_ranges(g, config.shape_ranges));
  KILN_RETURN_IF_ERROR(infer_types(g));
  return ranges;
}

namespace {

// The bytes of the host plan's values live at once at their peak (a fused CPU plan holds fewer);
// nullopt while a value's size is not fixed (symbolic dims).
std::optional<size_t> activation_peak(const Plan& p) {
  const Graph& g = *p.graph;
  std::vector<size_t> bytes(p.slots, 0);
  auto set = [&](const ValueRef& r, const Value* v) -> bool {
    if (r.kind != ValueRef::Kind::kSlot || !v) return true;
    if (!v->type.shape || v->type.dtype == DType::kString) return false;
    size_t n = dtype_size(v->type.dtype);
    for (const auto& d : v->type.shape->dims) {
      if (!d.is_static()) return false;
      n *= size_t(d.value());
    }
    bytes[r.index] = n;
    return true;
  };
  size_t live = 0;
  for (size_t i = 0; i < g.inputs.size() && i < p.inputs.size(); ++i) {
    if (!set(p.inputs[i], g.inputs[i])) return std::nullopt;
    if (p.inputs[i].kind == ValueRef::Kind::kSlot) live += bytes[p.inputs[i].index];
  }
  size_t peak = live;
  for (const PlanStep& s : p.steps) {
    const Node& n = *g.nodes[s.node];
    for (size_t k = 0; k < s.outputs.size() && k < n.outputs.size(); ++k) {
      if (!set(s.outputs[k], n.outputs[k])) return std::nullopt;
      if (s.outputs[k].kind == ValueRef::Kind::kSlot) live += bytes[s.outputs[k].index];
    }
    peak = std::max(peak, live);
    for (uint32_t f : s.frees) live -= std::min(live, bytes[f]);
  }
  return peak;
}

// A CPU engine's memory per session against BuildConfig::memory_budget_bytes (an error over it), and
// the report's line on it when there is a budget or the target is the edge.
Status cpu_memory(const Engine::Impl& e, const BuildConfig& config, std::string* note) {
  size_t weights = 0;
  for (const Value* c : e.plan->constants) weights += c->constant->nbytes();
  const size_t copies = e.fast_cpu ? e.fast_cpu->reordered_weight_bytes() : 0;
  const std::optional<size_t> peak = activation_peak(*e.plan);
  auto mib = [](size_t b) { return double(b) / (1 << 20); };
  const size_t budget = config.memory_budget_bytes;
  if (budget && peak && weights + copies + *peak > budget) {
    return KILN_ERROR(kOutOfMemory, "the engine needs {:.1f} MiB per session on the CPU (weights {:.1f}, reordered copies "
                      "{:.1f}, activations at their peak {:.1f}), over the memory budget of {:.1f} MiB",
                      mib(weights + copies + *peak), mib(weights), mib(copies), mib(*peak), mib(budget));
  }
  if (!budget && config.target != Target::kEdge) return Status::ok();
  *note += fmt::format("memory per session: weights {:.1f} MiB, reordered copies {:.1f} MiB, activations {}{}\n", mib(weights),
                       mib(copies), peak ? fmt::format("{:.1f} MiB at their peak", mib(*peak)) : "not known until the input shapes are",
                       budget ? fmt::format(" (budget {:.1f} MiB)", mib(budget)) : "");
  return Status::ok();
}

}  // namespace

Expected<Engine> engine_from_graph(std::unique_ptr<Graph> g, const BuildConfig& config, std::map<std::string, DimRange> ranges,
                                   std::unique_ptr<Graph> unoptimized, BuildPhases phases) {
  auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_shared<Engine::Impl>();
  impl->config = config;
  impl->ranges = ranges;
  impl->inputs = tensor_infos(g->inputs, ranges);
  impl->outputs = tensor_infos(g->outputs, ranges);
  Device want = config.device;
  std::string why;
  bool gpu = !is_cpu(want) && gpu_usable(&why);
  if (want == Device::kCuda && !gpu) return KILN_ERROR(kUnsupported, "device cuda: no usable GPU: {}", why);
  // A GPU engine keeps the plan too: it is what its engine file holds.
  KILN_ASSIGN_OR_RETURN(Plan plan, plan_host(std::move(g), /*require_cpu_kernels=*/!gpu));
  impl->plan = std::make_shared<const Plan>(std::move(plan));
  const double before = phases.import_ms + phases.passes_ms;
  if (gpu) {
    auto e = build_gpu_engine(impl->plan, config, std::move(unoptimized));
    if (e) {
      impl->device = Device::kCuda;
      impl->gpu = std::move(*e);
      if (auto p = impl->gpu->engine_file_plan()) impl->plan = std::move(p);
      impl->build_ms = before + ms_since(t0);
      impl->build_note = fmt::format("build phases: import {:.1f} ms, shapes and passes {:.1f}, GPU engine {:.1f} (of "
                                     "which {})\n", phases.import_ms, phases.passes_ms, ms_since(t0),
                                     impl->gpu->load_phases());
      return Engine(std::move(impl));
    }
    // Only "cannot run this here" falls back; a GPU fault (out of memory...) is the answer.
    if (e.status().code() != ErrorCode::kUnsupported || want == Device::kCuda) return e.status();
    why = e.status().message();
    KILN_RETURN_IF_ERROR(verify_cpu_kernels(*impl->plan));
  }
  if (want == Device::kAuto) std::fprintf(stderr, "kiln: warning: running on the CPU: %s\n", why.c_str());
  if (want == Device::kCpuRef) {
    impl->device = Device::kCpuRef;
    impl->report = plan_report(*impl->plan);
  } else {
    impl->device = Device::kCpu;
    KILN_ASSIGN_OR_RETURN(impl->fast_cpu, build_fast_cpu_engine(impl->plan, config));
  }
  std::string memory;
  KILN_RETURN_IF_ERROR(cpu_memory(*impl, config, &memory));
  impl->build_ms = before + ms_since(t0);
  impl->build_note = fmt::format("build phases: import {:.1f} ms, shapes and passes {:.1f}, plan {:.1f}\n", phases.import_ms,
                                 phases.passes_ms, ms_since(t0));
  if (config.target == Target::kEdge) impl->build_note += "target: edge (batch-1 latency: leading symbolic dims bound to 1)\n";
  impl->build_note += memory;
  return Engine(std::move(impl));
}

namespace {

// import_ms: what reading the model took (its own clock), for the report's phase line.
Expected<Engine> build_model(Model m, const BuildConfig& asked, double import_ms) {
  auto t0 = std::chrono::steady_clock::now();
  KILN_RETURN_IF_ERROR(validate_config(asked));
  BuildConfig config = asked;
  if (config.target == Target::kEdge && config.device == Device::kAuto) config.device = Device::kCpu;
  Graph& g = *m.graph;
  // A tensor-parallel build for a batch may run it as micro-batches: it keeps the graph as it was
  // to bind for a micro-batch, and which inputs the batch binds.
  std::unique_ptr<Graph> unbound;
  std::vector<bool> batched;
  if (config.tensor_parallel > 1 && config.batch > 1 && config.micro_batches != 1) {
    KILN_ASSIGN_OR_RETURN(unbound, clone_graph(g));
    for (const Value* v : g.inputs) {
      batched.push_back(!config.shapes.count(v->name) && !v->constant && v->type.shape && v->type.shape->rank() > 0 &&
                        !v->type.shape->dims[0].is_static());
    }
  }
  KILN_ASSIGN_OR_RETURN(auto ranges, bind_config_shapes(g, config));
  if (config.tensor_parallel > 1) {
    return build_tensor_parallel(std::move(m.graph), std::move(unbound), std::move(batched), config,
                                 import_ms + ms_since(t0));
  }
  // A dynamic GPU engine (ranged dims or value inputs) optimizes each exact shape from the graph as it
  // is before the passes, as a static build of that shape would (fusions that need static shapes
  // happen there).
  std::unique_ptr<Graph> unoptimized;
  if ((!ranges.empty() || !value_inputs(g).empty()) && !is_cpu(config.device)) {
    KILN_ASSIGN_OR_RETURN(unoptimized, clone_graph(g));
    // The pipeline's first pass, cse, needs no shapes: run once here, every shape plan starts from
    // the merged graph (a TorchScript BERT: 1,132 nodes -> about half) and copies, infers and
    // optimizes that instead. The others wait for the shapes (fuse-qdq-matmul must precede
    // fold-constants, the fusions need static dims).
    std::vector<Pass> first;
    for (Pass& p : default_pipeline()) {
      if (p.name == "cse" || p.name == "dce") first.push_back(std::move(p));
    }
    PassOptions fo;
    fo.disabled = config.disabled_passes;
    std::erase_if(fo.disabled, [](const std::string& n) { return n != "cse" && n != "dce"; });
    KILN_RETURN_IF_ERROR(run_passes(*unoptimized, first, fo).status());
  }
  // The default pipeline, for every device: the CPU gains as much as the GPU from fewer nodes, and
  // both then run the same graph, with one exception: a CPU engine leaves a QDQ model's products as
  // written (fuse-qdq-matmul skipped), so fold-constants dequantizes their weights and they run as
  // oneDNN's fp32 products of the fake-quantized activations, the values the model multiplies. The
  // CPU kernels have no 8-bit product: a QuantizedMatMul ran its body on the reference kernels, a
  // QDQ BERT-base ~40x slower than its fp32 model.
  PassOptions po;
  po.disabled = config.disabled_passes;
  if (std::string why; (is_cpu(config.device) || !gpu_usable(&why)) && config.tensor_parallel <= 1) {
    po.disabled.push_back(std::string(kCpuSkippedPass));
  }
  po.dump_ir_after = config.dump_ir_after;
  KILN_ASSIGN_OR_RETURN(PassReport pr, run_passes(g, default_pipeline(), po));
  if (config.print_pass_report) std::fprintf(stderr, "%s", pr.to_text().c_str());
  return engine_from_graph(std::move(m.graph), config, ranges, std::move(unoptimized), {import_ms, ms_since(t0)});
}

}  // namespace

Status validate_config(const BuildConfig& c) {
  if (c.gemm_sm90 < -1 || c.gemm_sm90 > 1) {
    return KILN_ERROR(kInvalidArgument, "gemm_sm90 {}: expected -1 (off), 0 (timed) or 1 (forced)", c.gemm_sm90);
  }
  if (c.gemm_sm90_tile != 0 && c.gemm_sm90_tile != 32 && c.gemm_sm90_tile != 64) {
    return KILN_ERROR(kInvalidArgument, "gemm_sm90_tile {}: expected 0 (time every width), 32 or 64", c.gemm_sm90_tile);
  }
  if (c.tensor_parallel < 1 || c.tensor_parallel > 64) {
    return KILN_ERROR(kInvalidArgument, "tensor_parallel {}: expected 1 (no split) to 64 ranks", c.tensor_parallel);
  }
  if (c.micro_batches < 0 || c.micro_batches > 64) {
    return KILN_ERROR(kInvalidArgument, "micro_batches {}: expected 0 (where it applies), 1 (off) or up to 64",
                      c.micro_batches);
  }
  if (c.micro_batches > 1 && (c.tensor_parallel < 2 || c.batch < 2)) {
    return KILN_ERROR(kInvalidArgument, "micro_batches {}: needs tensor_parallel above 1 and a batch (--batch) to split",
                      c.micro_batches);
  }
  if (c.tensor_parallel > 1 && !c.shape_ranges.empty()) {
    return KILN_ERROR(kInvalidArgument, "tensor_parallel {}: needs fixed input shapes; give shapes, not shape ranges",
                      c.tensor_parallel);
  }
  if (c.target == Target::kEdge && c.tensor_parallel > 1) {
    return KILN_ERROR(kInvalidArgument, "target edge runs on one device; tensor_parallel {} splits over several",
                      c.tensor_parallel);
  }
  if (!c.warm_shapes.empty() && c.shape_ranges.empty()) {
    return KILN_ERROR(kInvalidArgument, "warm shapes need shape ranges: a fixed-shape engine is ready for its one shape");
  }
  for (const auto& warm : c.warm_shapes) {
    if (warm.empty()) return KILN_ERROR(kInvalidArgument, "a warm shape binds no input");
  }
  if (c.workspace_bytes == 0) return KILN_ERROR(kInvalidArgument, "workspace_bytes must be positive");
  if (c.batch < 0) return KILN_ERROR(kInvalidArgument, "batch {}: expected a positive number (or 0: leave)", c.batch);
  for (const auto& [name, dims] : c.shape_ranges) {
    if (c.shapes.count(name)) {
      return KILN_ERROR(kInvalidArgument, "input '{}' is given both a shape and shape ranges; give one", name);
    }
    for (size_t k = 0; k < dims.size(); ++k) KILN_RETURN_IF_ERROR(check_dim_range(name, k, dims[k]));
  }
  return Status::ok();
}

Expected<Engine> build(const std::string& onnx_path, const BuildConfig& config) {
  auto t0 = std::chrono::steady_clock::now();
  ImportOptions io;
  io.infer = false;  // after the shapes are bound
  KILN_ASSIGN_OR_RETURN(Model m, import_onnx_file(onnx_path, io));
  return build_model(std::move(m), config, ms_since(t0));
}

Expected<Engine> build_from_bytes(const void* data, size_t size, const BuildConfig& config, const std::string& base_dir) {
  auto t0 = std::chrono::steady_clock::now();
  ImportOptions io;
  io.infer = false;
  KILN_ASSIGN_OR_RETURN(Model m, import_onnx_bytes(data, size, base_dir, io));
  return build_model(std::move(m), config, ms_since(t0));
}

}  // namespace kiln
