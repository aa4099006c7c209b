// Op family: matmul. MatMul (numpy semantics), Gemm, MatMulInteger and QLinearMatMul; Einsum is in
// nn_einsum.cc, Det in nn_det.cc. Every product is computed by gemm_accumulate (nn_util.h) on operands converted to
// the accumulator type: double for floats, int64 for integers and quantized values.
#include <cmath>

#include "ops/nn_util.h"

namespace kiln {

void register_einsum_op(OpRegistry& r);
void register_det_op(OpRegistry& r);

namespace {

// ---- shapes ---------------------------------------------------------------------------------

// numpy matmul operands: a 1-D A is [1, K] and a 1-D B is [K, 1]; the added dims are dropped from
// the result. Batch dims (all but the last two) broadcast.
template <typename D>
struct MatMulDims {
  std::vector<D> batch_a, batch_b;
  D m, ka, kb, n;
  bool vec_a = false, vec_b = false;
};

template <typename D, typename Ctx>
Expected<MatMulDims<D>> split_matmul_dims(const Ctx& c, std::vector<D> a, std::vector<D> b) {
  if (a.empty() || b.empty()) {
    return c.error("MatMul operands must have rank >= 1, got ranks {} and {}", a.size(), b.size());
  }
  MatMulDims<D> d;
  d.vec_a = a.size() == 1;
  d.vec_b = b.size() == 1;
  if (d.vec_a) a.insert(a.begin(), D(int64_t{1}));
  if (d.vec_b) b.push_back(D(int64_t{1}));
  d.m = a[a.size() - 2];
  d.ka = a.back();
  d.kb = b[b.size() - 2];
  d.n = b.back();
  d.batch_a.assign(a.begin(), a.end() - 2);
  d.batch_b.assign(b.begin(), b.end() - 2);
  return d;
}

template <typename D>
std::vector<D> matmul_out_dims(const MatMulDims<D>& d, std::vector<D> batch) {
  if (!d.vec_a) batch.push_back(d.m);
  if (!d.vec_b) batch.push_back(d.n);
  return batch;
}

// Output type of A @ B (inputs ia and ib) with element type dt.
Status infer_matmul_like(InferCtx& c, size_t ia, size_t ib, DType dt) {
  const Type& ta = c.input_type(ia);
  const Type& tb = c.input_type(ib);
  if (!ta.has_rank() || !tb.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(MatMulDims<Dim> d, split_matmul_dims<Dim>(c, ta.shape->dims, tb.shape->dims));
  if (!d.ka.compatible(d.kb)) {
    return c.error("inner dimensions differ: A is {} (K={}) and B is {} (K={})", ta.shape->to_string(),
                   d.ka.to_string(), tb.shape->to_string(), d.kb.to_string());
  }
  KILN_ASSIGN_OR_RETURN(Shape batch, broadcast_shapes(c, {Shape(d.batch_a), Shape(d.batch_b)}));
  c.set_output_tensor(0, dt, Shape(matmul_out_dims(d, batch.dims)));
  return Status::ok();
}

template <typename T>
constexpr bool matmul_accepts() {
  return is_nn_float_v<T> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t> ||
         std::is_same_v<T, uint32_t> || std::is_same_v<T, uint64_t>;
}

Status infer_matmul(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, 2));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (!visit_dtype(dt, [&]<typename T>() { return matmul_accepts<T>(); })) {
    return c.error("MatMul does not accept element type {}", dtype_name(dt));
  }
  return infer_matmul_like(c, 0, 1, dt);
}

// ---- the batched product --------------------------------------------------------------------

struct MatMulPlan {
  int64_t m = 0, k = 0, n = 0;
  std::vector<int64_t> out_dims;
  std::vector<int64_t> a_offsets, b_offsets;  // where each batch's matrices start in A and B
};

Expected<MatMulPlan> plan_matmul(const KernelCtx& c, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  KILN_ASSIGN_OR_RETURN(MatMulDims<int64_t> d, split_matmul_dims<int64_t>(c, a, b));
  if (d.ka != d.kb) {
    return c.error("inner dimensions differ: A is {} and B is {}", dims_to_string(a), dims_to_string(b));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> batch, broadcast_dims(c, {d.batch_a, d.batch_b}));
  MatMulPlan p;
  p.m = d.m;
  p.k = d.ka;
  p.n = d.n;
  p.out_dims = matmul_out_dims(d, batch);
  std::vector<int64_t> sa = broadcast_strides(d.batch_a, batch), sb = broadcast_strides(d.batch_b, batch);
  for (StridedIter it(batch, {sa, sb}); !it.done(); it.next()) {
    p.a_offsets.push_back(it.offset(0) * p.m * p.k);
    p.b_offsets.push_back(it.offset(1) * p.k * p.n);
  }
  return p;
}

template <typename A>
std::vector<A> run_matmul(const MatMulPlan& p, const A* a, const A* b) {
  const int64_t batches = int64_t(p.a_offsets.size()), mn = p.m * p.n;
  std::vector<A> out(size_t(batches * mn), A(0));
  auto one = [&](int64_t i) {
    gemm_accumulate<A>(p.m, p.n, p.k, {a + p.a_offsets[size_t(i)], p.k, 1}, {b + p.b_offsets[size_t(i)], p.n, 1},
                       out.data() + i * mn, p.n);
  };
  // Many small matrices: one thread per batch; otherwise gemm_accumulate splits the rows.
  if (batches >= 4) {
    parallel_for(batches, 1, [&](int64_t b0, int64_t b1) { for (int64_t i = b0; i < b1; ++i) one(i); });
  } else {
    for (int64_t i = 0; i < batches; ++i) one(i);
  }
  return out;
}

Status matmul_cpu(KernelCtx& c) {
  const Tensor& a = c.tensor(0);
  const Tensor& b = c.tensor(1);
  if (a.dtype() != b.dtype()) return c.error("A is {} but B is {}", a.summary(), b.summary());
  KILN_ASSIGN_OR_RETURN(MatMulPlan p, plan_matmul(c, a.dims(), b.dims()));
  return visit_dtype(a.dtype(), [&]<typename T>() -> Status {
    if constexpr (!matmul_accepts<T>()) {
      return c.unsupported("MatMul on {}", dtype_name(a.dtype()));
    } else {
      auto out = run_matmul(p, to_acc_vector<T>(a).data(), to_acc_vector<T>(b).data());
      KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, a.dtype(), p.out_dims));
      store_from_acc<T>(*y, out);
      return Status::ok();
    }
  });
}

// ---- Gemm -----------------------------------------------------------------------------------

Status infer_gemm(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, c.has_input(2) ? 3 : 2));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (!visit_dtype(dt, [&]<typename T>() { return matmul_accepts<T>(); })) {
    return c.error("Gemm does not accept element type {}", dtype_name(dt));
  }
  const Type& ta = c.input_type(0);
  const Type& tb = c.input_type(1);
  if (!ta.has_rank() || !tb.has_rank()) {
    c.set_output_tensor(0, dt, Shape({Dim(), Dim()}));
    return Status::ok();
  }
  if (ta.shape->rank() != 2 || tb.shape->rank() != 2) {
    return c.error("Gemm needs 2-D A and B, got {} and {}", ta.to_string(), tb.to_string());
  }
  const bool trans_a = c.node().attr_int("transA", 0) != 0, trans_b = c.node().attr_int("transB", 0) != 0;
  const Shape& sa = *ta.shape;
  const Shape& sb = *tb.shape;
  Dim m = sa[trans_a ? 1 : 0], ka = sa[trans_a ? 0 : 1], kb = sb[trans_b ? 1 : 0], n = sb[trans_b ? 0 : 1];
  if (!ka.compatible(kb)) {
    return c.error("inner dimensions differ: A {} (transA={}) and B {} (transB={})", sa.to_string(), trans_a,
                   sb.to_string(), trans_b);
  }
  c.set_output_tensor(0, dt, Shape({m, n}));
  return Status::ok();
}

Status gemm_cpu(KernelCtx& c) {
  const Tensor& a = c.tensor(0);
  const Tensor& b = c.tensor(1);
  if (a.rank() != 2 || b.rank() != 2 || a.dtype() != b.dtype()) {
    return c.error("Gemm needs 2-D A and B of one type, got {} and {}", a.summary(), b.summary());
  }
  const bool trans_a = c.node().attr_int("transA", 0) != 0, trans_b = c.node().attr_int("transB", 0) != 0;
  const int64_t m = a.dim(trans_a ? 1 : 0), k = a.dim(trans_a ? 0 : 1), n = b.dim(trans_b ? 0 : 1);
  if (b.dim(trans_b ? 1 : 0) != k) {
    return c.error("inner dimensions differ: A {} (transA={}) and B {} (transB={})", a.summary(), trans_a,
                   b.summary(), trans_b);
  }
  const Tensor* cin = c.has_input(2) ? &c.tensor(2) : nullptr;
  std::vector<int64_t> c_strides;
  if (cin) {
    bool ok = cin->rank() <= 2 && cin->dtype() == a.dtype();
    for (size_t i = 0; ok && i < cin->rank(); ++i) {
      int64_t d = cin->dim(cin->rank() - 1 - i);
      ok = d == 1 || d == (i == 0 ? n : m);
    }
    if (!ok) return c.error("C {} does not broadcast to [{},{}]", cin->summary(), m, n);
    c_strides = broadcast_strides(cin->dims(), {m, n});
  }
  const double alpha = c.node().attr_float("alpha", 1.0f), beta = c.node().attr_float("beta", 1.0f);
  return visit_dtype(a.dtype(), [&]<typename T>() -> Status {
    if constexpr (!matmul_accepts<T>()) {
      return c.unsupported("Gemm on {}", dtype_name(a.dtype()));
    } else {
      using A = nn_acc_t<T>;
      std::vector<A> va = to_acc_vector<T>(a), vb = to_acc_vector<T>(b), acc(size_t(m * n), A(0));
      MatView<A> ma{va.data(), trans_a ? 1 : k, trans_a ? m : 1};
      MatView<A> mb{vb.data(), trans_b ? 1 : n, trans_b ? k : 1};
      gemm_accumulate<A>(m, n, k, ma, mb, acc.data(), n);
      KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, a.dtype(), {m, n}));
      T* out = y->data<T>();
      const T* cp = cin ? cin->data<T>() : nullptr;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double v = alpha * double(acc[size_t(i * n + j)]);
          if (cp) v += beta * double(compute_t<T>(cp[i * c_strides[0] + j * c_strides[1]]));
          out[i * n + j] = nn_from_acc<T>(A(v));
        }
      }
      return Status::ok();
    }
  });
}

// ---- MatMulInteger and QLinearMatMul ---------------------------------------------------------

Status infer_matmul_integer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType ta, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType tb, c.tensor_dtype(1));
  if (!is_8bit_int(ta) || !is_8bit_int(tb)) {
    return c.error("MatMulInteger needs int8/uint8 inputs, got {} and {}", dtype_name(ta), dtype_name(tb));
  }
  return infer_matmul_like(c, 0, 1, DType::kInt32);
}

const Tensor* optional_tensor(const KernelCtx& c, size_t i) { return c.has_input(i) ? &c.tensor(i) : nullptr; }

// The integer product (A - a_zero_point) @ (B - b_zero_point) in int64.
Expected<std::vector<int64_t>> integer_product(const KernelCtx& c, const MatMulPlan& p, const Tensor& a,
                                               const Tensor* azp, const Tensor& b, const Tensor* bzp) {
  if (!is_8bit_int(a.dtype()) || !is_8bit_int(b.dtype())) {
    return c.unsupported("integer matmul on {} and {}", a.summary(), b.summary());
  }
  // A's zero point is per row, B's per column.
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> va, subtract_zero_point(c, a, azp, int64_t(a.rank()) - 2));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> vb, subtract_zero_point(c, b, bzp, int64_t(b.rank()) - 1));
  return run_matmul<int64_t>(p, va.data(), vb.data());
}

Status matmul_integer_cpu(KernelCtx& c) {
  const Tensor& a = c.tensor(0);
  const Tensor& b = c.tensor(1);
  KILN_ASSIGN_OR_RETURN(MatMulPlan p, plan_matmul(c, a.dims(), b.dims()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> out,
                        integer_product(c, p, a, optional_tensor(c, 2), b, optional_tensor(c, 3)));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kInt32, p.out_dims));
  store_from_acc<int32_t>(*y, out);
  return Status::ok();
}

// Inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point.
Status infer_qlinear_matmul(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType ta, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType tb, c.tensor_dtype(3));
  KILN_ASSIGN_OR_RETURN(DType ty, c.tensor_dtype(7));
  if (!is_8bit_int(ta) || !is_8bit_int(tb) || !is_8bit_int(ty)) {
    return c.error("QLinearMatMul needs int8/uint8 a, b and y_zero_point, got {}, {} and {}", dtype_name(ta),
                   dtype_name(tb), dtype_name(ty));
  }
  return infer_matmul_like(c, 0, 3, ty);
}

// y = saturate(round((A - azp) @ (B - bzp) * a_scale * b_scale / y_scale) + y_zero_point). Scales are
// per tensor, or per row of A / per column of B; the factor is rounded to the scales' type first, as
// the reference computes it there.
Status qlinear_matmul_cpu(KernelCtx& c) {
  const Tensor& a = c.tensor(0);
  const Tensor& b = c.tensor(3);
  const Tensor& y_zp = c.tensor(7);
  KILN_ASSIGN_OR_RETURN(MatMulPlan p, plan_matmul(c, a.dims(), b.dims()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> prod, integer_product(c, p, a, &c.tensor(2), b, &c.tensor(5)));
  std::vector<double> sa = tensor_as_doubles(c.tensor(1)), sb = tensor_as_doubles(c.tensor(4));
  std::vector<double> sy = tensor_as_doubles(c.tensor(6));
  if ((sa.size() != 1 && int64_t(sa.size()) != p.m) || (sb.size() != 1 && int64_t(sb.size()) != p.n) ||
      sy.size() != 1 || y_zp.numel() != 1) {
    return c.error("scales must be per tensor or per row of a [{}] / per column of b [{}]; got a_scale {}, "
                   "b_scale {}, y_scale {}, y_zero_point {}", p.m, p.n, c.tensor(1).summary(),
                   c.tensor(4).summary(), c.tensor(6).summary(), y_zp.summary());
  }
  const DType st = c.tensor(1).dtype();
  const double zp = y_zp.as_double(0);
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, y_zp.dtype(), p.out_dims));
  return visit_dtype(y_zp.dtype(), [&]<typename T>() -> Status {
    if constexpr (!std::is_same_v<T, int8_t> && !std::is_same_v<T, uint8_t>) {
      return c.unsupported("QLinearMatMul output {}", dtype_name(y_zp.dtype()));
    } else {
      T* out = y->data<T>();
      for (size_t i = 0; i < prod.size(); ++i) {
        const int64_t row = int64_t(i) / p.n % p.m, col = int64_t(i) % p.n;
        double f = round_to_dtype(sa[sa.size() == 1 ? 0 : size_t(row)] * sb[sb.size() == 1 ? 0 : size_t(col)], st);
        f = round_to_dtype(f / sy[0], st);
        out[i] = T(saturate_round(double(prod[i]) * f + zp, y_zp.dtype()));
      }
      return Status::ok();
    }
  });
}

}  // namespace

void register_matmul_ops(OpRegistry& r) {
  r.def(OpKind::kMatMul, {.inputs = {2, 2}, .infer = infer_matmul, .cpu = matmul_cpu});
  r.def(OpKind::kGemm, {.inputs = {2, 3},
                        .attrs = {{"alpha", Attribute::Kind::kFloat}, {"beta", Attribute::Kind::kFloat},
                                  {"transA", Attribute::Kind::kInt}, {"transB", Attribute::Kind::kInt}},
                        .infer = infer_gemm, .cpu = gemm_cpu});
  r.def(OpKind::kMatMulInteger, {.inputs = {2, 4}, .infer = infer_matmul_integer, .cpu = matmul_integer_cpu});
  r.def(OpKind::kQLinearMatMul, {.inputs = {8, 8}, .infer = infer_qlinear_matmul, .cpu = qlinear_matmul_cpu});
  register_einsum_op(r);
  register_det_op(r);
}

}  // namespace kiln
