// Op family: signal. DFT (opset 20: forward, inverse, one-sided RFFT/IRFFT, axis and dft_length
// inputs), STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix.
//
// Complex tensors are real tensors with a trailing dim of 2 (real, imaginary); real signals have a
// trailing 1. Transforms are direct O(n^2) DFTs in double with an exact twiddle table: this is the
// reference backend, where obviously-correct beats fast.
#include <cmath>
#include <complex>
#include <numbers>

#include "ops/elementwise_util.h"

namespace kiln {

namespace {

using cdouble = std::complex<double>;

// A double stored as element type T: floats convert, integers truncate toward zero (numpy astype).
template <typename T>
T store(double v) {
  if constexpr (is_int_v<T>) return saturate_cast<T>(v);
  else return static_cast<T>(static_cast<compute_t<T>>(v));
}

// out[k] = sum_t in[t] e^(-+2 pi i k t / n) for k < out.size(); in is zero beyond its size.
// The twiddle of k*t comes from a table indexed mod n, so large k*t loses no precision.
void dft(const std::vector<cdouble>& in, int64_t n, bool inverse, std::vector<cdouble>& out) {
  std::vector<cdouble> tw(static_cast<size_t>(n));
  const double sign = inverse ? 1.0 : -1.0;
  for (int64_t j = 0; j < n; ++j) tw[size_t(j)] = std::polar(1.0, sign * 2 * std::numbers::pi * double(j) / double(n));
  const int64_t m = std::min<int64_t>(n, int64_t(in.size()));
  for (size_t k = 0; k < out.size(); ++k) {
    cdouble acc = 0;
    for (int64_t t = 0; t < m; ++t) acc += in[size_t(t)] * tw[size_t((int64_t(k) * t) % n)];
    out[k] = acc;
  }
}

// Reads an optional scalar integer input; nullopt when absent or empty.
std::optional<int64_t> scalar_input(const KernelCtx& c, size_t i) {
  if (!c.has_input(i) || c.tensor(i).numel() == 0) return std::nullopt;
  return c.tensor(i).as_int(0);
}
std::optional<int64_t> constant_scalar(const InferCtx& c, size_t i) {
  std::optional<std::vector<Dim>> d = c.input_as_dims(i);
  if (!d || d->size() != 1 || !(*d)[0].is_static()) return std::nullopt;
  return (*d)[0].value();
}

Status check_float_input(const InferCtx& c, size_t i) { return check_input_class(c, i, TypeClass::kFloat); }

// ---- DFT -------------------------------------------------------------------------------------

struct DftAttrs {
  bool inverse, onesided;
};

// Output length along the axis and complex-ness for an input of length `in` along it.
struct DftShape {
  int64_t n;         // the DFT length
  int64_t out_len;   // n, or n/2+1 for RFFT
  int64_t out_comp;  // 2 (complex) or 1 (IRFFT gives a real signal)
};
DftShape dft_shape(const DftAttrs& a, int64_t in_len, std::optional<int64_t> dft_length) {
  const bool irfft = a.inverse && a.onesided;
  DftShape s;
  s.n = dft_length ? *dft_length : irfft ? 2 * (in_len - 1) : in_len;
  s.out_len = a.onesided && !a.inverse ? s.n / 2 + 1 : s.n;
  s.out_comp = irfft ? 1 : 2;
  return s;
}

Status infer_dft(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_float_input(c, 0));
  const DftAttrs a{c.node().attr_int("inverse", 0) != 0, c.node().attr_int("onesided", 0) != 0};
  const Type& x = c.input_type(0);
  std::optional<int64_t> axis = c.has_input(2) ? constant_scalar(c, 2) : std::optional<int64_t>(-2);
  if (!x.has_rank() || !axis) {
    c.set_output_tensor(0, dt, x.has_rank() ? std::optional<Shape>(Shape(std::vector<Dim>(x.shape->rank(), Dim()))) : std::nullopt);
    return Status::ok();
  }
  const Shape& in = *x.shape;
  const int64_t r = int64_t(in.rank());
  if (r < 2 || *axis < -r || *axis > r - 2 || *axis == -1) {
    return c.error("axis {} is invalid for input {} (the last dim holds real/imaginary parts)", *axis, x.to_string());
  }
  const size_t ax = size_t(*axis < 0 ? *axis + r : *axis);
  if (in[size_t(r - 1)].is_static() && in[size_t(r - 1)].value() != 1 && in[size_t(r - 1)].value() != 2) {
    return c.error("the last dim of input {} must be 1 (real) or 2 (complex)", x.to_string());
  }
  Shape out = in;
  std::optional<int64_t> len = c.has_input(1) ? constant_scalar(c, 1) : std::nullopt;
  if (in[ax].is_static() && (len || !c.has_input(1))) {
    DftShape s = dft_shape(a, in[ax].value(), len);
    out[ax] = Dim(s.out_len);
    out[size_t(r - 1)] = Dim(s.out_comp);
  } else {
    out[ax] = Dim();
    out[size_t(r - 1)] = a.inverse && a.onesided ? Dim(1) : Dim(2);
  }
  c.set_output_tensor(0, dt, out);
  return Status::ok();
}

template <typename T>
void dft_kernel(const Tensor& x, Tensor& y, size_t axis, const DftAttrs& a, const DftShape& s) {
  const std::vector<int64_t>& xd = x.dims();
  const size_t r = xd.size();
  int64_t outer = 1, inner = 1;
  for (size_t k = 0; k < axis; ++k) outer *= xd[k];
  for (size_t k = axis + 1; k + 1 < r; ++k) inner *= xd[k];
  const int64_t in_len = xd[axis], in_comp = xd[r - 1];
  const bool irfft = a.inverse && a.onesided;
  // IRFFT reads the first n/2+1 bins and rebuilds the rest by conjugate symmetry.
  const int64_t used = std::min(in_len, irfft ? s.n / 2 + 1 : s.n);
  const T* src = x.data<T>();
  T* dst = y.data<T>();
  parallel_for(outer * inner, 16, [&](int64_t b, int64_t e) {
    std::vector<cdouble> sig(size_t(irfft ? s.n : used)), res(size_t(s.out_len));
    for (int64_t oi = b; oi < e; ++oi) {
      const int64_t o = oi / inner, i = oi % inner;
      std::fill(sig.begin(), sig.end(), cdouble(0));
      for (int64_t t = 0; t < used; ++t) {
        const T* p = src + ((o * in_len + t) * inner + i) * in_comp;
        sig[size_t(t)] = cdouble(double(compute_t<T>(p[0])), in_comp == 2 ? double(compute_t<T>(p[1])) : 0.0);
      }
      if (irfft) {
        for (int64_t k = s.n / 2 + 1; k < s.n; ++k) sig[size_t(k)] = std::conj(sig[size_t(s.n - k)]);
      }
      dft(sig, s.n, a.inverse, res);
      const double scale = a.inverse ? 1.0 / double(s.n) : 1.0;
      for (int64_t k = 0; k < s.out_len; ++k) {
        T* q = dst + ((o * s.out_len + k) * inner + i) * s.out_comp;
        q[0] = store<T>(res[size_t(k)].real() * scale);
        if (s.out_comp == 2) q[1] = store<T>(res[size_t(k)].imag() * scale);
      }
    }
  });
}

Status dft_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const DftAttrs a{c.node().attr_int("inverse", 0) != 0, c.node().attr_int("onesided", 0) != 0};
  const int64_t r = int64_t(x.rank());
  const int64_t axis = scalar_input(c, 2).value_or(-2);
  if (r < 2 || axis < -r || axis > r - 2 || axis == -1) return c.error("axis {} is invalid for input {}", axis, x.summary());
  const size_t ax = size_t(axis < 0 ? axis + r : axis);
  const int64_t comp = x.dim(size_t(r - 1));
  if (comp != 1 && comp != 2) return c.error("the last dim of input {} must be 1 or 2", x.summary());
  if (a.onesided && !a.inverse && comp != 1) return c.error("a one-sided forward DFT needs a real input, got {}", x.summary());
  std::optional<int64_t> len = scalar_input(c, 1);
  if (len && *len <= 0) return c.error("dft_length must be positive, got {}", *len);
  DftShape s = dft_shape(a, x.dim(ax), len);
  if (s.n <= 0) return c.error("the DFT length is {} for input {}", s.n, x.summary());
  std::vector<int64_t> out = x.dims();
  out[ax] = s.out_len;
  out[size_t(r - 1)] = s.out_comp;
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), out));
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_float_v<T>) {
      return c.unsupported("DFT of {}", dtype_name(x.dtype()));
    } else {
      dft_kernel<T>(x, *y, ax, a, s);
      return Status::ok();
    }
  });
}

// ---- STFT ------------------------------------------------------------------------------------

Status infer_stft(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_float_input(c, 0));
  const bool onesided = c.node().attr_int("onesided", 1) != 0;
  const Type& x = c.input_type(0);
  // [batch, length] is read as a real signal: onnxruntime accepts it and torch.onnx writes it.
  if (x.has_rank() && x.shape->rank() != 2 && x.shape->rank() != 3) {
    return c.error("signal must be [batch, length] or [batch, length, 1 or 2], got {}", x.to_string());
  }
  Dim batch = x.has_rank() ? (*x.shape)[0] : Dim();
  Dim frames, bins;
  // The frame length: the frame_length input, else the window's length, else the signal's.
  const int64_t step = constant_scalar(c, 1).value_or(-1);
  const Type& w = c.input_type(2);
  const Dim signal_len = x.has_rank() ? (*x.shape)[1] : Dim();
  Dim flen = c.has_input(3) ? Dim(constant_scalar(c, 3).value_or(-1))
             : c.has_input(2) ? (w.has_rank() && w.shape->rank() == 1 ? (*w.shape)[0] : Dim())
                              : signal_len;
  if (flen.is_static() && flen.value() > 0) {
    bins = Dim(onesided ? flen.value() / 2 + 1 : flen.value());
    if (step > 0 && signal_len.is_static()) frames = Dim((signal_len.value() - flen.value()) / step + 1);
  }
  c.set_output_tensor(0, dt, Shape({batch, frames, bins, Dim(2)}));
  return Status::ok();
}

template <typename T>
void stft_kernel(const Tensor& x, const Tensor* window, Tensor& y, int64_t step, int64_t flen, int64_t bins) {
  const int64_t B = x.dim(0), L = x.dim(1), comp = x.rank() == 3 ? x.dim(2) : 1, frames = y.dim(1);
  const T* src = x.data<T>();
  T* dst = y.data<T>();
  parallel_for(B * frames, 4, [&](int64_t b, int64_t e) {
    std::vector<cdouble> sig(static_cast<size_t>(flen)), res(static_cast<size_t>(bins));
    for (int64_t bf = b; bf < e; ++bf) {
      const int64_t n = bf / frames, f = bf % frames;
      for (int64_t t = 0; t < flen; ++t) {
        const int64_t pos = f * step + t;
        const T* p = src + (n * L + pos) * comp;
        const double w = window ? double(compute_t<T>(window->data<T>()[t])) : 1.0;
        sig[size_t(t)] = pos < L ? w * cdouble(double(compute_t<T>(p[0])), comp == 2 ? double(compute_t<T>(p[1])) : 0.0) : 0.0;
      }
      dft(sig, flen, false, res);
      for (int64_t k = 0; k < bins; ++k) {
        T* q = dst + ((n * frames + f) * bins + k) * 2;
        q[0] = store<T>(res[size_t(k)].real());
        q[1] = store<T>(res[size_t(k)].imag());
      }
    }
  });
}

Status stft_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (!(x.rank() == 2 || (x.rank() == 3 && (x.dim(2) == 1 || x.dim(2) == 2)))) {
    return c.error("signal must be [batch, length] or [batch, length, 1 or 2], got {}", x.summary());
  }
  const bool complex_signal = x.rank() == 3 && x.dim(2) == 2;
  const bool onesided = c.node().attr_int("onesided", 1) != 0;
  const int64_t step = scalar_input(c, 1).value_or(0);
  if (step <= 0) return c.error("frame_step must be positive, got {}", step);
  const Tensor* window = c.has_input(2) && c.tensor(2).numel() > 0 ? &c.tensor(2) : nullptr;
  std::optional<int64_t> flen = scalar_input(c, 3);
  if (!flen) flen = window ? window->numel() : x.dim(1);
  if (*flen <= 0 || *flen > x.dim(1)) return c.error("frame_length {} must be in [1, {}]", *flen, x.dim(1));
  if (window && (window->rank() != 1 || window->numel() != *flen || window->dtype() != x.dtype())) {
    return c.error("window {} must be a 1-D {} of frame_length {}", window->summary(), dtype_name(x.dtype()), *flen);
  }
  if (onesided && complex_signal) return c.error("a one-sided STFT needs a real signal, got {}", x.summary());
  const int64_t frames = (x.dim(1) - *flen) / step + 1;
  const int64_t bins = onesided ? *flen / 2 + 1 : *flen;
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), {x.dim(0), frames, bins, 2}));
  return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
    if constexpr (!is_float_v<T>) {
      return c.unsupported("STFT of {}", dtype_name(x.dtype()));
    } else {
      stft_kernel<T>(x, window, *y, step, *flen, bins);
      return Status::ok();
    }
  });
}

// ---- windows and MelWeightMatrix --------------------------------------------------------------

Expected<DType> output_datatype(const InferCtx& c) {
  const int64_t code = c.node().attr_int("output_datatype", 1);
  std::optional<DType> dt = dtype_from_onnx(int32_t(code));
  if (!dt || !dtype_in_class(TypeClass::kNumeric, *dt)) return c.error("output_datatype {} is not a numeric type", code);
  return *dt;
}

Status infer_window(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, output_datatype(c));
  KILN_RETURN_IF_ERROR(check_input_class(c, 0, TypeClass::kInt));
  std::optional<int64_t> size = constant_scalar(c, 0);
  c.set_output_tensor(0, dt, Shape({size ? Dim(*size) : Dim()}));
  return Status::ok();
}

// The three cosine-sum windows; x = 2 pi n / N.
double hann(double x) { return 0.5 - 0.5 * std::cos(x); }
double hamming(double x) { return 25.0 / 46.0 - 21.0 / 46.0 * std::cos(x); }
double blackman(double x) { return 0.42 - 0.5 * std::cos(x) + 0.08 * std::cos(2 * x); }

// Fills output 0 of the given dtype with f(i) for i in [0, n).
template <typename F>
Status fill_output(KernelCtx& c, std::vector<int64_t> dims, const F& f) {
  std::optional<DType> dt = dtype_from_onnx(int32_t(c.node().attr_int("output_datatype", 1)));
  if (!dt) return c.error("bad output_datatype");
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, *dt, std::move(dims)));
  return visit_dtype(*dt, [&]<typename T>() -> Status {
    if constexpr (!is_numeric_v<T>) {
      return c.unsupported("output_datatype {}", dtype_name(*dt));
    } else {
      for (int64_t i = 0; i < y->numel(); ++i) y->data<T>()[i] = store<T>(f(i));
      return Status::ok();
    }
  });
}

template <double (*kWindow)(double)>
Status window_cpu(KernelCtx& c) {
  const int64_t size = c.tensor(0).as_int(0);
  if (size < 0) return c.error("size must not be negative, got {}", size);
  // A periodic window is the symmetric window of size+1 without its last point.
  const double N = c.node().attr_int("periodic", 1) != 0 ? double(size) : double(size - 1);
  return fill_output(c, {size}, [&](int64_t i) { return N == 0 ? 1.0 : kWindow(2 * std::numbers::pi * double(i) / N); });
}

Status infer_mel(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, output_datatype(c));
  std::optional<int64_t> bins = constant_scalar(c, 0), len = constant_scalar(c, 1);
  c.set_output_tensor(0, dt, Shape({len ? Dim(*len / 2 + 1) : Dim(), bins ? Dim(*bins) : Dim()}));
  return Status::ok();
}

// Triangular filters evenly spaced on the mel scale (HTK formula), as in the ONNX reference:
// band edges are snapped to spectrogram bins first, then each band ramps up and down linearly.
Status mel_cpu(KernelCtx& c) {
  const int64_t mels = c.tensor(0).as_int(0), len = c.tensor(1).as_int(0), rate = c.tensor(2).as_int(0);
  const double lo = c.tensor(3).as_double(0), hi = c.tensor(4).as_double(0);
  if (mels <= 0 || len <= 0 || rate <= 0) {
    return c.error("num_mel_bins ({}), dft_length ({}) and sample_rate ({}) must be positive", mels, len, rate);
  }
  const int64_t spec_bins = len / 2 + 1;
  auto to_mel = [](double hz) { return 2595.0 * std::log10(1 + hz / 700.0); };
  const double lo_mel = to_mel(lo), step = (to_mel(hi) - lo_mel) / double(mels + 2);
  std::vector<int64_t> edge(size_t(mels + 2));
  for (int64_t i = 0; i < mels + 2; ++i) {
    const double hz = 700.0 * (std::pow(10.0, (double(i) * step + lo_mel) / 2595.0) - 1);
    edge[size_t(i)] = int64_t(std::floor(double(len + 1) * hz / double(rate)));
    if (edge[size_t(i)] < 0 || edge[size_t(i)] >= spec_bins) {
      return c.error("mel band edge {} Hz falls outside the {} spectrogram bins", hz, spec_bins);
    }
  }
  std::vector<double> w(size_t(spec_bins * mels), 0.0);
  for (int64_t m = 0; m < mels; ++m) {
    const int64_t l = edge[size_t(m)], ctr = edge[size_t(m + 1)], h = edge[size_t(m + 2)];
    if (ctr == l) w[size_t(ctr * mels + m)] = 1;
    for (int64_t j = l; ctr > l && j <= ctr; ++j) w[size_t(j * mels + m)] = double(j - l) / double(ctr - l);
    for (int64_t j = ctr; j < h; ++j) w[size_t(j * mels + m)] = double(h - j) / double(h - ctr);
  }
  return fill_output(c, {spec_bins, mels}, [&](int64_t i) { return w[size_t(i)]; });
}

}  // namespace

void register_signal_ops(OpRegistry& r) {
  using K = Attribute::Kind;
  r.def(OpKind::kDFT, {.inputs = {1, 3},
                       .attrs = {{"inverse", K::kInt}, {"onesided", K::kInt}},
                       .infer = infer_dft,
                       .cpu = dft_cpu});
  r.def(OpKind::kSTFT, {.inputs = {2, 4}, .attrs = {{"onesided", K::kInt}}, .infer = infer_stft, .cpu = stft_cpu});
  const std::vector<AttrSpec> window_attrs = {{"output_datatype", K::kInt}, {"periodic", K::kInt}};
  r.def(OpKind::kHannWindow, {.inputs = {1, 1}, .attrs = window_attrs, .infer = infer_window, .cpu = window_cpu<hann>});
  r.def(OpKind::kHammingWindow, {.inputs = {1, 1}, .attrs = window_attrs, .infer = infer_window, .cpu = window_cpu<hamming>});
  r.def(OpKind::kBlackmanWindow, {.inputs = {1, 1}, .attrs = window_attrs, .infer = infer_window, .cpu = window_cpu<blackman>});
  r.def(OpKind::kMelWeightMatrix, {.inputs = {5, 5},
                                   .attrs = {{"output_datatype", K::kInt}},
                                   .infer = infer_mel,
                                   .cpu = mel_cpu});
}

}  // namespace kiln
