// Helpers shared by the control-flow family (If, Loop, Scan, SequenceMap, Sequence*, Optional*):
// type joins for inference, re-running a body's inference until loop-carried types settle, and
// the tensor copies (slice along an axis, concatenate, stack) the kernels need.
#pragma once

#include <vector>

#include "ops/op_util.h"

namespace kiln {

// The most specific type that covers both a and b: equal dims stay, differing dims become
// unknown, differing ranks give an unknown rank. Different kinds or dtypes give an unknown Type,
// except that optional<X> joined with Y is optional<join(X, Y)> (a Loop may carry an empty
// optional into a body that returns a plain value).
Type join_types(const Type& a, const Type& b);

// Infers a loop body whose inputs are `before`, the `carried` values, then `after`, and whose
// outputs are `outputs_before` values, then the carried ones. The carried types are widened (join_types)
// until the body maps them onto themselves, because a carried value may change shape between
// iterations and the CPU executor checks every value against its inferred type. Returns the
// body's output types from the last (settled) run; `carried` holds the settled input types.
Expected<std::vector<Type>> infer_body_fixpoint(const InferCtx& c, const Graph& body, const std::vector<Type>& before,
                                                std::vector<Type>& carried, const std::vector<Type>& after,
                                                size_t outputs_before);

// A tensor body output widened by one dim `d` inserted at `axis` (scan outputs).
Type with_inserted_dim(const Type& t, size_t axis, Dim d);

// Element type of a sequence input; an unknown Type when the input's type is not known yet.
Expected<Type> sequence_elem_type(const InferCtx& c, size_t i);

// ---- tensor copies for the kernels -----------------------------------------------------------

// Elements [start, start + len) of `t` along `axis`.
Expected<Tensor> slice_axis(const Tensor& t, size_t axis, int64_t start, int64_t len);
// Concatenates tensors of equal dtype and rank along `axis`; other dims must agree.
Expected<Tensor> concat_axis(const KernelCtx& c, const std::vector<Tensor>& items, size_t axis);
// Stacks tensors of equal dims along a new axis `axis` (0 <= axis <= rank).
Expected<Tensor> stack_axis(const KernelCtx& c, const std::vector<Tensor>& items, size_t axis);
// A tensor of the (tensor) type `t` with every dim that is not static set to 0: the value of a
// scan output after zero iterations.
Expected<Tensor> empty_of_type(const KernelCtx& c, const Type& t);

// The sequence/optional ops, registered from register_control_ops.
void register_control_sequence_ops(OpRegistry& r);

}  // namespace kiln
