// Op family: pool. This file: MaxPool, AveragePool, LpPool and their Global* forms, which are one
// window (kernel = the whole spatial extent). MaxUnpool, MaxRoiPool and RoiAlign are in
// nn_pool_roi.cc.
//
// A window table (nn_util.h) lists, for every output position, the input offsets its window reads;
// each (n, c) plane then folds its windows. Padding never contributes a value: it only counts
// toward AveragePool's divisor with count_include_pad (taps past the end padding, which only
// ceil_mode windows reach, never count).
#include <cmath>
#include <limits>

#include "ops/nn_util.h"

namespace kiln {

void register_pool_roi_ops(OpRegistry& r);

namespace {

enum class PoolKind { kMax, kAverage, kLp };

template <typename T>
constexpr bool pool_accepts(bool is_max) {
  return is_nn_float_v<T> || (is_max && (std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t>));
}

Status check_pool_dtype(InferCtx& c, DType dt) {
  const bool is_max = c.node().op == OpKind::kMaxPool || c.node().op == OpKind::kGlobalMaxPool;
  if (!visit_dtype(dt, [&]<typename T>() { return pool_accepts<T>(is_max); })) {
    return c.error("{} does not accept element type {}", op_name(c.node().op), dtype_name(dt));
  }
  return Status::ok();
}

Status infer_pool(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_pool_dtype(c, dt));
  const Type& t = c.input_type(0);
  std::optional<Shape> out;
  if (t.has_rank()) {
    const Shape& x = *t.shape;
    if (x.rank() < 3) return c.error("X must be [N, C, D1, ...] (rank >= 3), got {}", x.to_string());
    KILN_ASSIGN_OR_RETURN(Window w, read_window(c, x.rank() - 2, {}));
    std::vector<Dim> dims = {x[0], x[1]};
    for (const Dim& d : window_output_dims(w, *spatial_dims(t))) dims.push_back(d);
    out = Shape(dims);
  }
  c.set_output_tensor(0, dt, out);
  if (c.has_output(1)) c.set_output_tensor(1, DType::kInt64, out);
  return Status::ok();
}

Status infer_global_pool(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_pool_dtype(c, dt));
  const Type& t = c.input_type(0);
  std::optional<Shape> out;
  if (t.has_rank()) {
    if (t.shape->rank() < 3) return c.error("X must be [N, C, D1, ...] (rank >= 3), got {}", t.to_string());
    std::vector<Dim> dims(t.shape->rank(), Dim(1));
    dims[0] = (*t.shape)[0];
    dims[1] = (*t.shape)[1];
    out = Shape(dims);
  }
  c.set_output_tensor(0, dt, out);
  return Status::ok();
}

// The flat index MaxPool reports for input offset `off` of plane `plane`: row-major over the whole
// tensor, or with storage_order=1 column-major over the spatial dims (plane offsets stay row-major).
int64_t max_index(int64_t plane, int64_t off, const std::vector<int64_t>& in, bool column_major) {
  const int64_t size = prod_from(in, 0);
  if (!column_major) return plane * size + off;
  int64_t idx = 0, stride = 1;
  std::vector<int64_t> coord(in.size());
  for (size_t i = in.size(); i-- > 0;) {
    coord[i] = off % in[i];
    off /= in[i];
  }
  for (size_t i = 0; i < in.size(); ++i) {
    idx += coord[i] * stride;
    stride *= in[i];
  }
  return plane * size + idx;
}

struct PoolParams {
  PoolKind kind;
  bool count_include_pad = false;
  bool column_major = false;  // MaxPool storage_order
  double p = 2;               // LpPool
};

template <typename T>
void pool_planes(const PoolParams& pp, const WindowTable& t, const std::vector<int64_t>& in, int64_t planes,
                 const T* x, T* y, int64_t* indices) {
  const int64_t in_size = prod_from(in, 0);
  parallel_for(planes, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t pl = p0; pl < p1; ++pl) {
      const T* xp = x + pl * in_size;
      for (int64_t pos = 0; pos < t.positions; ++pos) {
        double acc = pp.kind == PoolKind::kMax ? -std::numeric_limits<double>::infinity() : 0.0;
        int64_t count = 0, best = -1;
        for (int64_t q = 0; q < t.kernel_size; ++q) {
          const int64_t off = t.at(pos, q);
          if (off == WindowTable::kPad && pp.count_include_pad) ++count;
          if (off < 0) continue;
          const double v = double(compute_t<T>(xp[off]));
          ++count;
          if (pp.kind == PoolKind::kMax) {
            if (v > acc || best < 0) { acc = v; best = off; }  // NaN only wins when first
          } else if (pp.kind == PoolKind::kAverage) {
            acc += v;
          } else {
            acc += std::pow(std::fabs(v), pp.p);
          }
        }
        if (pp.kind == PoolKind::kMax && best < 0 && !is_float_v<T>) acc = 0;  // a window of padding only
        if (pp.kind == PoolKind::kAverage) acc = count > 0 ? acc / double(count) : 0.0;
        if (pp.kind == PoolKind::kLp) acc = std::pow(acc, 1.0 / pp.p);
        const int64_t o = pl * t.positions + pos;
        y[o] = nn_from_acc<T>(nn_acc_t<T>(acc));
        if (indices) indices[o] = best < 0 ? -1 : max_index(pl, best, in, pp.column_major);
      }
    }
  });
}

Status run_pool(KernelCtx& c, Window w, const PoolParams& pp) {
  const Tensor& x = c.tensor(0);
  if (x.rank() < 3 || x.rank() != w.rank() + 2) {
    return c.error("X must be [N, C] plus {} spatial dims, got {}", w.rank(), x.summary());
  }
  const std::vector<int64_t> in(x.dims().begin() + 2, x.dims().end());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out, resolve_window(c, w, in));
  std::vector<int64_t> y_dims = {x.dim(0), x.dim(1)};
  y_dims.insert(y_dims.end(), out.begin(), out.end());
  const WindowTable t = make_window_table(w, in, out);
  const int64_t planes = x.dim(0) * x.dim(1);
  int64_t* indices = nullptr;
  if (c.has_output(1)) {
    KILN_ASSIGN_OR_RETURN(Tensor * ind, c.alloc_output(1, DType::kInt64, y_dims));
    indices = ind->data<int64_t>();
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), y_dims));
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!pool_accepts<T>(true)) {
      return c.unsupported("{} on {}", op_name(c.node().op), x.summary());
    } else {
      pool_planes<T>(pp, t, in, planes, x.data<T>(), y->data<T>(), indices);
      return Status::ok();
    }
  });
}

Status pool_cpu(KernelCtx& c) {
  const Node& n = c.node();
  PoolParams pp;
  pp.kind = n.op == OpKind::kMaxPool ? PoolKind::kMax : n.op == OpKind::kAveragePool ? PoolKind::kAverage : PoolKind::kLp;
  pp.count_include_pad = n.attr_int("count_include_pad", 0) != 0;
  pp.column_major = n.attr_int("storage_order", 0) != 0;
  pp.p = double(n.attr_int("p", 2));
  if (pp.kind == PoolKind::kLp && pp.p <= 0) return c.error("p must be positive, got {}", pp.p);
  const size_t ns = c.tensor(0).rank() >= 2 ? c.tensor(0).rank() - 2 : 0;
  KILN_ASSIGN_OR_RETURN(Window w, read_window(c, ns, {}));
  return run_pool(c, w, pp);
}

Status global_pool_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() < 3) return c.error("X must be [N, C, D1, ...] (rank >= 3), got {}", x.summary());
  const OpKind op = c.node().op;
  PoolParams pp;
  pp.kind = op == OpKind::kGlobalMaxPool ? PoolKind::kMax : op == OpKind::kGlobalAveragePool ? PoolKind::kAverage
                                                                                            : PoolKind::kLp;
  pp.p = double(c.node().attr_int("p", 2));
  Window w;
  w.kernel.assign(x.dims().begin() + 2, x.dims().end());
  w.strides.assign(w.kernel.size(), 1);
  w.dilations.assign(w.kernel.size(), 1);
  w.pads.assign(2 * w.kernel.size(), 0);
  return run_pool(c, w, pp);
}

std::vector<AttrSpec> pool_attrs(std::initializer_list<AttrSpec> extra) {
  std::vector<AttrSpec> a = {{"auto_pad", Attribute::Kind::kString}, {"ceil_mode", Attribute::Kind::kInt},
                             {"dilations", Attribute::Kind::kInts},  {"kernel_shape", Attribute::Kind::kInts, true},
                             {"pads", Attribute::Kind::kInts},       {"strides", Attribute::Kind::kInts}};
  a.insert(a.end(), extra);
  return a;
}

}  // namespace

void register_pool_ops(OpRegistry& r) {
  r.def(OpKind::kMaxPool, {.inputs = {1, 1}, .outputs = {1, 2},
                           .attrs = pool_attrs({{"storage_order", Attribute::Kind::kInt}}),
                           .infer = infer_pool, .cpu = pool_cpu});
  r.def(OpKind::kAveragePool, {.inputs = {1, 1}, .attrs = pool_attrs({{"count_include_pad", Attribute::Kind::kInt}}),
                               .infer = infer_pool, .cpu = pool_cpu});
  r.def(OpKind::kLpPool, {.inputs = {1, 1}, .attrs = pool_attrs({{"p", Attribute::Kind::kInt}}),
                          .infer = infer_pool, .cpu = pool_cpu});
  for (OpKind op : {OpKind::kGlobalAveragePool, OpKind::kGlobalMaxPool, OpKind::kGlobalLpPool}) {
    r.def(op, {.inputs = {1, 1}, .attrs = {{"p", Attribute::Kind::kInt}}, .infer = infer_global_pool,
               .cpu = global_pool_cpu});
  }
  register_pool_roi_ops(r);
}

}  // namespace kiln
