// Host steps: a node the CUDA backend declined runs with its CPU kernel inside the GPU plan. The
// step waits for the stream, copies its device inputs down, runs the kernel and copies its outputs
// up; constant inputs travel in the record. Sessions capture the device steps around it as graphs
// of their own (session.cc), so a CPU node costs its round trip, not the whole forward's graph.
#include <algorithm>
#include <cstring>

#include "backends/backend.h"
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

enum class HostIn : uint8_t { kNone, kDevice, kConstant };

bool has_subgraph(const Node& n) {
  for (const auto& [k, a] : n.attrs) {
    if (a.g || !a.graphs.empty()) return true;
  }
  return false;
}

struct In {
  HostIn kind = HostIn::kNone;
  Ref ref;
  k::DT dt = k::DT::kF32;
  std::vector<int64_t> dims;
  Tensor host;
};

// Reads one host-step input record (see encode_input).
Status read_input(Params& in, In& x) {
  x.kind = in.en(HostIn::kConstant);
  if (x.kind == HostIn::kNone) return Status::ok();
  if (x.kind == HostIn::kDevice) {
    x.ref = in.ref();
    x.dt = in.dt();
    x.dims = in.dims();
    return Status::ok();
  }
  const auto dtype = in.en(DType::kInt2);
  const std::vector<int64_t> dims = in.dims();
  const std::string_view bytes = in.bytes();
  KILN_ASSIGN_OR_RETURN(x.host, Tensor::create(dtype, dims));
  if (dtype == DType::kString || x.host.nbytes() != bytes.size()) {
    return KILN_ERROR(kInvalidModel, "step '{}': a constant input of the wrong size", in.step().label);
  }
  if (!bytes.empty()) std::memcpy(x.host.raw(), bytes.data(), bytes.size());
  return Status::ok();
}

// The host copy of a device input (or the constant itself), in the IR dtype `want`.
Expected<Data> fetch(const In& x, DType want, const RunCtx& c) {
  if (x.kind == HostIn::kConstant) return Data(x.host);
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(ir_dtype_of(x.dt), x.dims));
  KILN_CUDA_TRY(cudaMemcpy(t.raw(), c.ptr(x.ref), t.nbytes(), cudaMemcpyDeviceToHost));
  KILN_ASSIGN_OR_RETURN(Tensor ir, convert_tensor(t, want));
  return Data(std::move(ir));
}
struct Out {
  Ref ref;
  k::DT dt = k::DT::kF32;
};

Expected<StepFn> bind_host_op(Params& in, BindCtx& bc) {
  const int32_t idx = in.step().node_index;
  if (!bc.graph || idx < 0 || size_t(idx) >= bc.graph->nodes.size()) {
    return KILN_ERROR(kInvalidModel, "step '{}': a host step of no node of the plan's graph", in.step().label);
  }
  const Node* node = bc.graph->nodes[size_t(idx)].get();
  if (in.i32() != int32_t(node->inputs.size())) {
    return KILN_ERROR(kInvalidModel, "step '{}': its inputs do not match {}", in.step().label, node->describe());
  }
  std::vector<In> ins(node->inputs.size());
  for (In& x : ins) KILN_RETURN_IF_ERROR(read_input(in, x));
  // A control-flow node's bodies read values of the plan's graph: they come down too.
  const std::vector<const Value*> outer = has_subgraph(*node) ? outer_reads(*bc.graph, *node) : std::vector<const Value*>{};
  if (!outer.empty() && in.i32() != int32_t(outer.size())) {
    return KILN_ERROR(kInvalidModel, "step '{}': its outer-scope reads do not match {}", in.step().label, node->describe());
  }
  std::vector<In> outs_in(outer.size());
  for (In& x : outs_in) {
    KILN_RETURN_IF_ERROR(read_input(in, x));
    if (x.kind == HostIn::kNone) return KILN_ERROR(kInvalidModel, "step '{}': an omitted outer-scope read", in.step().label);
  }
  std::vector<std::optional<Out>> outs(node->outputs.size());
  if (in.i32() != int32_t(outs.size())) {
    return KILN_ERROR(kInvalidModel, "step '{}': its outputs do not match {}", in.step().label, node->describe());
  }
  for (auto& o : outs) {
    Ref r = in.opt_ref();
    k::DT dt = in.dt();
    if (r.id >= 0) o = Out{r, dt};
  }
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([node, ins, outs, outer, outs_in](const RunCtx& c) -> Status {
    KILN_CUDA_TRY(cudaStreamSynchronize(c.stream));
    std::vector<Data> held, held_outer;
    std::vector<const Data*> ptrs;
    held.reserve(ins.size());
    held_outer.reserve(outer.size());
    for (size_t i = 0; i < ins.size(); ++i) {
      if (ins[i].kind == HostIn::kNone) { ptrs.push_back(nullptr); continue; }
      KILN_ASSIGN_OR_RETURN(Data d, fetch(ins[i], node->inputs[i]->type.dtype, c));
      held.push_back(std::move(d));
      ptrs.push_back(&held.back());
    }
    for (size_t i = 0; i < outer.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(Data d, fetch(outs_in[i], outer[i]->type.dtype, c));
      held_outer.push_back(std::move(d));
    }
    ValueLookup lookup = [&](const Value* v) -> const Data* {
      for (size_t i = 0; i < outer.size(); ++i) {
        if (outer[i] == v) return &held_outer[i];
      }
      return nullptr;
    };
    // Through the CPU backend's interface (backends/backend.h), which also checks each output
    // against its inferred type.
    KILN_ASSIGN_OR_RETURN(std::vector<Data> results, run_node_on_cpu(*node, std::move(ptrs), lookup));
    for (size_t i = 0; i < outs.size(); ++i) {
      if (!outs[i]) continue;
      if (i >= results.size() || !results[i].is_tensor()) {
        return KILN_ERROR(kInternal, "{}: output {} is not a tensor", node->describe(), i);
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, convert_tensor(results[i].tensor, ir_dtype_of(outs[i]->dt)));
      KILN_CUDA_TRY(cudaMemcpy(c.ptr(outs[i]->ref), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    }
    return Status::ok();
  });
}

// One host-step input: omitted, a constant (its bytes in the record) or a device value.
Status encode_input(Lowering& L, const Node& n, const Value* v, ByteWriter& w, std::vector<int>& reads) {
  if (!v) {
    w.put(int32_t(HostIn::kNone));
    return Status::ok();
  }
  if (const Tensor* c = L.constant(v)) {
    if (c->dtype() == DType::kString) {
      return KILN_ERROR(kUnsupported, "{}: a string constant input on the host inside a GPU engine", n.describe());
    }
    w.put(int32_t(HostIn::kConstant));
    w.put(int32_t(c->dtype()));
    put(w, c->dims());
    w.str(std::string_view(static_cast<const char*>(c->raw()), c->nbytes()));
    return Status::ok();
  }
  if (!v->type.is_tensor()) {
    return KILN_ERROR(kUnsupported, "{}: '{}' is {}, which the GPU cannot hold", n.describe(), v->name, v->type.to_string());
  }
  KILN_ASSIGN_OR_RETURN(const DevValue* d, L.rowmajor(v));
  w.put(int32_t(HostIn::kDevice));
  put(w, d->ref);
  w.put(int32_t(d->dt));
  put(w, d->dims);
  if (!d->ref.weight) reads.push_back(d->ref.id);
  return Status::ok();
}

}  // namespace

// The values of g that n's subgraph bodies read (ONNX outer-scope references), nested bodies
// included, each once, in a fixed order: what a control-flow host step copies down besides its
// inputs. The build and the binder compute the same list from the same graph.
static void outer_reads(const Graph& g, const Graph& body, std::vector<const Value*>& out) {
  auto add = [&](const Value* v) {
    if (v && v->owner == &g && std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  };
  for (const auto& sn : body.nodes) {
    for (const Value* in : sn->inputs) add(in);
    for (const auto& [key, a] : sn->attrs) {
      if (a.g) outer_reads(g, *a.g, out);
      for (const auto& sg : a.graphs) outer_reads(g, *sg, out);
    }
  }
  for (const Value* o : body.outputs) add(o);
}

std::vector<const Value*> outer_reads(const Graph& g, const Node& n) {
  std::vector<const Value*> out;
  for (const auto& [key, a] : n.attrs) {
    if (a.g) outer_reads(g, *a.g, out);
    for (const auto& sg : a.graphs) outer_reads(g, *sg, out);
  }
  return out;
}

// The placer has checked that the CPU backend supports n. A control-flow node (If, Loop, Scan)
// runs whole on the host, its bodies' outer-scope reads copied down with its inputs.
Status lower_on_cpu(Lowering& L, const Node& n) {
  if (L.node_index(&n) < 0) return KILN_ERROR(kInternal, "{}: not a top-level node", n.describe());
  ByteWriter w;
  std::vector<int> reads, writes;
  w.put(int32_t(n.inputs.size()));
  for (const Value* v : n.inputs) KILN_RETURN_IF_ERROR(encode_input(L, n, v, w, reads));
  if (has_subgraph(n)) {
    const std::vector<const Value*> outer = outer_reads(L.graph(), n);
    if (!outer.empty()) {
      w.put(int32_t(outer.size()));
      for (const Value* v : outer) KILN_RETURN_IF_ERROR(encode_input(L, n, v, w, reads));
    }
  }
  w.put(int32_t(n.outputs.size()));
  for (const Value* o : n.outputs) {
    if (!o) {
      put(w, Ref{});
      w.put(int32_t(k::DT::kF32));
      continue;
    }
    if (!to_kdt(o->type.dtype)) {
      return KILN_ERROR(kUnsupported, "{}: output '{}' is {}, which the GPU cannot hold", n.describe(), o->name,
                        dtype_name(o->type.dtype));
    }
    const DevValue& d = L.define(o);
    put(w, d.ref);
    w.put(int32_t(d.dt));
    writes.push_back(d.ref.id);
  }
  L.emit(&n, "cpu kernel (host round trip)", reads, writes, StepOp::kHostOp, std::move(w), /*host=*/true);
  return Status::ok();
}

void register_host_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kHostOp] = bind_host_op; }

}  // namespace kiln::cuda
