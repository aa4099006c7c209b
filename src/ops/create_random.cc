// Op family create, part 3: the random generators. RandomNormal, RandomUniform (+Like),
// Bernoulli, Multinomial. With a `seed` attribute the output is reproducible across runs (the
// values are kiln's own, not numpy's: ONNX leaves the generator unspecified).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "ops/create_cast.h"
#include "ops/op_util.h"

namespace kiln {
namespace {

std::mt19937_64 make_engine(const Node& n) {
  if (!n.has_attr("seed")) return std::mt19937_64(std::random_device{}());
  // The seed is a float attribute: integral values seed as that integer; NaN, infinities and values
  // past the int64 range (undefined to convert; found by kiln_fuzz_run) seed with their bit pattern.
  float f = n.attr_float("seed", 0);
  if (std::isfinite(f) && std::fabs(f) < 9.2e18f) return std::mt19937_64(uint64_t(int64_t(f)));
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof(bits));
  return std::mt19937_64(bits);
}

// The `dtype` attribute when present, else `dflt`; must be a float type for the continuous
// generators and a numeric (or bool) type otherwise.
template <typename Ctx>
Expected<DType> output_dtype(const Ctx& c, DType dflt, bool float_only) {
  DType dt = dflt;
  if (c.node().has_attr("dtype")) {
    int64_t code = c.node().attr_int("dtype", 0);
    std::optional<DType> d = dtype_from_onnx(int32_t(code));
    if (!d) return c.error("dtype {} is not a known data type", code);
    dt = *d;
  }
  if (dt == DType::kString || (float_only && !dtype_is_float(dt))) {
    return c.error("output dtype {} is not allowed here", dtype_name(dt));
  }
  return dt;
}

// Fills t with draw(engine) converted to t's dtype.
template <typename Draw>
void fill_random(Tensor& t, std::mt19937_64& eng, Draw draw) {
  for (int64_t i = 0; i < t.numel(); ++i) set_element(t, i, draw(eng));
}

// ---- RandomNormal / RandomUniform and their *Like forms ------------------------------------------

bool is_like(OpKind op) { return op == OpKind::kRandomNormalLike || op == OpKind::kRandomUniformLike; }

Status random_infer(InferCtx& c) {
  if (is_like(c.node().op)) {
    KILN_ASSIGN_OR_RETURN(DType in, c.tensor_dtype(0));
    KILN_ASSIGN_OR_RETURN(DType dt, output_dtype(c, in, true));
    c.set_output_tensor(0, dt, c.input_type(0).shape);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(DType dt, output_dtype(c, DType::kFloat32, true));
  std::vector<int64_t> shape = c.node().attr_ints("shape");
  for (int64_t d : shape) {
    if (d < 0) return c.error("shape {} has a negative dimension", dims_to_string(shape));
  }
  c.set_output_tensor(0, dt, Shape::of(shape));
  return Status::ok();
}

Status random_cpu(KernelCtx& c) {
  const Node& n = c.node();
  std::vector<int64_t> dims;
  DType dt;
  if (is_like(n.op)) {
    dims = c.tensor(0).dims();
    KILN_ASSIGN_OR_RETURN(dt, output_dtype(c, c.tensor(0).dtype(), true));
  } else {
    dims = n.attr_ints("shape");
    KILN_ASSIGN_OR_RETURN(dt, output_dtype(c, DType::kFloat32, true));
  }
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, dt, dims));
  std::mt19937_64 eng = make_engine(n);
  if (n.op == OpKind::kRandomNormal || n.op == OpKind::kRandomNormalLike) {
    std::normal_distribution<double> dist(n.attr_float("mean", 0), n.attr_float("scale", 1));
    fill_random(*out, eng, dist);
  } else {
    double lo = n.attr_float("low", 0), hi = n.attr_float("high", 1);
    if (!(lo <= hi)) return c.error("low {} must not exceed high {}", lo, hi);
    std::uniform_real_distribution<double> dist(lo, hi);
    fill_random(*out, eng, dist);
  }
  return Status::ok();
}

// ---- Bernoulli ---------------------------------------------------------------------------------

Status bernoulli_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType in, c.tensor_dtype(0));
  if (!dtype_is_float(in)) return c.error("input must be a float tensor of probabilities, got {}", dtype_name(in));
  KILN_ASSIGN_OR_RETURN(DType dt, output_dtype(c, in, false));
  c.set_output_tensor(0, dt, c.input_type(0).shape);
  return Status::ok();
}

Status bernoulli_cpu(KernelCtx& c) {
  const Tensor& p = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(DType dt, output_dtype(c, p.dtype(), false));
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, dt, p.dims()));
  std::mt19937_64 eng = make_engine(c.node());
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < p.numel(); ++i) set_element(*out, i, u(eng) < p.as_double(i) ? 1.0 : 0.0);
  return Status::ok();
}

// ---- Multinomial -------------------------------------------------------------------------------

Status multinomial_infer(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType in, c.tensor_dtype(0));
  if (!dtype_is_float(in)) return c.error("input must be float log-probabilities, got {}", dtype_name(in));
  KILN_ASSIGN_OR_RETURN(DType dt, output_dtype(c, DType::kInt32, false));
  if (dt != DType::kInt32 && dt != DType::kInt64) return c.error("dtype must be int32 or int64, got {}", dtype_name(dt));
  int64_t samples = c.node().attr_int("sample_size", 1);
  const Type& x = c.input_type(0);
  if (x.has_rank() && x.shape->rank() != 2) return c.error("input must be [batch, classes], got {}", x.to_string());
  c.set_output_tensor(0, dt, Shape{x.has_rank() ? (*x.shape)[0] : Dim(), Dim(samples)});
  return Status::ok();
}

Status multinomial_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() != 2) return c.error("input must be [batch, classes], got {}", x.summary());
  KILN_ASSIGN_OR_RETURN(DType dt, output_dtype(c, DType::kInt32, false));
  int64_t samples = c.node().attr_int("sample_size", 1);
  if (samples < 0) return c.error("sample_size must be non-negative, got {}", samples);
  int64_t batch = x.dim(0), classes = x.dim(1);
  KILN_ASSIGN_OR_RETURN(Tensor* out, c.alloc_output(0, dt, {batch, samples}));
  std::mt19937_64 eng = make_engine(c.node());
  std::vector<double> cdf(static_cast<size_t>(classes));
  for (int64_t b = 0; b < batch; ++b) {
    // Unnormalized log-probabilities: softmax via the running sum of exp(x - max).
    double mx = -INFINITY;
    for (int64_t k = 0; k < classes; ++k) mx = std::max(mx, x.as_double(b * classes + k));
    double total = 0;
    for (int64_t k = 0; k < classes; ++k) cdf[size_t(k)] = total += std::exp(x.as_double(b * classes + k) - mx);
    std::uniform_real_distribution<double> u(0.0, total);
    for (int64_t s = 0; s < samples; ++s) {
      auto it = std::upper_bound(cdf.begin(), cdf.end(), u(eng));
      auto k = std::min<int64_t>(it - cdf.begin(), classes - 1);
      set_element(*out, b * samples + s, double(k));
    }
  }
  return Status::ok();
}

}  // namespace

void register_create_random_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  std::vector<AttrSpec> normal = {{"dtype", K::kInt}, {"mean", K::kFloat}, {"scale", K::kFloat}, {"seed", K::kFloat}};
  std::vector<AttrSpec> uniform = {{"dtype", K::kInt}, {"high", K::kFloat}, {"low", K::kFloat}, {"seed", K::kFloat}};
  auto with_shape = [](std::vector<AttrSpec> a) {
    a.push_back({"shape", K::kInts, true});
    return a;
  };
  r.def(OpKind::kRandomNormal, {.inputs = {0, 0}, .attrs = with_shape(normal), .infer = random_infer, .cpu = random_cpu});
  r.def(OpKind::kRandomUniform, {.inputs = {0, 0}, .attrs = with_shape(uniform), .infer = random_infer, .cpu = random_cpu});
  r.def(OpKind::kRandomNormalLike, {.inputs = {1, 1}, .attrs = normal, .infer = random_infer, .cpu = random_cpu});
  r.def(OpKind::kRandomUniformLike, {.inputs = {1, 1}, .attrs = uniform, .infer = random_infer, .cpu = random_cpu});
  r.def(OpKind::kBernoulli, {.inputs = {1, 1}, .attrs = {{"dtype", K::kInt}, {"seed", K::kFloat}},
                             .infer = bernoulli_infer, .cpu = bernoulli_cpu});
  r.def(OpKind::kMultinomial, {.inputs = {1, 1}, .attrs = {{"dtype", K::kInt}, {"sample_size", K::kInt}, {"seed", K::kFloat}},
                               .infer = multinomial_infer, .cpu = multinomial_cpu});
}

}  // namespace kiln
