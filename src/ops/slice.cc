// Op family: slice. Concat, Split, Slice, Tile, Trilu, ReverseSequence; Pad is in shape_pad.cc.
// Every kernel is a dtype-agnostic copy (shape_util.h). Concat, Split and Slice of 1-D integer
// tensors also carry symbolic values (dims_value) so shape arithmetic chains stay symbolic.
#include <algorithm>
#include <limits>

#include "ops/shape_util.h"

namespace kiln {

void register_shape_pad_ops(OpRegistry& r);

namespace {

// ---- Concat ---------------------------------------------------------------------------------

Status infer_concat(InferCtx& c) {
  KILN_RETURN_IF_ERROR(check_same_dtype(c, 0, c.num_inputs()));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  std::optional<Shape> out;
  bool all_ranked = true;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Type& t = c.input_type(i);
    if (!t.has_rank()) {
      all_ranked = false;
      continue;
    }
    if (!out) {
      out = *t.shape;
      continue;
    }
    if (t.shape->rank() != out->rank()) {
      return c.error("inputs must have the same rank, got {} and {}", out->to_string(), t.shape->to_string());
    }
  }
  if (!out) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", 0), int64_t(out->rank())));
  if (out->rank() == 0) return c.error("cannot concatenate scalars");
  Dim total(int64_t{0});
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Type& t = c.input_type(i);
    if (!t.has_rank()) continue;
    for (size_t k = 0; k < out->rank(); ++k) {
      const Dim& d = (*t.shape)[k];
      if (int64_t(k) == axis) continue;
      if (!d.compatible((*out)[k])) {
        return c.error("input {} has shape {} but input 0 has {}: dims other than axis {} must match", i,
                       t.shape->to_string(), out->to_string(), axis);
      }
      if (d.is_static()) (*out)[k] = d;
    }
    total = total + (*t.shape)[size_t(axis)];
  }
  (*out)[size_t(axis)] = all_ranked ? total : Dim();
  c.set_output_tensor(0, dt, std::move(out));
  // 1-D shape arithmetic: the output's values are the inputs' values one after another.
  std::vector<Dim> values;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    std::optional<std::vector<Dim>> v = c.input_as_dims(i);
    if (!v || !c.input_type(i).has_rank() || c.input_type(i).shape->rank() != 1) return Status::ok();
    values.insert(values.end(), v->begin(), v->end());
  }
  c.set_output_dims_value(0, std::move(values));
  return Status::ok();
}

Status concat_cpu(KernelCtx& c) {
  const Tensor& first = c.tensor(0);
  if (first.rank() == 0) return c.error("cannot concatenate scalars");
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", 0), int64_t(first.rank())));
  std::vector<int64_t> dims = first.dims();
  dims[size_t(axis)] = 0;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Tensor& t = c.tensor(i);
    bool same = t.dtype() == first.dtype() && t.rank() == first.rank();
    for (size_t k = 0; same && k < t.rank(); ++k) same = int64_t(k) == axis || t.dim(k) == first.dim(k);
    if (!same) return c.error("input {} {} does not match input 0 {} off axis {}", i, t.summary(), first.summary(), axis);
    dims[size_t(axis)] += t.dim(size_t(axis));
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, first.dtype(), dims));
  const std::vector<int64_t> out_strides = strides_of(dims);
  int64_t offset = 0;  // along the axis
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Tensor& t = c.tensor(i);
    copy_strided(t, 0, strides_of(t.dims()), *y, offset * out_strides[size_t(axis)], out_strides, t.dims());
    offset += t.dim(size_t(axis));
  }
  return Status::ok();
}

// ---- Split ----------------------------------------------------------------------------------

// Sizes of the parts when no split input is given: ceil(d / n) each, the last ones taking what is
// left (numpy slicing: 5 into 4 gives 2, 2, 1, 0).
std::vector<int64_t> even_split(int64_t d, int64_t n) {
  const int64_t chunk = (d + n - 1) / n;
  std::vector<int64_t> sizes;
  for (int64_t i = 0, pos = 0; i < n; ++i) {
    sizes.push_back(std::clamp<int64_t>(d - pos, 0, chunk));
    pos += sizes.back();
  }
  return sizes;
}

// Split's part count: num_outputs when given (it must match the node's outputs), else the outputs.
template <typename Ctx>
Expected<int64_t> split_parts(const Ctx& c) {
  const int64_t outs = int64_t(c.num_outputs());
  const int64_t n = c.node().attr_int("num_outputs", outs);
  if (n != outs) return c.error("num_outputs is {} but the node has {} outputs", n, outs);
  if (n < 1) return c.error("Split needs at least one output");
  return n;
}

// Split's part sizes at inference: from a known split input, else even parts of the dim (a
// symbolic dim is assumed to split evenly); unknown dims when the split input is not known.
Expected<std::vector<Dim>> infer_split_sizes(const InferCtx& c, const Dim& d, int64_t n) {
  const bool given = c.has_input(1) && !(c.input_type(1).has_rank() && c.input_type(1).shape->numel() == Dim(0));
  if (!given) {
    if (!d.is_static()) return std::vector<Dim>(static_cast<size_t>(n), d / Dim(n));
    std::vector<int64_t> even = even_split(d.value(), n);
    return std::vector<Dim>(even.begin(), even.end());
  }
  std::optional<std::vector<int64_t>> split = static_ints(c, 1);
  if (!split) return std::vector<Dim>(static_cast<size_t>(n));
  if (int64_t(split->size()) != n) return c.error("split has {} sizes for {} outputs", split->size(), n);
  int64_t sum = 0;
  for (int64_t s : *split) {
    if (s < 0) return c.error("split sizes must be >= 0, got {}", dims_to_string(*split));
    sum += s;
  }
  if (d.is_static() && sum != d.value()) {
    return c.error("split sizes {} add up to {}, not {}", dims_to_string(*split), sum, d.value());
  }
  return std::vector<Dim>(split->begin(), split->end());
}

Status infer_split(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_ASSIGN_OR_RETURN(int64_t n, split_parts(c));
  const Type& in = c.input_type(0);
  if (!in.has_rank()) {
    for (int64_t i = 0; i < n; ++i) c.set_output_tensor(size_t(i), dt, std::nullopt);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_dim_axis(c, c.node().attr_int("axis", 0), int64_t(in.shape->rank())));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> sizes, infer_split_sizes(c, (*in.shape)[size_t(axis)], n));
  std::optional<std::vector<Dim>> values = in.shape->rank() == 1 ? c.input_as_dims(0) : std::nullopt;
  size_t pos = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    Shape s = *in.shape;
    s[size_t(axis)] = sizes[i];
    c.set_output_tensor(i, dt, s);
    if (values && sizes[i].is_static() && pos + size_t(sizes[i].value()) <= values->size()) {
      c.set_output_dims_value(i, std::vector<Dim>(values->begin() + std::ptrdiff_t(pos),
                                                  values->begin() + std::ptrdiff_t(pos + size_t(sizes[i].value()))));
      pos += size_t(sizes[i].value());
    } else {
      values.reset();
    }
  }
  return Status::ok();
}

Status split_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(int64_t n, split_parts(c));
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(c, c.node().attr_int("axis", 0), int64_t(x.rank())));
  if (x.rank() == 0) return c.error("cannot split a scalar");
  const int64_t d = x.dim(size_t(axis));
  // An empty split input counts as absent (some exporters write one).
  const bool given = c.has_input(1) && c.tensor(1).numel() > 0;
  const std::vector<int64_t> sizes = given ? c.tensor(1).to_int_vector() : even_split(d, n);
  int64_t sum = 0;
  bool negative = false;
  for (int64_t s : sizes) {
    negative |= s < 0;
    sum += s;
  }
  if (int64_t(sizes.size()) != n || negative || sum != d) {
    return c.error("split sizes {} do not divide dim {} of input {} into {} parts", dims_to_string(sizes), axis,
                   x.summary(), n);
  }
  const std::vector<int64_t> in_strides = strides_of(x.dims());
  int64_t offset = 0;
  for (size_t i = 0; i < size_t(n); ++i) {
    std::vector<int64_t> dims = x.dims();
    dims[size_t(axis)] = sizes[i];
    if (c.has_output(i)) {
      KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(i, x.dtype(), dims));
      copy_strided(x, offset * in_strides[size_t(axis)], in_strides, *y, 0, strides_of(dims), dims);
    }
    offset += sizes[i];
  }
  return Status::ok();
}

// ---- Slice ----------------------------------------------------------------------------------

// The elements start, start + step, ... (count of them) that Slice takes from a dim of size d.
struct SliceRange {
  int64_t start = 0, step = 1, count = 0;
};

// ONNX clamping: negative start/end count from the back; then start is clamped to [0, d] (or
// [0, d-1] for negative steps) and end to [0, d] (or [-1, d-1]).
SliceRange slice_range(int64_t start, int64_t end, int64_t step, int64_t d) {
  step = std::max(step, -std::numeric_limits<int64_t>::max());  // so that -step cannot overflow
  if (start < 0) start += d;
  if (end < 0) end += d;
  SliceRange r;
  r.step = step;
  if (step > 0) {
    r.start = std::clamp<int64_t>(start, 0, d);
    end = std::clamp<int64_t>(end, 0, d);
    r.count = end > r.start ? (end - r.start - 1) / step + 1 : 0;
  } else {
    r.start = std::clamp<int64_t>(start, 0, d - 1);
    end = std::clamp<int64_t>(end, -1, d - 1);
    r.count = r.start > end ? (r.start - end - 1) / -step + 1 : 0;
  }
  return r;
}

// Slice's inputs, checked and expanded to one (start, end, step) per listed axis.
struct SliceArgs {
  std::vector<int64_t> starts, ends, axes, steps;
};

template <typename Ctx>
Status check_slice_args(const Ctx& c, SliceArgs& a, int64_t rank) {
  const size_t n = a.starts.size();
  if (a.axes.empty()) for (size_t k = 0; k < n; ++k) a.axes.push_back(int64_t(k));
  if (a.steps.empty()) a.steps.assign(n, 1);
  if (a.ends.size() != n || a.axes.size() != n || a.steps.size() != n) {
    return c.error("starts, ends, axes and steps must have the same length, got {}, {}, {}, {}", n, a.ends.size(),
                   a.axes.size(), a.steps.size());
  }
  KILN_RETURN_IF_ERROR(axes_mask(c, a.axes, rank).status());
  for (int64_t& ax : a.axes) ax = ax < 0 ? ax + rank : ax;
  for (int64_t s : a.steps) {
    if (s == 0) return c.error("slice steps must not be 0");
  }
  return Status::ok();
}

// A sliced dim that is symbolic: known only for open-ended slices with step 1 (x[:, 2:], x[-3:]),
// assuming the dim holds at least that many elements.
Dim symbolic_slice_dim(const Dim& d, int64_t start, int64_t end, int64_t step) {
  if (step != 1 || end < std::numeric_limits<int32_t>::max()) return Dim();
  return start >= 0 ? d - Dim(start) : Dim(-start);
}

Status infer_slice(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& in = c.input_type(0);
  if (!in.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  const int64_t rank = int64_t(in.shape->rank());
  std::optional<std::vector<int64_t>> starts = static_ints(c, 1), ends = static_ints(c, 2);
  std::optional<std::vector<int64_t>> axes = c.has_input(3) ? static_ints(c, 3) : std::vector<int64_t>{};
  std::optional<std::vector<int64_t>> steps = c.has_input(4) ? static_ints(c, 4) : std::vector<int64_t>{};
  if (!starts || !ends || !axes || !steps) {
    c.set_output_tensor(0, dt, Shape(std::vector<Dim>(size_t(rank))));
    return Status::ok();
  }
  SliceArgs a{*starts, *ends, *axes, *steps};
  KILN_RETURN_IF_ERROR(check_slice_args(c, a, rank));
  Shape out = *in.shape;
  std::vector<SliceRange> ranges(static_cast<size_t>(rank));
  for (size_t k = 0; k < size_t(rank); ++k) ranges[k].count = out[k].is_static() ? out[k].value() : -1;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    Dim& d = out[size_t(a.axes[i])];
    if (d.is_static()) {
      ranges[size_t(a.axes[i])] = slice_range(a.starts[i], a.ends[i], a.steps[i], d.value());
      d = Dim(ranges[size_t(a.axes[i])].count);
    } else {
      d = symbolic_slice_dim(d, a.starts[i], a.ends[i], a.steps[i]);
    }
  }
  c.set_output_tensor(0, dt, out);
  // Slicing a 1-D shape vector: pick the symbolic values.
  std::optional<std::vector<Dim>> values = rank == 1 ? c.input_as_dims(0) : std::nullopt;
  if (values && in.shape->dims[0].is_static() && int64_t(values->size()) == in.shape->dims[0].value()) {
    std::vector<Dim> picked;
    for (int64_t j = 0; j < ranges[0].count; ++j) picked.push_back((*values)[size_t(ranges[0].start + j * ranges[0].step)]);
    c.set_output_dims_value(0, std::move(picked));
  }
  return Status::ok();
}

Status slice_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const int64_t rank = int64_t(x.rank());
  SliceArgs a{c.tensor(1).to_int_vector(), c.tensor(2).to_int_vector(), optional_ints(c, 3), optional_ints(c, 4)};
  KILN_RETURN_IF_ERROR(check_slice_args(c, a, rank));
  // Per-axis source indices; untouched axes take every index.
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(rank));
  std::vector<SliceRange> ranges(static_cast<size_t>(rank));
  for (size_t k = 0; k < size_t(rank); ++k) ranges[k] = {0, 1, x.dim(k)};
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const size_t ax = size_t(a.axes[i]);
    ranges[ax] = slice_range(a.starts[i], a.ends[i], a.steps[i], x.dim(ax));
  }
  std::vector<int64_t> dims;
  for (size_t k = 0; k < size_t(rank); ++k) {
    dims.push_back(ranges[k].count);
    for (int64_t j = 0; j < ranges[k].count; ++j) maps[k].push_back(ranges[k].start + j * ranges[k].step);
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), dims));
  gather_axes(x, *y, maps);
  return Status::ok();
}

// ---- Tile -----------------------------------------------------------------------------------

Status infer_tile(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_rank(c, 1, 1));
  const Type& in = c.input_type(0);
  if (!in.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  Shape out = *in.shape;
  if (std::optional<std::vector<int64_t>> reps = static_ints(c, 1)) {
    if (reps->size() != out.rank()) {
      return c.error("repeats {} must have one entry per dim of input {}", dims_to_string(*reps), in.shape->to_string());
    }
    for (size_t k = 0; k < out.rank(); ++k) {
      if ((*reps)[k] < 0) return c.error("repeats must be >= 0, got {}", dims_to_string(*reps));
      out[k] = out[k] * Dim((*reps)[k]);
    }
  } else {
    out = Shape(std::vector<Dim>(out.rank()));
  }
  c.set_output_tensor(0, dt, std::move(out));
  return Status::ok();
}

Status tile_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  const std::vector<int64_t> reps = c.tensor(1).to_int_vector();
  if (reps.size() != x.rank()) return c.error("repeats {} must have one entry per dim of input {}", dims_to_string(reps), x.summary());
  std::vector<int64_t> dims;
  for (size_t k = 0; k < x.rank(); ++k) {
    int64_t n;
    if (reps[k] < 0 || __builtin_mul_overflow(x.dim(k), reps[k], &n)) {
      return c.error("cannot tile input {} by repeats {}", x.summary(), dims_to_string(reps));
    }
    dims.push_back(n);
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), dims));
  // An empty result may still have a huge dim (repeats 0 on one axis, 2^28 on another): no index
  // maps for it (the run fuzzer's 2 GiB of them, 2026-11-28).
  if (y->numel() == 0) return Status::ok();
  std::vector<std::vector<int64_t>> maps(x.rank());
  for (size_t k = 0; k < x.rank(); ++k) {
    for (int64_t i = 0; i < dims[k]; ++i) maps[k].push_back(i % x.dim(k));
  }
  gather_axes(x, *y, maps);
  return Status::ok();
}

// ---- Trilu ----------------------------------------------------------------------------------

Status infer_trilu(InferCtx& c) {
  const Type& in = c.input_type(0);
  if (in.has_rank() && in.shape->rank() < 2) return c.error("input must have rank >= 2, got {}", in.to_string());
  KILN_RETURN_IF_ERROR(c.tensor_dtype(0).status());
  c.set_output(0, in);
  return Status::ok();
}

Status trilu_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() < 2) return c.error("input must have rank >= 2, got {}", x.summary());
  int64_t k = 0;
  if (c.has_input(1)) {
    if (c.tensor(1).numel() != 1) return c.error("k must be a scalar, got {}", c.tensor(1).summary());
    k = c.tensor(1).as_int(0);
  }
  const bool upper = c.node().attr_int("upper", 1) != 0;
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), x.dims()));
  const int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
  const int64_t batch = rows * cols == 0 ? 0 : x.numel() / (rows * cols);
  visit_storage(x.dtype(), [&]<typename U>() {
    const U* s = static_cast<const U*>(x.raw());
    U* d = static_cast<U*>(y->raw());
    // Element (i, j) is kept when it lies on the chosen side of diagonal k (j - i == k); others stay 0.
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t off = (b * rows + i) * cols + j;
          if (upper ? j - i >= k : j - i <= k) d[off] = s[off];
        }
      }
    }
  });
  return Status::ok();
}

// ---- ReverseSequence --------------------------------------------------------------------------

// time_axis and batch_axis must be 0 and 1 in some order.
template <typename Ctx>
Expected<std::pair<int64_t, int64_t>> time_batch_axes(const Ctx& c) {
  const int64_t t = c.node().attr_int("time_axis", 0), b = c.node().attr_int("batch_axis", 1);
  if (!((t == 0 && b == 1) || (t == 1 && b == 0))) {
    return c.error("time_axis and batch_axis must be 0 and 1 (in either order), got {} and {}", t, b);
  }
  return std::pair{t, b};
}

Status infer_reverse_sequence(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(time_batch_axes(c).status());
  KILN_RETURN_IF_ERROR(check_rank(c, 1, 1));
  const Type& in = c.input_type(0);
  if (in.has_rank() && in.shape->rank() < 2) return c.error("input must have rank >= 2, got {}", in.to_string());
  c.set_output_tensor(0, dt, in.shape);
  return Status::ok();
}

Status reverse_sequence_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() < 2) return c.error("input must have rank >= 2, got {}", x.summary());
  KILN_ASSIGN_OR_RETURN(auto axes, time_batch_axes(c));
  const int64_t time_axis = axes.first, batch_axis = axes.second;  // not bindings: captured below
  const std::vector<int64_t> lens = c.tensor(1).to_int_vector();
  const int64_t steps = x.dim(size_t(time_axis)), batch = x.dim(size_t(batch_axis));
  if (int64_t(lens.size()) != batch) return c.error("sequence_lens has {} entries for batch {}", lens.size(), batch);
  for (int64_t l : lens) {
    if (l < 0 || l > steps) return c.error("sequence length {} is out of range [0, {}]", l, steps);
  }
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), x.dims()));
  const std::vector<int64_t> strides = strides_of(x.dims());
  const int64_t inner = strides[1];  // elements per (time, batch) pair: the dims after the first two
  visit_storage(x.dtype(), [&]<typename U>() {
    const U* s = static_cast<const U*>(x.raw());
    U* d = static_cast<U*>(y->raw());
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < steps; ++t) {
        const int64_t from = t < lens[size_t(b)] ? lens[size_t(b)] - 1 - t : t;
        const U* src = s + from * strides[size_t(time_axis)] + b * strides[size_t(batch_axis)];
        std::copy(src, src + inner, d + t * strides[size_t(time_axis)] + b * strides[size_t(batch_axis)]);
      }
    }
  });
  return Status::ok();
}

}  // namespace

void register_slice_ops(OpRegistry& r) {
  r.def(OpKind::kConcat, {.inputs = {1, kVariadic},
                          .attrs = {{"axis", Attribute::Kind::kInt, true}},
                          .infer = infer_concat,
                          .cpu = concat_cpu});
  r.def(OpKind::kSplit, {.inputs = {1, 2},
                         .outputs = {1, kVariadic},
                         .attrs = {{"axis", Attribute::Kind::kInt}, {"num_outputs", Attribute::Kind::kInt}},
                         .infer = infer_split,
                         .cpu = split_cpu});
  r.def(OpKind::kSlice, {.inputs = {3, 5}, .infer = infer_slice, .cpu = slice_cpu});
  r.def(OpKind::kTile, {.inputs = {2, 2}, .infer = infer_tile, .cpu = tile_cpu});
  r.def(OpKind::kTrilu,
        {.inputs = {1, 2}, .attrs = {{"upper", Attribute::Kind::kInt}}, .infer = infer_trilu, .cpu = trilu_cpu});
  r.def(OpKind::kReverseSequence, {.inputs = {2, 2},
                                   .attrs = {{"time_axis", Attribute::Kind::kInt}, {"batch_axis", Attribute::Kind::kInt}},
                                   .infer = infer_reverse_sequence,
                                   .cpu = reverse_sequence_cpu});
  register_shape_pad_ops(r);
}

}  // namespace kiln
