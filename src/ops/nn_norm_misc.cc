// Op family: norm. This file: LRN, MeanVarianceNormalization and Dropout.
#include <cmath>
#include <random>

#include "ops/nn_norm.h"
#include "ops/numpy_random.h"
#include "ops/shape_util.h"

namespace kiln {
namespace {

Status infer_float_like_input0(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_nn_float(c, dt));
  c.set_output(0, c.input_type(0));
  return Status::ok();
}

// ---- LRN ------------------------------------------------------------------------------------

// y = x / (bias + alpha / size * sum of x^2 over the channels [c - floor((size-1)/2), c + ceil((size-1)/2)])^beta
Status lrn_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const int64_t size = c.node().attr_int("size", 0);
  if (x.rank() < 3 || size < 1) return c.error("X must be [N, C, D1, ...] and size >= 1, got {} and {}", x.summary(), size);
  const double alpha = c.node().attr_float("alpha", 1e-4f), beta = c.node().attr_float("beta", 0.75f);
  const double bias = c.node().attr_float("bias", 1.0f);
  const int64_t ch = x.dim(1), plane = prod_from(x.dims(), 2), before = (size - 1) / 2, after = size / 2;
  const std::vector<double> vx = tensor_as_doubles(x);
  std::vector<double> y(vx.size());
  parallel_for(x.dim(0) * ch, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i / ch, k = i % ch;
      const int64_t lo = std::max<int64_t>(0, k - before), hi = std::min(ch - 1, k + after);
      for (int64_t p = 0; p < plane; ++p) {
        double sq = 0;
        for (int64_t j = lo; j <= hi; ++j) sq += vx[size_t((n * ch + j) * plane + p)] * vx[size_t((n * ch + j) * plane + p)];
        y[size_t(i * plane + p)] = vx[size_t(i * plane + p)] / std::pow(bias + alpha / double(size) * sq, beta);
      }
    }
  });
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), x.dims()));
  return store_doubles(c, *out, y);
}

// ---- MeanVarianceNormalization ----------------------------------------------------------------

// y = (x - mean) / (sqrt(variance) + 1e-9) over `axes` (default [0, 2, 3]), as the ONNX function
// body computes it.
Status mvn_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const std::vector<int64_t> axes = c.node().attr_ints("axes", {0, 2, 3});
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, axes_mask(c, axes, int64_t(x.rank())));
  const AxisPlan plan = make_axis_plan(x.dims(), mask);
  const std::vector<double> vx = tensor_as_doubles(x);
  std::vector<double> y(vx.size());
  parallel_for(int64_t(plan.outer.size()), 1, [&](int64_t o0, int64_t o1) {
    std::vector<double> values(plan.inner.size());
    for (int64_t o = o0; o < o1; ++o) {
      const int64_t base = plan.outer[size_t(o)];
      for (size_t j = 0; j < values.size(); ++j) values[j] = vx[size_t(base + plan.inner[j])];
      const Moments m = moments(values.data(), int64_t(values.size()), 1);
      const double denom = std::sqrt(m.var) + 1e-9;
      for (size_t j = 0; j < values.size(); ++j) y[size_t(base + plan.inner[j])] = (values[j] - m.mean) / denom;
    }
  });
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), x.dims()));
  return store_doubles(c, *out, y);
}

// ---- Dropout --------------------------------------------------------------------------------

// Inputs data, ratio (default 0.5), training_mode (default false); outputs output and mask (bool).
Status infer_dropout(InferCtx& c) {
  KILN_RETURN_IF_ERROR(c.tensor_dtype(0).status());
  c.set_output(0, c.input_type(0));
  if (c.has_output(1)) c.set_output_tensor(1, DType::kBool, c.input_type(0).shape);
  return Status::ok();
}

// Outside training (the default) Dropout is the identity with an all-true mask. In training it
// keeps an element when a uniform draw is >= ratio and scales kept elements by 1 / (1 - ratio);
// with the seed attribute the draws are those of numpy.random.seed(seed) (numpy_random.h), else
// nondeterministic.
Status dropout_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const bool training = c.has_input(2) && c.tensor(2).numel() > 0 && c.tensor(2).as_int(0) != 0;
  const double ratio = c.has_input(1) && c.tensor(1).numel() > 0 ? c.tensor(1).as_double(0) : 0.5;
  if (training && (ratio < 0 || ratio >= 1)) return c.error("ratio must be in [0, 1), got {}", ratio);
  bool* mask = nullptr;
  if (c.has_output(1)) {
    KILN_ASSIGN_OR_RETURN(Tensor * m, c.alloc_output(1, DType::kBool, x.dims()));
    mask = m->data<bool>();
  }
  if (!training || ratio == 0) {
    c.set_output(0, x.clone());
    for (int64_t i = 0; mask && i < x.numel(); ++i) mask[i] = true;
    return Status::ok();
  }
  const Node& n = c.node();
  std::mt19937 rng(n.has_attr("seed") ? uint32_t(n.attr_int("seed", 0)) : std::random_device{}());
  const double scale = 1.0 / (1.0 - ratio);
  std::vector<double> vx = tensor_as_doubles(x);
  for (size_t i = 0; i < vx.size(); ++i) {
    const bool keep = numpy_random_sample(rng) >= ratio;
    vx[i] = keep ? vx[i] * scale : 0.0;
    if (mask) mask[i] = keep;
  }
  KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(0, x.dtype(), x.dims()));
  return store_doubles(c, *out, vx);
}

}  // namespace

void register_norm_misc_ops(OpRegistry& r) {
  r.def(OpKind::kLRN, {.inputs = {1, 1},
                       .attrs = {{"alpha", Attribute::Kind::kFloat}, {"beta", Attribute::Kind::kFloat},
                                 {"bias", Attribute::Kind::kFloat}, {"size", Attribute::Kind::kInt, true}},
                       .infer = infer_float_like_input0, .cpu = lrn_cpu});
  r.def(OpKind::kMeanVarianceNormalization, {.inputs = {1, 1}, .attrs = {{"axes", Attribute::Kind::kInts}},
                                             .infer = infer_float_like_input0, .cpu = mvn_cpu});
  r.def(OpKind::kDropout, {.inputs = {1, 3}, .outputs = {1, 2}, .attrs = {{"seed", Attribute::Kind::kInt}},
                           .infer = infer_dropout, .cpu = dropout_cpu});
}

}  // namespace kiln
