// Op family: norm. This file: the statistics normalizations BatchNormalization, InstanceNormalization,
// LayerNormalization, GroupNormalization and RMSNormalization. LRN, MeanVarianceNormalization and
// Dropout are in nn_norm_misc.cc.
//
// Every kernel converts X to double, computes its statistics there with a two-pass mean and
// (population) variance, and rounds once to the output type: this is at least as accurate as the
// float32 stash_type computation the spec describes.
#include <cmath>

#include "ops/nn_norm.h"

namespace kiln {

void register_norm_misc_ops(OpRegistry& r);

Moments moments(const double* x, int64_t n, int64_t stride) {
  Moments m;
  if (n <= 0) return m;
  for (int64_t i = 0; i < n; ++i) m.mean += x[i * stride];
  m.mean /= double(n);
  for (int64_t i = 0; i < n; ++i) m.var += (x[i * stride] - m.mean) * (x[i * stride] - m.mean);
  m.var /= double(n);
  return m;
}

Status check_nn_float(InferCtx& c, DType dt) {
  if (!visit_dtype(dt, [&]<typename T>() { return is_nn_float_v<T>; })) {
    return c.error("{} needs a float input, got {}", op_name(c.node().op), dtype_name(dt));
  }
  return Status::ok();
}

namespace {

Expected<DType> stash_dtype(const InferCtx& c) {
  std::optional<DType> dt = dtype_from_onnx(int32_t(c.node().attr_int("stash_type", 1)));
  if (!dt || !dtype_is_float(*dt)) return c.error("stash_type {} is not a float type", c.node().attr_int("stash_type", 1));
  return *dt;
}

// ---- BatchNormalization -----------------------------------------------------------------------

// Inputs X [N, C, ...], scale, B, input_mean, input_var (all [C]). Outputs Y, and in training mode
// running_mean and running_var (the type of input_mean).
Status infer_batch_norm(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_nn_float(c, dt));
  const Type& t = c.input_type(0);
  if (t.has_rank() && t.shape->rank() < 2) return c.error("X must be [N, C, ...], got {}", t.to_string());
  c.set_output(0, t);
  KILN_ASSIGN_OR_RETURN(DType mt, c.tensor_dtype(3));
  std::optional<Shape> ch;
  if (t.has_rank()) ch = Shape({(*t.shape)[1]});
  for (size_t o = 1; o < 3; ++o) {
    if (c.has_output(o)) c.set_output_tensor(o, mt, ch);
  }
  return Status::ok();
}

Status batch_norm_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() < 2) return c.error("X must be [N, C, ...], got {}", x.summary());
  const int64_t n = x.dim(0), ch = x.dim(1), plane = prod_from(x.dims(), 2);
  KILN_ASSIGN_OR_RETURN(std::vector<double> scale, channel_param(c, 1, ch, "scale"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> bias, channel_param(c, 2, ch, "B"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> mean, channel_param(c, 3, ch, "input_mean"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> var, channel_param(c, 4, ch, "input_var"));
  const double eps = c.node().attr_float("epsilon", 1e-5f), momentum = c.node().attr_float("momentum", 0.9f);
  const bool training = c.node().attr_int("training_mode", 0) != 0;
  const std::vector<double> vx = tensor_as_doubles(x);
  if (training) {
    // Normalize with the batch statistics; report running = momentum * input + (1 - momentum) * batch.
    std::vector<double> running_mean(static_cast<size_t>(ch)), running_var(static_cast<size_t>(ch));
    for (int64_t k = 0; k < ch; ++k) {
      std::vector<double> values;
      for (int64_t b = 0; b < n; ++b) values.insert(values.end(), vx.begin() + (b * ch + k) * plane, vx.begin() + (b * ch + k + 1) * plane);
      const Moments m = moments(values.data(), int64_t(values.size()), 1);
      running_mean[size_t(k)] = mean[size_t(k)] * momentum + m.mean * (1 - momentum);
      running_var[size_t(k)] = var[size_t(k)] * momentum + m.var * (1 - momentum);
      mean[size_t(k)] = m.mean;
      var[size_t(k)] = m.var;
    }
    for (size_t o = 1; o < 3; ++o) {
      if (!c.has_output(o)) continue;
      KILN_ASSIGN_OR_RETURN(Tensor * t, c.alloc_output(o, c.tensor(3).dtype(), {ch}));
      KILN_RETURN_IF_ERROR(store_doubles(c, *t, o == 1 ? running_mean : running_var));
    }
  }
  std::vector<double> y(vx.size());
  for (size_t i = 0; i < y.size(); ++i) {
    const size_t k = size_t(int64_t(i) / plane % ch);
    y[i] = scale[k] * (vx[i] - mean[k]) / std::sqrt(var[k] + eps) + bias[k];
  }
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), x.dims()));
  return store_doubles(c, *out, y);
}

// ---- InstanceNormalization and GroupNormalization ----------------------------------------------

Status infer_same_float(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_nn_float(c, dt));
  const Type& t = c.input_type(0);
  if (t.has_rank() && t.shape->rank() < 2) return c.error("X must be [N, C, ...], got {}", t.to_string());
  c.set_output(0, t);
  return Status::ok();
}

// Normalizes X [N, C, ...] over groups of `channels / groups` consecutive channels (and all spatial
// positions) per image, then applies per-channel scale and bias.
Status group_norm(KernelCtx& c, int64_t groups, const std::vector<double>& scale, const std::vector<double>& bias) {
  const Tensor& x = c.tensor(0);
  const int64_t ch = x.dim(1), plane = prod_from(x.dims(), 2);
  const int64_t size = ch / groups * plane;  // elements per group
  const double eps = c.node().attr_float("epsilon", 1e-5f);
  const std::vector<double> vx = tensor_as_doubles(x);
  std::vector<double> y(vx.size());
  parallel_for(x.dim(0) * groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const Moments m = moments(vx.data() + g * size, size, 1);
      const double inv = 1 / std::sqrt(m.var + eps);
      for (int64_t i = g * size; i < (g + 1) * size; ++i) {
        const size_t k = size_t(i / plane % ch);
        y[size_t(i)] = (vx[size_t(i)] - m.mean) * inv * scale[k] + bias[k];
      }
    }
  });
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), x.dims()));
  return store_doubles(c, *out, y);
}

Status instance_norm_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() < 2) return c.error("X must be [N, C, ...], got {}", x.summary());
  KILN_ASSIGN_OR_RETURN(std::vector<double> scale, channel_param(c, 1, x.dim(1), "scale"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> bias, channel_param(c, 2, x.dim(1), "B"));
  return group_norm(c, x.dim(1), scale, bias);
}

// scale and bias are per channel ([C], opset 21). The opset-18 form gives them per group ([G]);
// that is accepted too: the two agree when G == C and cannot be confused otherwise.
Status group_norm_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const int64_t groups = c.node().attr_int("num_groups", 0);
  if (x.rank() < 2 || groups < 1 || x.dim(1) % groups != 0) {
    return c.error("X {} must be [N, C, ...] with C divisible by num_groups {}", x.summary(), groups);
  }
  const int64_t ch = x.dim(1);
  std::vector<double> param[2];
  for (size_t i = 0; i < 2; ++i) {
    const Tensor& t = c.tensor(i + 1);
    if (t.rank() != 1 || (t.numel() != ch && t.numel() != groups)) {
      return c.error("{} must be [{}] (per channel) or [{}] (per group), got {}", i == 0 ? "scale" : "bias", ch,
                     groups, t.summary());
    }
    std::vector<double> v = tensor_as_doubles(t);
    for (int64_t k = 0; k < ch; ++k) param[i].push_back(v[size_t(t.numel() == ch ? k : k / (ch / groups))]);
  }
  return group_norm(c, groups, param[0], param[1]);
}

// ---- LayerNormalization and RMSNormalization ---------------------------------------------------

// Outputs Y (like X) and, for LayerNormalization, Mean and InvStdDev: X's dims before axis, then
// 1s, in the stash type.
Status infer_layer_norm(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_nn_float(c, dt));
  const Type& t = c.input_type(0);
  c.set_output(0, t);
  if (!c.has_output(1) && !c.has_output(2)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(DType st, stash_dtype(c));
  std::optional<Shape> stats;
  if (t.has_rank()) {
    const int64_t rank = int64_t(t.shape->rank());
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", -1), rank));
    std::vector<Dim> d = t.shape->dims;
    for (int64_t i = axis; i < rank; ++i) d[size_t(i)] = Dim(1);
    stats = Shape(d);
  }
  for (size_t o = 1; o < 3; ++o) {
    if (c.has_output(o)) c.set_output_tensor(o, st, stats);
  }
  return Status::ok();
}

// Input i broadcast (numpy-style, unidirectionally) to dims, as doubles.
Expected<std::vector<double>> broadcast_param(const KernelCtx& c, size_t i, const std::vector<int64_t>& dims, const char* what) {
  const Tensor& t = c.tensor(i);
  bool ok = t.rank() <= dims.size();
  for (size_t k = 0; ok && k < t.rank(); ++k) {
    const int64_t d = t.dim(t.rank() - 1 - k);
    ok = d == 1 || d == dims[dims.size() - 1 - k];
  }
  if (!ok) return c.error("{} {} does not broadcast to X {}", what, t.summary(), dims_to_string(dims));
  std::vector<double> v;
  v.reserve(size_t(prod_from(dims, 0)));
  for (StridedIter it(dims, {broadcast_strides(t.dims(), dims)}); !it.done(); it.next()) v.push_back(t.as_double(it.offset(0)));
  return v;
}

// Normalizes each row (X flattened to [prod(dims[:axis]), prod(dims[axis:])]): LayerNormalization
// subtracts the mean and divides by the standard deviation; RMSNormalization divides by the root
// mean square.
Status row_norm_cpu(KernelCtx& c) {
  const bool rms = c.node().op == OpKind::kRMSNormalization;
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", -1), int64_t(x.rank())));
  const int64_t cols = prod_from(x.dims(), size_t(axis)), rows = cols > 0 ? x.numel() / cols : 0;
  KILN_ASSIGN_OR_RETURN(std::vector<double> scale, broadcast_param(c, 1, x.dims(), "scale"));
  std::vector<double> bias;
  if (c.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(bias, broadcast_param(c, 2, x.dims(), "B"));
  }
  const double eps = c.node().attr_float("epsilon", 1e-5f);
  const std::vector<double> vx = tensor_as_doubles(x);
  std::vector<double> y(vx.size()), mean(static_cast<size_t>(rows)), inv_std(static_cast<size_t>(rows));
  parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const double* row = vx.data() + r * cols;
      double center = 0, inv = 0;
      if (rms) {
        double sq = 0;
        for (int64_t j = 0; j < cols; ++j) sq += row[j] * row[j];
        inv = 1 / std::sqrt(sq / double(cols) + eps);
      } else {
        const Moments m = moments(row, cols, 1);
        center = m.mean;
        inv = 1 / std::sqrt(m.var + eps);
      }
      mean[size_t(r)] = center;
      inv_std[size_t(r)] = inv;
      for (int64_t i = r * cols; i < (r + 1) * cols; ++i) {
        y[size_t(i)] = (vx[size_t(i)] - center) * inv * scale[size_t(i)] + (bias.empty() ? 0.0 : bias[size_t(i)]);
      }
    }
  });
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), x.dims()));
  KILN_RETURN_IF_ERROR(store_doubles(c, *out, y));
  std::vector<int64_t> stats_dims = x.dims();
  for (size_t i = size_t(axis); i < stats_dims.size(); ++i) stats_dims[i] = 1;
  const std::optional<DType> st = dtype_from_onnx(int32_t(c.node().attr_int("stash_type", 1)));
  for (size_t o = 1; o < 3 && !rms; ++o) {
    if (!c.has_output(o)) continue;
    KILN_ASSIGN_OR_RETURN(Tensor * t, c.alloc_output(o, st.value_or(DType::kFloat32), stats_dims));
    KILN_RETURN_IF_ERROR(store_doubles(c, *t, o == 1 ? mean : inv_std));
  }
  return Status::ok();
}

std::vector<AttrSpec> eps_attrs(std::initializer_list<AttrSpec> extra) {
  std::vector<AttrSpec> a = {{"epsilon", Attribute::Kind::kFloat}};
  a.insert(a.end(), extra);
  return a;
}

}  // namespace

void register_norm_ops(OpRegistry& r) {
  r.def(OpKind::kBatchNormalization,
        {.inputs = {5, 5}, .outputs = {1, 3},
         .attrs = eps_attrs({{"momentum", Attribute::Kind::kFloat}, {"training_mode", Attribute::Kind::kInt}}),
         .infer = infer_batch_norm, .cpu = batch_norm_cpu});
  r.def(OpKind::kInstanceNormalization,
        {.inputs = {3, 3}, .attrs = eps_attrs({}), .infer = infer_same_float, .cpu = instance_norm_cpu});
  r.def(OpKind::kGroupNormalization,
        {.inputs = {3, 3},
         .attrs = eps_attrs({{"num_groups", Attribute::Kind::kInt, true}, {"stash_type", Attribute::Kind::kInt}}),
         .infer = infer_same_float, .cpu = group_norm_cpu});
  r.def(OpKind::kLayerNormalization,
        {.inputs = {2, 3}, .outputs = {1, 3},
         .attrs = eps_attrs({{"axis", Attribute::Kind::kInt}, {"stash_type", Attribute::Kind::kInt}}),
         .infer = infer_layer_norm, .cpu = row_norm_cpu});
  r.def(OpKind::kRMSNormalization,
        {.inputs = {2, 2},
         .attrs = eps_attrs({{"axis", Attribute::Kind::kInt}, {"stash_type", Attribute::Kind::kInt}}),
         .infer = infer_layer_norm, .cpu = row_norm_cpu});
  register_norm_misc_ops(r);
}

}  // namespace kiln
