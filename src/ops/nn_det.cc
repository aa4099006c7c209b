// Det: determinant of each square matrix in the last two dims of a float tensor [*, M, M] -> [*].
// LU decomposition with partial pivoting, in double (registered from matmul.cc).
#include <cmath>

#include "ops/elementwise_util.h"
#include "ops/nn_util.h"

namespace kiln {

namespace {

Status infer_det(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kFloat));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& x = c.input_type(0);
  std::optional<Shape> out;
  if (x.has_rank()) {
    const auto& d = x.shape->dims;
    if (d.size() < 2) return c.error("input must be [*, M, M], got {}", x.to_string());
    const Dim& m = d[d.size() - 2];
    const Dim& n = d[d.size() - 1];
    if (m.is_static() && n.is_static() && m.value() != n.value()) {
      return c.error("input must hold square matrices, got {}", x.to_string());
    }
    out = Shape(std::vector<Dim>(d.begin(), d.end() - 2));
  }
  c.set_output_tensor(0, dt, out);
  return Status::ok();
}

double determinant(std::vector<double> a, int64_t m) {
  double det = 1;
  for (int64_t col = 0; col < m; ++col) {
    int64_t piv = col;
    for (int64_t r = col + 1; r < m; ++r) {
      if (std::abs(a[size_t(r * m + col)]) > std::abs(a[size_t(piv * m + col)])) piv = r;
    }
    if (a[size_t(piv * m + col)] == 0) return 0;
    if (piv != col) {
      for (int64_t k = 0; k < m; ++k) std::swap(a[size_t(piv * m + k)], a[size_t(col * m + k)]);
      det = -det;
    }
    const double p = a[size_t(col * m + col)];
    det *= p;
    for (int64_t r = col + 1; r < m; ++r) {
      const double f = a[size_t(r * m + col)] / p;
      for (int64_t k = col; k < m; ++k) a[size_t(r * m + k)] -= f * a[size_t(col * m + k)];
    }
  }
  return det;
}

Status det_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() < 2 || x.dim(x.rank() - 1) != x.dim(x.rank() - 2)) {
    return c.error("input must be [*, M, M], got {}", dims_to_string(x.dims()));
  }
  const int64_t m = x.dim(x.rank() - 1);
  std::vector<int64_t> out_dims(x.dims().begin(), x.dims().end() - 2);
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), out_dims));
  const std::vector<double> v = tensor_as_doubles(x);
  std::vector<double> out(size_t(y->numel()));
  for (size_t b = 0; b < out.size(); ++b) {
    out[b] = determinant(std::vector<double>(v.begin() + long(b * size_t(m * m)), v.begin() + long((b + 1) * size_t(m * m))), m);
  }
  return store_doubles(c, *y, out);
}

}  // namespace

void register_det_op(OpRegistry& r) {
  r.def(OpKind::kDet, {.inputs = {1, 1}, .infer = infer_det, .cpu = det_cpu});
}

}  // namespace kiln
