// Op family: conv. This file: the forward convolutions Conv, ConvInteger and QLinearConv, and the
// shared inference and planning (nn_conv.h). ConvTranspose, DeformConv and Col2Im are in
// nn_conv_extra.cc.
//
// Every forward convolution is im2col + GEMM in the accumulator type (double for floats, int64 for
// quantized values after subtracting zero points, so the padding value 0 is the zero point).
#include "ops/nn_conv.h"

namespace kiln {

void register_conv_extra_ops(OpRegistry& r);

Status infer_conv_output(InferCtx& c, size_t xi, size_t wi, DType dt) {
  const Type& tx = c.input_type(xi);
  const Type& tw = c.input_type(wi);
  if (!tx.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const Shape& x = *tx.shape;
  const size_t r = x.rank();
  if (r < 3) return c.error("X must be [N, C, D1, ...] (rank >= 3), got {}", x.to_string());
  if (tw.has_rank() && tw.shape->rank() != r) {
    return c.error("W {} must have the rank of X {}", tw.shape->to_string(), x.to_string());
  }
  const int64_t group = c.node().attr_int("group", 1);
  if (group < 1) return c.error("group must be >= 1, got {}", group);
  std::vector<Dim> out = {x[0], tw.has_rank() ? (*tw.shape)[0] : Dim()};
  std::vector<int64_t> kernel;
  if (tw.has_rank()) {
    const Shape& w = *tw.shape;
    if (x[1].is_static() && w[1].is_static() && x[1].value() != w[1].value() * group) {
      return c.error("X has {} channels but W {} with group {} expects {}", x[1].to_string(), w.to_string(), group,
                     w[1].value() * group);
    }
    for (size_t i = 2; i < r && w[i].is_static(); ++i) kernel.push_back(w[i].value());
  }
  if (!c.node().has_attr("kernel_shape") && kernel.size() != r - 2) {
    out.resize(r);  // kernel unknown until W's dims are
  } else {
    KILN_ASSIGN_OR_RETURN(Window w, read_window(c, r - 2, kernel));
    for (const Dim& d : window_output_dims(w, std::vector<Dim>(x.dims.begin() + 2, x.dims.end()))) out.push_back(d);
  }
  c.set_output_tensor(0, dt, Shape(out));
  return Status::ok();
}

Expected<ConvPlan> plan_conv(const KernelCtx& c, const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  if (x.size() < 3 || w.size() != x.size()) {
    return c.error("X must be [N, C, D1, ...] and W [M, C/group, k1, ...] of the same rank, got {} and {}",
                   dims_to_string(x), dims_to_string(w));
  }
  ConvPlan p;
  p.group = c.node().attr_int("group", 1);
  p.batch = x[0];
  p.in_ch = x[1];
  p.out_ch = w[0];
  if (p.group < 1 || p.in_ch != w[1] * p.group || p.out_ch % p.group != 0) {
    return c.error("X {} and W {} do not fit group {} (need C = W[1]*group and M divisible by group)",
                   dims_to_string(x), dims_to_string(w), p.group);
  }
  KILN_ASSIGN_OR_RETURN(p.w, read_window(c, x.size() - 2, std::vector<int64_t>(w.begin() + 2, w.end())));
  for (size_t i = 2; i < w.size(); ++i) {
    if (p.w.kernel[i - 2] != w[i]) {
      return c.error("kernel_shape {} differs from W's spatial dims {}", dims_to_string(p.w.kernel), dims_to_string(w));
    }
  }
  p.in.assign(x.begin() + 2, x.end());
  KILN_ASSIGN_OR_RETURN(p.out, resolve_window(c, p.w, p.in));
  p.y_dims = {p.batch, p.out_ch};
  p.y_dims.insert(p.y_dims.end(), p.out.begin(), p.out.end());
  return p;
}

namespace {

template <typename A>
std::vector<A> conv_forward(const ConvPlan& p, const A* x, const A* w) {
  const WindowTable t = make_window_table(p.w, p.in, p.out);
  return conv_gemm<A>(p, w, [&](int64_t n, int64_t g, A* col) { im2col<A>(p, t, x, n, g, col); });
}

// Bias B [M] as accumulator values (zeros when absent).
template <typename T>
Expected<std::vector<nn_acc_t<T>>> channel_bias(const KernelCtx& c, size_t bi, int64_t channels) {
  if (!c.has_input(bi)) return std::vector<nn_acc_t<T>>(size_t(channels), 0);
  const Tensor& b = c.tensor(bi);
  if (b.numel() != channels || b.rank() != 1 || b.dtype() != dtype_of<T>()) {
    return c.error("bias must be 1-D [{}] of type {}, got {}", channels, dtype_name(dtype_of<T>()), b.summary());
  }
  return to_acc_vector<T>(b);
}

// ---- Conv -------------------------------------------------------------------------------------

Status infer_conv(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, c.has_input(2) ? 3 : 2));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (dt != DType::kFloat32 && dt != DType::kFloat64 && dt != DType::kFloat16 && dt != DType::kBFloat16) {
    return c.error("Conv needs a float input, got {}", dtype_name(dt));
  }
  return infer_conv_output(c, 0, 1, dt);
}

Status conv_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& w = c.tensor(1);
  if (x.dtype() != w.dtype()) return c.error("X {} and W {} must share a type", x.summary(), w.summary());
  KILN_ASSIGN_OR_RETURN(ConvPlan p, plan_conv(c, x.dims(), w.dims()));
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_nn_float_v<T>) {
      return c.unsupported("Conv on {}", x.summary());
    } else {
      using A = nn_acc_t<T>;
      KILN_ASSIGN_OR_RETURN(std::vector<A> bias, channel_bias<T>(c, 2, p.out_ch));
      std::vector<A> y = conv_forward<A>(p, to_acc_vector<T>(x).data(), to_acc_vector<T>(w).data());
      add_channel_bias(y, bias, p.out_ch, p.out_size());
      KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), p.y_dims));
      store_from_acc<T>(*out, y);
      return Status::ok();
    }
  });
}

// ---- ConvInteger and QLinearConv --------------------------------------------------------------

// The integer convolution (x - x_zero_point) * (w - w_zero_point) with w's zero point per tensor
// or per output channel.
Expected<std::vector<int64_t>> integer_conv(const KernelCtx& c, const ConvPlan& p, size_t xi, size_t xzi, size_t wi,
                                            size_t wzi) {
  const Tensor& x = c.tensor(xi);
  const Tensor& w = c.tensor(wi);
  if (!is_8bit_int(x.dtype()) || !is_8bit_int(w.dtype())) return c.unsupported("integer conv of {} by {}", x.summary(), w.summary());
  const Tensor* xz = c.has_input(xzi) ? &c.tensor(xzi) : nullptr;
  const Tensor* wz = c.has_input(wzi) ? &c.tensor(wzi) : nullptr;
  if (xz && xz->numel() != 1) return c.error("x_zero_point must be a scalar, got {}", xz->summary());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> vx, subtract_zero_point(c, x, xz, -1));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> vw, subtract_zero_point(c, w, wz, 0));
  return conv_forward<int64_t>(p, vx.data(), vw.data());
}

Status infer_conv_integer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType tx, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType tw, c.tensor_dtype(1));
  if (!is_8bit_int(tx) || !is_8bit_int(tw)) {
    return c.error("ConvInteger needs int8/uint8 x and w, got {} and {}", dtype_name(tx), dtype_name(tw));
  }
  return infer_conv_output(c, 0, 1, DType::kInt32);
}

Status conv_integer_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(ConvPlan p, plan_conv(c, c.tensor(0).dims(), c.tensor(1).dims()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> y, integer_conv(c, p, 0, 2, 1, 3));
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, DType::kInt32, p.y_dims));
  store_from_acc<int32_t>(*out, y);
  return Status::ok();
}

// Inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B (int32).
Status infer_qlinear_conv(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType tx, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType tw, c.tensor_dtype(3));
  KILN_ASSIGN_OR_RETURN(DType ty, c.tensor_dtype(7));
  if (!is_8bit_int(tx) || !is_8bit_int(tw) || !is_8bit_int(ty)) {
    return c.error("QLinearConv needs int8/uint8 x, w and y_zero_point, got {}, {} and {}", dtype_name(tx),
                   dtype_name(tw), dtype_name(ty));
  }
  return infer_conv_output(c, 0, 3, ty);
}

// y = saturate(round((conv + B[m]) * x_scale * w_scale[m] / y_scale) + y_zero_point); the factor is
// rounded to the scales' type, as the reference computes it there.
Status qlinear_conv_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(ConvPlan p, plan_conv(c, c.tensor(0).dims(), c.tensor(3).dims()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> y, integer_conv(c, p, 0, 2, 3, 5));
  if (c.has_input(8)) {
    const Tensor& b = c.tensor(8);
    if (b.numel() != p.out_ch || b.rank() != 1) return c.error("B must be [{}], got {}", p.out_ch, b.summary());
    std::vector<int64_t> bias(size_t(p.out_ch));
    for (int64_t m = 0; m < p.out_ch; ++m) bias[size_t(m)] = b.as_int(m);
    add_channel_bias(y, bias, p.out_ch, p.out_size());
  }
  const Tensor& ys = c.tensor(6);
  const Tensor& yz = c.tensor(7);
  std::vector<double> xs = tensor_as_doubles(c.tensor(1)), ws = tensor_as_doubles(c.tensor(4));
  if (xs.size() != 1 || ys.numel() != 1 || yz.numel() != 1 || (ws.size() != 1 && int64_t(ws.size()) != p.out_ch)) {
    return c.error("x_scale, y_scale and y_zero_point must be scalars and w_scale scalar or [{}]; got {}, {}, {}, {}",
                   p.out_ch, c.tensor(1).summary(), ys.summary(), yz.summary(), c.tensor(4).summary());
  }
  const DType st = c.tensor(1).dtype();
  std::vector<double> factor;
  for (double s : ws) factor.push_back(round_to_dtype(round_to_dtype(xs[0] * s, st) / ys.as_double(0), st));
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, yz.dtype(), p.y_dims));
  const double zp = yz.as_double(0);
  const int64_t plane = p.out_size();
  for (size_t i = 0; i < y.size(); ++i) {
    const double f = factor[factor.size() == 1 ? 0 : size_t(int64_t(i) / plane % p.out_ch)];
    const int64_t q = saturate_round(double(y[i]) * f + zp, yz.dtype());
    if (yz.dtype() == DType::kInt8) out->data<int8_t>()[i] = int8_t(q);
    else out->data<uint8_t>()[i] = uint8_t(q);
  }
  return Status::ok();
}

}  // namespace

std::vector<AttrSpec> conv_attrs() {
  return {{"auto_pad", Attribute::Kind::kString}, {"dilations", Attribute::Kind::kInts},
          {"group", Attribute::Kind::kInt},       {"kernel_shape", Attribute::Kind::kInts},
          {"pads", Attribute::Kind::kInts},       {"strides", Attribute::Kind::kInts}};
}

void register_conv_ops(OpRegistry& r) {
  r.def(OpKind::kConv, {.inputs = {2, 3}, .attrs = conv_attrs(), .infer = infer_conv, .cpu = conv_cpu});
  r.def(OpKind::kConvInteger,
        {.inputs = {2, 4}, .attrs = conv_attrs(), .infer = infer_conv_integer, .cpu = conv_integer_cpu});
  r.def(OpKind::kQLinearConv,
        {.inputs = {8, 9}, .attrs = conv_attrs(), .infer = infer_qlinear_conv, .cpu = qlinear_conv_cpu});
  register_conv_extra_ops(r);
}

}  // namespace kiln
