// Op family: shape. This file: ops that move elements to a new layout (Transpose, Expand,
// DepthToSpace, SpaceToDepth). Each is one strided copy (shape_util.h), so every dtype works.
#include <numeric>

#include "ops/shape_util.h"

namespace kiln {

namespace {

// ---- Transpose ------------------------------------------------------------------------------

// The perm attribute, or the reversed axes by default; checked to be a permutation of [0, rank).
template <typename Ctx>
Expected<std::vector<int64_t>> transpose_perm(const Ctx& c, size_t rank) {
  std::vector<int64_t> perm(rank);
  std::iota(perm.rbegin(), perm.rend(), 0);
  perm = c.node().attr_ints("perm", perm);
  std::vector<bool> seen(rank, false);
  bool ok = perm.size() == rank;
  for (int64_t p : perm) {
    ok = ok && p >= 0 && p < int64_t(rank) && !seen[size_t(p)];
    if (ok) seen[size_t(p)] = true;
  }
  if (!ok) return c.error("perm {} is not a permutation of the {} axes", dims_to_string(perm), rank);
  return perm;
}

Status infer_transpose(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  const Type& in = c.input_type(0);
  if (!in.has_rank()) {
    c.set_output_tensor(0, dt, std::nullopt);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, transpose_perm(c, in.shape->rank()));
  std::vector<Dim> out;
  for (int64_t p : perm) out.push_back((*in.shape)[size_t(p)]);
  c.set_output_tensor(0, dt, Shape(std::move(out)));
  return Status::ok();
}

Status transpose_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> perm, transpose_perm(c, x.rank()));
  KILN_ASSIGN_OR_RETURN(Tensor y, transpose_tensor(x, perm));
  c.set_output(0, std::move(y));
  return Status::ok();
}

// ---- Expand ---------------------------------------------------------------------------------

Status infer_expand(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_rank(c, 1, 1));
  const Type& in = c.input_type(0);
  std::optional<std::vector<Dim>> target = c.input_as_dims(1);
  std::optional<Shape> out;
  if (target && in.has_rank()) {
    KILN_ASSIGN_OR_RETURN(out, broadcast_shapes(c, {*in.shape, Shape(*target)}));
  } else if (const Type& st = c.input_type(1); in.has_rank() && st.has_rank() && (*st.shape)[0].is_static()) {
    out = Shape(std::vector<Dim>(std::max(in.shape->rank(), size_t((*st.shape)[0].value()))));
  }
  c.set_output_tensor(0, dt, std::move(out));
  return Status::ok();
}

Status expand_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, broadcast_dims(c, {x.dims(), c.tensor(1).to_int_vector()}));
  KILN_ASSIGN_OR_RETURN(Tensor * y, c.alloc_output(0, x.dtype(), dims));
  copy_strided(x, 0, broadcast_strides(x.dims(), dims), *y, 0, strides_of(dims), dims);
  return Status::ok();
}

// ---- DepthToSpace / SpaceToDepth --------------------------------------------------------------
//
// Both are a reshape to 6-D, a transpose and a reshape back to 4-D (the ONNX spec's definition).

struct BlockMove {
  std::vector<int64_t> view;  // the 6-D view of the input
  std::vector<int64_t> perm;  // the transpose applied to it
  std::vector<int64_t> out;   // the 4-D output
};

// n, c, h, w: the input dims; b: blocksize.
BlockMove depth_to_space_move(bool crd, int64_t n, int64_t c, int64_t h, int64_t w, int64_t b) {
  const int64_t cd = c / (b * b);
  if (crd) return {{n, cd, b, b, h, w}, {0, 1, 4, 2, 5, 3}, {n, cd, h * b, w * b}};
  return {{n, b, b, cd, h, w}, {0, 3, 4, 1, 5, 2}, {n, cd, h * b, w * b}};
}

BlockMove space_to_depth_move(bool crd, int64_t n, int64_t c, int64_t h, int64_t w, int64_t b) {
  std::vector<int64_t> perm = crd ? std::vector<int64_t>{0, 1, 3, 5, 2, 4} : std::vector<int64_t>{0, 3, 5, 1, 2, 4};
  return {{n, c, h / b, b, w / b, b}, perm, {n, c * b * b, h / b, w / b}};
}

template <typename Ctx>
Expected<bool> block_mode_is_crd(const Ctx& c) {
  const std::string mode = c.node().attr_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") return c.error("mode must be DCR or CRD, got '{}'", mode);
  return mode == "CRD";
}

template <typename Ctx>
Expected<int64_t> blocksize(const Ctx& c) {
  const int64_t b = c.node().attr_int("blocksize", 0);
  if (b <= 0) return c.error("blocksize must be positive, got {}", b);
  return b;
}

template <bool kToSpace>
Status infer_block_move(InferCtx& c) {
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  KILN_RETURN_IF_ERROR(check_rank(c, 0, 4));
  KILN_RETURN_IF_ERROR(block_mode_is_crd(c).status());
  KILN_ASSIGN_OR_RETURN(int64_t b, blocksize(c));
  const Type& in = c.input_type(0);
  if (!in.has_rank()) {
    c.set_output_tensor(0, dt, Shape(std::vector<Dim>(4)));
    return Status::ok();
  }
  const Shape& s = *in.shape;
  // The dim that must divide by the block: channels for DepthToSpace, height and width otherwise.
  for (size_t k : kToSpace ? std::vector<size_t>{1} : std::vector<size_t>{2, 3}) {
    const int64_t div = kToSpace ? b * b : b;
    if (s[k].is_static() && s[k].value() % div != 0) {
      return c.error("dim {} of input {} must be divisible by {}", k, s.to_string(), div);
    }
  }
  if (kToSpace) {
    c.set_output_tensor(0, dt, Shape({s[0], s[1] / Dim(b * b), s[2] * Dim(b), s[3] * Dim(b)}));
  } else {
    c.set_output_tensor(0, dt, Shape({s[0], s[1] * Dim(b * b), s[2] / Dim(b), s[3] / Dim(b)}));
  }
  return Status::ok();
}

template <bool kToSpace>
Status block_move_cpu(KernelCtx& c) {
  const Tensor& x = c.tensor(0);
  if (x.rank() != 4) return c.error("input must have rank 4, got {}", x.summary());
  KILN_ASSIGN_OR_RETURN(bool crd, block_mode_is_crd(c));
  KILN_ASSIGN_OR_RETURN(int64_t b, blocksize(c));
  const int64_t n = x.dim(0), ch = x.dim(1), h = x.dim(2), w = x.dim(3);
  if (kToSpace ? ch % (b * b) != 0 : (h % b != 0 || w % b != 0)) {
    return c.error("input {} does not divide into blocks of {}", x.summary(), b);
  }
  const BlockMove m = kToSpace ? depth_to_space_move(crd, n, ch, h, w, b) : space_to_depth_move(crd, n, ch, h, w, b);
  KILN_ASSIGN_OR_RETURN(Tensor y, transpose_tensor(x.reshaped(m.view), m.perm));
  c.set_output(0, y.reshaped(m.out));
  return Status::ok();
}

OpDef block_move_def(InferFn infer, CpuKernelFn cpu) {
  return {.inputs = {1, 1},
          .attrs = {{"blocksize", Attribute::Kind::kInt, true}, {"mode", Attribute::Kind::kString}},
          .infer = infer,
          .cpu = cpu};
}

}  // namespace

void register_shape_layout_ops(OpRegistry& r) {
  r.def(OpKind::kTranspose, {.inputs = {1, 1},
                             .attrs = {{"perm", Attribute::Kind::kInts}},
                             .infer = infer_transpose,
                             .cpu = transpose_cpu});
  r.def(OpKind::kExpand, {.inputs = {2, 2}, .infer = infer_expand, .cpu = expand_cpu});
  r.def(OpKind::kDepthToSpace, block_move_def(infer_block_move<true>, block_move_cpu<true>));
  r.def(OpKind::kSpaceToDepth, block_move_def(infer_block_move<false>, block_move_cpu<false>));
}

}  // namespace kiln
