// Op family: pool. This file: MaxUnpool, MaxRoiPool and RoiAlign.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ops/nn_util.h"
#include "ops/roi_align_math.h"
#include "ops/shape_util.h"

namespace kiln {
namespace {

// ---- MaxUnpool ------------------------------------------------------------------------------

// Inputs: X [N, C, D...], I (MaxPool's indices into the flattened output), output_shape (optional).
// Default output spatial dims invert MaxPool's: (in - 1) * stride + kernel - pads.
Status infer_max_unpool(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& t = c.input_type(0);
  if (c.has_input(2)) {
    std::optional<std::vector<Dim>> shape = c.input_as_dims(2);
    std::optional<Shape> out;
    if (shape) out = Shape(*shape);
    else if (t.has_rank()) out = Shape(std::vector<Dim>(t.shape->rank()));
    c.set_output_tensor(0, dt, out);
    return Status::ok();
  }
  if (!t.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const Shape& x = *t.shape;
  if (x.rank() < 3) return c.error("X must be [N, C, D1, ...] (rank >= 3), got {}", x.to_string());
  KILN_ASSIGN_OR_RETURN(Window w, read_window(c, x.rank() - 2, {}));
  std::vector<Dim> out = {x[0], x[1]};
  for (size_t i = 0; i < w.rank(); ++i) {
    out.push_back((x[i + 2] - Dim(1)) * Dim(w.strides[i]) + Dim(w.kernel[i] - w.pads[i] - w.pads[i + w.rank()]));
  }
  c.set_output_tensor(0, dt, Shape(out));
  return Status::ok();
}

// The indices address the inferred output (the MaxPool input); a larger output_shape gets that
// result in its leading corner, zeros elsewhere (as the reference does).
Status max_unpool_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const Tensor& ind = c.tensor(1);
  if (x.rank() < 3 || ind.dims() != x.dims() || ind.dtype() != DType::kInt64) {
    return c.error("X must be [N, C, D1, ...] and I int64 of the same shape, got {} and {}", x.summary(), ind.summary());
  }
  KILN_ASSIGN_OR_RETURN(Window w, read_window(c, x.rank() - 2, {}));
  std::vector<int64_t> dims = {x.dim(0), x.dim(1)};
  for (size_t i = 0; i < w.rank(); ++i) {
    dims.push_back((x.dim(i + 2) - 1) * w.strides[i] + w.kernel[i] - w.pads[i] - w.pads[i + w.rank()]);
  }
  std::vector<int64_t> y_dims = c.has_input(2) ? c.tensor(2).to_int_vector() : dims;
  bool fits = y_dims.size() == dims.size();
  for (size_t i = 0; fits && i < dims.size(); ++i) fits = y_dims[i] >= dims[i];
  if (!fits) return c.error("output_shape {} must hold the unpooled shape {}", dims_to_string(y_dims), dims_to_string(dims));
  KILN_ASSIGN_OR_RETURN(Tensor unpooled, Tensor::create(x.dtype(), dims));
  const size_t elem = dtype_size(x.dtype());
  const int64_t* idx = ind.data<int64_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (idx[i] < 0 || idx[i] >= unpooled.numel()) {
      return c.error("index {} at position {} is outside the unpooled shape {}", idx[i], i, dims_to_string(dims));
    }
    std::memcpy(static_cast<char*>(unpooled.raw()) + idx[i] * int64_t(elem),
                static_cast<const char*>(x.raw()) + i * int64_t(elem), elem);
  }
  if (y_dims == dims) {
    c.set_output(0, unpooled);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), y_dims));
  copy_strided(unpooled, 0, strides_of(dims), *y, 0, strides_of(y_dims), dims);
  return Status::ok();
}

// ---- MaxRoiPool and RoiAlign -----------------------------------------------------------------

// Output [num_rois, C, pooled_h, pooled_w] for X [N, C, H, W] and rois [num_rois, cols].
Status infer_roi(InferCtx& c, int64_t ph, int64_t pw) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (dt != DType::kFloat32 && dt != DType::kFloat64 && dt != DType::kFloat16 && dt != DType::kBFloat16) {
    return c.error("{} needs a float input, got {}", op_name(c.node().op), dtype_name(dt));
  }
  const Type& x = c.input_type(0);
  const Type& rois = c.input_type(1);
  if (x.has_rank() && x.shape->rank() != 4) return c.error("X must be [N, C, H, W], got {}", x.to_string());
  Dim n = rois.has_rank() && rois.shape->rank() == 2 ? (*rois.shape)[0] : Dim();
  Dim ch = x.has_rank() ? (*x.shape)[1] : Dim();
  c.set_output_tensor(0, dt, Shape({n, ch, Dim(ph), Dim(pw)}));
  return Status::ok();
}

Status infer_max_roi_pool(InferCtx& c) {
  std::vector<int64_t> pooled = c.node().attr_ints("pooled_shape");
  if (pooled.size() != 2 || pooled[0] < 1 || pooled[1] < 1) {
    return c.error("pooled_shape must be two positive values, got {}", dims_to_string(pooled));
  }
  return infer_roi(c, pooled[0], pooled[1]);
}

Status infer_roi_align(InferCtx& c) {
  return infer_roi(c, c.node().attr_int("output_height", 1), c.node().attr_int("output_width", 1));
}

struct RoiGeom {
  int64_t batch, channels, height, width, num_rois, ph, pw;
};

// Checks shapes, then calls f(geom, roi, plane_in, plane_out) for every roi and channel: f reads
// the roi's row and its batch's input plane (as doubles) and writes the pooled plane.
template <typename F>
Status run_roi(KernelCtx& c, int64_t roi_cols, int64_t ph, int64_t pw, const std::vector<int64_t>& batch_of, F&& f) {
  const Tensor& x = c.tensor(0);
  const Tensor& rois = c.tensor(1);
  if (x.rank() != 4 || rois.rank() != 2 || rois.dim(1) != roi_cols || ph < 1 || pw < 1) {
    return c.error("X must be [N, C, H, W] and rois [R, {}], with positive output dims; got {}, {} and [{}, {}]",
                   roi_cols, x.summary(), rois.summary(), ph, pw);
  }
  RoiGeom g{x.dim(0), x.dim(1), x.dim(2), x.dim(3), rois.dim(0), ph, pw};
  for (int64_t b : batch_of) {
    if (b < 0 || b >= g.batch) return c.error("roi batch index {} is outside [0, {})", b, g.batch);
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), {g.num_rois, g.channels, ph, pw}));
  const std::vector<double> vx = tensor_as_doubles(x), vr = tensor_as_doubles(rois);
  std::vector<double> out(size_t(y->numel()));
  const int64_t hw = g.height * g.width;
  parallel_for(g.num_rois * g.channels, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / g.channels, ch = i % g.channels;
      f(g, vr.data() + r * roi_cols, vx.data() + (batch_of[size_t(r)] * g.channels + ch) * hw, out.data() + i * ph * pw);
    }
  });
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_float_v<T>) {
      return c.unsupported("{} on {}", op_name(c.node().op), x.summary());
    } else {
      store_from_acc<T>(*y, out);
      return Status::ok();
    }
  });
}

// rois are [batch, x1, y1, x2, y2]; each bin takes the max over its (rounded) input cells, 0 if empty.
Status max_roi_pool_cpu(KernelCtx& c) {
  const std::vector<int64_t> pooled = c.node().attr_ints("pooled_shape");
  if (pooled.size() != 2) return c.error("pooled_shape must have two values, got {}", dims_to_string(pooled));
  const double scale = c.node().attr_float("spatial_scale", 1.0f);
  const Tensor& rois = c.tensor(1);
  std::vector<int64_t> batch_of;
  for (int64_t r = 0; rois.rank() == 2 && rois.dim(1) == 5 && r < rois.dim(0); ++r) batch_of.push_back(int64_t(rois.as_double(r * 5)));
  auto pool = [&](const RoiGeom& g, const double* roi, const double* x, double* out) {
    const int64_t x1 = int64_t(std::round(roi[1] * scale)), y1 = int64_t(std::round(roi[2] * scale));
    const int64_t x2 = int64_t(std::round(roi[3] * scale)), y2 = int64_t(std::round(roi[4] * scale));
    const double bin_h = double(std::max<int64_t>(y2 - y1 + 1, 1)) / double(g.ph);
    const double bin_w = double(std::max<int64_t>(x2 - x1 + 1, 1)) / double(g.pw);
    for (int64_t ph = 0; ph < g.ph; ++ph) {
      for (int64_t pw = 0; pw < g.pw; ++pw) {
        const int64_t h0 = std::clamp(int64_t(std::floor(double(ph) * bin_h)) + y1, int64_t{0}, g.height);
        const int64_t h1 = std::clamp(int64_t(std::ceil(double(ph + 1) * bin_h)) + y1, int64_t{0}, g.height);
        const int64_t w0 = std::clamp(int64_t(std::floor(double(pw) * bin_w)) + x1, int64_t{0}, g.width);
        const int64_t w1 = std::clamp(int64_t(std::ceil(double(pw + 1) * bin_w)) + x1, int64_t{0}, g.width);
        double m = (h1 <= h0 || w1 <= w0) ? 0.0 : -std::numeric_limits<double>::infinity();
        for (int64_t h = h0; h < h1; ++h) {
          for (int64_t w = w0; w < w1; ++w) m = std::max(m, x[h * g.width + w]);
        }
        out[ph * g.pw + pw] = m;
      }
    }
  };
  return run_roi(c, 5, pooled[0], pooled[1], batch_of, pool);
}

// rois are [x1, y1, x2, y2] in input coordinates (times spatial_scale); each bin averages (or maxes)
// a sampling_ratio^2 grid (adaptive when 0) of bilinear samples (roi_align_math.h, shared with the
// CUDA kernel).
Status roi_align_cpu(KernelCtx& c) {
  const Node& n = c.node();
  const std::string mode = n.attr_string("mode", "avg");
  const std::string ctm = n.attr_string("coordinate_transformation_mode", "half_pixel");
  if ((mode != "avg" && mode != "max") || (ctm != "half_pixel" && ctm != "output_half_pixel")) {
    return c.error("mode must be avg or max and coordinate_transformation_mode half_pixel or output_half_pixel, "
                   "got '{}' and '{}'", mode, ctm);
  }
  const bool is_max = mode == "max", half_pixel = ctm == "half_pixel";
  const double scale = n.attr_float("spatial_scale", 1.0f);
  const int64_t ratio = n.attr_int("sampling_ratio", 0);
  const Tensor& bi = c.tensor(2);
  if (bi.rank() != 1 || bi.dim(0) != c.tensor(1).dim(0)) {
    return c.error("batch_indices must be [{}], got {}", c.tensor(1).dim(0), bi.summary());
  }
  const std::vector<int64_t> batch_of = bi.to_int_vector();
  auto align = [&](const RoiGeom& g, const double* roi, const double* x, double* out) {
    roi::Align a;
    a.spatial_scale = scale;
    a.sampling_ratio = ratio;
    a.half_pixel = half_pixel;
    a.is_max = is_max;
    a.out_h = g.ph;
    a.out_w = g.pw;
    a.height = g.height;
    a.width = g.width;
    for (int64_t ph = 0; ph < g.ph; ++ph) {
      for (int64_t pw = 0; pw < g.pw; ++pw) {
        out[ph * g.pw + pw] = roi::align_bin(a, roi, ph, pw, [x](int64_t o) { return x[o]; });
      }
    }
  };
  {
    roi::Align a;
    a.spatial_scale = scale;
    a.sampling_ratio = ratio;
    a.out_h = std::max<int64_t>(1, n.attr_int("output_height", 1));
    a.out_w = std::max<int64_t>(1, n.attr_int("output_width", 1));
    const std::vector<double> vr = tensor_as_doubles(c.tensor(1));
    for (size_t r = 0; r + 4 <= vr.size(); r += 4) {
      if (!roi::roi_ok(a, vr.data() + r)) {
        return c.error("roi {} [{}, {}, {}, {}] is not finite or asks for more than {} samples per bin side", r / 4, vr[r],
                       vr[r + 1], vr[r + 2], vr[r + 3], roi::kMaxSamplesPerSide);
      }
    }
  }
  return run_roi(c, 4, n.attr_int("output_height", 1), n.attr_int("output_width", 1), batch_of, align);
}

}  // namespace

void register_pool_roi_ops(OpRegistry& r) {
  r.def(OpKind::kMaxUnpool, {.inputs = {2, 3},
                             .attrs = {{"kernel_shape", Attribute::Kind::kInts, true},
                                       {"pads", Attribute::Kind::kInts}, {"strides", Attribute::Kind::kInts}},
                             .infer = infer_max_unpool, .cpu = max_unpool_cpu});
  r.def(OpKind::kMaxRoiPool, {.inputs = {2, 2},
                              .attrs = {{"pooled_shape", Attribute::Kind::kInts, true},
                                        {"spatial_scale", Attribute::Kind::kFloat}},
                              .infer = infer_max_roi_pool, .cpu = max_roi_pool_cpu});
  r.def(OpKind::kRoiAlign, {.inputs = {3, 3},
                            .attrs = {{"coordinate_transformation_mode", Attribute::Kind::kString},
                                      {"mode", Attribute::Kind::kString},
                                      {"output_height", Attribute::Kind::kInt},
                                      {"output_width", Attribute::Kind::kInt},
                                      {"sampling_ratio", Attribute::Kind::kInt},
                                      {"spatial_scale", Attribute::Kind::kFloat}},
                            .infer = infer_roi_align, .cpu = roi_align_cpu});
}

}  // namespace kiln
