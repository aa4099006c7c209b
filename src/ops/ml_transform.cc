// ai.onnx.ml feature transforms: Scaler, Normalizer, Imputer, OneHotEncoder, LinearRegressor,
// FeatureVectorizer. Numeric inputs of any type are read as double; outputs are float32 as the
// spec declares (Imputer keeps its input type).
#include <algorithm>
#include <cmath>

#include "ops/elementwise_util.h"

namespace kiln {

void register_ml_transform_ops(OpRegistry& r);

namespace {

std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.as_double(i);
  return v;
}

// Rows and columns of a [N, C] (or [C]: one row) input.
std::pair<int64_t, int64_t> rows_cols(const Tensor& x) {
  const int64_t cols = x.rank() == 0 ? 1 : x.dims().back();
  return {cols == 0 ? 0 : x.numel() / cols, cols};
}

Status write_floats(KernelCtx& c, const std::vector<double>& v, std::vector<int64_t> dims) {
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kFloat32, std::move(dims)));
  for (size_t i = 0; i < v.size(); ++i) y->data<float>()[i] = float(v[i]);
  return Status::ok();
}

Status infer_float_same_shape(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kNumeric));
  c.set_output_tensor(0, DType::kFloat32, c.input_type(0).shape);
  return Status::ok();
}

// A per-column attribute list: one value for all columns, or exactly one per column.
Expected<std::vector<double>> per_column(const KernelCtx& c, const char* name, std::vector<float> v, int64_t cols,
                                         double dflt) {
  if (v.empty()) return std::vector<double>(size_t(cols), dflt);
  if (v.size() == 1) return std::vector<double>(size_t(cols), double(v[0]));
  if (int64_t(v.size()) != cols) return c.error("{} has {} values for {} columns", name, v.size(), cols);
  return std::vector<double>(v.begin(), v.end());
}

// ---- Scaler: (x - offset) * scale per column ----------------------------------------------------

Status scaler_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const auto rc = rows_cols(x);  // named, not bound: lambdas capture them (clang 14)
  const int64_t rows = rc.first, cols = rc.second;
  KILN_ASSIGN_OR_RETURN(std::vector<double> offset, per_column(c, "offset", c.node().attr_floats("offset"), cols, 0.0));
  KILN_ASSIGN_OR_RETURN(std::vector<double> scale, per_column(c, "scale", c.node().attr_floats("scale"), cols, 1.0));
  std::vector<double> v = as_doubles(x);
  for (int64_t i = 0; i < rows * cols; ++i) v[size_t(i)] = (v[size_t(i)] - offset[size_t(i % cols)]) * scale[size_t(i % cols)];
  return write_floats(c, v, x.dims());
}

// ---- Normalizer: each row divided by its MAX, L1 or L2 norm ------------------------------------------

Status normalizer_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const std::string norm = c.node().attr_string("norm", "MAX");
  if (norm != "MAX" && norm != "L1" && norm != "L2") return c.error("norm must be MAX, L1 or L2, got '{}'", norm);
  const auto rc = rows_cols(x);  // named, not bound: lambdas capture them (clang 14)
  const int64_t rows = rc.first, cols = rc.second;
  std::vector<double> v = as_doubles(x);
  for (int64_t r = 0; r < rows; ++r) {
    double* row = &v[size_t(r * cols)];
    double d = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double a = std::abs(row[j]);
      d = norm == "MAX" ? std::max(d, a) : norm == "L1" ? d + a : d + a * a;
    }
    if (norm == "L2") d = std::sqrt(d);
    d = std::max(d, 1e-30);  // all-zero rows stay zero
    for (int64_t j = 0; j < cols; ++j) row[j] /= d;
  }
  return write_floats(c, v, x.dims());
}

// ---- Imputer: replaces the "missing" marker (NaN or a given value) with per-column values -------------

Status infer_imputer(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kNumeric));
  return infer_same_as_input0(c);
}

Status imputer_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Node& n = c.node();
  const auto rc = rows_cols(x);  // named, not bound: lambdas capture them (clang 14)
  const int64_t rows = rc.first, cols = rc.second;
  std::vector<float> fv = n.attr_floats("imputed_value_floats");
  std::vector<int64_t> iv = n.attr_ints("imputed_value_int64s");
  const bool floats = !fv.empty();
  if (!floats && iv.empty()) return c.error("Imputer needs imputed_value_floats or imputed_value_int64s");
  std::vector<float> values = floats ? fv : std::vector<float>(iv.begin(), iv.end());
  KILN_ASSIGN_OR_RETURN(std::vector<double> fill, per_column(c, "imputed values", values, cols, 0.0));
  const double marker = floats ? double(n.attr_float("replaced_value_float", 0.0f)) : double(n.attr_int("replaced_value_int64", 0));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), x.dims()));
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) {
      return c.unsupported("Imputer of {}", dtype_name(x.dtype()));
    } else {
      for (int64_t i = 0; i < rows * cols; ++i) {
        const double v = double(compute_t<T>(x.data<T>()[i]));
        const bool missing = std::isnan(marker) ? std::isnan(v) : v == marker;
        y->data<T>()[i] = missing ? static_cast<T>(static_cast<compute_t<T>>(fill[size_t(i % cols)])) : x.data<T>()[i];
      }
      return Status::ok();
    }
  });
}

// ---- OneHotEncoder: a trailing axis with 1 at the element's category ----------------------------------

Status infer_one_hot_encoder(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  (void)dt;
  const Node& n = c.node();
  const int64_t cats = int64_t(std::max(n.attr_ints("cats_int64s").size(), n.attr_strings("cats_strings").size()));
  std::optional<Shape> out = c.input_type(0).shape;
  if (out) out->dims.push_back(Dim(cats));
  c.set_output_tensor(0, DType::kFloat32, out);
  return Status::ok();
}

Status one_hot_encoder_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Node& n = c.node();
  const bool strings = x.dtype() == DType::kString;
  const std::vector<std::string> cs = n.attr_strings("cats_strings");
  const std::vector<int64_t> ci = n.attr_ints("cats_int64s");
  const int64_t cats = int64_t(strings ? cs.size() : ci.size());
  if (cats == 0) return c.error("no categories for a {} input", dtype_name(x.dtype()));
  std::vector<int64_t> dims = x.dims();
  dims.push_back(cats);
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kFloat32, dims));
  const bool zeros = n.attr_int("zeros", 1) != 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t k = -1;
    if (strings) k = std::find(cs.begin(), cs.end(), x.data<std::string>()[i]) - cs.begin();
    else k = std::find(ci.begin(), ci.end(), int64_t(x.as_double(i))) - ci.begin();
    if (k < cats) y->data<float>()[i * cats + k] = 1.0f;
    else if (!zeros) return c.error("element {} has no category (and zeros is 0)", i);
  }
  return Status::ok();
}

// ---- LinearRegressor: x W^T + b over `targets` outputs -------------------------------------------------

Status infer_linear_regressor(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kNumeric));
  const Type& x = c.input_type(0);
  const Dim n = x.has_rank() && x.shape->rank() == 2 ? (*x.shape)[0] : x.has_rank() && x.shape->rank() == 1 ? Dim(1) : Dim();
  c.set_output_tensor(0, DType::kFloat32, Shape({n, Dim(c.node().attr_int("targets", 1))}));
  return Status::ok();
}

Status linear_regressor_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Node& n = c.node();
  if (n.attr_string("post_transform", "NONE") != "NONE") return c.unsupported("LinearRegressor post_transform other than NONE");
  const auto rc = rows_cols(x);  // named, not bound: lambdas capture them (clang 14)
  const int64_t rows = rc.first, cols = rc.second;
  const int64_t targets = n.attr_int("targets", 1);
  const std::vector<float> w = n.attr_floats("coefficients");
  const std::vector<float> b = n.attr_floats("intercepts");
  if (targets < 1 || int64_t(w.size()) != targets * cols || (!b.empty() && int64_t(b.size()) != targets)) {
    return c.error("coefficients ({}) must be targets ({}) x features ({}), intercepts one per target", w.size(), targets, cols);
  }
  std::vector<double> xs = as_doubles(x), out(size_t(rows * targets));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < targets; ++t) {
      double acc = b.empty() ? 0.0 : double(b[size_t(t)]);
      for (int64_t j = 0; j < cols; ++j) acc += xs[size_t(r * cols + j)] * double(w[size_t(t * cols + j)]);
      out[size_t(r * targets + t)] = acc;
    }
  }
  return write_floats(c, out, {rows, targets});
}

// ---- FeatureVectorizer: concatenates [N, C_i] inputs, each cut or zero-padded to inputdimensions[i] ----

Status infer_feature_vectorizer(InferCtx& c) {
  int64_t total = 0;
  for (int64_t d : c.node().attr_ints("inputdimensions")) total += d;
  const Type& x = c.input_type(0);
  const Dim n = x.has_rank() && x.shape->rank() >= 1 ? (*x.shape)[0] : Dim();
  c.set_output_tensor(0, DType::kFloat32, Shape({x.has_rank() && x.shape->rank() == 1 ? Dim(1) : n, Dim(total)}));
  return Status::ok();
}

Status feature_vectorizer_cpu(KernelCtx& c) {
  const std::vector<int64_t> widths = c.node().attr_ints("inputdimensions");
  if (widths.size() != c.num_inputs()) return c.error("inputdimensions has {} values for {} inputs", widths.size(), c.num_inputs());
  int64_t total = 0, rows = -1;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Tensor& t = c.tensor(i);
    const int64_t r = t.rank() <= 1 ? 1 : t.dim(0);
    if (rows >= 0 && r != rows) return c.error("input {} has {} rows, expected {}", i, r, rows);
    if (widths[i] < 0) return c.error("inputdimensions[{}] is negative", i);
    rows = r;
    total += widths[i];
  }
  std::vector<double> out(size_t(std::max<int64_t>(rows, 0) * total), 0.0);
  int64_t at = 0;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Tensor& t = c.tensor(i);
    const int64_t cols = rows > 0 ? t.numel() / rows : 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < std::min(cols, widths[i]); ++j) out[size_t(r * total + at + j)] = t.as_double(r * cols + j);
    }
    at += widths[i];
  }
  return write_floats(c, out, {std::max<int64_t>(rows, 0), total});
}

}  // namespace

void register_ml_transform_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kScaler, {.inputs = {1, 1},
                          .attrs = {{"offset", K::kFloats}, {"scale", K::kFloats}},
                          .infer = infer_float_same_shape,
                          .cpu = scaler_cpu});
  r.def(OpKind::kNormalizer, {.inputs = {1, 1},
                              .attrs = {{"norm", K::kString}},
                              .infer = infer_float_same_shape,
                              .cpu = normalizer_cpu});
  r.def(OpKind::kImputer, {.inputs = {1, 1},
                           .attrs = {{"imputed_value_floats", K::kFloats}, {"imputed_value_int64s", K::kInts},
                                     {"replaced_value_float", K::kFloat}, {"replaced_value_int64", K::kInt}},
                           .infer = infer_imputer,
                           .cpu = imputer_cpu});
  r.def(OpKind::kOneHotEncoder, {.inputs = {1, 1},
                                 .attrs = {{"cats_int64s", K::kInts}, {"cats_strings", K::kStrings}, {"zeros", K::kInt}},
                                 .infer = infer_one_hot_encoder,
                                 .cpu = one_hot_encoder_cpu});
  r.def(OpKind::kLinearRegressor, {.inputs = {1, 1},
                                   .attrs = {{"coefficients", K::kFloats}, {"intercepts", K::kFloats},
                                             {"post_transform", K::kString}, {"targets", K::kInt}},
                                   .infer = infer_linear_regressor,
                                   .cpu = linear_regressor_cpu});
  r.def(OpKind::kFeatureVectorizer, {.inputs = {1, kVariadic},
                                     .attrs = {{"inputdimensions", K::kInts}},
                                     .infer = infer_feature_vectorizer,
                                     .cpu = feature_vectorizer_cpu});
}

}  // namespace kiln
