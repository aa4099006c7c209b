// The tensor-parallel estimator (plan_parallel.h): rank 0's graph from the same pipeline a
// `--tensor-parallel` build runs, measured rather than built: its weights, its planned activation
// arena, the keys and values its attention reads, and its collectives.
#include "api/plan_parallel.h"

#include <algorithm>
#include <map>

#include "api/engine_impl.h"
#include "frontend/onnx/importer.h"
#include "passes/pipeline.h"
#include "passes/tensor_parallel.h"
#include "runtime/engine_file.h"
#include "runtime/memory_planner.h"

namespace kiln {

namespace {

// Bytes of a value as a build of `precision` stores it (f32 becomes 16-bit in half builds).
double stored_bytes(const Value* v, Precision precision) {
  if (!v->type.shape || !v->type.shape->is_static()) return 0;
  double n = 1;
  for (const Dim& d : v->type.shape->dims) n *= double(d.value());
  const bool half = precision == Precision::kFp16 || precision == Precision::kBf16;
  return n * double(half && v->type.dtype == DType::kFloat32 ? 2 : dtype_size(v->type.dtype));
}

// What a cache would keep of an attention operand: the smallest value on its chain of views back
// to the projection (grouped KV heads are expanded to the query heads just before attention).
double cached_bytes(const Value* v, Precision precision) {
  double best = stored_bytes(v, precision);
  for (int step = 0; step < 8 && v->producer; ++step) {
    const Node* p = v->producer;
    const bool view = p->op == OpKind::kReshape || p->op == OpKind::kTranspose || p->op == OpKind::kExpand ||
                      p->op == OpKind::kUnsqueeze || p->op == OpKind::kSqueeze || p->op == OpKind::kIdentity ||
                      p->op == OpKind::kCast || p->op == OpKind::kMul || p->op == OpKind::kDiv;
    if (!view || !p->has_input(0)) break;
    v = p->inputs[0];
    best = std::min(best, stored_bytes(v, precision));
  }
  return best;
}

// The keys and values one forward's attention reads: K and V of fused Attention nodes, else the
// second operand of products between two activations (Q.K^T reads K^T, P.V reads V).
double kv_bytes(const Graph& g, Precision precision) {
  double b = 0;
  for (const auto& np : g.nodes) {
    const Node& n = *np;
    if (n.op == OpKind::kAttention && n.has_input(1) && n.has_input(2)) {
      b += cached_bytes(n.inputs[1], precision) + cached_bytes(n.inputs[2], precision);
    } else if (n.op == OpKind::kMatMul && n.inputs.size() == 2 && !n.inputs[0]->constant && !n.inputs[1]->constant &&
               n.inputs[0]->producer && n.inputs[1]->producer) {
      b += cached_bytes(n.inputs[1], precision);
    }
  }
  return b;
}

// The activation arena of one forward: every step's outputs live from that step to their last
// reader, planned as the GPU plans its arena (graph inputs and outputs apart, as there).
Expected<size_t> activation_bytes(std::unique_ptr<Graph> g, Precision precision) {
  KILN_ASSIGN_OR_RETURN(Plan plan, plan_host(std::move(g), /*require_cpu_kernels=*/false));
  const Graph& pg = *plan.graph;
  std::map<uint32_t, BufferRequest> live;  // slot -> its current value's request
  std::vector<BufferRequest> reqs;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const PlanStep& s = plan.steps[i];
    const Node& n = *pg.nodes[s.node];
    for (size_t o = 0; o < s.outputs.size() && o < n.outputs.size(); ++o) {
      if (s.outputs[o].kind != ValueRef::Kind::kSlot || !n.outputs[o]) continue;
      if (std::find(pg.outputs.begin(), pg.outputs.end(), n.outputs[o]) != pg.outputs.end()) continue;
      live[s.outputs[o].index] = {size_t(stored_bytes(n.outputs[o], precision)), int(i), int(plan.steps.size())};
    }
    for (uint32_t f : s.frees) {
      auto it = live.find(f);
      if (it == live.end()) continue;
      it->second.last_step = int(i);
      reqs.push_back(it->second);
      live.erase(it);
    }
  }
  for (auto& [slot, r] : live) reqs.push_back(r);
  return plan_memory(reqs).peak;
}

double token_count(const Graph& g) {
  double best = 0, batch = 1;
  for (const Value* v : g.inputs) {
    if (!v->type.shape || !v->type.shape->is_static()) continue;
    double n = 1;
    for (const Dim& d : v->type.shape->dims) n *= double(d.value());
    if (v->type.dtype == DType::kInt64 || v->type.dtype == DType::kInt32) best = std::max(best, n);
    if (v == g.inputs.front() && v->type.shape->rank() > 0) batch = double(v->type.shape->dims[0].value());
  }
  return best > 0 ? best : batch;
}

}  // namespace

Expected<std::vector<ParallelEstimate>> estimate_parallel(const std::string& onnx_path, const BuildConfig& config,
                                                          const std::vector<int>& gpus) {
  ImportOptions io;
  io.infer = false;
  KILN_ASSIGN_OR_RETURN(Model m, import_onnx_file(onnx_path, io));
  KILN_ASSIGN_OR_RETURN(auto ranges, bind_config_shapes(*m.graph, config));
  if (!ranges.empty()) return KILN_ERROR(kInvalidArgument, "plan-parallel needs fixed shapes, not ranges");
  std::vector<ParallelEstimate> rows;
  for (int n : gpus) {
    if (n < 1 || n > 64) return KILN_ERROR(kInvalidArgument, "--gpus {}: expected 1 to 64", n);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, clone_graph(*m.graph));
    TensorParallelReport rep;
    PassOptions po;
    po.disabled = config.disabled_passes;
    KILN_ASSIGN_OR_RETURN(PassReport pr, run_passes(*g, n > 1 ? tensor_parallel_pipeline(n, 0, &rep) : default_pipeline(), po));
    (void)pr;
    ParallelEstimate e;
    e.gpus = n;
    const bool half = config.precision == Precision::kFp16 || config.precision == Precision::kBf16;
    for (const auto& v : g->values) {
      if (v->constant && !v->producer) e.weight_bytes += v->constant->dtype() == DType::kFloat32 && half ? v->constant->nbytes() / 2 : v->constant->nbytes();
    }
    e.tokens = token_count(*g);
    e.kv_bytes_per_token = kv_bytes(*g, config.precision) / std::max(1.0, e.tokens);
    const double scale = half ? 0.5 : 1.0;  // the report counts the IR's f32 bytes
    e.all_reduces = rep.all_reduces;
    e.all_gathers = rep.all_gathers;
    e.payload_bytes = size_t(double(rep.all_reduce_bytes + rep.all_gather_bytes) * scale);
    e.bus_bytes = (2.0 * (n - 1) / n * double(rep.all_reduce_bytes) + double(n - 1) / n * double(rep.all_gather_bytes)) * scale;
    e.kept_whole = rep.kept_whole;
    KILN_ASSIGN_OR_RETURN(e.activation_bytes, activation_bytes(std::move(g), config.precision));
    rows.push_back(std::move(e));
  }
  return rows;
}

Expected<double> measure_all_reduce_ms(int n, size_t bytes, int iterations) {
  std::string why;
  if (!gpu_usable(&why)) return KILN_ERROR(kUnsupported, "no usable GPU: {}", why);
  if (gpu_count() < n) return KILN_ERROR(kUnsupported, "{} GPUs asked for, {} here", n, gpu_count());
  return gpu_all_reduce_ms(n, bytes, iterations);
}

}  // namespace kiln
