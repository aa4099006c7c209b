// Op family: reduce. This file: ops that work line by line along one axis and keep the shape
// (Softmax, LogSoftmax, Hardmax, LpNormalization, CumSum) and TopK. Opset 13 semantics: the axis is
// a single axis, not "flatten to 2-D at axis" as in opset < 13 (the importer rewrites those).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ops/reduce_util.h"
#include "ops/shape_util.h"

namespace kiln {

namespace {

// Lines along `axis`: plan.outer are the line starts, plan.inner the offsets along the line.
AxisPlan line_plan(const std::vector<int64_t>& dims, int64_t axis) {
  std::vector<bool> mask(dims.size(), false);
  if (!dims.empty()) mask[size_t(axis)] = true;
  return make_axis_plan(dims, mask);
}

// Runs fn(const T* in_line, T* out_line, inner) over every line, for float element types only.
template <typename Fn>
Status for_float_lines(KernelCtx& c, const Tensor& x, Tensor& y, const AxisPlan& plan, Fn fn) {
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_float_v<T>) {
      return c.unsupported("element type {} is not supported", dtype_name(x.dtype()));
    } else {
      const T* xp = x.data<T>();
      T* yp = y.data<T>();
      const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, int64_t(plan.inner.size())));
      parallel_for(int64_t(plan.outer.size()), grain, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) fn(xp + plan.outer[size_t(o)], yp + plan.outer[size_t(o)], plan.inner);
      });
      return Status::ok();
    }
  });
}

Status infer_float_same_shape(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (!dtype_is_float(dt)) return c.error("input must be a float tensor, got {}", dtype_name(dt));
  const Type& t = c.input_type(0);
  if (t.has_rank()) KILN_RETURN_IF_ERROR(normalize_axis(c, c.node().attr_int("axis", -1), int64_t(t.shape->rank())).status());
  c.set_output(0, t);
  return Status::ok();
}

// ---- Softmax, LogSoftmax, Hardmax, LpNormalization -----------------------------------------

enum class LineKind { kSoftmax, kLogSoftmax, kHardmax, kLpNorm };

template <LineKind K, typename T>
void apply_line(const T* x, T* y, const std::vector<int64_t>& inner, int64_t p) {
  if (inner.empty()) return;
  if constexpr (K == LineKind::kHardmax) {
    size_t best = 0;  // first index of the maximum
    for (size_t j = 1; j < inner.size(); ++j) {
      if (double(x[inner[j]]) > double(x[inner[best]])) best = j;
    }
    for (size_t j = 0; j < inner.size(); ++j) y[inner[j]] = T(j == best ? 1.0f : 0.0f);
  } else if constexpr (K == LineKind::kLpNorm) {
    double norm = 0;
    for (int64_t off : inner) {
      double v = std::abs(double(x[off]));
      norm += p == 1 ? v : v * v;
    }
    if (p == 2) norm = std::sqrt(norm);
    // A zero norm gives 0, not 0/0 (as the ONNX reference does).
    for (int64_t off : inner) y[off] = T(norm == 0 ? 0.0 : double(x[off]) / norm);
  } else {
    // exp(x - max) keeps the exponentials in range (softmax is shift-invariant).
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t off : inner) m = std::max(m, double(x[off]));
    double sum = 0;
    for (int64_t off : inner) sum += std::exp(double(x[off]) - m);
    for (int64_t off : inner) {
      double v = double(x[off]) - m;
      y[off] = T(K == LineKind::kSoftmax ? std::exp(v) / sum : v - std::log(sum));
    }
  }
}

template <LineKind K>
Status line_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", -1), int64_t(x.rank())));
  const int64_t p = c.node().attr_int("p", 2);
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), x.dims()));
  return for_float_lines(c, x, *y, line_plan(x.dims(), axis), [&]<typename T>(const T* xl, T* yl, const auto& inner) {
    apply_line<K>(xl, yl, inner, p);
  });
}

Status infer_lp_norm(InferCtx& c) {
  const int64_t p = c.node().attr_int("p", 2);
  if (p != 1 && p != 2) return c.error("attribute p must be 1 or 2, got {}", p);
  return infer_float_same_shape(c);
}

// ---- CumSum / CumProd ---------------------------------------------------------------------------------

Status infer_cumsum(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  bool ok = visit_dtype(dt, [&]<typename T>() { return is_numeric_v<T>; });
  if (!ok) return c.error("element type {} is not supported by {}", dtype_name(dt), op_name(c.node().op));
  const Type& axis = c.input_type(1);
  if (axis.has_rank() && axis.shape->rank() > 1) return c.error("axis must be a scalar, got shape {}", axis.shape->to_string());
  c.set_output(0, c.input_type(0));
  return Status::ok();
}

// Integers wrap around like numpy's cumsum/cumprod (through unsigned arithmetic: no signed overflow).
template <bool kProduct, typename A>
A combine(A acc, A v) {
  if constexpr (std::is_integral_v<A>) {
    const uint64_t a = uint64_t(acc), b = uint64_t(v);
    return A(kProduct ? a * b : a + b);
  } else {
    return kProduct ? acc * v : acc + v;
  }
}

template <bool kProduct>
Status cumulative_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& axis_t = c.tensor(1);
  if (axis_t.numel() != 1) return c.error("axis must hold one value, got {}", axis_t.summary());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, axis_t.as_int(0), int64_t(x.rank())));
  const bool exclusive = c.node().attr_int("exclusive", 0) != 0;
  const bool reverse = c.node().attr_int("reverse", 0) != 0;
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), x.dims()));
  const AxisPlan plan = line_plan(x.dims(), axis);
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) {
      return c.unsupported("element type {} is not supported", dtype_name(x.dtype()));
    } else {
      const T* xp = x.data<T>();
      T* yp = y->data<T>();
      const size_t n = plan.inner.size();
      for (int64_t start : plan.outer) {
        acc_t<T> acc = kProduct ? 1 : 0;
        for (size_t k = 0; k < n; ++k) {
          const int64_t off = start + plan.inner[reverse ? n - 1 - k : k];
          if (exclusive) yp[off] = from_acc<T>(acc);
          acc = combine<kProduct>(acc, to_acc(xp[off]));
          if (!exclusive) yp[off] = from_acc<T>(acc);
        }
      }
      return Status::ok();
    }
  });
}

// ---- TopK -----------------------------------------------------------------------------------

Status infer_topk(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  bool ok = visit_dtype(dt, [&]<typename T>() { return is_numeric_v<T>; });
  if (!ok) return c.error("element type {} is not supported by TopK", dtype_name(dt));
  const Type& t = c.input_type(0);
  std::optional<Shape> s;
  if (t.has_rank()) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", -1), int64_t(t.shape->rank())));
    s = *t.shape;
    Dim k;
    if (std::optional<std::vector<Dim>> kv = c.input_as_dims(1)) {
      if (kv->size() != 1) return c.error("K must hold one value, got {}", kv->size());
      k = (*kv)[0];
    }
    const Dim& n = s->dims[size_t(axis)];
    if (k.is_static() && (k.value() < 0 || (n.is_static() && k.value() > n.value()))) {
      return c.error("K = {} is out of range for axis {} of shape {}", k.value(), axis, t.shape->to_string());
    }
    s->dims[size_t(axis)] = k;
  }
  c.set_output_tensor(0, dt, s);
  c.set_output_tensor(1, DType::kInt64, s);
  return Status::ok();
}

// The k best of a line, best first; ties keep the lower index first. NaN ranks above every number.
template <typename T>
void topk_line(const T* x, const std::vector<int64_t>& inner, int64_t k, bool largest, std::vector<int64_t>& order) {
  using A = acc_t<T>;
  order.resize(inner.size());
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int64_t i, int64_t j) {
    A a = to_acc(x[inner[size_t(i)]]), b = to_acc(x[inner[size_t(j)]]);
    if (largest ? less_nan_last(b, a) : less_nan_last(a, b)) return true;
    if (largest ? less_nan_last(a, b) : less_nan_last(b, a)) return false;
    return i < j;
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
}

Status topk_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& k_t = c.tensor(1);
  if (k_t.numel() != 1) return c.error("K must hold one value, got {}", k_t.summary());
  if (x.rank() == 0) return c.error("input must have rank >= 1, got a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", -1), int64_t(x.rank())));
  const int64_t k = k_t.as_int(0);
  if (k < 0 || k > x.dim(size_t(axis))) {
    return c.error("K = {} is out of range for axis {} of input {}", k, axis, x.summary());
  }
  const bool largest = c.node().attr_int("largest", 1) != 0;
  std::vector<int64_t> out_dims = x.dims();
  out_dims[size_t(axis)] = k;
  KILN_ASSIGN_OR_RETURN(Tensor * values, c.alloc_output(0, x.dtype(), out_dims));
  Tensor indices_storage;
  Tensor* indices = &indices_storage;
  if (c.has_output(1)) {
    KILN_ASSIGN_OR_RETURN(indices, c.alloc_output(1, DType::kInt64, out_dims));
  } else {
    KILN_ASSIGN_OR_RETURN(indices_storage, Tensor::create(DType::kInt64, out_dims));
  }
  const AxisPlan in_plan = line_plan(x.dims(), axis);
  const AxisPlan out_plan = line_plan(out_dims, axis);
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) {
      return c.unsupported("element type {} is not supported", dtype_name(x.dtype()));
    } else {
      const T* xp = x.data<T>();
      T* vp = values->data<T>();
      int64_t* ip = indices->data<int64_t>();
      std::vector<int64_t> order;
      for (size_t o = 0; o < in_plan.outer.size(); ++o) {
        const T* line = xp + in_plan.outer[o];
        topk_line(line, in_plan.inner, k, largest, order);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t dst = out_plan.outer[o] + out_plan.inner[size_t(j)];
          vp[dst] = line[in_plan.inner[size_t(order[size_t(j)])]];
          ip[dst] = order[size_t(j)];
        }
      }
      return Status::ok();
    }
  });
}

OpDef axis_line_def(InferFn infer, CpuKernelFn cpu) {
  return {.inputs = {1, 1}, .attrs = {{"axis", Attribute::Kind::kInt}}, .infer = infer, .cpu = cpu};
}

}  // namespace

void register_reduce_axis_ops(OpRegistry& r) {
  r.def(OpKind::kSoftmax, axis_line_def(infer_float_same_shape, line_cpu<LineKind::kSoftmax>));
  r.def(OpKind::kLogSoftmax, axis_line_def(infer_float_same_shape, line_cpu<LineKind::kLogSoftmax>));
  r.def(OpKind::kHardmax, axis_line_def(infer_float_same_shape, line_cpu<LineKind::kHardmax>));
  r.def(OpKind::kLpNormalization, {.inputs = {1, 1},
                                   .attrs = {{"axis", Attribute::Kind::kInt}, {"p", Attribute::Kind::kInt}},
                                   .infer = infer_lp_norm,
                                   .cpu = line_cpu<LineKind::kLpNorm>});
  const std::vector<AttrSpec> cum_attrs = {{"exclusive", Attribute::Kind::kInt}, {"reverse", Attribute::Kind::kInt}};
  r.def(OpKind::kCumSum, {.inputs = {2, 2}, .attrs = cum_attrs, .infer = infer_cumsum, .cpu = cumulative_cpu<false>});
  r.def(OpKind::kCumProd, {.inputs = {2, 2}, .attrs = cum_attrs, .infer = infer_cumsum, .cpu = cumulative_cpu<true>});
  r.def(OpKind::kTopK, {.inputs = {2, 2},
                        .outputs = {1, 2},
                        .attrs = {{"axis", Attribute::Kind::kInt},
                                  {"largest", Attribute::Kind::kInt},
                                  {"sorted", Attribute::Kind::kInt}},
                        .infer = infer_topk,
                        .cpu = topk_cpu});
}

}  // namespace kiln
