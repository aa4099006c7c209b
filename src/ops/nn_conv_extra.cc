// Op family: conv. This file: ConvTranspose, Col2Im, DeformConv and CausalConvWithState.
//
// ConvTranspose is the adjoint of Conv: a GEMM makes columns W^T X, and col2im scatters them into
// the output through the window table of the forward convolution that would map the output back
// to the input. Col2Im is that scatter alone. CausalConvWithState is a depthwise causal 1-D conv
// over a carried state. DeformConv is Conv whose im2col samples the input
// (multilinearly, zero outside) at positions moved by learned offsets and scaled by a mask.
#include <cmath>

#include "ops/nn_conv.h"
#include "ops/shape_util.h"

namespace kiln {
namespace {

// out_plane[t(p, q)] += col[q, p] for every in-range tap: the scatter of one channel's columns.
template <typename A>
void col2im_add(const WindowTable& t, const A* col, A* out_plane) {
  for (int64_t q = 0; q < t.kernel_size; ++q) {
    for (int64_t p = 0; p < t.positions; ++p) {
      const int64_t off = t.at(p, q);
      if (off >= 0) out_plane[off] += col[q * t.positions + p];
    }
  }
}

// ---- ConvTranspose --------------------------------------------------------------------------

// Output spatial dim i of a transposed convolution with the given begin + end pads.
template <typename D>
D deconv_output_dim(const Window& w, size_t i, const D& in, int64_t output_padding, int64_t pad_sum) {
  return D(w.strides[i]) * (in - D(int64_t{1})) + D(output_padding + w.extent(i) - pad_sum);
}

std::vector<int64_t> output_shape_attr(const Node& n, size_t nspatial) {
  std::vector<int64_t> s = n.attr_ints("output_shape");
  if (s.size() == nspatial + 2) s.erase(s.begin(), s.begin() + 2);  // some exporters give [N, C, ...]
  return s;
}

template <typename Ctx>
Expected<std::vector<int64_t>> read_output_padding(const Ctx& c, const Window& w) {
  std::vector<int64_t> op = c.node().attr_ints("output_padding", std::vector<int64_t>(w.rank(), 0));
  if (op.size() != w.rank()) return c.error("output_padding has {} values, expected {}", op.size(), w.rank());
  for (size_t i = 0; i < op.size(); ++i) {
    if (op[i] < 0 || (op[i] >= w.strides[i] && op[i] >= w.dilations[i])) {
      return c.error("output_padding {} must be below the stride or the dilation", dims_to_string(op));
    }
  }
  return op;
}

Status infer_conv_transpose(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, c.has_input(2) ? 3 : 2));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& tx = c.input_type(0);
  const Type& tw = c.input_type(1);
  if (!tx.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const Shape& x = *tx.shape;
  const size_t r = x.rank(), ns = r >= 2 ? r - 2 : 0;
  if (r < 3 || (tw.has_rank() && tw.shape->rank() != r)) {
    return c.error("X must be [N, C, D1, ...] and W [C, M/group, k1, ...] of the same rank, got {} and {}",
                   x.to_string(), tw.to_string());
  }
  const int64_t group = c.node().attr_int("group", 1);
  std::vector<Dim> out = {x[0], tw.has_rank() ? (*tw.shape)[1] * Dim(group) : Dim()};
  std::vector<int64_t> kernel;
  for (size_t i = 2; tw.has_rank() && i < r && (*tw.shape)[i].is_static(); ++i) kernel.push_back((*tw.shape)[i].value());
  const std::vector<int64_t> shape = output_shape_attr(c.node(), ns);
  if (!shape.empty()) {
    if (shape.size() != ns) return c.error("output_shape has {} values, expected {}", shape.size(), ns);
    out.insert(out.end(), shape.begin(), shape.end());
  } else if (!c.node().has_attr("kernel_shape") && kernel.size() != ns) {
    out.resize(r);
  } else {
    KILN_ASSIGN_OR_RETURN(Window w, read_window(c, ns, kernel));
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> op, read_output_padding(c, w));
    for (size_t i = 0; i < ns; ++i) {
      const bool same = w.auto_pad == AutoPad::kSameUpper || w.auto_pad == AutoPad::kSameLower;
      out.push_back(same ? x[i + 2] * Dim(w.strides[i])
                         : deconv_output_dim<Dim>(w, i, x[i + 2], op[i], w.pads[i] + w.pads[i + ns]));
    }
  }
  c.set_output_tensor(0, dt, Shape(out));
  return Status::ok();
}

struct DeconvPlan {
  Window w;  // pads resolved
  int64_t batch = 0, in_ch = 0, out_ch = 0, group = 1;
  std::vector<int64_t> in, out, y_dims;
};

Expected<DeconvPlan> plan_conv_transpose(const KernelCtx& c, const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  if (x.size() < 3 || w.size() != x.size()) {
    return c.error("X must be [N, C, D1, ...] and W [C, M/group, k1, ...] of the same rank, got {} and {}",
                   dims_to_string(x), dims_to_string(w));
  }
  DeconvPlan p;
  p.group = c.node().attr_int("group", 1);
  p.batch = x[0];
  p.in_ch = x[1];
  if (p.group < 1 || w[0] != p.in_ch || p.in_ch % p.group != 0) {
    return c.error("X {} and W {} do not fit group {} (need W[0] = C, divisible by group)", dims_to_string(x),
                   dims_to_string(w), p.group);
  }
  p.out_ch = w[1] * p.group;
  const size_t ns = x.size() - 2;
  KILN_ASSIGN_OR_RETURN(p.w, read_window(c, ns, std::vector<int64_t>(w.begin() + 2, w.end())));
  for (size_t i = 0; i < ns; ++i) {
    if (p.w.kernel[i] != w[i + 2]) return c.error("kernel_shape {} differs from W {}", dims_to_string(p.w.kernel), dims_to_string(w));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> op, read_output_padding(c, p.w));
  p.in.assign(x.begin() + 2, x.end());
  std::vector<int64_t> shape = output_shape_attr(c.node(), ns);
  const bool same = p.w.auto_pad == AutoPad::kSameUpper || p.w.auto_pad == AutoPad::kSameLower;
  if (shape.empty() && same) {
    for (size_t i = 0; i < ns; ++i) shape.push_back(p.in[i] * p.w.strides[i]);
  }
  if (!shape.empty()) {
    // The pads that give this output: total = (the size with no pads) - output_shape, split with the
    // odd one at the end for SAME_UPPER and at the beginning otherwise (floor division: the total
    // may be negative when output_shape is larger).
    if (shape.size() != ns) return c.error("output_shape has {} values, expected {}", shape.size(), ns);
    for (size_t i = 0; i < ns; ++i) {
      const int64_t total = deconv_output_dim<int64_t>(p.w, i, p.in[i], op[i], 0) - shape[i];
      const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
      p.w.pads[i] = p.w.auto_pad == AutoPad::kSameUpper ? half : total - half;
      p.w.pads[i + ns] = total - p.w.pads[i];
    }
    p.out = shape;
  } else {
    for (size_t i = 0; i < ns; ++i) {
      p.out.push_back(deconv_output_dim<int64_t>(p.w, i, p.in[i], op[i], p.w.pads[i] + p.w.pads[i + ns]));
    }
  }
  for (size_t i = 0; i < ns; ++i) {
    if (p.out[i] < 0) return c.error("output spatial dims {} are negative", dims_to_string(p.out));
  }
  p.y_dims = {p.batch, p.out_ch};
  p.y_dims.insert(p.y_dims.end(), p.out.begin(), p.out.end());
  return p;
}

Status conv_transpose_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& w = c.tensor(1);
  if (x.dtype() != w.dtype()) return c.error("X {} and W {} must share a type", x.summary(), w.summary());
  KILN_ASSIGN_OR_RETURN(DeconvPlan p, plan_conv_transpose(c, x.dims(), w.dims()));
  // The forward conv from the output (its input) to x (its output) says where each tap lands.
  const WindowTable t = make_window_table(p.w, p.out, p.in);
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_nn_float_v<T>) {
      return c.unsupported("ConvTranspose on {}", x.summary());
    } else {
      using A = nn_acc_t<T>;
      const std::vector<A> vx = to_acc_vector<T>(x), vw = to_acc_vector<T>(w);
      const int64_t cg = p.in_ch / p.group, mg = p.out_ch / p.group, k = t.kernel_size, pin = t.positions;
      const int64_t plane = prod_from(p.out, 0);
      std::vector<A> y(size_t(p.batch * p.out_ch * plane), A(0));
      std::vector<A> col(size_t(mg * k * pin));
      for (int64_t n = 0; n < p.batch; ++n) {
        for (int64_t g = 0; g < p.group; ++g) {
          // col [Mg*K, P] = W_g^T [Mg*K, Cg] @ X_g [Cg, P]; W_g is [Cg, Mg*K] row-major.
          std::fill(col.begin(), col.end(), A(0));
          gemm_accumulate<A>(mg * k, pin, cg, {vw.data() + g * cg * mg * k, 1, mg * k},
                             {vx.data() + (n * p.in_ch + g * cg) * pin, pin, 1}, col.data(), pin);
          parallel_for(mg, 1, [&](int64_t m0, int64_t m1) {
            for (int64_t m = m0; m < m1; ++m) {
              col2im_add<A>(t, col.data() + m * k * pin, y.data() + (n * p.out_ch + g * mg + m) * plane);
            }
          });
        }
      }
      if (c.has_input(2)) {
        const Tensor& b = c.tensor(2);
        if (b.numel() != p.out_ch || b.dtype() != x.dtype()) return c.error("B must be [{}], got {}", p.out_ch, b.summary());
        add_channel_bias(y, to_acc_vector<T>(b), p.out_ch, plane);
      }
      KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), p.y_dims));
      store_from_acc<T>(*out, y);
      return Status::ok();
    }
  });
}

// ---- Col2Im ---------------------------------------------------------------------------------

// Inputs: input [N, C*prod(block_shape), L], image_shape [n], block_shape [n]. Output [N, C, image...].
Status infer_col2im(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& t = c.input_type(0);
  std::optional<std::vector<int64_t>> image = static_ints(c, 1), block = static_ints(c, 2);
  if (!t.has_rank() || !image || !block) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  if (t.shape->rank() != 3 || image->size() != block->size()) {
    return c.error("input must be [N, C*K, L] and image_shape/block_shape of one length, got {}, {} and {}",
                   t.to_string(), dims_to_string(*image), dims_to_string(*block));
  }
  const int64_t k = prod_from(*block, 0);
  std::vector<Dim> out = {(*t.shape)[0], k > 0 ? floor_div((*t.shape)[1], Dim(k)) : Dim()};
  out.insert(out.end(), image->begin(), image->end());
  c.set_output_tensor(0, dt, Shape(out));
  return Status::ok();
}

Status col2im_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const std::vector<int64_t> image = c.tensor(1).to_int_vector(), block = c.tensor(2).to_int_vector();
  if (x.rank() != 3 || image.size() != block.size() || image.empty()) {
    return c.error("input must be [N, C*K, L] and image_shape/block_shape of one length, got {}, {} and {}",
                   x.summary(), dims_to_string(image), dims_to_string(block));
  }
  KILN_ASSIGN_OR_RETURN(Window w, read_window(c, image.size(), block));
  for (int64_t v : image) {
    if (v < 1) return c.error("image_shape {} must be positive", dims_to_string(image));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> blocks, resolve_window(c, w, image));
  const int64_t k = w.kernel_size();
  if (x.dim(1) % k != 0 || x.dim(2) != prod_from(blocks, 0)) {
    return c.error("input {} must be [N, C*{}, {}] for image {} and block {}", x.summary(), k,
                   prod_from(blocks, 0), dims_to_string(image), dims_to_string(block));
  }
  const int64_t channels = x.dim(0) * (x.dim(1) / k), plane = prod_from(image, 0);
  std::vector<int64_t> y_dims = {x.dim(0), x.dim(1) / k};
  y_dims.insert(y_dims.end(), image.begin(), image.end());
  const WindowTable t = make_window_table(w, image, blocks);
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) {
      return c.unsupported("Col2Im on {}", x.summary());
    } else {
      using A = nn_acc_t<T>;
      const std::vector<A> vx = to_acc_vector<T>(x);
      std::vector<A> y(size_t(channels * plane), A(0));
      parallel_for(channels, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t ch = c0; ch < c1; ++ch) col2im_add<A>(t, vx.data() + ch * k * t.positions, y.data() + ch * plane);
      });
      KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), y_dims));
      store_from_acc<T>(*out, y);
      return Status::ok();
    }
  });
}

// ---- DeformConv -----------------------------------------------------------------------------

// Inputs: X, W, offset [N, G*K*n, out...], B [M] (optional), mask [N, G*K, out...] (optional).
Status infer_deform_conv(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, 3));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  return infer_conv_output(c, 0, 1, dt);
}

// x's value at a fractional position, interpolated multilinearly from the 2^n surrounding
// elements, each taken as 0 when outside x (GridSample with align_corners and zero padding).
template <typename A>
A sample_multilinear(const A* x, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
                     const std::vector<double>& pos) {
  const size_t n = dims.size();
  A sum = 0;
  for (size_t corner = 0; corner < (size_t(1) << n); ++corner) {
    double weight = 1;
    int64_t off = 0;
    bool inside = true;
    for (size_t i = 0; i < n && inside; ++i) {
      const double lo = std::floor(pos[i]);
      const bool high = (corner >> i) & 1;
      const int64_t at = int64_t(lo) + (high ? 1 : 0);
      weight *= high ? pos[i] - lo : 1 - (pos[i] - lo);
      inside = at >= 0 && at < dims[i];
      off += at * strides[i];
    }
    if (inside && weight != 0) sum += A(weight) * x[off];
  }
  return sum;
}

Status deform_conv_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& w = c.tensor(1);
  const Tensor& offset = c.tensor(2);
  if (x.dtype() != w.dtype() || offset.dtype() != x.dtype()) {
    return c.error("X {}, W {} and offset {} must share a type", x.summary(), w.summary(), offset.summary());
  }
  KILN_ASSIGN_OR_RETURN(ConvPlan p, plan_conv(c, x.dims(), w.dims()));
  const size_t ns = p.in.size();
  const int64_t og = c.node().attr_int("offset_group", 1), k = p.w.kernel_size(), cols = p.out_size();
  std::vector<int64_t> off_dims = {p.batch, og * k * int64_t(ns)}, mask_dims = {p.batch, og * k};
  off_dims.insert(off_dims.end(), p.out.begin(), p.out.end());
  mask_dims.insert(mask_dims.end(), p.out.begin(), p.out.end());
  if (og < 1 || p.in_ch % og != 0 || offset.dims() != off_dims) {
    return c.error("offset must be {} for offset_group {} (dividing C={}), got {}", dims_to_string(off_dims), og,
                   p.in_ch, offset.summary());
  }
  const Tensor* mask = c.has_input(4) ? &c.tensor(4) : nullptr;
  if (mask && (mask->dims() != mask_dims || mask->dtype() != x.dtype())) {
    return c.error("mask must be {}, got {}", dims_to_string(mask_dims), mask->summary());
  }
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_nn_float_v<T>) {
      return c.unsupported("DeformConv on {}", x.summary());
    } else {
      using A = nn_acc_t<T>;
      const std::vector<A> vx = to_acc_vector<T>(x), vw = to_acc_vector<T>(w), voff = to_acc_vector<T>(offset);
      const std::vector<A> vmask = mask ? to_acc_vector<T>(*mask) : std::vector<A>();
      const std::vector<int64_t> in_strides = strides_of(p.in), out_strides = strides_of(p.out);
      const std::vector<int64_t> k_strides = strides_of(p.w.kernel);
      const int64_t cg = p.in_ch / p.group, per_og = p.in_ch / og;
      auto fill = [&](int64_t n, int64_t g, A* col) {
        parallel_for(cg * k, 1, [&](int64_t r0, int64_t r1) {
          std::vector<double> pos(ns);
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t ch = g * cg + r / k, q = r % k, grp = ch / per_og;
            const A* plane = vx.data() + (n * p.in_ch + ch) * p.in_size();
            const A* offs = voff.data() + ((n * og + grp) * k + q) * int64_t(ns) * cols;
            for (int64_t o = 0; o < cols; ++o) {
              for (size_t i = 0; i < ns; ++i) {
                const int64_t oi = o / out_strides[i] % p.out[i], qi = q / k_strides[i] % p.w.kernel[i];
                pos[i] = double(oi * p.w.strides[i] - p.w.pads[i] + qi * p.w.dilations[i]) +
                         double(offs[int64_t(i) * cols + o]);
              }
              A v = sample_multilinear<A>(plane, p.in, in_strides, pos);
              if (mask) v *= vmask[size_t(((n * og + grp) * k + q) * cols + o)];
              col[r * cols + o] = v;
            }
          }
        });
      };
      std::vector<A> y = conv_gemm<A>(p, vw.data(), fill);
      if (c.has_input(3)) {
        const Tensor& b = c.tensor(3);
        if (b.numel() != p.out_ch || b.dtype() != x.dtype()) return c.error("B must be [{}], got {}", p.out_ch, b.summary());
        add_channel_bias(y, to_acc_vector<T>(b), p.out_ch, cols);
      }
      KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), p.y_dims));
      store_from_acc<T>(*out, y);
      return Status::ok();
    }
  });
}

// ---- CausalConvWithState ----------------------------------------------------------------------

// Inputs input [B, C, L], weight [C, 1, k], bias [C] (optional), past_state [B, C, k-1] (optional,
// zeros when absent). Outputs output [B, C, L] and present_state [B, C, k-1].
Status infer_causal_conv(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, 2));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& x = c.input_type(0);
  const Type& w = c.input_type(1);
  if ((x.has_rank() && x.shape->rank() != 3) || (w.has_rank() && w.shape->rank() != 3)) {
    return c.error("input must be [B, C, L] and weight [C, 1, k], got {} and {}", x.to_string(), w.to_string());
  }
  c.set_output(0, x);
  Dim b = x.has_rank() ? (*x.shape)[0] : Dim(), ch = x.has_rank() ? (*x.shape)[1] : Dim();
  Dim state = w.has_rank() ? (*w.shape)[2] - Dim(1) : Dim();
  if (c.has_output(1)) c.set_output_tensor(1, dt, Shape({b, ch, state}));
  return Status::ok();
}

// A depthwise causal conv over [past_state, input]: output[t] = bias + sum_j w[j] * padded[t + j],
// rounded to the element type before the optional SiLU (as the reference rounds it); the new state
// is the last k-1 positions of the padded sequence.
Status causal_conv_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& w = c.tensor(1);
  const std::string act = c.node().attr_string("activation", "none");
  if (act != "none" && act != "silu" && act != "swish") return c.error("activation must be none, silu or swish, got '{}'", act);
  if (x.rank() != 3 || w.rank() != 3 || w.dim(0) != x.dim(1) || w.dim(1) != 1 || w.dim(2) < 1 || w.dtype() != x.dtype()) {
    return c.error("input must be [B, C, L] and weight [C, 1, k] of its type, got {} and {}", x.summary(), w.summary());
  }
  const int64_t batch = x.dim(0), ch = x.dim(1), len = x.dim(2), k = w.dim(2), padded_len = len + k - 1;
  std::vector<double> bias(size_t(ch), 0.0), state(size_t(batch * ch * (k - 1)), 0.0);
  if (c.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(bias, channel_param(c, 2, ch, "bias"));
  }
  if (c.has_input(3)) {
    const Tensor& past = c.tensor(3);
    if (past.dims() != std::vector<int64_t>{batch, ch, k - 1}) {
      return c.error("past_state must be [{}, {}, {}], got {}", batch, ch, k - 1, past.summary());
    }
    state = tensor_as_doubles(past);
  }
  const std::vector<double> vx = tensor_as_doubles(x), vw = tensor_as_doubles(w);
  std::vector<double> y(vx.size()), present(state.size()), padded(static_cast<size_t>(padded_len));
  for (int64_t i = 0; i < batch * ch; ++i) {
    const int64_t ci = i % ch;
    std::copy(state.begin() + i * (k - 1), state.begin() + (i + 1) * (k - 1), padded.begin());
    std::copy(vx.begin() + i * len, vx.begin() + (i + 1) * len, padded.begin() + (k - 1));
    for (int64_t t = 0; t < len; ++t) {
      double acc = bias[size_t(ci)];
      for (int64_t j = 0; j < k; ++j) acc += vw[size_t(ci * k + j)] * padded[size_t(t + j)];
      acc = round_to_dtype(acc, x.dtype());
      y[size_t(i * len + t)] = act == "none" ? acc : acc / (1 + std::exp(-acc));
    }
    std::copy(padded.end() - (k - 1), padded.end(), present.begin() + i * (k - 1));
  }
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), x.dims()));
  KILN_RETURN_IF_ERROR(store_doubles(c, *out, y));
  if (!c.has_output(1)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(Tensor * st, c.alloc_output(1, x.dtype(), {batch, ch, k - 1}));
  return store_doubles(c, *st, present);
}

}  // namespace

void register_conv_extra_ops(OpRegistry& r) {
  std::vector<AttrSpec> deconv = conv_attrs();
  deconv.push_back({"output_padding", Attribute::Kind::kInts});
  deconv.push_back({"output_shape", Attribute::Kind::kInts});
  r.def(OpKind::kConvTranspose, {.inputs = {2, 3}, .attrs = deconv, .infer = infer_conv_transpose, .cpu = conv_transpose_cpu});
  r.def(OpKind::kCol2Im, {.inputs = {3, 3},
                          .attrs = {{"dilations", Attribute::Kind::kInts}, {"pads", Attribute::Kind::kInts},
                                    {"strides", Attribute::Kind::kInts}},
                          .infer = infer_col2im, .cpu = col2im_cpu});
  std::vector<AttrSpec> deform = conv_attrs();
  deform.push_back({"offset_group", Attribute::Kind::kInt});
  r.def(OpKind::kCausalConvWithState, {.inputs = {2, 4}, .outputs = {1, 2},
                                       .attrs = {{"activation", Attribute::Kind::kString}},
                                       .infer = infer_causal_conv, .cpu = causal_conv_cpu});
  r.def(OpKind::kDeformConv, {.inputs = {3, 5}, .attrs = deform, .infer = infer_deform_conv, .cpu = deform_conv_cpu});
}

}  // namespace kiln
