// Op family: image. Resize lives in image_resize.cc, GridSample and AffineGrid in image_grid.cc;
// this file holds NonMaxSuppression, CenterCropPad and ImageDecoder.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/image_util.h"

namespace kiln {

namespace {

// ---- NonMaxSuppression ---------------------------------------------------------------------------

Status infer_nms(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType bt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(DType st, c.tensor_dtype(1));
  if (bt != DType::kFloat32 || st != DType::kFloat32) {
    return c.error("boxes and scores must be float32, got {} and {}", dtype_name(bt), dtype_name(st));
  }
  const Type& b = c.input_type(0);
  const Type& s = c.input_type(1);
  if (b.has_rank() && (b.shape->rank() != 3 || !(*b.shape)[2].compatible(Dim(4)))) {
    return c.error("boxes must be [batches, boxes, 4], got {}", b.to_string());
  }
  if (s.has_rank() && s.shape->rank() != 3) return c.error("scores must be [batches, classes, boxes], got {}", s.to_string());
  const int64_t cpb = c.node().attr_int("center_point_box", 0);
  if (cpb != 0 && cpb != 1) return c.error("center_point_box must be 0 or 1, got {}", cpb);
  // The number of selected boxes depends on the data.
  c.set_output_tensor(0, DType::kInt64, Shape({Dim(), Dim(3)}));
  return Status::ok();
}

// An axis-aligned box as (min, max) corners, from either box encoding.
struct Box {
  float y0, x0, y1, x1;
  float area() const { return (x1 - x0) * (y1 - y0); }
};

Box read_box(const float* b, bool center_point) {
  if (center_point) {  // [x_center, y_center, width, height]
    return {b[1] - b[3] / 2, b[0] - b[2] / 2, b[1] + b[3] / 2, b[0] + b[2] / 2};
  }
  // [y1, x1, y2, x2] with the corners in either order
  return {std::min(b[0], b[2]), std::min(b[1], b[3]), std::max(b[0], b[2]), std::max(b[1], b[3])};
}

// True when the IoU of a and b exceeds the threshold (degenerate boxes never suppress).
bool suppresses(const Box& a, const Box& b, float iou_threshold) {
  const float ix0 = std::max(a.x0, b.x0), ix1 = std::min(a.x1, b.x1);
  const float iy0 = std::max(a.y0, b.y0), iy1 = std::min(a.y1, b.y1);
  if (ix1 <= ix0 || iy1 <= iy0) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  const float area_a = a.area(), area_b = b.area(), uni = area_a + area_b - inter;
  if (area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

// The boxes one (batch, class) has kept so far, bucketed along x: a candidate is compared only with
// the kept boxes in the buckets its x range touches, as boxes apart along x never overlap. Buckets
// are as wide as the widest candidate, so a box lies in at most two. Exporters' batched NMS (every
// class in one call, each class's boxes offset far from the others') then costs about what one
// class's would, where comparing with every kept box grew with the square of all the boxes. The
// result is the one every-pair comparison gives: only pairs that cannot overlap are skipped.
class KeptBoxes {
 public:
  // `boxes`: every candidate (finite coordinates), to size the buckets.
  explicit KeptBoxes(const std::vector<Box>& boxes) {
    float lo = boxes.empty() ? 0.0f : boxes[0].x0, hi = lo, widest = 0;
    for (const Box& b : boxes) {
      lo = std::min(lo, b.x0);
      hi = std::max(hi, b.x1);
      widest = std::max(widest, b.x1 - b.x0);
    }
    lo_ = lo;
    const float span = hi - lo;
    if (!std::isfinite(span) || !std::isfinite(widest)) {  // coordinates near the float range: one bucket
      buckets_.resize(1);
      return;
    }
    // At most ~2 buckets per candidate (and 65,536): a few small boxes spread wide make few.
    const float most = float(std::min<size_t>(65536, 2 * boxes.size() + 1));
    width_ = std::max({widest, span / most, 1e-6f});
    buckets_.resize(size_t(span / width_) + 1);
  }
  bool suppressed(const Box& b, const std::vector<Box>& all, float iou) const {
    for (size_t i = bucket(b.x0), last = bucket(b.x1); i <= last; ++i) {
      for (int64_t k : buckets_[i]) {
        if (suppresses(b, all[size_t(k)], iou)) return true;
      }
    }
    return false;
  }
  void keep(const Box& b, int64_t index) {
    for (size_t i = bucket(b.x0), last = bucket(b.x1); i <= last; ++i) buckets_[i].push_back(index);
  }

 private:
  // Boxes with x0 > x1 (a negative width) span no bucket: they overlap nothing.
  size_t bucket(float x) const {
    const float f = (x - lo_) / width_;
    if (!(f > 0)) return 0;
    return f >= float(buckets_.size() - 1) ? buckets_.size() - 1 : size_t(f);
  }
  float lo_ = 0, width_ = 1;
  std::vector<std::vector<int64_t>> buckets_;
};

bool finite_box(const Box& b) { return std::isfinite(b.x0) && std::isfinite(b.x1) && std::isfinite(b.y0) && std::isfinite(b.y1); }

// A scalar optional input (an empty tensor counts as absent).
std::optional<double> optional_scalar(const KernelCtx& c, size_t i) {
  if (!c.has_input(i) || c.tensor(i).numel() == 0) return std::nullopt;
  return c.tensor(i).as_double(0);
}

Status nms_cpu(KernelCtx& c) {
  const Tensor& boxes = c.tensor(0);
  const Tensor& scores = c.tensor(1);
  if (boxes.rank() != 3 || boxes.dim(2) != 4 || scores.rank() != 3 || scores.dim(0) != boxes.dim(0) ||
      scores.dim(2) != boxes.dim(1)) {
    return c.error("boxes {} must be [B, S, 4] and scores {} [B, C, S]", boxes.summary(), scores.summary());
  }
  const int64_t max_out = std::max<int64_t>(0, c.has_input(2) && c.tensor(2).numel() > 0 ? c.tensor(2).as_int(0) : 0);
  const float iou = float(optional_scalar(c, 3).value_or(0.0));
  const std::optional<double> score_threshold = optional_scalar(c, 4);
  const bool center = c.node().attr_int("center_point_box", 0) == 1;
  const int64_t B = boxes.dim(0), C = scores.dim(1), S = boxes.dim(1);
  std::vector<int64_t> selected;  // flattened (batch, class, box) triples
  std::vector<Box> all(static_cast<size_t>(S));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) all[size_t(s)] = read_box(boxes.data<float>() + (b * S + s) * 4, center);
    for (int64_t cl = 0; cl < C; ++cl) {
      const float* sc = scores.data<float>() + (b * C + cl) * S;
      std::vector<int64_t> cand;
      for (int64_t s = 0; s < S; ++s) {
        if (!score_threshold || sc[s] > *score_threshold) cand.push_back(s);
      }
      // Highest score first; equal scores keep the lower box index first.
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t i, int64_t j) { return sc[i] > sc[j]; });
      std::vector<Box> cand_boxes;
      for (int64_t s : cand) cand_boxes.push_back(all[size_t(s)]);
      // Every pair is compared when a coordinate is not finite (buckets need finite ones).
      const bool bucketed = max_out > 0 && std::all_of(cand_boxes.begin(), cand_boxes.end(), finite_box);
      KeptBoxes index(bucketed ? cand_boxes : std::vector<Box>{});
      std::vector<int64_t> kept;
      for (int64_t s : cand) {
        if (int64_t(kept.size()) >= max_out) break;
        const Box& box = all[size_t(s)];
        const bool drop = bucketed ? index.suppressed(box, all, iou)
                                   : std::any_of(kept.begin(), kept.end(),
                                                 [&](int64_t k) { return suppresses(box, all[size_t(k)], iou); });
        if (drop) continue;
        kept.push_back(s);
        if (bucketed) index.keep(box, s);
        selected.insert(selected.end(), {b, cl, s});
      }
    }
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, DType::kInt64, {int64_t(selected.size() / 3), 3}));
  std::copy(selected.begin(), selected.end(), y->data<int64_t>());
  return Status::ok();
}

// ---- CenterCropPad -------------------------------------------------------------------------------

template <typename Ctx>
Expected<std::vector<int64_t>> center_crop_axes(const Ctx& c, int64_t rank) {
  std::vector<int64_t> axes;
  if (!c.node().has_attr("axes")) {
    axes.resize(size_t(rank));
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (int64_t a : c.node().attr_ints("axes")) {
    KILN_ASSIGN_OR_RETURN(int64_t k, normalize_axis(c, a, rank));
    axes.push_back(k);
  }
  return axes;
}

Status infer_center_crop_pad(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& x = c.input_type(0);
  if (!x.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, center_crop_axes(c, int64_t(x.shape->rank())));
  Shape out = *x.shape;
  std::optional<std::vector<Dim>> shape = c.input_as_dims(1);
  if (shape && shape->size() != axes.size()) {
    return c.error("shape has {} values, expected one per axis ({})", shape->size(), axes.size());
  }
  for (size_t i = 0; i < axes.size(); ++i) out[size_t(axes[i])] = shape ? (*shape)[i] : Dim();
  c.set_output_tensor(0, dt, out);
  return Status::ok();
}

Status center_crop_pad_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const size_t r = x.rank();
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, center_crop_axes(c, int64_t(r)));
  std::vector<int64_t> shape = c.tensor(1).to_int_vector();
  if (shape.size() != axes.size()) return c.error("shape has {} values, expected {}", shape.size(), axes.size());
  std::vector<int64_t> out = x.dims();
  std::vector<int64_t> shift(r, 0);  // input index = output index + shift
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t a = size_t(axes[i]);
    if (shape[i] < 0) return c.error("shape[{}] is negative ({})", i, shape[i]);
    // Cropping drops floor(d/2) from the start; padding adds floor(d/2) zeros before.
    shift[a] = x.dim(a) >= shape[i] ? (x.dim(a) - shape[i]) / 2 : -((shape[i] - x.dim(a)) / 2);
    out[a] = shape[i];
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), out));
  visit_dtype(x.dtype(), [&]<typename T>() {
    const T* src = x.data<T>();
    T* dst = y->data<T>();
    const std::vector<int64_t> st = strides_of(x.dims());
    for (int64_t o = 0; o < y->numel(); ++o) {
      int64_t rem = o, off = 0;
      bool inside = true;
      for (size_t k = r; k-- > 0;) {
        const int64_t i = rem % out[k] + shift[k];
        rem /= out[k];
        inside = inside && i >= 0 && i < x.dim(k);
        off += i * st[k];
      }
      if (inside) dst[o] = src[off];
    }
  });
  return Status::ok();
}

// ---- ImageDecoder --------------------------------------------------------------------------------

Status infer_image_decoder(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  if (dt != DType::kUInt8) return c.error("encoded_stream must be uint8, got {}", dtype_name(dt));
  const std::string fmt = c.node().attr_string("pixel_format", "RGB");
  if (fmt != "RGB" && fmt != "BGR" && fmt != "Grayscale") {
    return c.error("pixel_format must be RGB, BGR or Grayscale, got '{}'", fmt);
  }
  c.set_output_tensor(0, DType::kUInt8, Shape({Dim(), Dim(), Dim(int64_t(fmt == "Grayscale" ? 1 : 3))}));
  return Status::ok();
}

Status image_decoder_cpu(KernelCtx& c) {
  return c.unsupported("ImageDecoder needs image codecs (JPEG, PNG, WebP...), which kiln does not link; "
                       "decode images before the model");
}

}  // namespace

void register_image_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  register_image_resize_ops(r);
  register_image_grid_ops(r);
  r.def(OpKind::kNonMaxSuppression, {.inputs = {2, 5},
                                     .attrs = {{"center_point_box", K::kInt}},
                                     .infer = infer_nms,
                                     .cpu = nms_cpu});
  r.def(OpKind::kCenterCropPad, {.inputs = {2, 2},
                                 .attrs = {{"axes", K::kInts}},
                                 .infer = infer_center_crop_pad,
                                 .cpu = center_crop_pad_cpu});
  r.def(OpKind::kImageDecoder, {.inputs = {1, 1},
                                .attrs = {{"pixel_format", K::kString}},
                                .infer = infer_image_decoder,
                                .cpu = image_decoder_cpu});
}

}  // namespace kiln
