// A 2-D convolution with fewer output channels than a multiple of 8 (a UNet's or a VAE's 4-channel
// latent output, a segmentation head's few classes) in half-precision NHWC: cuDNN pads the filter,
// the bias and the output to 8 channels itself on every run (four extra kernels around the
// convolution in the diffusion UNet's last layer, bench/RESULTS.md forty-first session). Here the
// zero filters and bias are made once, at build: the convolution runs with K rounded up to 8, as
// any other (its library paths and timing), into a buffer of its own, and one copy takes the first
// K channels into the node's output (which a following layout copy composes with).
#include <algorithm>
#include <memory>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

// The padded stand-in for the node: its own weight, bias and output values (constants the lowering
// knows through set_constant), alive as long as the lowering.
struct PaddedConv {
  Value w, b, y;
  Node node;
};

// t's leading dim grown to `rows`, the new rows zero.
Expected<Tensor> pad_rows(const Tensor& t, int64_t rows) {
  KILN_ASSIGN_OR_RETURN(Tensor f, convert_tensor(t, DType::kFloat32));
  std::vector<int64_t> dims = f.dims();
  dims[0] = rows;
  KILN_ASSIGN_OR_RETURN(Tensor o, Tensor::create(DType::kFloat32, dims));
  std::fill(o.data<float>(), o.data<float>() + o.numel(), 0.f);
  std::copy(f.data<float>(), f.data<float>() + f.numel(), o.data<float>());
  return o;
}

}  // namespace

Expected<bool> lower_conv_padded_k(Lowering& L, const Node& n, const Tensor& w, const Tensor* bias,
                                   const std::function<Status(const Node&)>& lower) {
  const int64_t k = w.dim(0), kp = (k + 7) / 8 * 8;
  const Type& yt = n.outputs[0]->type;
  if (kp == k || !yt.has_rank() || yt.shape->rank() != 4 || !yt.shape->is_static()) return false;
  auto pc = std::make_shared<PaddedConv>();
  KILN_ASSIGN_OR_RETURN(Tensor wp, pad_rows(w, kp));
  pc->w.name = n.inputs[1]->name + "_padded";
  pc->w.type = Type::tensor(DType::kFloat32, Shape::of(wp.dims()));
  L.set_constant(&pc->w, std::move(wp));
  if (bias) {
    KILN_ASSIGN_OR_RETURN(Tensor bp, pad_rows(*bias, kp));
    pc->b.name = n.inputs[2]->name + "_padded";
    pc->b.type = Type::tensor(DType::kFloat32, Shape::of(bp.dims()));
    L.set_constant(&pc->b, std::move(bp));
  }
  pc->y.name = n.outputs[0]->name + "_padded";
  pc->y.type = yt;
  pc->y.type.shape->dims[1] = Dim(kp);
  pc->node.op = n.op;
  pc->node.name = n.name;
  pc->node.index = n.index;
  pc->node.attrs = n.attrs;
  pc->node.owner = n.owner;
  pc->node.inputs = {n.inputs[0], &pc->w, bias ? &pc->b : nullptr};
  pc->node.outputs = {&pc->y};
  L.keep_alive.push_back(pc);

  // The input in NHWC first, kept whatever follows: a lowering caches the conversion, so one made
  // inside an attempt that declines would be cached with its step dropped.
  KILN_RETURN_IF_ERROR(L.nhwc(n.inputs[0]).status());
  const size_t first = L.steps.size();
  if (Status s = lower(pc->node); !s) {  // the unpadded convolution's own path may still take it
    if (s.code() != ErrorCode::kUnsupported) return s;
    L.drop_steps_from(first);
    return false;
  }
  // The steps count as the node's (the profile groups steps by ONNX node).
  for (size_t i = first; i < L.steps.size(); ++i) L.steps[i].node_index = L.node_index(&n);
  KILN_ASSIGN_OR_RETURN(const DevValue* yp, L.value(&pc->y));
  const DevValue& y = L.define(n.outputs[0], yp->layout);
  emit_copy_nd(L, &n, fmt::format("kernel copy_nd (the first {} of {} channels)", k, kp), k::dt_size(yp->dt), yp->ref, 0,
               nd(y.dims, yp->strides()), y.ref, 0, nd(y.dims, y.strides()));
  return true;
}

}  // namespace kiln::cuda
