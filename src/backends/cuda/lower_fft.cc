// DFT and STFT through cuFFT: the signal is packed into a complex buffer [rows, n] (k::fft_pack:
// the DFT's axis gathered, dft_length's zero padding or truncation, an IRFFT's mirrored bins, or
// the STFT's windowed frames), cuFFT transforms every row (C2C in f32, Z2Z for f64 signals), and
// k::fft_unpack writes the bins ONNX asks for (one-sided, real parts of an IRFFT, 1/n for the
// inverse). cuFFT is opened with dlopen when first needed, as NVRTC is, so kiln starts without it
// and such nodes then run on the CPU, with the reason in the build report. A plan is shared by the
// engine's sessions: its stream and work area (each session's own, in its arena) are set and the
// transform enqueued under one lock.
#include <cufft.h>
#include <dlfcn.h>

#include <mutex>

#include "backends/cuda/kernels/fft.h"
#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

struct Cufft {
  void* lib = nullptr;
  std::string why;  // why lib is null
  decltype(&::cufftCreate) create = nullptr;
  decltype(&::cufftDestroy) destroy = nullptr;
  decltype(&::cufftSetAutoAllocation) set_auto_allocation = nullptr;
  decltype(&::cufftMakePlanMany64) make_plan_many = nullptr;
  decltype(&::cufftSetStream) set_stream = nullptr;
  decltype(&::cufftSetWorkArea) set_work_area = nullptr;
  decltype(&::cufftExecC2C) exec_c2c = nullptr;
  decltype(&::cufftExecZ2Z) exec_z2z = nullptr;
};

template <typename F>
bool resolve(Cufft& c, F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(c.lib, name));
  if (!f) c.why = fmt::format("libcufft has no {}", name);
  return f != nullptr;
}

const Cufft& cufft() {
  static Cufft c;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libcufft.so.12", "libcufft.so"}) {
      c.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (c.lib) break;
    }
    if (!c.lib) {
      c.why = "cannot open libcufft.so.12 (the CUDA toolkit's FFT library; is it on the library path?)";
      return;
    }
    const bool ok = resolve(c, c.create, "cufftCreate") && resolve(c, c.destroy, "cufftDestroy") &&
                    resolve(c, c.set_auto_allocation, "cufftSetAutoAllocation") &&
                    resolve(c, c.make_plan_many, "cufftMakePlanMany64") && resolve(c, c.set_stream, "cufftSetStream") &&
                    resolve(c, c.set_work_area, "cufftSetWorkArea") && resolve(c, c.exec_c2c, "cufftExecC2C") &&
                    resolve(c, c.exec_z2z, "cufftExecZ2Z");
    if (!ok) {
      dlclose(c.lib);
      c.lib = nullptr;
    }
  });
  return c;
}

Status cufft_status(cufftResult r, const char* what) {
  if (r == CUFFT_SUCCESS) return Status::ok();
  return KILN_ERROR(kInternal, "{} failed (cuFFT error {})", what, int(r));
}

// A plan of `rows` transforms of length n (rows contiguous), its work area left to the caller;
// *work is its size.
Expected<cufftHandle> make_plan(int64_t n, int64_t rows, bool f64, size_t* work) {
  const Cufft& f = cufft();
  cufftHandle h = 0;
  KILN_RETURN_IF_ERROR(cufft_status(f.create(&h), "cufftCreate"));
  long long len = n;
  Status st = cufft_status(f.set_auto_allocation(h, 0), "cufftSetAutoAllocation");
  if (st) {
    st = cufft_status(f.make_plan_many(h, 1, &len, nullptr, 1, len, nullptr, 1, len, f64 ? CUFFT_Z2Z : CUFFT_C2C, rows, work),
                      "cufftMakePlanMany64");
  }
  if (!st) {
    f.destroy(h);
    return st;
  }
  return h;
}

struct FftStep {
  k::FftPack pack;
  k::FftUnpack unpack;
  bool inverse = false;
};

void put_fft(ByteWriter& w, const FftStep& s) {
  const k::FftPack& p = s.pack;
  w.put(int32_t(p.dt));
  w.u8(p.f64);
  for (int64_t v : {p.n, p.outer, p.in_len, p.inner, p.in_comp, p.used, p.frames, p.step}) w.i64(v);
  w.u8(p.irfft);
  const k::FftUnpack& u = s.unpack;
  for (int64_t v : {u.outer, u.out_len, u.inner, u.out_comp}) w.i64(v);
  w.put(u.scale);
  w.u8(s.inverse);
}

// The transform's rows, packed and unpacked.
int64_t fft_rows(const k::FftPack& p) { return p.frames > 0 ? p.outer * p.frames : p.outer * p.inner; }

Status emit_fft(Lowering& L, const Node& n, FftStep s, const DevValue* x, const DevValue* window, const DevValue& y) {
  if (!cufft().lib) KILN_UNSUPPORTED("{}", cufft().why);
  s.pack.dt = x->dt;
  s.pack.f64 = x->dt == k::DT::kF64;
  s.unpack.dt = y.dt;
  s.unpack.f64 = s.pack.f64;
  s.unpack.n = s.pack.n;
  const int64_t rows = fft_rows(s.pack);
  if (rows < 1 || s.pack.n < 1) KILN_UNSUPPORTED("{} of an empty signal", op_name(n.op));
  size_t work = 0;
  Expected<cufftHandle> h = make_plan(s.pack.n, rows, s.pack.f64, &work);
  if (!h) KILN_UNSUPPORTED("cuFFT cannot plan it: {}", h.status().message());
  cufft().destroy(*h);  // planned here for its work size; the binder makes the engine's own
  const size_t zbytes = size_t(rows * s.pack.n) * (s.pack.f64 ? 16 : 8);
  const int z = L.scratch(zbytes), wk = L.scratch(std::max<size_t>(work, 256));
  ByteWriter w;
  put_fft(w, s);
  w.u64(work);
  put(w, x->ref);
  put(w, window ? window->ref : Ref{});
  put(w, Ref{false, z});
  put(w, Ref{false, wk});
  put(w, y.ref);
  L.emit(&n, fmt::format("cufft {} n={} x {} rows", s.pack.f64 ? "Z2Z" : "C2C", s.pack.n, rows),
         {read_id(x), read_id(window)}, {y.ref.id, z, wk}, StepOp::kCufft, std::move(w));
  return Status::ok();
}

// A constant integer scalar input, if given and constant.
Expected<std::optional<int64_t>> scalar_const(Lowering& L, const Node& n, size_t i) {
  if (i >= n.inputs.size() || !n.inputs[i]) return std::optional<int64_t>();
  const Tensor* t = L.constant(n.inputs[i]);
  if (!t || t->numel() != 1) KILN_UNSUPPORTED("{} input {} computed at run time", op_name(n.op), i);
  return std::optional<int64_t>(int64_t(t->as_double(0)));
}

Status lower_dft(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> xd, exact_dims(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> len, scalar_const(L, n, 1));
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> axis_in, scalar_const(L, n, 2));
  const int64_t r = int64_t(xd.size()), axis = axis_in.value_or(-2);
  if (r < 2 || axis < -r || axis > r - 2 || axis == -1 || yd.size() != xd.size()) KILN_UNSUPPORTED("DFT axis {} of {}", axis, dims_to_string(xd));
  const size_t ax = size_t(axis < 0 ? axis + r : axis);
  const bool inverse = n.attr_int("inverse", 0) != 0, onesided = n.attr_int("onesided", 0) != 0;
  const bool irfft = inverse && onesided;
  const int64_t in_len = xd[ax], comp = xd.back();
  FftStep s;
  s.inverse = inverse;
  k::FftPack& p = s.pack;
  p.n = len ? *len : irfft ? 2 * (in_len - 1) : in_len;
  p.outer = prod_of(xd, 0, ax);
  p.in_len = in_len;
  p.inner = prod_of(xd, ax + 1, xd.size() - 1);
  p.in_comp = comp;
  p.used = std::min(in_len, irfft ? p.n / 2 + 1 : p.n);
  p.irfft = irfft;
  k::FftUnpack& u = s.unpack;
  u.outer = p.outer;
  u.inner = p.inner;
  u.out_len = onesided && !inverse ? p.n / 2 + 1 : p.n;
  u.out_comp = irfft ? 1 : 2;
  u.scale = inverse ? 1.0 / double(p.n) : 1.0;
  if (p.n < 1 || (comp != 1 && comp != 2) || (onesided && !inverse && comp != 1) || yd[ax] != u.out_len ||
      yd.back() != u.out_comp) {
    KILN_UNSUPPORTED("DFT of {} to {}", dims_to_string(xd), dims_to_string(yd));
  }
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  const DevValue& y = L.define(n.outputs[0]);
  return emit_fft(L, n, s, x, nullptr, y);
}

Status lower_stft(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> xd, exact_dims(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> step, scalar_const(L, n, 1));
  KILN_ASSIGN_OR_RETURN(std::optional<int64_t> flen, scalar_const(L, n, 3));
  const bool onesided = n.attr_int("onesided", 1) != 0;
  if (xd.size() == 2) xd.push_back(1);  // [batch, length]: a real signal, as on the CPU
  if (xd.size() != 3 || (xd[2] != 1 && xd[2] != 2) || (onesided && xd[2] != 1) || !step || *step < 1) {
    KILN_UNSUPPORTED("STFT of {}", dims_to_string(xd));
  }
  const DevValue* window = nullptr;
  if (n.inputs.size() > 2 && n.inputs[2]) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> wd, exact_dims(n.inputs[2]));
    if (prod_of(wd, 0, wd.size()) > 0) {
      if (wd.size() != 1) KILN_UNSUPPORTED("an STFT window of shape {}", dims_to_string(wd));
      KILN_ASSIGN_OR_RETURN(window, L.rowmajor(n.inputs[2]));
      if (!flen) flen = window->numel();
    }
  }
  if (!flen) flen = xd[1];
  const int64_t bins = onesided ? *flen / 2 + 1 : *flen, frames = *flen >= 1 && *flen <= xd[1] ? (xd[1] - *flen) / *step + 1 : 0;
  if (frames < 1 || (window && window->numel() != *flen) || yd != std::vector<int64_t>{xd[0], frames, bins, 2}) {
    KILN_UNSUPPORTED("STFT of {} to {}", dims_to_string(xd), dims_to_string(yd));
  }
  FftStep s;
  k::FftPack& p = s.pack;
  p.n = *flen;
  p.outer = xd[0];
  p.in_len = xd[1];
  p.in_comp = xd[2];
  p.frames = frames;
  p.step = *step;
  k::FftUnpack& u = s.unpack;
  u.outer = xd[0] * frames;
  u.out_len = bins;
  u.out_comp = 2;
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (window && window->dt != x->dt) KILN_UNSUPPORTED("an STFT window of another type than the signal");
  const DevValue& y = L.define(n.outputs[0]);
  return emit_fft(L, n, s, x, window, y);
}

struct Plan {
  cufftHandle h = 0;
  std::mutex mu;  // the plan's stream and work area are set per call
  ~Plan() {
    if (h) cufft().destroy(h);
  }
};

Expected<StepFn> bind_cufft(Params& in, BindCtx& bc) {
  FftStep s;
  k::FftPack& p = s.pack;
  p.dt = in.dt();
  p.f64 = in.flag();
  for (int64_t* v : {&p.n, &p.outer, &p.in_len, &p.inner, &p.in_comp, &p.used, &p.frames, &p.step}) *v = in.i64();
  p.irfft = in.flag();
  k::FftUnpack& u = s.unpack;
  for (int64_t* v : {&u.outer, &u.out_len, &u.inner, &u.out_comp}) *v = in.i64();
  u.scale = in.f64();
  s.inverse = in.flag();
  const uint64_t work_recorded = uint64_t(in.i64());
  const Ref xr = in.ref(), wr = in.opt_ref(), zr = in.ref(), kr = in.ref(), yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  u.dt = p.dt;
  u.f64 = p.f64;
  u.n = p.n;
  const int64_t rows = fft_rows(p);
  if (p.n < 1 || rows < 1 || p.outer < 1 || p.inner < 1 || p.in_len < 1 || (p.in_comp != 1 && p.in_comp != 2) ||
      p.frames < 0 || (p.frames > 0 && p.step < 1) || p.used < 0 || u.out_len < 1 || u.out_len > p.n ||
      u.outer * u.inner != rows || p.used > p.n || zr.weight || kr.weight || yr.weight ||
      bc.plan.buffer_bytes[size_t(zr.id)] < uint64_t(rows * p.n) * (p.f64 ? 16 : 8) ||
      bc.plan.buffer_bytes[size_t(kr.id)] < work_recorded) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed cuFFT parameters", in.step().label);
  }
  if (!cufft().lib) return KILN_ERROR(kUnsupported, "step '{}': {}", in.step().label, cufft().why);
  auto plan = std::make_shared<Plan>();
  size_t work = 0;
  KILN_ASSIGN_OR_RETURN(plan->h, make_plan(p.n, rows, p.f64, &work));
  bc.keep_alive.push_back(plan);
  if (work > work_recorded) {  // another cuFFT than the build's wants more room than the arena holds
    return KILN_ERROR(kInvalidModel, "step '{}': this cuFFT needs {} bytes of work area, the engine has {}", in.step().label,
                      work, work_recorded);
  }
  return StepFn([=](const RunCtx& c) -> Status {
    KILN_RETURN_IF_ERROR(cuda_status(k::fft_pack(p, c.ptr(xr), wr.id >= 0 ? c.ptr(wr) : nullptr, c.ptr(zr), c.stream), "fft_pack"));
    {
      std::lock_guard<std::mutex> lock(plan->mu);
      const Cufft& f = cufft();
      KILN_RETURN_IF_ERROR(cufft_status(f.set_stream(plan->h, c.stream), "cufftSetStream"));
      KILN_RETURN_IF_ERROR(cufft_status(f.set_work_area(plan->h, c.ptr(kr)), "cufftSetWorkArea"));
      const int dir = s.inverse ? CUFFT_INVERSE : CUFFT_FORWARD;
      void* z = c.ptr(zr);
      KILN_RETURN_IF_ERROR(p.f64 ? cufft_status(f.exec_z2z(plan->h, static_cast<cufftDoubleComplex*>(z), static_cast<cufftDoubleComplex*>(z), dir), "cufftExecZ2Z")
                                 : cufft_status(f.exec_c2c(plan->h, static_cast<cufftComplex*>(z), static_cast<cufftComplex*>(z), dir), "cufftExecC2C"));
    }
    return cuda_status(k::fft_unpack(u, c.ptr(zr), c.ptr(yr), c.stream), "fft_unpack");
  });
}

}  // namespace

void register_fft_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kDFT] = lower_dft;
  t[OpKind::kSTFT] = lower_stft;
}

void register_fft_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kCufft] = bind_cufft; }

}  // namespace kiln::cuda
