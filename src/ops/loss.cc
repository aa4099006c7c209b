// Op family: loss. NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 13 / 22
// semantics). Inputs are scores [N, C] or [N, C, D1, ..., Dk] and integer targets [N, D1, ..., Dk];
// the kernels compute in double, so every float dtype gets the same reference answer.
//
//   loss[n, d] = -input[n, target[n, d], d] * weight[target[n, d]]   (0 where target == ignore_index)
//   reduction "none": loss;  "sum": sum(loss);  "mean": sum(loss) / sum(weight of counted targets)
#include <cmath>

#include "ops/elementwise_util.h"
#include "ops/nn_util.h"

namespace kiln {

namespace {

enum class Reduction { kNone, kSum, kMean };

template <typename Ctx>
Expected<Reduction> read_reduction(const Ctx& c) {
  const std::string r = c.node().attr_string("reduction", "mean");
  if (r == "none") return Reduction::kNone;
  if (r == "sum") return Reduction::kSum;
  if (r == "mean") return Reduction::kMean;
  return c.error("reduction must be 'none', 'sum' or 'mean', got '{}'", r);
}

Status infer_loss(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kFloat));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType tt, c.tensor_dtype(1));
  if (tt != DType::kInt32 && tt != DType::kInt64) {
    return c.error("target must be int32 or int64, got {}", dtype_name(tt));
  }
  if (c.has_input(2)) {
    KILN_ASSIGN_OR_RETURN(DType wt, c.tensor_dtype(2));
    if (wt != dt) return c.error("weight must be {} like the input, got {}", dtype_name(dt), dtype_name(wt));
  }
  KILN_ASSIGN_OR_RETURN(Reduction red, read_reduction(c));
  const Type& x = c.input_type(0);
  const Type& t = c.input_type(1);
  if (x.has_rank() && x.shape->rank() < 2) return c.error("input must have rank >= 2 ([N, C, ...]), got {}", x.to_string());
  if (x.has_rank() && t.has_rank()) {
    if (t.shape->rank() + 1 != x.shape->rank()) {
      return c.error("target {} must have rank {} for input {}", t.to_string(), x.shape->rank() - 1, x.to_string());
    }
    for (size_t k = 0; k < t.shape->rank(); ++k) {
      const Dim& a = x.shape->dims[k == 0 ? 0 : k + 1];
      const Dim& b = t.shape->dims[k];
      if (a.is_static() && b.is_static() && a.value() != b.value()) {
        return c.error("target {} does not match input {} (N, D1, ...)", t.to_string(), x.to_string());
      }
    }
  }
  std::optional<Shape> out;
  if (red != Reduction::kNone) out = Shape(std::vector<Dim>{});
  else if (t.has_rank()) out = *t.shape;
  c.set_output_tensor(0, dt, out);
  if (c.num_outputs() > 1 && c.has_output(1)) c.set_output(1, x);  // SCE's log_prob
  return Status::ok();
}

// NLL over log-probabilities lp laid out as x.dims(); returns the reduced (or per-element) loss.
Expected<std::vector<double>> nll(const KernelCtx& c, const std::vector<double>& lp, const std::vector<int64_t>& xd,
                                  const Tensor& target, const Tensor* weight, Reduction red) {
  if (xd.size() < 2) return c.error("input must have rank >= 2 ([N, C, ...]), got {}", dims_to_string(xd));
  const int64_t n = xd[0], classes = xd[1], inner = prod_from(xd, 2);
  std::vector<int64_t> want = {n};
  for (size_t k = 2; k < xd.size(); ++k) want.push_back(xd[k]);
  if (target.dims() != want) {
    return c.error("target {} must have shape {} for input {}", dims_to_string(target.dims()), dims_to_string(want),
                   dims_to_string(xd));
  }
  std::vector<double> w;
  if (weight) {
    if (weight->dims() != std::vector<int64_t>{classes}) {
      return c.error("weight {} must have shape [{}]", dims_to_string(weight->dims()), classes);
    }
    w = tensor_as_doubles(*weight);
  }
  const Attribute* ig = c.node().attr("ignore_index");
  std::vector<double> loss(size_t(n * inner));
  double total = 0, wsum = 0;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t at = b * inner + i;
      const int64_t cls = target.as_int(at);
      if (ig && cls == ig->i) continue;
      if (cls < 0 || cls >= classes) {
        return c.error("target value {} at flat index {} is out of range [0, {})", cls, at, classes);
      }
      const double wc = weight ? w[size_t(cls)] : 1.0;
      loss[size_t(at)] = -lp[size_t((b * classes + cls) * inner + i)] * wc;
      total += loss[size_t(at)];
      wsum += wc;
    }
  }
  if (red == Reduction::kNone) return loss;
  if (red == Reduction::kSum) return std::vector<double>{total};
  return std::vector<double>{total / wsum};
}

Status store_loss(KernelCtx& c, DType dt, const std::vector<int64_t>& target_dims, Reduction red,
                  const std::vector<double>& v) {
  std::vector<int64_t> dims = red == Reduction::kNone ? target_dims : std::vector<int64_t>{};
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, dt, dims));
  return store_doubles(c, *y, v);
}

Status nll_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(Reduction red, read_reduction(c));
  const Tensor* w = c.has_input(2) ? &c.tensor(2) : nullptr;
  KILN_ASSIGN_OR_RETURN(std::vector<double> loss, nll(c, tensor_as_doubles(x), x.dims(), c.tensor(1), w, red));
  return store_loss(c, x.dtype(), c.tensor(1).dims(), red, loss);
}

Status sce_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(Reduction red, read_reduction(c));
  if (x.rank() < 2) return c.error("scores must have rank >= 2 ([N, C, ...]), got {}", dims_to_string(x.dims()));
  // log_softmax over axis 1.
  std::vector<double> lp = tensor_as_doubles(x);
  const int64_t n = x.dim(0), classes = x.dim(1), inner = prod_from(x.dims(), 2);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t k) -> double& { return lp[size_t((b * classes + k) * inner + i)]; };
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < classes; ++k) mx = std::max(mx, at(k));
      for (int64_t k = 0; k < classes; ++k) sum += std::exp(at(k) - mx);
      const double lse = mx + std::log(sum);
      for (int64_t k = 0; k < classes; ++k) at(k) -= lse;
    }
  }
  const Tensor* w = c.has_input(2) ? &c.tensor(2) : nullptr;
  KILN_ASSIGN_OR_RETURN(std::vector<double> loss, nll(c, lp, x.dims(), c.tensor(1), w, red));
  KILN_RETURN_IF_ERROR(store_loss(c, x.dtype(), c.tensor(1).dims(), red, loss));
  if (c.num_outputs() > 1 && c.has_output(1)) {
    KILN_ASSIGN_OR_RETURN(Tensor * out, c.alloc_output(1, x.dtype(), x.dims()));
    KILN_RETURN_IF_ERROR(store_doubles(c, *out, lp));
  }
  return Status::ok();
}

}  // namespace

void register_loss_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  const std::vector<AttrSpec> attrs = {{"reduction", K::kString}, {"ignore_index", K::kInt}};
  r.def(OpKind::kNegativeLogLikelihoodLoss, {.inputs = {2, 3}, .attrs = attrs, .infer = infer_loss, .cpu = nll_cpu});
  r.def(OpKind::kSoftmaxCrossEntropyLoss,
        {.inputs = {2, 3}, .outputs = {1, 2}, .attrs = attrs, .infer = infer_loss, .cpu = sce_cpu});
}

}  // namespace kiln
