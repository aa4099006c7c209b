#include "ops/nn_util.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kiln {

int64_t Window::kernel_size() const {
  int64_t k = 1;
  for (int64_t v : kernel) k *= v;
  return k;
}

int64_t prod_from(const std::vector<int64_t>& dims, size_t first) {
  int64_t p = 1;
  for (size_t i = first; i < dims.size(); ++i) p *= dims[i];
  return p;
}

std::optional<std::vector<Dim>> spatial_dims(const Type& t) {
  if (!t.has_rank() || t.shape->rank() < 2) return std::nullopt;
  return std::vector<Dim>(t.shape->dims.begin() + 2, t.shape->dims.end());
}

std::vector<double> tensor_as_doubles(const Tensor& t) {
  std::vector<double> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = t.as_double(int64_t(i));
  return v;
}

Status store_doubles(const KernelCtx& c, Tensor& t, const std::vector<double>& v) {
  return visit_dtype(t.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_nn_float_v<T>) {
      return c.unsupported("{} output {}", op_name(c.node().op), t.summary());
    } else {
      store_from_acc<T>(t, v);
      return Status::ok();
    }
  });
}

Expected<std::vector<double>> channel_param(const KernelCtx& c, size_t i, int64_t channels, const char* what) {
  const Tensor& t = c.tensor(i);
  if (t.numel() != channels || t.rank() > 1) return c.error("{} must be [{}], got {}", what, channels, t.summary());
  return tensor_as_doubles(t);
}

double round_to_dtype(double v, DType dt) {
  return visit_dtype(dt, [&]<typename T>() -> double {
    if constexpr (is_float_v<T>) return double(compute_t<T>(T(compute_t<T>(v))));
    else return v;
  });
}

Expected<std::vector<int64_t>> subtract_zero_point(const KernelCtx& c, const Tensor& x, const Tensor* zp,
                                                   int64_t axis) {
  std::vector<int64_t> v(size_t(x.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = x.as_int(int64_t(i));
  if (!zp || zp->numel() == 0) return v;
  std::vector<int64_t> zdims = zp->dims();
  const size_t r = x.rank();
  if (zdims.size() == 1 && zdims[0] != 1 && axis >= 0 && axis < int64_t(r) && zdims[0] == x.dim(size_t(axis))) {
    zdims.resize(r - size_t(axis), 1);
  }
  bool ok = zdims.size() <= r;
  for (size_t i = 0; ok && i < zdims.size(); ++i) {
    int64_t d = zdims[zdims.size() - 1 - i];
    ok = d == 1 || d == x.dim(r - 1 - i);
  }
  if (!ok) return c.error("zero point {} does not broadcast to its input {}", zp->summary(), x.summary());
  size_t i = 0;
  for (StridedIter it(x.dims(), {broadcast_strides(zdims, x.dims())}); !it.done(); it.next(), ++i) {
    v[i] -= zp->as_int(it.offset(0));
  }
  return v;
}

int64_t saturate_round(double v, DType dt) {
  auto [lo, hi] = visit_dtype(dt, [&]<typename T>() -> std::pair<double, double> {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      return {double(std::numeric_limits<T>::min()), double(std::numeric_limits<T>::max())};
    } else {
      return {-1e300, 1e300};
    }
  });
  return int64_t(std::clamp(std::nearbyint(v), lo, hi));
}

template <typename Ctx>
Expected<AutoPad> read_auto_pad(const Ctx& c) {
  std::string s = c.node().attr_string("auto_pad", "NOTSET");
  if (s == "NOTSET" || s.empty()) return AutoPad::kNotSet;
  if (s == "SAME_UPPER") return AutoPad::kSameUpper;
  if (s == "SAME_LOWER") return AutoPad::kSameLower;
  if (s == "VALID") return AutoPad::kValid;
  return c.error("auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '{}'", s);
}

namespace {
// An int-list attribute of length n (default: n copies of dflt) whose values are >= min_value.
template <typename Ctx>
Expected<std::vector<int64_t>> window_attr(const Ctx& c, const char* name, size_t n, int64_t dflt,
                                           int64_t min_value) {
  std::vector<int64_t> v = c.node().attr_ints(name, std::vector<int64_t>(n, dflt));
  if (v.empty()) v.assign(n, dflt);
  if (v.size() != n) return c.error("{} has {} values, expected {}", name, v.size(), n);
  for (int64_t x : v) {
    if (x < min_value) return c.error("{} values must be >= {}, got {}", name, min_value, x);
  }
  return v;
}
}  // namespace

template <typename Ctx>
Expected<Window> read_window(const Ctx& c, size_t nspatial, const std::vector<int64_t>& kernel) {
  Window w;
  KILN_ASSIGN_OR_RETURN(w.auto_pad, read_auto_pad(c));
  if (c.node().has_attr("kernel_shape")) {
    KILN_ASSIGN_OR_RETURN(w.kernel, window_attr(c, "kernel_shape", nspatial, 1, 1));
  } else if (kernel.size() == nspatial) {
    w.kernel = kernel;
    for (int64_t k : kernel) {
      if (k < 1) return c.error("kernel dims must be >= 1, got {}", dims_to_string(kernel));
    }
  } else {
    return c.error("kernel_shape is required here ({} spatial dims)", nspatial);
  }
  KILN_ASSIGN_OR_RETURN(w.strides, window_attr(c, "strides", nspatial, 1, 1));
  KILN_ASSIGN_OR_RETURN(w.dilations, window_attr(c, "dilations", nspatial, 1, 1));
  KILN_ASSIGN_OR_RETURN(w.pads, window_attr(c, "pads", 2 * nspatial, 0, 0));
  if (w.auto_pad != AutoPad::kNotSet) w.pads.assign(2 * nspatial, 0);  // auto_pad wins over pads
  w.ceil_mode = c.node().attr_int("ceil_mode", 0) != 0;
  return w;
}

template Expected<AutoPad> read_auto_pad(const InferCtx&);
template Expected<AutoPad> read_auto_pad(const KernelCtx&);
template Expected<Window> read_window(const InferCtx&, size_t, const std::vector<int64_t>&);
template Expected<Window> read_window(const KernelCtx&, size_t, const std::vector<int64_t>&);

namespace {
Dim window_output_dim(const Window& w, size_t i, const Dim& in) {
  const Dim s(w.strides[i]);
  switch (w.auto_pad) {
    case AutoPad::kSameUpper:
    case AutoPad::kSameLower:
      return ceil_div(in, s);
    case AutoPad::kValid:
      return floor_div(in - Dim(w.extent(i)), s) + Dim(1);
    case AutoPad::kNotSet:
      break;
  }
  const Dim span = in + Dim(w.pads[i] + w.pads[i + w.rank()] - w.extent(i));
  if (!w.ceil_mode) return floor_div(span, s) + Dim(1);
  Dim out = ceil_div(span, s) + Dim(1);
  // The last window must start inside the input or its begin padding (PyTorch's rule).
  if (out.is_static() && in.is_static() && (out.value() - 1) * w.strides[i] >= in.value() + w.pads[i]) {
    out = Dim(out.value() - 1);
  }
  return out;
}
}  // namespace

std::vector<Dim> window_output_dims(const Window& w, const std::vector<Dim>& in) {
  std::vector<Dim> out;
  for (size_t i = 0; i < w.rank(); ++i) out.push_back(window_output_dim(w, i, in[i]));
  return out;
}

Expected<std::vector<int64_t>> resolve_window(const KernelCtx& c, Window& w, const std::vector<int64_t>& in) {
  const size_t n = w.rank();
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = window_output_dim(w, i, Dim(in[i])).value();
    if (out[i] < 1) {
      return c.error("spatial dim {} of size {} is too small for a window of extent {} (pads {}, {})", i, in[i],
                     w.extent(i), w.pads[i], w.pads[i + n]);
    }
    if (w.auto_pad == AutoPad::kSameUpper || w.auto_pad == AutoPad::kSameLower) {
      int64_t total = std::max<int64_t>(0, (out[i] - 1) * w.strides[i] + w.extent(i) - in[i]);
      int64_t small = total / 2, large = total - total / 2;
      w.pads[i] = w.auto_pad == AutoPad::kSameUpper ? small : large;
      w.pads[i + n] = w.auto_pad == AutoPad::kSameUpper ? large : small;
    }
  }
  return out;
}

namespace {
// Advances a row-major multi-index; false once it wraps around to all zeros.
bool next_index(std::vector<int64_t>& idx, const std::vector<int64_t>& dims) {
  for (size_t k = idx.size(); k-- > 0;) {
    if (++idx[k] < dims[k]) return true;
    idx[k] = 0;
  }
  return false;
}
}  // namespace

WindowTable make_window_table(const Window& w, const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  const size_t n = w.rank();
  // Per dim, for output coordinate o and kernel coordinate q: the input coordinate or a code.
  std::vector<std::vector<int64_t>> coord(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t begin = w.pads[i], end = w.pads[i + n];
    for (int64_t o = 0; o < out[i]; ++o) {
      for (int64_t q = 0; q < w.kernel[i]; ++q) {
        int64_t pos = o * w.strides[i] - begin + q * w.dilations[i];
        // Pads may be negative (ConvTranspose with a larger output_shape): test the input first.
        int64_t code = pos;
        if (pos < 0 || pos >= in[i]) {
          code = pos >= -begin && pos < in[i] + end ? WindowTable::kPad : WindowTable::kBeyond;
        }
        coord[i].push_back(code);
      }
    }
  }
  WindowTable t;
  t.positions = prod_from(out, 0);
  t.kernel_size = w.kernel_size();
  t.offsets.reserve(size_t(t.positions * t.kernel_size));
  if (t.positions == 0) return t;
  const std::vector<int64_t> in_strides = strides_of(in);
  std::vector<int64_t> o(n, 0);
  do {
    std::vector<int64_t> q(n, 0);
    do {
      int64_t off = 0;
      for (size_t i = 0; i < n; ++i) {
        int64_t v = coord[i][size_t(o[i] * w.kernel[i] + q[i])];
        if (v < 0) { off = std::min(off < 0 ? off : 0, v); continue; }  // kBeyond wins over kPad
        if (off >= 0) off += v * in_strides[i];
      }
      t.offsets.push_back(off);
    } while (next_index(q, w.kernel));
  } while (next_index(o, out));
  return t;
}

}  // namespace kiln
