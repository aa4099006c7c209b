// AllReduce and AllGather (the tensor-parallel pass's collectives) -> NCCL on the session's
// communicator (RunCtx::comm), enqueued on its stream and so captured in its CUDA graph like any
// kernel. A gather along an inner axis lands rank-major in a scratch buffer ([ranks, outer, chunk],
// as NCCL writes it) and one strided copy puts each rank's chunk in place.
#include "backends/cuda/lower.h"
#include "backends/cuda/nccl.h"

namespace kiln::cuda {

namespace {

std::optional<ncclDataType_t> nccl_dt(k::DT d) {
  switch (d) {
    case k::DT::kF32: return ncclFloat32;
    case k::DT::kF16: return ncclFloat16;
    case k::DT::kBF16: return ncclBfloat16;
    case k::DT::kF64: return ncclFloat64;
    case k::DT::kI64: return ncclInt64;
    case k::DT::kI32: return ncclInt32;
    case k::DT::kI8: return ncclInt8;
    case k::DT::kU8: case k::DT::kBool: return ncclUint8;
    case k::DT::kU32: return ncclUint32;
    case k::DT::kU64: return ncclUint64;
    case k::DT::kI16: case k::DT::kU16: return std::nullopt;
  }
  return std::nullopt;
}

Status lower_all_reduce(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (!nccl_dt(x->dt) || x->dt == k::DT::kBool) KILN_UNSUPPORTED("AllReduce of {}", dtype_name(x->ir_dtype));
  const DevValue& y = L.define(n.outputs[0]);
  ByteWriter p;
  p.put(int32_t(x->dt));
  p.i64(x->numel());
  put(p, x->ref);
  put(p, y.ref);
  L.emit(&n, fmt::format("nccl all-reduce {} elements", x->numel()), {read_id(x)}, {y.ref.id}, StepOp::kAllReduce,
         std::move(p));
  return Status::ok();
}

Status lower_all_gather(Lowering& L, const Node& n) {
  KILN_ASSIGN_OR_RETURN(const DevValue* x, L.rowmajor(n.inputs[0]));
  if (!nccl_dt(x->dt)) KILN_UNSUPPORTED("AllGather of {}", dtype_name(x->ir_dtype));
  const int64_t ranks = n.attr_int("ranks", 1), axis = n.attr_int("axis", 0);
  if (axis < 0 || axis >= int64_t(x->dims.size()) || ranks < 1) KILN_UNSUPPORTED("axis {} of rank {}", axis, x->dims.size());
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x->dims[size_t(i)];
  const int64_t chunk = outer ? x->numel() / outer : 0;
  const DevValue& y = L.define(n.outputs[0]);
  const int tmp = outer > 1 ? L.scratch(y.bytes()) : -1;
  ByteWriter p;
  p.put(int32_t(x->dt));
  p.i64(x->numel());
  put(p, x->ref);
  put(p, tmp >= 0 ? Ref{false, tmp} : y.ref);
  L.emit(&n, fmt::format("nccl all-gather {} x {} elements", ranks, x->numel()), {read_id(x)}, {tmp >= 0 ? tmp : y.ref.id},
         StepOp::kAllGather, std::move(p));
  if (tmp >= 0) {
    // scratch [ranks, outer, chunk] -> y [outer, ranks, chunk]
    const k::NdStrides src = nd({outer, ranks, chunk}, {chunk, outer * chunk, 1});
    const k::NdStrides dst = nd({outer, ranks, chunk}, {ranks * chunk, chunk, 1});
    emit_copy_nd(L, &n, "kernel copy (ranks' parts in place)", k::dt_size(x->dt), Ref{false, tmp}, 0, src, y.ref, 0, dst);
  }
  return Status::ok();
}

Expected<StepFn> bind_collective(Params& in, BindCtx&) {
  const bool reduce = in.step().kind == uint16_t(StepOp::kAllReduce);
  const k::DT dt = in.dt();
  const int64_t count = in.i64();
  const Ref x = in.ref(), y = in.ref();
  KILN_RETURN_IF_ERROR(in.done());
  auto ndt = nccl_dt(dt);
  if (!ndt || count < 0) return KILN_ERROR(kInvalidModel, "step '{}': a malformed collective", in.step().label);
  KILN_ASSIGN_OR_RETURN(const Nccl* api, nccl_library());
  const std::string label = in.step().label;
  return StepFn([=](const RunCtx& c) -> Status {
    if (!c.comm) return KILN_ERROR(kInvalidArgument, "step '{}' runs only in a tensor-parallel session", label);
    auto comm = static_cast<ncclComm_t>(c.comm);
    if (reduce) return nccl_status(api->all_reduce(c.ptr(x), c.ptr(y), size_t(count), *ndt, ncclSum, comm, c.stream), "ncclAllReduce");
    return nccl_status(api->all_gather(c.ptr(x), c.ptr(y), size_t(count), *ndt, comm, c.stream), "ncclAllGather");
  });
}

}  // namespace

void register_collective_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kAllReduce] = lower_all_reduce;
  t[OpKind::kAllGather] = lower_all_gather;
}

void register_collective_binders(std::map<StepOp, BindFn>& t) {
  t[StepOp::kAllReduce] = bind_collective;
  t[StepOp::kAllGather] = bind_collective;
}

}  // namespace kiln::cuda
