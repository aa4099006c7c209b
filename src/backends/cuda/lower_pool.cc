// MaxPool and AveragePool over 1 or 2 spatial dims (1-D as 2-D over a height of 1): cuDNN's
// pooling, or kiln's NHWC max-pooling kernel in half builds. cuDNN pads symmetrically and floors
// the output size; other geometry goes through an explicit padded copy of the input:
//   - asymmetric pads (TensorFlow's SAME, auto_pad SAME_UPPER/SAME_LOWER) and ceil_mode's extra
//     windows: the copy is filled with -inf (max) or 0 (average) around x, then pooled unpadded;
//   - average pooling that excludes the padding then divides by the window size (cuDNN's
//     count-including mode over the copy) and multiplies by a constant map of window / valid
//     elements per output position, so every output is the mean of the elements it covers.
// What cuDNN's pooling cannot say (dilation, 3 or more spatial dims, MaxPool's Indices, integer
// and f64 inputs, LpPool, AveragePool counting the pads with ceil_mode) goes to k::pool_table,
// which reads the CPU reference's own window table (ops/nn_util.h), uploaded once.
#include <cmath>

#include "backends/cuda/kernels/window.h"
#include "backends/cuda/lower.h"
#include "ops/nn_util.h"

namespace kiln::cuda {

namespace {

Status destroy_pool(cudnnPoolingDescriptor_t d) { return cuda_status(cudnnDestroyPoolingDescriptor(d), "destroy"); }

// One spatial dim's geometry: input, kernel, stride, leading and trailing padding, output.
struct Axis {
  int64_t in, k, s, pb, pe, out;
};

// Pads from auto_pad (SAME_UPPER puts the odd one at the end) or the pads attribute.
Status axis_pads(const Node& n, std::vector<Axis>& ax) {
  const std::string ap = n.attr_string("auto_pad", "NOTSET");
  const size_t sp = ax.size();
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    for (Axis& a : ax) {
      const int64_t total = std::max<int64_t>(0, (a.out - 1) * a.s + a.k - a.in);
      a.pb = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      a.pe = total - a.pb;
    }
    return Status::ok();
  }
  if (ap != "NOTSET" && ap != "VALID") KILN_UNSUPPORTED("{} with auto_pad {}", op_name(n.op), ap);
  const std::vector<int64_t> p = ap == "VALID" ? std::vector<int64_t>(2 * sp, 0) : n.attr_ints("pads", std::vector<int64_t>(2 * sp, 0));
  if (p.size() != 2 * sp) KILN_UNSUPPORTED("{} pads {}", op_name(n.op), dims_to_string(p));
  for (size_t i = 0; i < sp; ++i) {
    ax[i].pb = p[i];
    ax[i].pe = p[i + sp];
  }
  return Status::ok();
}

void emit_cudnn_pool(Lowering& L, const Node& n, k::DT dt, Layout lay, const std::vector<int64_t>& xd,
                     const std::vector<int64_t>& yd, cudnnPoolingMode_t mode, const std::array<int64_t, 6>& geom, Ref x,
                     Ref y, int read) {
  ByteWriter w;
  w.put(int32_t(dt));
  w.u8(lay == Layout::kNHWC);
  put(w, xd);
  put(w, yd);
  w.put(int32_t(mode));
  for (int64_t v : geom) w.put(int32_t(v));  // kh, kw, pad h, pad w, stride h, stride w
  put(w, x);
  put(w, y);
  L.emit(&n, fmt::format("cudnn pooling {}", lay == Layout::kNHWC ? "NHWC" : "NCHW"), {read}, {y.id}, StepOp::kCudnnPool,
         std::move(w));
}

// A pooling attribute list of sp values, `dflt` each when absent.
std::vector<int64_t> pool_attr(const Node& n, const char* name, size_t sp, int64_t dflt) {
  std::vector<int64_t> v = n.attr_ints(name, std::vector<int64_t>(sp, dflt));
  return v.empty() ? std::vector<int64_t>(sp, dflt) : v;
}

// k::pool_table over the CPU's window table for this node's geometry (the output dims, ceil_mode's
// included, are the IR's; SAME pads are resolved as the CPU resolves them).
Status lower_pool_table(Lowering& L, const Node& n) {
  const Value* xv = n.inputs[0];
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> xd, exact_dims(xv));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  if (xd.size() < 3 || yd.size() != xd.size() || xd.size() - 2 > size_t(k::kMaxRank)) {
    KILN_UNSUPPORTED("{} of rank {}", op_name(n.op), xd.size());
  }
  const size_t sp = xd.size() - 2;
  const bool is_max = n.op == OpKind::kMaxPool;
  auto dt = L.device_dt(xv->type.dtype);
  const bool float_dt = dt && (*dt == k::DT::kF32 || *dt == k::DT::kF16 || *dt == k::DT::kBF16 || *dt == k::DT::kF64);
  if (!dt || !(float_dt || (is_max && (*dt == k::DT::kI8 || *dt == k::DT::kU8)))) {
    KILN_UNSUPPORTED("{} on {}", op_name(n.op), xv->type.to_string());
  }
  Window w;
  w.kernel = n.attr_ints("kernel_shape");
  w.strides = pool_attr(n, "strides", sp, 1);
  w.dilations = pool_attr(n, "dilations", sp, 1);
  if (w.kernel.size() != sp || w.strides.size() != sp || w.dilations.size() != sp) {
    KILN_UNSUPPORTED("{} attributes for {} spatial dims", op_name(n.op), sp);
  }
  const std::vector<int64_t> in(xd.begin() + 2, xd.end()), out(yd.begin() + 2, yd.end());
  const std::string ap = n.attr_string("auto_pad", "NOTSET");
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    w.pads.assign(2 * sp, 0);
    for (size_t i = 0; i < sp; ++i) {
      const int64_t total = std::max<int64_t>(0, (out[i] - 1) * w.strides[i] + w.extent(i) - in[i]);
      w.pads[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.pads[i + sp] = total - w.pads[i];
    }
  } else if (ap == "VALID") {
    w.pads.assign(2 * sp, 0);
  } else if (ap == "NOTSET" || ap.empty()) {
    w.pads = pool_attr(n, "pads", 2 * sp, 0);
  } else {
    KILN_UNSUPPORTED("{} with auto_pad {}", op_name(n.op), ap);
  }
  if (w.pads.size() != 2 * sp) KILN_UNSUPPORTED("{} pads {}", op_name(n.op), dims_to_string(w.pads));
  const int64_t in_size = prod_of(in, 0, sp), planes = xd[0] * xd[1];
  const int64_t positions = prod_of(out, 0, sp), taps_per = prod_of(w.kernel, 0, sp);
  if (positions < 1 || planes < 1 || in_size < 1) KILN_UNSUPPORTED("{} with an empty input or output", op_name(n.op));
  if (in_size > INT32_MAX || taps_per > INT32_MAX || double(positions) * double(taps_per) > double(int64_t(1) << 26)) {
    KILN_UNSUPPORTED("{} window table of {} x {} taps", op_name(n.op), positions, taps_per);
  }
  const int mode = is_max ? 0 : n.op == OpKind::kAveragePool ? 1 : 2;
  const int64_t p = n.attr_int("p", 2);
  if (mode == 2 && (p < 1 || p > 64)) KILN_UNSUPPORTED("LpPool with p = {}", p);
  const WindowTable t = make_window_table(w, in, out);
  const std::vector<int32_t> taps(t.offsets.begin(), t.offsets.end());  // offsets < in_size, or -1 / -2
  KILN_ASSIGN_OR_RETURN(Ref table, L.upload_raw(taps.data(), taps.size() * sizeof(int32_t)));
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(xv));
  const DevValue& y = L.define(n.outputs[0]);
  const DevValue* idx = n.outputs.size() > 1 && n.has_output(1) ? &L.define(n.outputs[1]) : nullptr;
  ByteWriter wr;
  wr.put(int32_t(*dt));
  for (int64_t v : {planes, t.positions, in_size, t.kernel_size, int64_t(mode), p}) wr.i64(v);
  wr.u8(n.attr_int("count_include_pad", 0) != 0);
  wr.u8(n.attr_int("storage_order", 0) != 0);
  put(wr, in);
  put(wr, x->ref);
  put(wr, table);
  put(wr, y.ref);
  put(wr, idx ? idx->ref : Ref{});
  std::vector<int> writes{y.ref.id};
  if (idx) writes.push_back(idx->ref.id);
  L.emit(&n, fmt::format("kernel pool_table ({} spatial dims, {} taps{})", sp, t.kernel_size, idx ? ", indices" : ""),
         {read_id(x)}, writes, StepOp::kPoolTable, std::move(wr));
  return Status::ok();
}

Expected<StepFn> bind_pool_table(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  k::PoolTableShape s;
  s.planes = in.i64();
  s.positions = in.i64();
  s.in_size = in.i64();
  const int64_t ks = in.i64(), mode = in.i64(), p = in.i64();
  s.count_pad = in.flag();
  s.column_major = in.flag();
  const std::vector<int64_t> dims = in.dims();
  const Ref xr = in.ref(), tr = in.ref(), yr = in.ref(), ir = in.opt_ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (s.planes < 1 || s.positions < 1 || s.in_size < 1 || s.in_size > INT32_MAX || ks < 1 || ks > INT32_MAX ||
      mode < 0 || mode > 2 || p < 1 || p > 64 || dims.empty() || dims.size() > size_t(k::kMaxRank) ||
      prod_of(dims, 0, dims.size()) != s.in_size) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed pooling parameters", in.step().label);
  }
  s.kernel_size = int(ks);
  s.mode = int(mode);
  s.p = int(p);
  s.rank = int(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) s.in_dims[i] = dims[i];
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::pool_table(dt, c.ptr(xr), static_cast<const int32_t*>(c.ptr(tr)), s, c.ptr(yr),
                                     ir.id >= 0 ? static_cast<int64_t*>(c.ptr(ir)) : nullptr, c.stream),
                       "pool_table");
  });
}

Status lower_pool(Lowering& L, const Node& n) {
  const std::vector<int64_t> ks = n.attr_ints("kernel_shape");
  const size_t sp = ks.size();
  const std::vector<int64_t> st = pool_attr(n, "strides", sp, 1), dil = pool_attr(n, "dilations", sp, 1);
  const Value* xv = n.inputs[0];
  auto dt = L.device_dt(xv->type.dtype);
  // What cuDNN's path below cannot say goes to the window table.
  const bool table = n.op == OpKind::kLpPool || (n.outputs.size() > 1 && n.has_output(1)) || (sp != 1 && sp != 2) ||
                     std::any_of(dil.begin(), dil.end(), [](int64_t d) { return d != 1; }) ||
                     !dt || (*dt != k::DT::kF32 && *dt != k::DT::kF16 && *dt != k::DT::kBF16) ||
                     (n.op == OpKind::kAveragePool && n.attr_int("count_include_pad", 0) != 0 && n.attr_int("ceil_mode", 0) != 0);
  if (table) return lower_pool_table(L, n);
  if (st.size() != sp) KILN_UNSUPPORTED("{} attributes", op_name(n.op));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yd, exact_dims(n.outputs[0]));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> xd0, exact_dims(xv));
  if (xd0.size() != sp + 2 || yd.size() != sp + 2) KILN_UNSUPPORTED("{} of rank {}", op_name(n.op), xd0.size());
  std::vector<Axis> ax(sp);
  for (size_t i = 0; i < sp; ++i) ax[i] = Axis{xd0[2 + i], ks[i], st[i], 0, 0, yd[2 + i]};
  KILN_RETURN_IF_ERROR(axis_pads(n, ax));
  // 1-D as 2-D over a height of 1 (same memory, row-major).
  if (sp == 1) {
    ax.insert(ax.begin(), Axis{1, 1, 1, 0, 0, 1});
    xd0.insert(xd0.begin() + 2, 1);
    yd.insert(yd.begin() + 2, 1);
  }
  // Windows past the padded input (ceil_mode) extend the trailing padding.
  bool plain = true;
  for (Axis& a : ax) {
    const int64_t need = (a.out - 1) * a.s + a.k - (a.in + a.pb + a.pe);
    if (need > 0) a.pe += need;
    plain = plain && a.pb == a.pe && need <= 0;
  }
  const bool is_max = n.op == OpKind::kMaxPool, include_pad = n.attr_int("count_include_pad", 0) != 0;
  const Layout lay = L.half() && sp == 2 && plain ? Layout::kNHWC : Layout::kRowMajor;
  KILN_ASSIGN_OR_RETURN(const DevValue* x, lay == Layout::kNHWC ? L.nhwc(xv) : L.rowmajor(xv));
  const std::array<int64_t, 6> geom{ax[0].k, ax[1].k, ax[0].pb, ax[1].pb, ax[0].s, ax[1].s};
  if (plain) {
    if (is_max && lay == Layout::kNHWC && x->dims[1] % 8 == 0 && k::dt_size(x->dt) == 2) {
      // kiln's kernel: cuDNN's NHWC max pooling ran well over its memory time on ResNet-50's at batch
      // 256 (bench/RESULTS.md, "ResNet-50: input image read by space-to-depth, kiln's max pooling,
      // conv algorithms re-timed (c955006, 9be7bf1, 285d861)").
      k::PoolShape ps{int(x->dims[0]), int(xd0[2]), int(xd0[3]), int(x->dims[1]), int(yd[2]), int(yd[3]),
                      int(ax[0].k), int(ax[1].k), int(ax[0].s), int(ax[1].s), int(ax[0].pb), int(ax[1].pb)};
      const DevValue& y = L.define(n.outputs[0], lay);
      ByteWriter w;
      w.put(int32_t(x->dt));
      put(w, x->ref);
      put(w, y.ref);
      for (int v : {ps.n, ps.h, ps.w, ps.c, ps.p, ps.q, ps.kh, ps.kw, ps.sh, ps.sw, ps.ph, ps.pw}) w.put(int32_t(v));
      L.emit(&n, "kernel max_pool_nhwc", {read_id(x)}, {y.ref.id}, StepOp::kMaxPoolNhwc, std::move(w));
      return Status::ok();
    }
    const cudnnPoolingMode_t mode = is_max        ? CUDNN_POOLING_MAX
                                    : include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                  : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    const DevValue& y = L.define(n.outputs[0], lay);
    emit_cudnn_pool(L, n, *dt, lay, xd0, yd, mode, geom, x->ref, y.ref, read_id(x));
    return Status::ok();
  }
  // The padded copy [N, C, H + pads, W + pads], pooled without padding.
  const int64_t N = xd0[0], C = xd0[1], H = ax[0].in, W = ax[1].in;
  const int64_t Hp = H + ax[0].pb + ax[0].pe, Wp = W + ax[1].pb + ax[1].pe;
  const int eb = k::dt_size(*dt);
  const std::vector<int64_t> pd = {N, C, Hp, Wp};
  const Ref padded{false, L.scratch(size_t(N * C * Hp * Wp) * size_t(eb))};
  emit_fill(L, n, is_max ? "kernel fill (-inf around the pooled input)" : "kernel fill (zeros around the pooled input)",
            *dt, padded, N * C * Hp * Wp, is_max ? -INFINITY : 0.0);
  const std::vector<int64_t> xs = contiguous_strides(xd0);
  emit_copy_nd(L, &n, "kernel copy_nd (pooled input into its padding)", eb, x->ref, 0, nd(xd0, xs), padded,
               ax[0].pb * Wp + ax[1].pb, nd(xd0, {C * Hp * Wp, Hp * Wp, Wp, 1}));
  const std::array<int64_t, 6> unpadded{ax[0].k, ax[1].k, 0, 0, ax[0].s, ax[1].s};
  const cudnnPoolingMode_t mode = is_max ? CUDNN_POOLING_MAX : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING;
  if (is_max || include_pad) {
    const DevValue& y = L.define(n.outputs[0], Layout::kRowMajor);
    emit_cudnn_pool(L, n, *dt, Layout::kRowMajor, pd, yd, mode, unpadded, padded, y.ref, padded.id);
    return Status::ok();
  }
  // Excluding the pads: the window mean over the copy, times window / valid elements per position.
  const int64_t P = yd[2], Q = yd[3];
  const Ref sum{false, L.scratch(size_t(N * C * P * Q) * size_t(eb))};
  emit_cudnn_pool(L, n, *dt, Layout::kRowMajor, pd, yd, mode, unpadded, padded, sum, padded.id);
  auto valid = [](const Axis& a, int64_t o) {
    const int64_t lo = o * a.s - a.pb, hi = lo + a.k;
    return std::max<int64_t>(0, std::min(hi, a.in) - std::max<int64_t>(lo, 0));
  };
  KILN_ASSIGN_OR_RETURN(Tensor map, Tensor::create(DType::kFloat32, {P, Q}));
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t q = 0; q < Q; ++q) {
      const int64_t v = valid(ax[0], p) * valid(ax[1], q);
      map.data<float>()[p * Q + q] = v > 0 ? float(double(ax[0].k * ax[1].k) / double(v)) : 0.0f;
    }
  }
  KILN_ASSIGN_OR_RETURN(Ref mr, L.upload(map, *dt));
  const DevValue& y = L.define(n.outputs[0], Layout::kRowMajor);
  emit_binary_nd(L, &n, "kernel binary Mul (mean over the covered elements)", k::Binary::kMul, *dt, sum,
                 nd(yd, contiguous_strides(yd)), mr, nd(yd, {0, 0, Q, 1}), y.ref);
  return Status::ok();
}

// Four dims (cuDNN's 2-D descriptors), each at least 1 and within int.
std::vector<int64_t> pool_dims(Params& in, bool& ok) {
  std::vector<int64_t> d = in.dims();
  ok = ok && d.size() == 4 && std::all_of(d.begin(), d.end(), [](int64_t v) { return v >= 1 && v <= INT32_MAX; });
  return d;
}

Expected<StepFn> bind_cudnn_pool(Params& in, BindCtx& bc) {
  bool ok = true;
  const k::DT dt = in.dt();
  const Layout lay = in.flag() ? Layout::kNHWC : Layout::kRowMajor;
  const std::vector<int64_t> xdims = pool_dims(in, ok), ydims = pool_dims(in, ok);
  const auto mode = cudnnPoolingMode_t(in.i32());
  std::array<int, 6> pi{};
  for (int& v : pi) v = in.i32();
  const Ref xr = in.ref(), yr = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  if (!ok) return KILN_ERROR(kInvalidModel, "step '{}': malformed pooling parameters", in.step().label);
  KILN_ASSIGN_OR_RETURN(auto xd, make_tensor_desc(bc.keep_alive, xdims, dt, lay));
  KILN_ASSIGN_OR_RETURN(auto yd, make_tensor_desc(bc.keep_alive, ydims, dt, lay));
  cudnnPoolingDescriptor_t pd = nullptr;
  KILN_CUDA_TRY(cudnnCreatePoolingDescriptor(&pd));
  hold(bc.keep_alive, pd, destroy_pool);
  KILN_CUDA_TRY(cudnnSetPooling2dDescriptor(pd, mode, CUDNN_NOT_PROPAGATE_NAN, pi[0], pi[1], pi[2], pi[3], pi[4], pi[5]));
  return StepFn([=](const RunCtx& c) -> Status {
    float one = 1.0f, zero = 0.0f;
    KILN_CUDA_TRY(cudnnPoolingForward(c.dnn, pd, &one, xd, c.ptr(xr), &zero, yd, c.ptr(yr)));
    return Status::ok();
  });
}

Expected<StepFn> bind_max_pool_nhwc(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  k::PoolShape ps{};
  for (int* v : {&ps.n, &ps.h, &ps.w, &ps.c, &ps.p, &ps.q, &ps.kh, &ps.kw, &ps.sh, &ps.sw, &ps.ph, &ps.pw}) *v = in.i32();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::max_pool_nhwc(dt, c.ptr(xr), ps, c.ptr(yr), c.stream), "max_pool_nhwc");
  });
}

}  // namespace

void register_pool_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kMaxPool] = lower_pool;
  t[OpKind::kAveragePool] = lower_pool;
  t[OpKind::kLpPool] = lower_pool;
}

void register_pool_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kCudnnPool] = bind_cudnn_pool;
  t[StepOp::kMaxPoolNhwc] = bind_max_pool_nhwc;
  t[StepOp::kPoolTable] = bind_pool_table;
}

}  // namespace kiln::cuda
