// Op family: slice. This file: Pad (modes constant, reflect, edge, wrap; pads, constant_value and
// axes as inputs, opset 18+ form). Each mode is a per-axis map from output index to input index
// (-1: the constant), so one gather serves every mode and dtype. Negative pads crop.
#include <algorithm>

#include "ops/shape_util.h"

namespace kiln {

namespace {

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

template <typename Ctx>
Expected<PadMode> pad_mode(const Ctx& c) {
  const std::string m = c.node().attr_string("mode", "constant");
  if (m == "constant") return PadMode::kConstant;
  if (m == "reflect") return PadMode::kReflect;
  if (m == "edge") return PadMode::kEdge;
  if (m == "wrap") return PadMode::kWrap;
  return c.error("mode must be constant, reflect, edge or wrap, got '{}'", m);
}

// Per-axis (begin, end) pads for every axis of a rank-`rank` tensor, from the pads and axes values.
template <typename Ctx>
Expected<std::vector<std::pair<int64_t, int64_t>>> pads_per_axis(const Ctx& c, const std::vector<int64_t>& pads,
                                                                  std::vector<int64_t> axes, int64_t rank) {
  if (axes.empty()) {
    for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
  }
  if (pads.size() != 2 * axes.size()) {
    return c.error("pads has {} values; expected 2 per padded axis ({})", pads.size(), 2 * axes.size());
  }
  KILN_RETURN_IF_ERROR(axes_mask(c, axes, rank).status());
  // No tensor has 2^40 elements along an axis: a larger pad is hostile, and bounding it keeps the
  // sums below from overflowing.
  constexpr int64_t kMaxPad = int64_t(1) << 40;
  for (int64_t p : pads) {
    if (p > kMaxPad || p < -kMaxPad) return c.error("pads {} holds {}, beyond any tensor's size", dims_to_string(pads), p);
  }
  std::vector<std::pair<int64_t, int64_t>> per_axis(size_t(rank), {0, 0});
  for (size_t i = 0; i < axes.size(); ++i) {
    per_axis[size_t(axes[i] < 0 ? axes[i] + rank : axes[i])] = {pads[i], pads[i + axes.size()]};
  }
  return per_axis;
}

// Source index for output index i of an axis of size d padded by `begin` in front.
int64_t pad_source(PadMode mode, int64_t i, int64_t begin, int64_t d) {
  const int64_t s = i - begin;
  if (s >= 0 && s < d) return s;
  switch (mode) {
    case PadMode::kConstant: return -1;
    case PadMode::kEdge: return std::clamp<int64_t>(s, 0, d - 1);
    case PadMode::kWrap: return ((s % d) + d) % d;
    case PadMode::kReflect: {
      if (d == 1) return 0;
      // Mirroring about the first and last elements repeats with period 2*(d-1).
      const int64_t period = 2 * (d - 1);
      const int64_t m = ((s % period) + period) % period;
      return m < d ? m : period - m;
    }
  }
  return -1;
}

Status infer_pad(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(pad_mode(c).status());
  if (c.has_input(2) && c.input_type(2).is_tensor() && c.input_type(2).dtype != dt) {
    return c.error("constant_value is {} but data is {}", dtype_name(c.input_type(2).dtype), dtype_name(dt));
  }
  const Type& in = c.input_type(0);
  if (!in.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const int64_t rank = int64_t(in.shape->rank());
  std::optional<std::vector<int64_t>> pads = static_ints(c, 1);
  std::optional<std::vector<int64_t>> axes = c.has_input(3) ? static_ints(c, 3) : std::vector<int64_t>{};
  if (!pads || !axes) {
    c.set_output_tensor(0, dt, Shape(std::vector<Dim>(size_t(rank))));
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(auto per_axis, pads_per_axis(c, *pads, *axes, rank));
  Shape out = *in.shape;
  for (size_t k = 0; k < out.rank(); ++k) {
    const int64_t added = per_axis[k].first + per_axis[k].second;  // each within 2^40
    int64_t sum = 0;
    if (out[k].is_static() && __builtin_add_overflow(out[k].value(), added, &sum)) {
      return c.error("pads {} grow dim {} of {} past int64", dims_to_string(*pads), k, in.shape->to_string());
    }
    out[k] = out[k] + Dim(added);
    if (out[k].is_static() && out[k].value() < 0) {
      return c.error("pads {} crop dim {} of {} below zero", dims_to_string(*pads), k, in.shape->to_string());
    }
  }
  c.set_output_tensor(0, dt, std::move(out));
  return Status::ok();
}

Status pad_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(PadMode mode, pad_mode(c));
  KILN_ASSIGN_OR_RETURN(auto per_axis,
                        pads_per_axis(c, c.tensor(1).to_int_vector(), optional_ints(c, 3), int64_t(x.rank())));
  std::vector<int64_t> dims;
  for (size_t k = 0; k < x.rank(); ++k) {
    const auto [begin, end] = per_axis[k];
    const int64_t d = x.dim(k), n = d + begin + end;
    if (n < 0) return c.error("pads crop dim {} of input {} below zero", k, x.summary());
    if (d == 0 && n > 0 && mode != PadMode::kConstant) {
      return c.error("cannot pad the empty dim {} of input {} in this mode", k, x.summary());
    }
    dims.push_back(n);
  }
  // The output first: its size is checked there, and an empty one (a dim cropped to 0 beside a huge
  // pad) needs no index maps.
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), dims));
  if (y->numel() == 0) return Status::ok();
  std::vector<std::vector<int64_t>> maps(x.rank());
  for (size_t k = 0; k < x.rank(); ++k) {
    const int64_t begin = per_axis[k].first, d = x.dim(k);
    for (int64_t i = 0; i < dims[k]; ++i) maps[k].push_back(pad_source(mode, i, begin, d));
  }
  if (mode == PadMode::kConstant && c.has_input(2) && c.tensor(2).numel() > 0) {
    const Tensor& v = c.tensor(2);
    if (v.dtype() != x.dtype()) return c.error("constant_value {} does not match data {}", v.summary(), x.summary());
    fill_with(*y, v);
  }
  gather_axes(x, *y, maps);
  return Status::ok();
}

}  // namespace

void register_shape_pad_ops(OpRegistry& r) {
  r.def(OpKind::kPad,
        {.inputs = {2, 4}, .attrs = {{"mode", Attribute::Kind::kString}}, .infer = infer_pad, .cpu = pad_cpu});
}

}  // namespace kiln
