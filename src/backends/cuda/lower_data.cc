// Data movement: views that need no work (Reshape, Squeeze, Flatten...), strided copies
// (Transpose, Slice, Expand, Concat, Split, Tile, DepthToSpace, SpaceToDepth), Gather, GatherElements
// and CumSum; Trilu; GatherND, ScatterND and ScatterElements. Every copy is one copy_nd launch that
// reads its input through the input's logical strides, so NHWC inputs are read in place.
#include <algorithm>

#include "backends/cuda/lower.h"

namespace kiln::cuda {

namespace {

std::vector<int64_t> dims_of(const Value* v) {
  std::vector<int64_t> d;
  for (const Dim& x : v->type.shape->dims) d.push_back(x.value());
  return d;
}


// Emits dst[idx . ds] = src[src_off + idx . ss] for idx in dims; offsets in elements.
void emit_copy(Lowering& L, const Node& n, std::string what, const DevValue* src, int64_t src_off,
               std::vector<int64_t> ss, Ref dst, int64_t dst_off, std::vector<int64_t> ds, std::vector<int64_t> dims) {
  emit_copy_nd(L, &n, "kernel copy_nd (" + what + ")", k::dt_size(src->dt), src->ref, src_off, nd(dims, ss), dst, dst_off,
               nd(dims, ds));
}

Expected<StepFn> bind_copy_nd(Params& in, BindCtx&) {
  const int eb = in.i32();
  const Ref sr = in.ref(), dr = in.ref();
  const int64_t src_off = in.i64(), dst_off = in.i64();
  const k::NdStrides s = in.nd(), d = in.nd();
  const uint64_t zero_bytes = uint64_t(in.i64());
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) -> Status {
    if (zero_bytes) KILN_CUDA_TRY(cudaMemsetAsync(c.ptr(dr), 0, zero_bytes, c.stream));
    const char* sp = static_cast<const char*>(c.ptr(sr)) + src_off * eb;
    char* dp = static_cast<char*>(c.ptr(dr)) + dst_off * eb;
    return cuda_status(k::copy_nd(eb, sp, s, dp, d, c.stream), "copy_nd");
  });
}

// Gather and GatherElements share their record: element bytes, data, indices, output, the data
// viewed as [outer, axis, inner], the index count (Gather) or the axis length of indices
// (GatherElements), the index dtype; both count out-of-range indices in the step's slot.
template <bool kElements>
Expected<StepFn> bind_gather(Params& in, BindCtx&) {
  const int eb = in.i32();
  const Ref xr = in.ref(), ir = in.ref(), yr = in.ref();
  const int64_t outer = in.i64(), ad = in.i64(), inner = in.i64(), n_idx = in.i64();
  const k::DT idt = in.dt();
  const int slot = in.step().bad_index_slot;
  if (slot < 0) return KILN_ERROR(kInvalidModel, "step '{}': a gather without its index check", in.step().label);
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    if constexpr (kElements) {
      return cuda_status(k::gather_elements(eb, c.ptr(xr), outer, ad, inner, c.ptr(ir), idt, n_idx, c.ptr(yr),
                                            c.bad_index + slot, c.stream), "gather_elements");
    } else {
      return cuda_status(k::gather(eb, c.ptr(xr), outer, ad, inner, c.ptr(ir), idt, n_idx, c.ptr(yr), c.bad_index + slot,
                                   c.stream), "gather");
    }
  });
}

Expected<StepFn> bind_fill(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref yr = in.ref();
  const int64_t count = in.i64();
  const double val = in.f64();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) { return cuda_status(k::fill(dt, c.ptr(yr), count, val, c.stream), "fill"); });
}

Status check_rank(const std::vector<int64_t>& dims) {
  if (dims.size() > size_t(k::kMaxRank)) KILN_UNSUPPORTED("rank {} > {}", dims.size(), k::kMaxRank);
  return Status::ok();
}

Status lower_view(Lowering& L, const Node& n) {
  if (n.op == OpKind::kDropout && n.has_input(2)) {  // training, or maybe (computed): lower_train_mode.cc
    const Tensor* mode = L.constant(n.inputs[2]);
    if (!mode || mode->numel() != 1 || mode->as_double(0) != 0) return lower_dropout_train(L, n);
  }
  if (n.outputs.size() > 1 && n.has_output(1) && n.op != OpKind::kDropout) {
    KILN_UNSUPPORTED("{} with a second output", op_name(n.op));
  }
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  L.define_alias(n.outputs[0], *x);
  // Inference Dropout keeps every element: its mask is all true.
  if (n.outputs.size() > 1 && n.has_output(1)) {
    const DevValue& m = L.define(n.outputs[1]);
    emit_fill(L, n, "kernel fill", m.dt, m.ref, m.numel(), 1.0);
  }
  return Status::ok();
}

// Whether strides a and b address the same bytes over dims (a dim of 1's stride never matters).
bool same_strides(const std::vector<int64_t>& dims, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] != 1 && a[i] != b[i]) return false;
  }
  return true;
}

Status lower_transpose(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  KILN_RETURN_IF_ERROR(check_rank(x->dims));
  std::vector<int64_t> perm = n.attr_ints("perm");
  if (perm.empty()) {
    for (size_t i = x->dims.size(); i-- > 0;) perm.push_back(int64_t(i));
  }
  std::vector<int64_t> xs = x->strides(), ss, dims;
  for (int64_t p : perm) {
    dims.push_back(x->dims[size_t(p)]);
    ss.push_back(xs[size_t(p)]);
  }
  // A permutation that leaves the bytes in place is a view: NHWC read as [N,H,W,C] (a ConvNeXt
  // block's permute before its LayerNorm), [N,H,W,C] read back as NCHW in the NHWC layout (the
  // permute after), or one that only moves dims of 1.
  DevValue view = *x;
  for (Layout lay : {Layout::kRowMajor, Layout::kNHWC}) {
    if (lay == Layout::kNHWC && (dims.size() != 4 || dims[2] * dims[3] == 1)) continue;
    view.layout = lay;
    view.dims = dims;
    if (same_strides(dims, ss, view.strides())) {
      L.define_alias(n.outputs[0], view);
      return Status::ok();
    }
  }
  const DevValue& y = L.define(n.outputs[0]);
  emit_copy(L, n, "transpose", x, 0, ss, y.ref, 0, contiguous_strides(dims), dims);
  return Status::ok();
}

Status lower_slice(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  KILN_RETURN_IF_ERROR(check_rank(x->dims));
  size_t r = x->dims.size();
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    if (n.has_input(i) && !L.constant(n.inputs[i])) KILN_UNSUPPORTED("Slice bounds computed at run time");
  }
  std::vector<int64_t> starts = L.constant(n.inputs[1])->to_int_vector(), ends = L.constant(n.inputs[2])->to_int_vector();
  std::vector<int64_t> axes, steps(starts.size(), 1);
  if (n.has_input(3)) axes = L.constant(n.inputs[3])->to_int_vector();
  else for (size_t i = 0; i < starts.size(); ++i) axes.push_back(int64_t(i));
  if (n.has_input(4)) steps = L.constant(n.inputs[4])->to_int_vector();
  std::vector<int64_t> xs = x->strides(), ss = xs, out = dims_of(n.outputs[0]);
  int64_t off = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t a = axes[i] < 0 ? axes[i] + int64_t(r) : axes[i];
    int64_t d = x->dims[size_t(a)], st = steps[i], s = starts[i];
    if (st == 0) return KILN_ERROR(kInvalidModel, "Slice step 0");
    if (s < 0) s += d;
    s = st > 0 ? std::clamp<int64_t>(s, 0, d) : std::clamp<int64_t>(s, 0, d - 1);
    off += s * xs[size_t(a)];
    ss[size_t(a)] = xs[size_t(a)] * st;
  }
  const DevValue& y = L.define(n.outputs[0]);
  if (y.numel() == 0) return Status::ok();
  emit_copy(L, n, "slice", x, off, ss, y.ref, 0, contiguous_strides(out), out);
  return Status::ok();
}

Status lower_expand(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  std::vector<int64_t> out = dims_of(n.outputs[0]);
  KILN_RETURN_IF_ERROR(check_rank(out));
  const DevValue& y = L.define(n.outputs[0]);
  emit_copy(L, n, "expand", x, 0, broadcast_strides(*x, out), y.ref, 0, contiguous_strides(out), out);
  return Status::ok();
}

// Concat's output keeps its inputs' layout when all share NHWC (a DenseNet's concatenations between
// convolutions stay NHWC), and the inputs laid out like the output are row blocks of it: one
// concat_rows step moves them all. An input in another layout is a strided copy of its own.
Status lower_concat(Lowering& L, const Node& n) {
  std::vector<int64_t> out = dims_of(n.outputs[0]);
  KILN_RETURN_IF_ERROR(check_rank(out));
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += int64_t(out.size());
  std::vector<const DevValue*> ins;
  bool nhwc = out.size() == 4, any = false;
  for (const Value* v : n.inputs) {
    KILN_ASSIGN_OR_RETURN(const DevValue* d, L.value(v));
    ins.push_back(d);
    if (d->numel() == 0) continue;
    any = true;
    nhwc = nhwc && d->layout == Layout::kNHWC;
  }
  const DevValue& y = L.define(n.outputs[0], nhwc && any ? Layout::kNHWC : Layout::kRowMajor);
  if (y.numel() == 0) return Status::ok();
  const Ref yr = y.ref;
  const std::vector<int64_t> ys = y.strides();
  // rows: the dims laid out outside the axis; an input's row is its axis length times `inner`, the
  // elements laid out inside the axis (the axis's stride in the output).
  const int64_t inner = ys[size_t(axis)], rows = y.numel() / (out[size_t(axis)] * inner);
  int n_parts = 0;
  ByteWriter p;
  std::vector<int> reads;
  int64_t at = 0;
  for (const DevValue* d : ins) {
    const int64_t len = d->dims[size_t(axis)];
    if (d->numel() > 0) {
      DevValue as_y = *d;
      as_y.layout = y.layout;
      const std::vector<int64_t> ds = d->strides();
      if (same_strides(d->dims, ds, as_y.strides())) {  // d's bytes in y's order
        ++n_parts;
        put(p, d->ref);
        p.i64(len * inner);
        p.i64(at * inner);
        reads.push_back(read_id(d));
      } else {
        emit_copy(L, n, "concat", d, 0, ds, yr, at * ys[size_t(axis)], ys, d->dims);
      }
    }
    at += len;
  }
  if (n_parts == 0) return Status::ok();
  ByteWriter w;
  w.put(int32_t(k::dt_size(y.dt)));
  put(w, yr);
  w.i64(rows);
  w.i64(out[size_t(axis)] * inner);
  w.put(int32_t(n_parts));
  w.raw(p.bytes().data(), p.bytes().size());
  L.emit(&n, fmt::format("kernel concat_rows ({} parts)", n_parts), reads, {yr.id}, StepOp::kConcat,
         std::move(w));
  return Status::ok();
}

Expected<StepFn> bind_concat(Params& in, BindCtx&) {
  const int eb = in.i32();
  const Ref yr = in.ref();
  const int64_t rows = in.i64(), row_width = in.i64();
  const int32_t n_parts = in.i32();
  if (n_parts < 1 || n_parts > (1 << 16)) {
    return KILN_ERROR(kInvalidModel, "step '{}': {} concat parts", in.step().label, n_parts);
  }
  std::vector<Ref> refs;
  std::vector<k::ConcatPart> parts;
  for (int32_t i = 0; i < n_parts; ++i) {
    refs.push_back(in.ref());
    const int64_t width = in.i64(), col = in.i64();
    parts.push_back({nullptr, width, col});
  }
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) -> Status {
    std::vector<k::ConcatPart> ps = parts;
    for (size_t i = 0; i < ps.size(); ++i) ps[i].src = c.ptr(refs[i]);
    return cuda_status(k::concat_rows(eb, ps.data(), int(ps.size()), c.ptr(yr), rows, row_width, c.stream),
                       "concat_rows");
  });
}

Status lower_split(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  KILN_RETURN_IF_ERROR(check_rank(x->dims));
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += int64_t(x->dims.size());
  std::vector<int64_t> xs = x->strides();
  // Each output's length along the axis: its dims, or for an omitted output the split sizes (input
  // or attribute), else equal parts (the last smaller, as opset 18's num_outputs has it).
  std::vector<int64_t> sizes;
  if (const Tensor* sp = n.has_input(1) ? L.constant(n.inputs[1]) : nullptr) sizes = sp->to_int_vector();
  else if (n.has_attr("split")) sizes = n.attr_ints("split");
  const int64_t dim = x->dims[size_t(axis)], parts = int64_t(n.outputs.size());
  const int64_t chunk = parts > 0 ? (dim + parts - 1) / parts : 0;
  int64_t at = 0;
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    const Value* o = n.outputs[i];
    if (!o) {
      at += i < sizes.size() ? sizes[i] : std::min(chunk, std::max<int64_t>(dim - chunk * int64_t(i), 0));
      continue;
    }
    std::vector<int64_t> od = dims_of(o);
    // An output nothing reads (a Concat took the Split's input whole instead) is not copied.
    if (L.consumers(o) > 0 || L.is_graph_output(o)) {
      const DevValue& y = L.define(o);
      if (y.numel() > 0) emit_copy(L, n, "split", x, at * xs[size_t(axis)], xs, y.ref, 0, contiguous_strides(od), od);
    }
    at += od[size_t(axis)];
  }
  return Status::ok();
}

Status lower_gather(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* idx, L.rowmajor(n.inputs[1]));
  if (idx->dt != k::DT::kI64 && idx->dt != k::DT::kI32) KILN_UNSUPPORTED("Gather indices of {}", dtype_name(idx->ir_dtype));
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += int64_t(x->dims.size());
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x->dims[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < x->dims.size(); ++i) inner *= x->dims[i];
  int64_t ad = x->dims[size_t(axis)], n_idx = idx->numel();
  const DevValue& y = L.define(n.outputs[0]);
  if (y.numel() == 0) return Status::ok();
  ByteWriter p;
  p.put(int32_t(k::dt_size(x->dt)));
  put(p, x->ref);
  put(p, idx->ref);
  put(p, y.ref);
  for (int64_t v : {outer, ad, inner, n_idx}) p.i64(v);
  p.put(int32_t(idx->dt));
  const int slot = L.new_bad_index_slot();
  L.emit(&n, "kernel gather", {read_id(x), read_id(idx)}, {y.ref.id}, StepOp::kGather, std::move(p));
  L.steps.back().bad_index_slot = slot;
  return Status::ok();
}

Status lower_constant_of_shape(Lowering& L, const Node& n) {
  const Tensor* v = n.attr_tensor("value");
  const DevValue& y = L.define(n.outputs[0]);
  emit_fill(L, n, "kernel fill", y.dt, y.ref, y.numel(), v && v->numel() ? v->as_double(0) : 0.0);
  return Status::ok();
}

// Tile: the output viewed as [r0, d0, r1, d1, ...] (repeat, then the input's dim), read with
// stride 0 along each repeat: one copy_nd over up to four dims.
Status lower_tile(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.value(n.inputs[0]));
  const Tensor* reps = L.constant(n.inputs[1]);
  if (!reps) KILN_UNSUPPORTED("Tile repeats computed at run time");
  const std::vector<int64_t> r = reps->to_int_vector();
  if (r.size() != x->dims.size() || 2 * r.size() > size_t(k::kMaxRank)) KILN_UNSUPPORTED("Tile of rank {}", x->dims.size());
  std::vector<int64_t> dims, ss, ds;
  const std::vector<int64_t> xs = x->strides();
  std::vector<int64_t> out = dims_of(n.outputs[0]);
  const std::vector<int64_t> os = contiguous_strides(out);
  for (size_t i = 0; i < r.size(); ++i) {
    dims.insert(dims.end(), {r[i], x->dims[i]});
    ss.insert(ss.end(), {0, xs[i]});
    ds.insert(ds.end(), {x->dims[i] * os[i], os[i]});
  }
  const DevValue& y = L.define(n.outputs[0]);
  if (y.numel() == 0) return Status::ok();
  emit_copy(L, n, "tile", x, 0, ss, y.ref, 0, ds, dims);
  return Status::ok();
}

// DepthToSpace (DCR and CRD) and SpaceToDepth: a permutation of the 6-D view [N, ., ., ., ., .]
// of a row-major NCHW input, written contiguously (one copy_nd).
Status lower_depth_space(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (x->dims.size() != 4) KILN_UNSUPPORTED("{} of rank {}", op_name(n.op), x->dims.size());
  const int64_t b = n.attr_int("blocksize", 0);
  const int64_t N = x->dims[0], C = x->dims[1], H = x->dims[2], W = x->dims[3];
  if (b < 1) KILN_UNSUPPORTED("blocksize {}", b);
  std::vector<int64_t> dims, ss;
  if (n.op == OpKind::kDepthToSpace) {
    if (C % (b * b) != 0) KILN_UNSUPPORTED("DepthToSpace of {} channels by {}", C, b);
    const int64_t c2 = C / (b * b), hw = H * W;
    // y [N, C', H, b1, W, b2] reads x[n, b1, b2, c', h, w] (DCR) or x[n, c', b1, b2, h, w] (CRD).
    dims = {N, c2, H, b, W, b};
    if (n.attr_string("mode", "DCR") == "CRD") ss = {C * hw, b * b * hw, W, b * hw, 1, hw};
    else ss = {C * hw, hw, W, b * c2 * hw, 1, c2 * hw};
  } else {
    if (H % b != 0 || W % b != 0) KILN_UNSUPPORTED("SpaceToDepth of {}x{} by {}", H, W, b);
    // y [N, b1, b2, C, H/b, W/b] reads x[n, c, h' * b + b1, w' * b + b2].
    dims = {N, b, b, C, H / b, W / b};
    ss = {C * H * W, W, 1, H * W, b * W, b};
  }
  const DevValue& y = L.define(n.outputs[0]);
  if (y.numel() == 0) return Status::ok();
  emit_copy(L, n, n.op == OpKind::kDepthToSpace ? "depth_to_space" : "space_to_depth", x, 0, ss, y.ref, 0,
            contiguous_strides(dims), dims);
  return Status::ok();
}

// Trilu: the upper (j - i >= k) or lower (j - i <= k) triangle of the last two dims kept, the rest 0.
Status lower_trilu(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (x->dims.size() < 2) KILN_UNSUPPORTED("Trilu of rank {}", x->dims.size());
  int64_t kk = 0;
  if (n.has_input(1)) {
    const Tensor* t = L.constant(n.inputs[1]);
    if (!t || t->numel() != 1) KILN_UNSUPPORTED("Trilu k computed at run time");
    kk = t->as_int(0);
  }
  const size_t r = x->dims.size();
  const int64_t rows = x->dims[r - 2], cols = x->dims[r - 1];
  const DevValue& y = L.define(n.outputs[0]);
  if (y.numel() == 0) return Status::ok();
  ByteWriter p;
  p.put(int32_t(k::dt_size(x->dt)));
  put(p, x->ref);
  put(p, y.ref);
  for (int64_t v : {y.numel() / std::max<int64_t>(rows * cols, 1), rows, cols, kk}) p.i64(v);
  p.u8(n.attr_int("upper", 1) != 0);
  L.emit(&n, "kernel trilu", {read_id(x)}, {y.ref.id}, StepOp::kTrilu, std::move(p));
  return Status::ok();
}

Expected<StepFn> bind_trilu(Params& in, BindCtx&) {
  const int eb = in.i32();
  const Ref xr = in.ref(), yr = in.ref();
  const int64_t batch = in.i64(), rows = in.i64(), cols = in.i64(), kk = in.i64();
  const bool upper = in.flag();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::trilu(eb, c.ptr(xr), c.ptr(yr), batch, rows, cols, kk, upper, c.stream), "trilu");
  });
}


// The index tuple over data dims [from, from + k): their sizes and row-major element strides.
k::IndexTuple index_tuple(const std::vector<int64_t>& d, size_t from, size_t k) {
  k::IndexTuple t;
  t.k = int(k);
  for (size_t j = 0; j < k; ++j) {
    t.dims[j] = d[from + j];
    t.strides[j] = prod_of(d, from + j + 1, d.size());
  }
  return t;
}

void put_tuple(ByteWriter& w, const k::IndexTuple& t) {
  put(w, std::vector<int64_t>(t.dims, t.dims + t.k));
  put(w, std::vector<int64_t>(t.strides, t.strides + t.k));
}

Expected<k::IndexTuple> read_tuple(Params& in) {
  const std::vector<int64_t> dims = in.dims(), strides = in.dims();
  if (dims.size() != strides.size() || dims.size() > size_t(k::kMaxRank)) {
    return KILN_ERROR(kInvalidModel, "step '{}': a malformed index tuple", in.step().label);
  }
  k::IndexTuple t;
  t.k = int(dims.size());
  std::copy(dims.begin(), dims.end(), t.dims);
  std::copy(strides.begin(), strides.end(), t.strides);
  return t;
}

// GatherND with any batch_dims: the output viewed as [batch, index tuples, slice].
Status lower_gather_nd(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* idx, L.rowmajor(n.inputs[1]));
  if (idx->dt != k::DT::kI64 && idx->dt != k::DT::kI32) KILN_UNSUPPORTED("GatherND indices of {}", dtype_name(idx->ir_dtype));
  const size_t b = size_t(n.attr_int("batch_dims", 0)), q = idx->dims.size(), r = x->dims.size();
  if (q < 1) KILN_UNSUPPORTED("GatherND with scalar indices");
  const size_t kk = size_t(idx->dims[q - 1]);
  if (b + kk > r || b >= q || kk > size_t(k::kMaxRank)) KILN_UNSUPPORTED("GatherND of {} by {}", dims_to_string(x->dims), dims_to_string(idx->dims));
  const DevValue& y = L.define(n.outputs[0]);
  if (y.numel() == 0) return Status::ok();
  ByteWriter p;
  p.put(int32_t(k::dt_size(x->dt)));
  put(p, x->ref);
  put(p, idx->ref);
  put(p, y.ref);
  p.put(int32_t(idx->dt));
  for (int64_t v : {prod_of(x->dims, 0, b), prod_of(idx->dims, b, q - 1), prod_of(x->dims, b + kk, r), prod_of(x->dims, b, r)}) {
    p.i64(v);
  }
  put_tuple(p, index_tuple(x->dims, b, kk));
  const int slot = L.new_bad_index_slot();
  L.emit(&n, "kernel gather_nd", {read_id(x), read_id(idx)}, {y.ref.id}, StepOp::kGatherND, std::move(p));
  L.steps.back().bad_index_slot = slot;
  return Status::ok();
}

Expected<StepFn> bind_gather_nd(Params& in, BindCtx&) {
  const int eb = in.i32();
  const Ref xr = in.ref(), ir = in.ref(), yr = in.ref();
  const k::DT idt = in.dt();
  const int64_t nb = in.i64(), ni = in.i64(), nr = in.i64(), batch_stride = in.i64();
  KILN_ASSIGN_OR_RETURN(k::IndexTuple t, read_tuple(in));
  const int slot = in.step().bad_index_slot;
  if (slot < 0) return KILN_ERROR(kInvalidModel, "step '{}': a gather without its index check", in.step().label);
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::gather_nd(eb, c.ptr(xr), c.ptr(ir), idt, c.ptr(yr), nb, ni, nr, t, batch_stride, c.bad_index + slot,
                                    c.stream), "gather_nd");
  });
}

// ScatterND and ScatterElements (KV-cache writes, detection heads): the output is a copy of data
// with the updates written over it, or combined into it (reduction add/mul/max/min).
Status lower_scatter(Lowering& L, const Node& n) {
  const bool elements = n.op == OpKind::kScatterElements;
  const std::string red_name = n.attr_string("reduction", "none");
  const int red = red_name == "none" ? 0 : red_name == "add" ? 1 : red_name == "mul" ? 2 : red_name == "max" ? 3
                                                                                  : red_name == "min" ? 4 : -1;
  if (red < 0) KILN_UNSUPPORTED("{} reduction '{}'", op_name(n.op), red_name);
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* idx, L.rowmajor(n.inputs[1]));
  KILN_ASSIGN_OR_RETURN(const DevValue* upd, L.rowmajor(n.inputs[2]));
  if (idx->dt != k::DT::kI64 && idx->dt != k::DT::kI32) KILN_UNSUPPORTED("{} indices of {}", op_name(n.op), dtype_name(idx->ir_dtype));
  if (upd->dt != x->dt) KILN_UNSUPPORTED("{} updates of another dtype", op_name(n.op));
  if (red != 0 && x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16 && x->dt != k::DT::kF64 &&
      x->dt != k::DT::kI32 && x->dt != k::DT::kI64) {
    KILN_UNSUPPORTED("{} with reduction '{}' of {}", op_name(n.op), red_name, dtype_name(x->ir_dtype));
  }
  const size_t r = x->dims.size(), q = idx->dims.size();
  int64_t a = 0, n_axis = 0, inner = 0, nr_or_axis = 0;
  k::IndexTuple t;
  if (elements) {
    a = n.attr_int("axis", 0);
    if (a < 0) a += int64_t(r);
    if (a < 0 || a >= int64_t(r) || q != r || upd->dims != idx->dims) KILN_UNSUPPORTED("ScatterElements axis {}", a);
    for (size_t i = 0; i < r; ++i) {
      if (int64_t(i) != a && idx->dims[i] != x->dims[i]) KILN_UNSUPPORTED("ScatterElements indices smaller than the data");
    }
    nr_or_axis = x->dims[size_t(a)];
    n_axis = idx->dims[size_t(a)];
    inner = prod_of(x->dims, size_t(a) + 1, r);
  } else {
    if (q < 1) KILN_UNSUPPORTED("ScatterND with scalar indices");
    const size_t kk = size_t(idx->dims[q - 1]);
    if (kk > r || kk > size_t(k::kMaxRank)) KILN_UNSUPPORTED("ScatterND tuples of {}", kk);
    nr_or_axis = prod_of(x->dims, kk, r);
    t = index_tuple(x->dims, 0, kk);
  }
  const DevValue& y = L.define(n.outputs[0]);
  emit_scatter(L, n, fmt::format("kernel {}{}", elements ? "scatter_elements" : "scatter_nd", red ? " (" + red_name + ")" : ""),
               x->dt, x->ref, x->numel(), idx, upd->ref, upd->numel(), y.ref, elements, nr_or_axis, t, n_axis, inner, red);
  return Status::ok();
}

Expected<StepFn> bind_scatter(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), ir = in.ref(), ur = in.ref(), yr = in.ref();
  const k::DT idt = in.dt();
  const bool elements = in.flag();
  const int64_t numel = in.i64(), upd_numel = in.i64(), nr_or_axis = in.i64(), n_axis = in.i64(), inner = in.i64();
  KILN_ASSIGN_OR_RETURN(k::IndexTuple t, read_tuple(in));
  const int32_t red = in.i32();
  const bool wrap = in.flag();
  const int slot = in.step().bad_index_slot;
  if (slot < 0) return KILN_ERROR(kInvalidModel, "step '{}': a scatter without its index check", in.step().label);
  KILN_RETURN_IF_ERROR(in.done());
  if (red < 0 || red > 4) return KILN_ERROR(kInvalidModel, "step '{}': scatter reduction {}", in.step().label, red);
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::scatter(dt, c.ptr(xr), numel, c.ptr(ir), idt, c.ptr(ur), upd_numel, c.ptr(yr), elements, nr_or_axis,
                                  t, n_axis, inner, red, wrap, c.bad_index + slot, c.stream), "scatter");
  });
}

// CumSum along a constant axis: one thread per line (position ids over an attention mask are
// short lines; nothing here is bandwidth-bound).
Status lower_cumsum(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (x->dt != k::DT::kF32 && x->dt != k::DT::kF16 && x->dt != k::DT::kBF16 && x->dt != k::DT::kF64 &&
      x->dt != k::DT::kI64 && x->dt != k::DT::kI32) {
    KILN_UNSUPPORTED("CumSum of {}", dtype_name(x->ir_dtype));
  }
  const Tensor* a = L.constant(n.inputs[1]);
  if (!a || a->numel() != 1) KILN_UNSUPPORTED("CumSum axis computed at run time");
  const int64_t r = int64_t(x->dims.size());
  int64_t axis = a->as_int(0);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) KILN_UNSUPPORTED("CumSum axis {} of a rank-{} input", a->as_int(0), r);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x->dims[size_t(i)];
  for (int64_t i = axis + 1; i < r; ++i) inner *= x->dims[size_t(i)];
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter p;
  p.put(int32_t(x->dt));
  put(p, x->ref);
  put(p, y.ref);
  for (int64_t v : {outer, x->dims[size_t(axis)], inner}) p.i64(v);
  p.u8(n.attr_int("exclusive", 0) != 0);
  p.u8(n.attr_int("reverse", 0) != 0);
  L.emit(&n, "kernel cumsum", {read_id(x)}, {y.ref.id}, StepOp::kCumSum, std::move(p));
  return Status::ok();
}

Expected<StepFn> bind_cumsum(Params& in, BindCtx&) {
  const k::DT dt = in.dt();
  const Ref xr = in.ref(), yr = in.ref();
  const int64_t outer = in.i64(), len = in.i64(), inner = in.i64();
  const bool exclusive = in.flag(), reverse = in.flag();
  KILN_RETURN_IF_ERROR(in.done());
  return StepFn([=](const RunCtx& c) {
    return cuda_status(k::cumsum(dt, c.ptr(xr), c.ptr(yr), outer, len, inner, exclusive, reverse, c.stream), "cumsum");
  });
}

// GatherElements where indices and data agree on every dim but the axis (what models write).
// OneHot(indices, depth, [off, on]) with the depth axis inserted at `axis`: over [outer, depth,
// inner], position j is on where the index is j or j - depth (negative indices count from the
// end; any other index leaves its row off, as ONNX asks): two compares against constant iotas,
// Or, and a Where choosing between the two values (copied out of `values` when it is fed).
Status lower_one_hot(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* idx, L.rowmajor(n.inputs[0]));
  const Tensor* dt_ = L.constant(n.inputs[1]);
  if (!dt_ || dt_->numel() != 1) KILN_UNSUPPORTED("OneHot depth computed at run time");
  const int64_t depth = int64_t(dt_->as_double(0));
  if (depth < 1) KILN_UNSUPPORTED("OneHot depth {}", depth);
  KILN_ASSIGN_OR_RETURN(const DevValue* vals, L.rowmajor(n.inputs[2]));
  if (vals->numel() != 2) KILN_UNSUPPORTED("OneHot values of {} elements", vals->numel());
  const int64_t r = int64_t(idx->dims.size());
  int64_t axis = n.attr_int("axis", -1);
  if (axis < 0) axis += r + 1;
  if (axis < 0 || axis > r) KILN_UNSUPPORTED("OneHot axis {} for indices of rank {}", n.attr_int("axis", -1), r);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < r; ++i) (i < axis ? outer : inner) *= idx->dims[size_t(i)];
  // Indices compare as i64 (float indices are truncated, as the reference's astype).
  Ref ix = idx->ref;
  if (idx->dt != k::DT::kI64) {
    ix = Ref{false, L.scratch(size_t(idx->numel()) * sizeof(int64_t))};
    emit_cast(L, &n, "kernel cast (OneHot indices)", idx->dt, k::DT::kI64, idx->ref, ix, idx->numel());
  }
  std::vector<int64_t> iota(static_cast<size_t>(depth)), iota_neg(static_cast<size_t>(depth));
  for (int64_t j = 0; j < depth; ++j) {
    iota[size_t(j)] = j;
    iota_neg[size_t(j)] = j - depth;
  }
  KILN_ASSIGN_OR_RETURN(Ref pos, L.upload(Tensor::from_vector<int64_t>(iota, {depth}), k::DT::kI64));
  KILN_ASSIGN_OR_RETURN(Ref neg, L.upload(Tensor::from_vector<int64_t>(iota_neg, {depth}), k::DT::kI64));
  const std::vector<int64_t> dims = {outer, depth, inner};
  const k::NdStrides along = nd(dims, {0, 1, 0}), index = nd(dims, {inner, 0, 1}), flat = nd(dims, {depth * inner, inner, 1});
  const size_t count = size_t(outer * depth * inner);
  const Ref e1{false, L.scratch(count)}, e2{false, L.scratch(count)}, on{false, L.scratch(count)};
  emit_binary_nd(L, &n, "kernel binary Equal (OneHot)", k::Binary::kEqual, k::DT::kI64, pos, along, ix, index, e1);
  emit_binary_nd(L, &n, "kernel binary Equal (OneHot, negative)", k::Binary::kEqual, k::DT::kI64, neg, along, ix, index, e2);
  emit_binary_nd(L, &n, "kernel binary Or (OneHot)", k::Binary::kOr, k::DT::kBool, e1, flat, e2, flat, on);
  const DevValue& y = L.define(n.outputs[0]);
  if (vals->dt != y.dt) KILN_UNSUPPORTED("OneHot values of another dtype than the output");
  const int eb = k::dt_size(vals->dt);
  const Ref off_v{false, L.scratch(size_t(eb))}, on_v{false, L.scratch(size_t(eb))};
  emit_copy_nd(L, &n, "kernel copy_nd (OneHot off value)", eb, vals->ref, 0, nd({1}, {1}), off_v, 0, nd({1}, {1}));
  emit_copy_nd(L, &n, "kernel copy_nd (OneHot on value)", eb, vals->ref, 1, nd({1}, {1}), on_v, 0, nd({1}, {1}));
  ByteWriter w;  // the kWhere record (lower_elementwise.cc)
  w.put(int32_t(y.dt));
  put(w, on);
  put(w, flat);
  put(w, on_v);
  put(w, nd(dims, {0, 0, 0}));
  put(w, off_v);
  put(w, nd(dims, {0, 0, 0}));
  put(w, y.ref);
  L.emit(&n, "kernel where (OneHot)", {on.id, on_v.id, off_v.id}, {y.ref.id}, StepOp::kWhere, std::move(w));
  return Status::ok();
}

Status lower_gather_elements(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  KILN_ASSIGN_OR_RETURN(const DevValue* idx, L.rowmajor(n.inputs[1]));
  if (idx->dt != k::DT::kI64 && idx->dt != k::DT::kI32) KILN_UNSUPPORTED("GatherElements indices of {}", dtype_name(idx->ir_dtype));
  const int64_t r = int64_t(x->dims.size());
  int64_t axis = n.attr_int("axis", 0);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r || idx->dims.size() != x->dims.size()) KILN_UNSUPPORTED("GatherElements axis {}", axis);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < r; ++i) {
    if (i != axis && idx->dims[size_t(i)] != x->dims[size_t(i)]) {
      KILN_UNSUPPORTED("GatherElements with indices {} smaller than the data {} off the axis", dims_to_string(idx->dims),
                       dims_to_string(x->dims));
    }
    if (i < axis) outer *= x->dims[size_t(i)];
    if (i > axis) inner *= x->dims[size_t(i)];
  }
  if (x->dims[size_t(axis)] == 0 && idx->numel() > 0) KILN_UNSUPPORTED("GatherElements from an empty axis");
  const DevValue& y = L.define(n.outputs[0]);
  if (y.numel() == 0) return Status::ok();
  ByteWriter p;
  p.put(int32_t(k::dt_size(x->dt)));
  put(p, x->ref);
  put(p, idx->ref);
  put(p, y.ref);
  for (int64_t v : {outer, x->dims[size_t(axis)], inner, idx->dims[size_t(axis)]}) p.i64(v);
  p.put(int32_t(idx->dt));
  const int slot = L.new_bad_index_slot();
  L.emit(&n, "kernel gather_elements", {read_id(x), read_id(idx)}, {y.ref.id}, StepOp::kGatherElements, std::move(p));
  L.steps.back().bad_index_slot = slot;
  return Status::ok();
}

}  // namespace

int64_t prod_of(const std::vector<int64_t>& d, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < d.size(); ++i) p *= d[i];
  return p;
}

void emit_scatter(Lowering& L, const Node& n, std::string label, k::DT dt, Ref data, int64_t data_numel,
                  const DevValue* idx, Ref upd, int64_t upd_numel, Ref y, bool elements, int64_t nr_or_axis,
                  const k::IndexTuple& t, int64_t n_axis, int64_t inner, int reduction, bool wrap_negative) {
  ByteWriter p;
  p.put(int32_t(dt));
  put(p, data);
  put(p, idx->ref);
  put(p, upd);
  put(p, y);
  p.put(int32_t(idx->dt));
  p.u8(elements);
  for (int64_t v : {data_numel, upd_numel, nr_or_axis, n_axis, inner}) p.i64(v);
  put_tuple(p, t);
  p.put(int32_t(reduction));
  p.u8(wrap_negative);
  const int slot = L.new_bad_index_slot();
  const int data_id = data.weight || data.id == y.id ? -1 : data.id, upd_id = upd.weight ? -1 : upd.id;
  L.emit(&n, std::move(label), {data_id, read_id(idx), upd_id}, {y.id}, StepOp::kScatter, std::move(p));
  L.steps.back().bad_index_slot = slot;
}

void register_data_lowerings(std::map<OpKind, LowerFn>& t) {
  for (OpKind op : {OpKind::kReshape, OpKind::kFlatten, OpKind::kSqueeze, OpKind::kUnsqueeze, OpKind::kIdentity,
                    OpKind::kDropout}) {
    t[op] = lower_view;
  }
  t[OpKind::kTranspose] = lower_transpose;
  t[OpKind::kSlice] = lower_slice;
  t[OpKind::kExpand] = lower_expand;
  t[OpKind::kConcat] = lower_concat;
  t[OpKind::kSplit] = lower_split;
  t[OpKind::kGather] = lower_gather;
  t[OpKind::kConstantOfShape] = lower_constant_of_shape;
  t[OpKind::kCumSum] = lower_cumsum;
  t[OpKind::kTile] = lower_tile;
  t[OpKind::kTrilu] = lower_trilu;
  t[OpKind::kGatherND] = lower_gather_nd;
  t[OpKind::kScatterND] = lower_scatter;
  t[OpKind::kScatterElements] = lower_scatter;
  t[OpKind::kDepthToSpace] = lower_depth_space;
  t[OpKind::kSpaceToDepth] = lower_depth_space;
  t[OpKind::kGatherElements] = lower_gather_elements;
  t[OpKind::kOneHot] = lower_one_hot;
}

void emit_fill(Lowering& L, const Node& n, std::string label, k::DT dt, Ref r, int64_t count, double value) {
  ByteWriter p;
  p.put(int32_t(dt));
  put(p, r);
  p.i64(count);
  p.put(value);
  L.emit(&n, std::move(label), {}, {r.id}, StepOp::kFill, std::move(p));
}

ByteWriter encode_copy(const CopyRecord& c) {
  k::NdStrides s, d;
  s.rank = d.rank = int(c.copy.dims.size());
  for (int i = 0; i < s.rank; ++i) {
    s.dims[i] = d.dims[i] = c.copy.dims[size_t(i)];
    s.strides[i] = c.copy.src[size_t(i)];
    d.strides[i] = c.copy.dst[size_t(i)];
  }
  ByteWriter p;
  p.put(int32_t(c.eb));
  put(p, c.src);
  put(p, c.dst);
  p.i64(c.copy.src_off);
  p.i64(c.copy.dst_off);
  put(p, s);
  put(p, d);
  p.i64(int64_t(c.zero_bytes));
  return p;
}

void emit_copy_nd(Lowering& L, const Node* n, std::string label, int eb, Ref src, int64_t src_off, const k::NdStrides& s,
                  Ref dst, int64_t dst_off, const k::NdStrides& d, size_t zero_bytes) {
  CopyRecord c{eb, src, dst, {}, zero_bytes};
  c.copy.dims.assign(s.dims, s.dims + s.rank);
  c.copy.src.assign(s.strides, s.strides + s.rank);
  c.copy.dst.assign(d.strides, d.strides + d.rank);
  c.copy.src_off = src_off;
  c.copy.dst_off = dst_off;
  L.emit(n, std::move(label), {src.weight ? -1 : src.id}, {dst.id}, StepOp::kCopyNd, encode_copy(c));
  L.copy_records[L.steps.size() - 1] = std::move(c);
}

void register_data_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kCopyNd] = bind_copy_nd;
  t[StepOp::kConcat] = bind_concat;
  t[StepOp::kGather] = bind_gather<false>;
  t[StepOp::kFill] = bind_fill;
  t[StepOp::kCumSum] = bind_cumsum;
  t[StepOp::kGatherElements] = bind_gather<true>;
  t[StepOp::kTrilu] = bind_trilu;
  t[StepOp::kGatherND] = bind_gather_nd;
  t[StepOp::kScatter] = bind_scatter;
}

}  // namespace kiln::cuda
