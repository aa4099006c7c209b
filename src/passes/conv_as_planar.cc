// conv-as-planar: a 1-D convolution or transposed convolution (speech front ends, temporal
// convolutions, vocoder upsamplers) becomes the same over a height of 1, between an Unsqueeze and a
// Squeeze. Backends then need one
// convolution path (cuDNN's 2-D one on the GPU), and the views cost nothing.
//
//   Before:  %w = const dense<f32[16,8,3]> ...
//            %y = Conv(%x, %w, %b) {pads = [1, 1], strides = [2]} : f32[N,16,L2] @conv1
//   After:   %w_2d = const dense<f32[16,8,1,3]> ...                 # the same values
//            %x_2d = Unsqueeze(%x, %axis2) : f32[N,8,1,L]
//            %y_2d = Conv(%x_2d, %w_2d, %b) {pads = [0, 1, 0, 1], strides = [1, 2]} : f32[N,16,1,L2] @conv1
//            %y = Squeeze(%y_2d, %axis2) : f32[N,16,L2]
//
// kernel_shape, strides, dilations, pads, output_padding and output_shape gain the height's identity
// values (1, 1, 1, 0 and 0, 0, 1);
// group and auto_pad carry over (a height of 1 with a kernel of 1 needs no padding under any
// auto_pad). Preconditions, all checked: the input has rank 3 and a known type, the weight is a
// rank-3 constant; other convolutions, and those carrying a graph-valued attribute (which would
// need re-parenting onto the new node), are left alone.
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace kiln {

namespace {

Type with_unit_height(const Type& t) {
  Type r = t;
  r.shape->dims.insert(r.shape->dims.begin() + 2, Dim(1));
  return r;
}

// attr [a...] -> [identity, a...] (or [i0, a0.., i1, a1..] for pads, begin and end halves).
void lift_attr(Node& n, const std::string& name, int64_t identity) {
  if (!n.has_attr(name)) return;
  std::vector<int64_t> v = n.attr_ints(name);
  std::vector<int64_t> r;
  if (name == "pads" && v.size() == 2) r = {identity, v[0], identity, v[1]};
  else if (v.size() == 1) r = {identity, v[0]};
  else return;
  n.attrs[name] = Attribute::of_ints(std::move(r));
}

}  // namespace

Expected<bool> conv_as_planar(Graph& g) {
  UseMap uses(g);
  std::vector<Node*> convs;
  for (const auto& np : g.nodes) {
    if (np->op == OpKind::kConv || np->op == OpKind::kConvTranspose) convs.push_back(np.get());
  }
  bool changed = false;
  for (Node* n : convs) {
    Value* x = n->inputs[0];
    Value* y = n->outputs[0];
    const Tensor* w = constant_of(g, n->inputs[1]);
    if (!x->type.is_tensor() || !x->type.has_rank() || x->type.shape->rank() != 3 || !w || w->rank() != 3) continue;
    if (has_subgraph(*n)) continue;
    if (!y->type.is_tensor() || !y->type.has_rank() || y->type.shape->rank() != 3) continue;
    Value* axis = add_i64_constant(g, "axis2", {2});
    Value* wv = g.add_constant(g.unique_name(n->inputs[1]->name + "_2d"), w->reshaped({w->dim(0), w->dim(1), 1, w->dim(2)}));
    Node* up = g.add_node(OpKind::kUnsqueeze, {x, axis}, 1, g.unique_name(n->name + "_unsqueeze"));
    up->outputs[0]->type = with_unit_height(x->type);
    up->outputs[0]->name = g.unique_name(x->name + "_2d");
    std::vector<Value*> ins = {up->outputs[0], wv};
    if (n->inputs.size() > 2) ins.push_back(n->inputs[2]);
    Node* conv = g.add_node(n->op, ins, 1, n->name);
    conv->attrs = n->attrs;
    conv->index = n->index;
    lift_attr(*conv, "kernel_shape", 1);
    lift_attr(*conv, "strides", 1);
    lift_attr(*conv, "dilations", 1);
    lift_attr(*conv, "pads", 0);
    lift_attr(*conv, "output_padding", 0);  // ConvTranspose
    lift_attr(*conv, "output_shape", 1);
    conv->outputs[0]->type = with_unit_height(y->type);
    conv->outputs[0]->name = g.unique_name(y->name + "_2d");
    // The original node becomes the Squeeze, so its output keeps its name, type and readers.
    uses.remove_node(n);
    n->op = OpKind::kSqueeze;
    n->attrs.clear();
    n->inputs = {conv->outputs[0], axis};
    n->name = g.unique_name(n->name + "_squeeze");
    uses.add_node(n);
    uses.add_node(up);
    uses.add_node(conv);
    changed = true;
  }
  if (changed) {
    KILN_RETURN_IF_ERROR(g.topo_sort());
    KILN_RETURN_IF_ERROR(eliminate_dead_code(g).status());
  }
  return changed;
}

}  // namespace kiln
