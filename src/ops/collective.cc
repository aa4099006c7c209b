// AllReduce and AllGather: the collectives the tensor-parallel pass (passes/tensor_parallel.cc)
// puts between the ranks' shards. Shape inference, and the reference CPU kernels over the thread
// communicator (ops/collective.h); the CUDA backend runs them through NCCL (lower_collective.cc).
//
//   %y = ai.kiln.AllReduce(%x) {ranks = 2}           sum of every rank's %x, same type
//   %y = ai.kiln.AllGather(%x) {axis = 2, ranks = 2} ranks' %x concatenated along axis 2
#include "ops/collective.h"

#include <cstring>

#include <fmt/ranges.h>

#include "ops/op_registry.h"

namespace kiln {

namespace {

thread_local CommSlot t_slot;

Status same_everywhere(const std::vector<const Tensor*>& posted, const char* what) {
  const Tensor& a = *posted[0];
  for (size_t r = 1; r < posted.size(); ++r) {
    if (posted[r]->dtype() != a.dtype() || posted[r]->dims() != a.dims()) {
      return KILN_ERROR(kInvalidArgument, "{}: rank {} holds {}{}, rank 0 {}{}", what, r, dtype_name(posted[r]->dtype()),
                        fmt::join(posted[r]->dims(), "x"), dtype_name(a.dtype()), fmt::join(a.dims(), "x"));
    }
  }
  return Status::ok();
}

}  // namespace

const CommSlot& current_comm() { return t_slot; }

ScopedComm::ScopedComm(ThreadComm* comm, int rank) : saved_(t_slot) { t_slot = {comm, rank}; }
ScopedComm::~ScopedComm() { t_slot = saved_; }

Status ThreadComm::wait_phase(std::unique_lock<std::mutex>& lock) {
  const uint64_t phase = phase_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++phase_;
    cv_.notify_all();
  } else {
    cv_.wait(lock, [&] { return phase_ != phase || aborted_; });
  }
  if (aborted_) return KILN_ERROR(kInternal, "collective aborted: another rank failed");
  return Status::ok();
}

void ThreadComm::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

template <typename F>
Status ThreadComm::exchange(int rank, const Tensor& x, F&& f) {
  if (rank < 0 || rank >= size_) return KILN_ERROR(kInternal, "rank {} of a {}-rank communicator", rank, size_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return KILN_ERROR(kInternal, "collective aborted: another rank failed");
    posted_[size_t(rank)] = &x;
    KILN_RETURN_IF_ERROR(wait_phase(lock));
  }
  // Every rank has posted; nobody posts again until every rank has passed the second barrier.
  Status s = f(posted_);
  std::unique_lock<std::mutex> lock(mu_);
  Status w = wait_phase(lock);
  return s ? w : s;
}

Expected<Tensor> ThreadComm::all_reduce(int rank, const Tensor& x) {
  Tensor out;
  KILN_RETURN_IF_ERROR(exchange(rank, x, [&](const std::vector<const Tensor*>& posted) -> Status {
    KILN_RETURN_IF_ERROR(same_everywhere(posted, "AllReduce"));
    KILN_ASSIGN_OR_RETURN(out, Tensor::create(x.dtype(), x.dims()));
    return visit_dtype(x.dtype(), [&]<typename T>() -> Status {
      if constexpr (!is_numeric_v<T> || is_small_int_v<T> || std::is_same_v<T, float4e2m1>) {
        return KILN_ERROR(kUnsupported, "AllReduce of {}", dtype_name(x.dtype()));
      } else {
        T* o = out.data<T>();
        for (int64_t i = 0; i < x.numel(); ++i) {
          compute_t<T> acc = 0;
          for (const Tensor* t : posted) acc += compute_t<T>(t->data<T>()[i]);  // rank order: every rank agrees
          o[i] = T(acc);
        }
        return Status::ok();
      }
    });
  }));
  return out;
}

Expected<Tensor> ThreadComm::all_gather(int rank, const Tensor& x, int64_t axis) {
  Tensor out;
  KILN_RETURN_IF_ERROR(exchange(rank, x, [&](const std::vector<const Tensor*>& posted) -> Status {
    KILN_RETURN_IF_ERROR(same_everywhere(posted, "AllGather"));
    if (axis < 0 || axis >= int64_t(x.rank())) return KILN_ERROR(kInvalidArgument, "AllGather axis {} of rank {}", axis, x.rank());
    if (x.dtype() == DType::kString || dtype_size(x.dtype()) == 0) return KILN_ERROR(kUnsupported, "AllGather of {}", dtype_name(x.dtype()));
    std::vector<int64_t> dims = x.dims();
    dims[size_t(axis)] *= size_;
    KILN_ASSIGN_OR_RETURN(out, Tensor::create(x.dtype(), dims));
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= x.dim(size_t(i));
    const size_t chunk = outer ? x.nbytes() / size_t(outer) : 0;
    auto* o = static_cast<char*>(out.raw());
    for (int64_t i = 0; i < outer; ++i) {
      for (const Tensor* t : posted) {
        std::memcpy(o, static_cast<const char*>(t->raw()) + size_t(i) * chunk, chunk);
        o += chunk;
      }
    }
    return Status::ok();
  }));
  return out;
}

namespace {

int64_t ranks_of(const Node& n) { return n.attr_int("ranks", 0); }

Status infer_all_reduce(InferCtx& c) {
  if (ranks_of(c.node()) < 1) return c.error("ranks must be at least 1, got {}", ranks_of(c.node()));
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  c.set_output_tensor(0, dt, c.input_type(0).shape);
  return Status::ok();
}

Status infer_all_gather(InferCtx& c) {
  const int64_t ranks = ranks_of(c.node());
  if (ranks < 1) return c.error("ranks must be at least 1, got {}", ranks);
  KILN_ASSIGN_OR_RETURN(DType dt, c.tensor_dtype(0));
  std::optional<Shape> s = c.input_type(0).shape;
  if (s) {
    const int64_t axis = c.node().attr_int("axis", 0);
    if (axis < 0 || axis >= int64_t(s->rank())) return c.error("axis {} out of range for rank {}", axis, s->rank());
    Dim& d = s->dims[size_t(axis)];
    d = d * Dim(ranks);
  }
  c.set_output_tensor(0, dt, std::move(s));
  return Status::ok();
}

// Outside a tensor-parallel session a graph of one rank is the whole model, and the collectives are
// copies; a rank of several without its peers is an error, never a silently partial sum.
Expected<const CommSlot*> comm_for(KernelCtx& c) {
  const CommSlot& s = current_comm();
  const int64_t ranks = ranks_of(c.node());
  if (ranks == 1 && !s.comm) return nullptr;
  if (!s.comm) return c.error("one rank of a {}-rank tensor-parallel engine runs only beside its peers", ranks);
  if (s.comm->size() != ranks) return c.error("built for {} ranks, running among {}", ranks, s.comm->size());
  return &s;
}

Status all_reduce_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(const CommSlot* s, comm_for(c));
  if (!s) {
    c.set_output(0, c.input(0));
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Tensor y, s->comm->all_reduce(s->rank, c.tensor(0)));
  c.set_output(0, Data(std::move(y)));
  return Status::ok();
}

Status all_gather_cpu(KernelCtx& c) {
  KILN_ASSIGN_OR_RETURN(const CommSlot* s, comm_for(c));
  if (!s) {
    c.set_output(0, c.input(0));
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Tensor y, s->comm->all_gather(s->rank, c.tensor(0), c.node().attr_int("axis", 0)));
  c.set_output(0, Data(std::move(y)));
  return Status::ok();
}

}  // namespace

void register_collective_ops(OpRegistry& r) {
  r.def(OpKind::kAllReduce, {.inputs = {1, 1}, .outputs = {1, 1}, .attrs = {{"ranks", Attribute::Kind::kInt, true}},
                             .infer = infer_all_reduce, .cpu = all_reduce_cpu});
  r.def(OpKind::kAllGather, {.inputs = {1, 1}, .outputs = {1, 1},
                             .attrs = {{"axis", Attribute::Kind::kInt, true}, {"ranks", Attribute::Kind::kInt, true}},
                             .infer = infer_all_gather, .cpu = all_gather_cpu});
}

}  // namespace kiln
