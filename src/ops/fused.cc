// Op family: fused (kiln's own ops, domain "ai.kiln"; made by graph passes, not by exporters).
// Each carries the subgraph it replaces as its body, which the CPU reference runs node by node, so
// its meaning is exactly the unfused graph's; backends that compile it read what they need there.
//
// FusedElementwise(x0, ..., xn-1) {body = graph (p0, ..., pn-1) { elementwise nodes; return r }}
// One output: the body evaluated on the inputs. The fuse-elementwise pass builds it from a chain
// of elementwise nodes (numpy broadcasting throughout, so the output has the broadcast shape of
// the inputs); the body's inputs are the node's inputs in order and it reads nothing else of the
// enclosing graph, so a backend can compile it on its own (the CUDA backend generates one kernel
// from it). The CPU reference runs the body node by node, exactly as the unfused graph ran.
#include "ops/op_registry.h"

namespace kiln {

namespace {

Status check_body(const Node& n, const Graph& body, size_t inputs, size_t outputs) {
  if (body.inputs.size() != inputs) {
    return KILN_ERROR(kInvalidModel, "{}: body has {} inputs, the node {}", n.describe(), body.inputs.size(), inputs);
  }
  if (body.outputs.size() != outputs) {
    return KILN_ERROR(kInvalidModel, "{}: body has {} outputs, the node {}", n.describe(), body.outputs.size(),
                      outputs);
  }
  return Status::ok();
}

Status infer_body(InferCtx& c) {
  const Graph& body = *c.node().attr_graph("body");
  KILN_RETURN_IF_ERROR(check_body(c.node(), body, c.num_inputs(), c.num_outputs()));
  std::vector<Type> in;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    if (!c.has_input(i)) return c.error("input {} is missing (a fused body takes every input)", i);
    in.push_back(c.input_type(i));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Type> out, c.infer_graph(body, in));
  for (size_t i = 0; i < out.size(); ++i) c.set_output(i, std::move(out[i]));
  return Status::ok();
}

// Both ops run their body: the inputs in order, every one present.
Status run_body_cpu(KernelCtx& c) {
  const Graph& body = *c.node().attr_graph("body");
  KILN_RETURN_IF_ERROR(check_body(c.node(), body, c.num_inputs(), c.num_outputs()));
  std::vector<Data> in;
  for (size_t i = 0; i < c.num_inputs(); ++i) in.push_back(c.input(i));  // shares the buffers
  KILN_ASSIGN_OR_RETURN(std::vector<Data> out, c.run_graph(body, std::move(in)));
  for (size_t i = 0; i < out.size(); ++i) c.set_output(i, std::move(out[i]));
  return Status::ok();
}

}  // namespace

void register_fused_ops(OpRegistry& r) {
  r.def(OpKind::kFusedElementwise, {.inputs = {1, kVariadic}, .outputs = {1, 1},
                                    .attrs = {{"body", Attribute::Kind::kGraph, true}},
                                    .infer = infer_body, .cpu = run_body_cpu});
  // QuantizedMatMul(x, w_q, w_scale [, bias]) {body}: a MatMul between a quantized activation and a
  // quantized constant weight, made by fuse-qdq-matmul from QuantizeLinear -> DequantizeLinear on x
  // and DequantizeLinear on w_q (and a bias Add). Its body (see that pass for the exact form) holds
  // x's scale and zero point as constants; a backend with int8/fp8 GEMMs runs it as one, on the
  // quantized values, instead of the float ops.
  r.def(OpKind::kQuantizedMatMul, {.inputs = {3, 4}, .outputs = {1, 1},
                                   .attrs = {{"body", Attribute::Kind::kGraph, true}},
                                   .infer = infer_body, .cpu = run_body_cpu});
}

}  // namespace kiln
