// GridSample (opset 22, any number of spatial dims) and AffineGrid (opset 20, 2-D and 3-D).
//
// GridSample reads X [N, C, D1..Dr] at the normalized points of grid [N, O1..Or, r], whose last
// axis lists coordinates innermost-first (x = Dr, y = Dr-1, ...), the PyTorch convention. Points
// map to pixel space (align_corners decides whether -1/1 are pixel centers or edges), then
// padding_mode handles those outside, then nearest/linear/cubic interpolation reads taps around
// them. Matches onnx/reference/ops/op_grid_sample.py and PyTorch's GridSampler.h.
#include <algorithm>
#include <cmath>

#include "ops/grid_sample_math.h"
#include "ops/image_util.h"

namespace kiln {

namespace {

using SampleMode = grid::Mode;
using PaddingMode = grid::Padding;

constexpr NamedValue<SampleMode> kSampleModes[] = {
    {"nearest", grid::kNearest}, {"linear", grid::kLinear}, {"cubic", grid::kCubic},
    // opset 16 spellings, kept so older models also work if the importer passes them through
    {"bilinear", grid::kLinear}, {"bicubic", grid::kCubic}};
constexpr NamedValue<PaddingMode> kPaddingModes[] = {
    {"zeros", grid::kZeros}, {"border", grid::kBorder}, {"reflection", grid::kReflection}};

// ---- GridSample inference ------------------------------------------------------------------------

Status infer_grid_sample(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType gdt, c.tensor_dtype(1));
  KILN_ASSIGN_OR_RETURN(SampleMode mode, parse_enum_attr(c, "mode", "linear", kSampleModes));
  KILN_ASSIGN_OR_RETURN(PaddingMode padding, parse_enum_attr(c, "padding_mode", "zeros", kPaddingModes));
  (void)mode, (void)padding;  // parsed only to reject bad values early
  if (!dtype_in_class(TypeClass::kNumeric, dt)) return c.error("X must be numeric, got {}", dtype_name(dt));
  if (!dtype_in_class(TypeClass::kFloat, gdt)) return c.error("grid must be float, got {}", dtype_name(gdt));
  const Type& x = c.input_type(0);
  const Type& g = c.input_type(1);
  if (!x.has_rank() || !g.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const Shape& xs = *x.shape;
  const Shape& gs = *g.shape;
  if (xs.rank() < 3 || gs.rank() != xs.rank()) {
    return c.error("X {} and grid {} must have the same rank >= 3", x.to_string(), g.to_string());
  }
  const size_t r = xs.rank() - 2;
  if (gs[r + 1].is_static() && gs[r + 1].value() != int64_t(r)) {
    return c.error("grid {} must end in {} (one coordinate per spatial dim of X {})", g.to_string(), r, x.to_string());
  }
  if (!xs[0].compatible(gs[0])) return c.error("X {} and grid {} disagree on N", x.to_string(), g.to_string());
  std::vector<Dim> out = {xs[0].is_static() ? xs[0] : gs[0], xs[1]};
  for (size_t i = 1; i <= r; ++i) out.push_back(gs[i]);
  c.set_output_tensor(0, dt, Shape(out));
  return Status::ok();
}

// ---- GridSample kernel ---------------------------------------------------------------------------

struct SampleAttrs {
  SampleMode mode;
  PaddingMode padding;
  bool align_corners;
};

// G: float for 16- and 32-bit grids (read as float, their compute type), double for f64.
template <typename T, typename G>
void grid_sample(const Tensor& x, const G* g, Tensor& y, const SampleAttrs& a) {
  const std::vector<int64_t>& xd = x.dims();
  const size_t r = xd.size() - 2;
  const int64_t N = xd[0], C = xd[1];
  std::vector<grid::SpatialDim> dims(r);
  int64_t image = 1;  // elements per (n, c) image
  for (size_t i = 0; i < r; ++i) {
    const int64_t s = xd[i + 2];
    dims[i] = grid::spatial_dim(s, a.align_corners);
    image *= s;
  }
  const std::vector<int64_t> st = strides_of(std::vector<int64_t>(xd.begin() + 2, xd.end()));
  const int64_t points = y.numel() / std::max<int64_t>(N * C, 1);
  const T* src = x.data<T>();
  T* dst = y.data<T>();
  parallel_for(N * points, 256, [&](int64_t b, int64_t e) {
    std::vector<grid::DimTaps> taps(r);
    for (int64_t np = b; np < e; ++np) {
      const int64_t n = np / points, p = np % points;
      const G* gp = g + np * int64_t(r);
      for (size_t i = 0; i < r; ++i) {
        // Grid coordinates come innermost-first; denormalize in the grid's compute type.
        using GC = compute_t<G>;
        const GC coord = grid::denormalize(GC(gp[r - 1 - i]), GC(dims[i].size), a.align_corners);
        taps[i] = grid::taps_for(double(coord), dims[i], a.mode, a.padding);
      }
      // Sum over every combination of taps (n^r of them), skipping zero-padded ones.
      for (int64_t ch = 0; ch < C; ++ch) {
        const T* img = src + (n * C + ch) * image;
        double acc = 0;
        std::vector<int> k(r, 0);
        for (;;) {
          double w = 1;
          int64_t off = 0;
          for (size_t i = 0; i < r && off >= 0; ++i) {
            int64_t idx = taps[i].index[k[i]];
            w *= taps[i].weight[k[i]];
            off = idx < 0 ? -1 : off + idx * st[i];
          }
          if (off >= 0 && w != 0) acc += w * double(compute_t<T>(img[off]));
          size_t i = r;
          while (i > 0 && ++k[i - 1] == taps[i - 1].n) k[--i] = 0;
          if (i == 0) break;
        }
        dst[(n * C + ch) * points + p] = from_double<T>(acc);
      }
    }
  });
}

Status grid_sample_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& grid = c.tensor(1);
  SampleAttrs a;
  KILN_ASSIGN_OR_RETURN(a.mode, parse_enum_attr(c, "mode", "linear", kSampleModes));
  KILN_ASSIGN_OR_RETURN(a.padding, parse_enum_attr(c, "padding_mode", "zeros", kPaddingModes));
  a.align_corners = c.node().attr_int("align_corners", 0) != 0;
  const size_t rank = x.rank();
  if (rank < 3 || grid.rank() != rank || grid.dim(rank - 1) != int64_t(rank - 2) || grid.dim(0) != x.dim(0)) {
    return c.error("X {} and grid {} do not match: grid must be [N, O1..Or, r] for X [N, C, D1..Dr]",
                   x.summary(), grid.summary());
  }
  std::vector<int64_t> out = {x.dim(0), x.dim(1)};
  for (size_t i = 1; i + 1 < rank; ++i) out.push_back(grid.dim(i));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), out));
  if (y->numel() == 0) return Status::ok();
  for (size_t i = 2; i < rank; ++i) {
    if (x.dim(i) == 0) return c.error("X {} has an empty spatial dim to sample from", x.summary());
  }
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) {
      return c.unsupported("GridSample of {}", dtype_name(x.dtype()));
    } else {
      if (!dtype_is_float(grid.dtype())) return c.unsupported("GridSample grid of {}", dtype_name(grid.dtype()));
      if (grid.dtype() == DType::kFloat64) {
        grid_sample<T, double>(x, grid.data<double>(), *y, a);
      } else {
        std::vector<float> g(size_t(grid.numel()));
        for (int64_t i = 0; i < grid.numel(); ++i) g[size_t(i)] = float(grid.as_double(i));
        grid_sample<T, float>(x, g.data(), *y, a);
      }
      return Status::ok();
    }
  });
}

// ---- AffineGrid ----------------------------------------------------------------------------------

Status infer_affine_grid(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (!dtype_in_class(TypeClass::kFloat, dt)) return c.error("theta must be float, got {}", dtype_name(dt));
  std::optional<std::vector<Dim>> size = c.input_as_dims(1);
  const Type& theta = c.input_type(0);
  if (!size) {
    // The rank still follows from theta: [N, 2, 3] gives a 4-D grid, [N, 3, 4] a 5-D one.
    if (theta.has_rank() && theta.shape->rank() == 3 && (*theta.shape)[1].is_static()) {
      const int64_t r = (*theta.shape)[1].value();
      std::vector<Dim> out(size_t(r + 2), Dim());
      out[0] = (*theta.shape)[0];
      out.back() = Dim(r);
      c.set_output_tensor(0, dt, Shape(out));
    } else {
      c.set_output_tensor(0, dt, std::nullopt);
    }
    return Status::ok();
  }
  if (size->size() != 4 && size->size() != 5) {
    return c.error("size must have 4 (N,C,H,W) or 5 (N,C,D,H,W) values, got {}", size->size());
  }
  const int64_t r = int64_t(size->size()) - 2;
  if (theta.has_rank()) {
    const Shape& ts = *theta.shape;
    if (ts.rank() != 3 || !ts[1].compatible(Dim(r)) || !ts[2].compatible(Dim(r + 1))) {
      return c.error("theta {} must be [N, {}, {}] for a {}-D size", theta.to_string(), r, r + 1, r);
    }
  }
  std::vector<Dim> out = {(*size)[0]};
  for (size_t i = 2; i < size->size(); ++i) out.push_back((*size)[i]);
  out.push_back(Dim(r));
  c.set_output_tensor(0, dt, Shape(out));
  return Status::ok();
}

// The normalized coordinate of pixel j of n along one dim: pixel centers spread over [-1, 1].
double base_coord(int64_t j, int64_t n, bool align_corners) {
  if (align_corners) return n == 1 ? -1.0 : -1.0 + 2.0 * double(j) / double(n - 1);
  return -1.0 + (2.0 * double(j) + 1.0) / double(n);
}

template <typename T>
void affine_grid(const Tensor& theta, const std::vector<int64_t>& spatial, bool align, Tensor& out) {
  const size_t r = spatial.size();
  const int64_t N = theta.dim(0);
  int64_t points = 1;
  for (int64_t s : spatial) points *= s;
  const T* th = theta.data<T>();
  T* dst = out.data<T>();
  std::vector<double> base(r + 1, 1.0);  // homogeneous (x, y[, z], 1), x innermost
  for (int64_t n = 0; n < N; ++n) {
    const T* m = th + n * int64_t(r * (r + 1));
    for (int64_t p = 0; p < points; ++p) {
      int64_t rem = p;
      for (size_t i = r; i-- > 0;) {  // spatial dim i feeds component r-1-i
        base[r - 1 - i] = base_coord(rem % spatial[i], spatial[i], align);
        rem /= spatial[i];
      }
      for (size_t k = 0; k < r; ++k) {
        double acc = 0;
        for (size_t j = 0; j <= r; ++j) acc += double(compute_t<T>(m[k * (r + 1) + j])) * base[j];
        dst[(n * points + p) * int64_t(r) + int64_t(k)] = from_double<T>(acc);
      }
    }
  }
}

Status affine_grid_cpu(KernelCtx& c) {
  const Tensor& theta = c.tensor(0);
  std::vector<int64_t> size = c.tensor(1).to_int_vector();
  if (size.size() != 4 && size.size() != 5) return c.error("size must have 4 or 5 values, got {}", size.size());
  const int64_t r = int64_t(size.size()) - 2;
  if (theta.rank() != 3 || theta.dim(0) != size[0] || theta.dim(1) != r || theta.dim(2) != r + 1) {
    return c.error("theta {} must be [{}, {}, {}] for size {}", theta.summary(), size[0], r, r + 1, dims_to_string(size));
  }
  std::vector<int64_t> spatial(size.begin() + 2, size.end());
  std::vector<int64_t> out = {size[0]};
  out.insert(out.end(), spatial.begin(), spatial.end());
  out.push_back(r);
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, theta.dtype(), out));
  const bool align = c.node().attr_int("align_corners", 0) != 0;
  return visit_dtype(theta.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_float_v<T>) {
      return c.unsupported("AffineGrid of {}", dtype_name(theta.dtype()));
    } else {
      affine_grid<T>(theta, spatial, align, *y);
      return Status::ok();
    }
  });
}

}  // namespace

void register_image_grid_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kGridSample, {.inputs = {2, 2},
                              .attrs = {{"align_corners", K::kInt}, {"mode", K::kString}, {"padding_mode", K::kString}},
                              .infer = infer_grid_sample,
                              .cpu = grid_sample_cpu});
  r.def(OpKind::kAffineGrid, {.inputs = {2, 2},
                              .attrs = {{"align_corners", K::kInt}},
                              .infer = infer_affine_grid,
                              .cpu = affine_grid_cpu});
}

}  // namespace kiln
