// Op family: reduce. This file: the Reduce* ops and ArgMax/ArgMin. The per-axis ops (Softmax,
// LogSoftmax, Hardmax, LpNormalization, CumSum, TopK) are in reduce_axis.cc.
//
// A reduction is planned once (make_axis_plan: where each output's line of inputs starts and the
// offsets along it), then each output element folds its line in the accumulator type (double for
// floats, 64-bit for integers). Reducing over an empty set gives the identity of the reduction:
// 0 for sums, 1 for products, -inf/lowest for max, +inf/highest for min, log(0) = -inf for LogSum.
#include <cmath>
#include <limits>

#include "ops/reduce_util.h"
#include "ops/shape_util.h"

namespace kiln {

void register_reduce_axis_ops(OpRegistry& r);

namespace {

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

// Which element types a reduction accepts (the ONNX type constraints, widened to every integer
// width where the arithmetic is the same).
template <ReduceKind K, typename T>
constexpr bool reduce_accepts() {
  if constexpr (K == ReduceKind::kLogSum || K == ReduceKind::kLogSumExp) return is_float_v<T>;
  else if constexpr (K == ReduceKind::kMax || K == ReduceKind::kMin) return is_numeric_v<T> || std::is_same_v<T, bool>;
  else return is_numeric_v<T>;
}

// ---- the mask of reduced axes ---------------------------------------------------------------

// Axes from the optional axes input: empty means every axis, or none with noop_with_empty_axes.
template <typename Ctx>
Expected<std::vector<bool>> reduce_mask(const Ctx& c, const std::vector<int64_t>& axes, int64_t rank) {
  if (axes.empty()) return std::vector<bool>(size_t(rank), c.node().attr_int("noop_with_empty_axes", 0) == 0);
  return axes_mask(c, axes, rank);
}

template <typename D>
std::vector<D> reduced_dims(const std::vector<D>& dims, const std::vector<bool>& mask, bool keepdims) {
  std::vector<D> out;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (!mask[k]) out.push_back(dims[k]);
    else if (keepdims) out.push_back(D(int64_t{1}));
  }
  return out;
}

bool keepdims(const Node& n) { return n.attr_int("keepdims", 1) != 0; }

template <ReduceKind K>
Status infer_reduce(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  bool ok = visit_dtype(dt, [&]<typename T>() { return reduce_accepts<K, T>(); });
  if (!ok) return c.error("element type {} is not supported by {}", dtype_name(dt), op_name(c.node().op));
  const Type& t = c.input_type(0);
  if (!t.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const int64_t rank = int64_t(t.shape->rank());
  std::optional<std::vector<int64_t>> axes = c.has_input(1) ? static_ints(c, 1) : std::vector<int64_t>{};
  if (!axes) {
    // Axes known only at run time: keepdims keeps the rank, but which dims become 1 is unknown.
    std::optional<Shape> s;
    if (keepdims(c.node())) s = Shape(std::vector<Dim>(size_t(rank)));
    c.set_output_tensor(0, dt, std::move(s));
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, reduce_mask(c, *axes, rank));
  c.set_output_tensor(0, dt, Shape(reduced_dims(t.shape->dims, mask, keepdims(c.node()))));
  return Status::ok();
}

// ---- the kernel ---------------------------------------------------------------------------

// The identity of the reduction. Integer max/min start from the element type's extremes.
template <ReduceKind K, typename T>
acc_t<T> reduce_start() {
  using A = acc_t<T>;
  constexpr bool kFloat = std::is_floating_point_v<A>;
  constexpr bool kBool = std::is_same_v<T, bool>;
  if constexpr (K == ReduceKind::kProd) {
    return A(1);
  } else if constexpr (K == ReduceKind::kMax) {
    if constexpr (kFloat) return -std::numeric_limits<A>::infinity();
    else return kBool ? A(0) : A(std::numeric_limits<T>::lowest());
  } else if constexpr (K == ReduceKind::kMin) {
    if constexpr (kFloat) return std::numeric_limits<A>::infinity();
    else return kBool ? A(1) : A(std::numeric_limits<T>::max());
  } else {
    return A(0);
  }
}

template <ReduceKind K, typename A>
A reduce_step(A acc, A v) {
  if constexpr (K == ReduceKind::kSum || K == ReduceKind::kMean || K == ReduceKind::kLogSum) return acc + v;
  else if constexpr (K == ReduceKind::kSumSquare || K == ReduceKind::kL2) return acc + v * v;
  else if constexpr (K == ReduceKind::kL1) {
    if constexpr (std::is_unsigned_v<A>) return acc + v;
    else return acc + (v < 0 ? -v : v);
  } else if constexpr (K == ReduceKind::kProd) return acc * v;
  else if constexpr (K == ReduceKind::kMax) return (v > acc || is_nan(v)) ? v : acc;  // NaN sticks
  else if constexpr (K == ReduceKind::kMin) return (v < acc || is_nan(v)) ? v : acc;
  else return acc;  // kLogSumExp folds in reduce_line
}

template <ReduceKind K, typename A>
A reduce_finish(A acc, int64_t count) {
  if constexpr (K == ReduceKind::kL2) return A(std::sqrt(double(acc)));
  else if constexpr (K == ReduceKind::kLogSum) return A(std::log(double(acc)));
  else if constexpr (K == ReduceKind::kMean) {
    if (count > 0) return acc / A(count);
    return std::is_floating_point_v<A> ? std::numeric_limits<A>::quiet_NaN() : A(0);
  } else {
    return acc;
  }
}

template <ReduceKind K, typename T>
T reduce_line(const T* base, const std::vector<int64_t>& inner) {
  using A = acc_t<T>;
  if constexpr (K == ReduceKind::kLogSumExp) {
    // log(sum(exp(x - m))) + m with m the largest finite value, so large inputs do not overflow.
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t off : inner) {
      A v = to_acc(base[off]);
      if (std::isfinite(v) && v > m) m = v;
    }
    if (!std::isfinite(m)) m = 0;
    A s = 0;
    for (int64_t off : inner) s += std::exp(to_acc(base[off]) - m);
    return from_acc<T>(std::log(s) + m);
  } else {
    A acc = reduce_start<K, T>();
    for (int64_t off : inner) acc = reduce_step<K>(acc, to_acc(base[off]));
    return from_acc<T>(reduce_finish<K>(acc, int64_t(inner.size())));
  }
}

template <ReduceKind K>
Status reduce_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const int64_t rank = int64_t(x.rank());
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, reduce_mask(c, optional_ints(c, 1), rank));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), reduced_dims(x.dims(), mask, keepdims(c.node()))));
  const AxisPlan plan = make_axis_plan(x.dims(), mask);
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!reduce_accepts<K, T>()) {
      return c.unsupported("element type {} is not supported", dtype_name(x.dtype()));
    } else {
      const T* xp = x.data<T>();
      T* yp = y->data<T>();
      const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, int64_t(plan.inner.size())));
      parallel_for(int64_t(plan.outer.size()), grain, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) yp[o] = reduce_line<K>(xp + plan.outer[size_t(o)], plan.inner);
      });
      return Status::ok();
    }
  });
}

// ---- ArgMax / ArgMin ------------------------------------------------------------------------

Status infer_arg(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (dt == DType::kString || dt == DType::kBool) {
    return c.error("element type {} is not supported by {}", dtype_name(dt), op_name(c.node().op));
  }
  const Type& t = c.input_type(0);
  if (!t.has_rank()) {
    c.set_output_tensor(0, DType::kInt64, std::nullopt);
    return Status::ok();
  }
  const int64_t rank = int64_t(t.shape->rank());
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, axes_mask(c, {c.node().attr_int("axis", 0)}, rank));
  c.set_output_tensor(0, DType::kInt64, Shape(reduced_dims(t.shape->dims, mask, keepdims(c.node()))));
  return Status::ok();
}

// Index of the largest (kMax) or smallest element of a line; NaN counts as the extreme, as in numpy.
// Ties go to the first index, or the last with select_last_index.
template <bool kMax, typename T>
int64_t arg_line(const T* base, const std::vector<int64_t>& inner, bool last) {
  using A = acc_t<T>;
  auto better = [](A v, A b) {
    if (is_nan(b)) return false;
    if (is_nan(v)) return true;
    return kMax ? v > b : v < b;
  };
  int64_t best = 0;
  A bv = to_acc(base[inner[0]]);
  for (size_t j = 1; j < inner.size(); ++j) {
    A v = to_acc(base[inner[j]]);
    bool tie = v == bv || (is_nan(v) && is_nan(bv));
    if (better(v, bv) || (last && tie)) {
      best = int64_t(j);
      bv = v;
    }
  }
  return best;
}

template <bool kMax>
Status arg_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(std::vector<bool> mask, axes_mask(c, {c.node().attr_int("axis", 0)}, int64_t(x.rank())));
  const std::vector<int64_t> out_dims = reduced_dims(x.dims(), mask, keepdims(c.node()));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kInt64, out_dims));
  const AxisPlan plan = make_axis_plan(x.dims(), mask);
  if (plan.inner.empty() && !plan.outer.empty()) {
    return c.error("cannot take {} over an empty axis of input {}", op_name(c.node().op), x.summary());
  }
  const bool last = c.node().attr_int("select_last_index", 0) != 0;
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) {
      return c.unsupported("element type {} is not supported", dtype_name(x.dtype()));
    } else {
      const T* xp = x.data<T>();
      int64_t* yp = y->data<int64_t>();
      for (size_t o = 0; o < plan.outer.size(); ++o) yp[o] = arg_line<kMax>(xp + plan.outer[o], plan.inner, last);
      return Status::ok();
    }
  });
}

OpDef reduce_def(InferFn infer, CpuKernelFn cpu) {
  return {.inputs = {1, 2},
          .attrs = {{"keepdims", Attribute::Kind::kInt}, {"noop_with_empty_axes", Attribute::Kind::kInt}},
          .infer = infer,
          .cpu = cpu};
}

template <ReduceKind K>
OpDef reduce_def() {
  return reduce_def(infer_reduce<K>, reduce_cpu<K>);
}

OpDef arg_def(CpuKernelFn cpu) {
  return {.inputs = {1, 1},
          .attrs = {{"axis", Attribute::Kind::kInt},
                    {"keepdims", Attribute::Kind::kInt},
                    {"select_last_index", Attribute::Kind::kInt}},
          .infer = infer_arg,
          .cpu = cpu};
}

}  // namespace

void register_reduce_ops(OpRegistry& r) {
  r.def(OpKind::kReduceSum, reduce_def<ReduceKind::kSum>());
  r.def(OpKind::kReduceMean, reduce_def<ReduceKind::kMean>());
  r.def(OpKind::kReduceMax, reduce_def<ReduceKind::kMax>());
  r.def(OpKind::kReduceMin, reduce_def<ReduceKind::kMin>());
  r.def(OpKind::kReduceProd, reduce_def<ReduceKind::kProd>());
  r.def(OpKind::kReduceL1, reduce_def<ReduceKind::kL1>());
  r.def(OpKind::kReduceL2, reduce_def<ReduceKind::kL2>());
  r.def(OpKind::kReduceLogSum, reduce_def<ReduceKind::kLogSum>());
  r.def(OpKind::kReduceLogSumExp, reduce_def<ReduceKind::kLogSumExp>());
  r.def(OpKind::kReduceSumSquare, reduce_def<ReduceKind::kSumSquare>());
  r.def(OpKind::kArgMax, arg_def(arg_cpu<true>));
  r.def(OpKind::kArgMin, arg_def(arg_cpu<false>));
  register_reduce_axis_ops(r);
}

}  // namespace kiln
