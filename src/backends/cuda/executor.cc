// Parameter encoding and the binding loop (executor.h).
#include "backends/cuda/executor.h"

namespace kiln::cuda {

void put(ByteWriter& w, Ref r) {
  w.u8(r.weight);
  w.put(r.id);
}

void put(ByteWriter& w, const k::NdStrides& s) {
  w.put(int32_t(s.rank));
  for (int i = 0; i < s.rank; ++i) {
    w.i64(s.dims[i]);
    w.i64(s.strides[i]);
  }
}

void put(ByteWriter& w, const std::vector<int64_t>& v) { w.vec(v); }

Params::Params(const DeviceStep& s, const DevicePlan& p) : s_(s), p_(p), r_(s.params, "parameters") {}

Ref Params::opt_ref() {
  Ref r;
  r.weight = r_.get_in<uint8_t>("a buffer reference", 0, 1) != 0;
  r.id = r_.get<int32_t>("a buffer reference");
  if (r.id < -1 || (r.id >= 0 && size_t(r.id) >= (r.weight ? p_.weights.size() : p_.buffer_bytes.size()))) {
    r_.fail("a buffer reference", "outside the plan");
    return Ref{};
  }
  return r;
}

Ref Params::ref() {
  Ref r = opt_ref();
  if (r.id < 0) r_.fail("a buffer reference", "missing");
  return r;
}

k::DT Params::dt() { return k::DT(r_.get_in<int32_t>("a dtype", 0, int32_t(k::kLastDT))); }

k::NdStrides Params::nd() {
  k::NdStrides s;
  s.rank = r_.get_in<int32_t>("a rank", 0, k::kMaxRank);
  for (int i = 0; i < s.rank; ++i) {
    s.dims[i] = r_.get<int64_t>("a dim");
    s.strides[i] = r_.get<int64_t>("a stride");
    if (s.dims[i] < 0) r_.fail("a dim", "negative");
  }
  return s;
}

std::vector<int64_t> Params::dims() {
  std::vector<int64_t> v = r_.vec<int64_t>("dims");
  for (int64_t d : v) {
    if (d < 0) r_.fail("dims", "negative");
  }
  return v;
}

Status Params::done() {
  if (r_.ok() && r_.left() != 0) return KILN_ERROR(kInvalidModel, "step '{}': {} unread parameter bytes", s_.label, r_.left());
  if (!r_.ok()) return KILN_ERROR(kInvalidModel, "step '{}': {}", s_.label, r_.failed());
  return Status::ok();
}

namespace {

const std::map<StepOp, BindFn>& binders() {
  static const std::map<StepOp, BindFn> table = [] {
    std::map<StepOp, BindFn> t;
    register_gemm_binders(t);
    register_conv_binders(t);
    register_elementwise_binders(t);
    register_data_binders(t);
    register_norm_binders(t);
    register_attention_binders(t);
    register_fused_binders(t);
    register_resample_binders(t);
    register_conv_transpose_binders(t);
    register_pool_binders(t);
    register_rnn_binders(t);
    register_classic_binders(t);
    register_random_binders(t);
    register_conv_nd_binders(t);
    register_train_mode_binders(t);
    register_fft_binders(t);
    register_integer_binders(t);
    register_host_binders(t);
    register_quant_binders(t);
    register_loss_binders(t);
    register_collective_binders(t);
    return t;
  }();
  return table;
}

}  // namespace

Expected<std::vector<StepFn>> bind_plan(BindCtx& ctx) {
  const auto& table = binders();
  std::vector<StepFn> fns;
  fns.reserve(ctx.plan.steps.size());
  for (const DeviceStep& s : ctx.plan.steps) {
    auto it = table.find(StepOp(s.kind));
    if (it == table.end()) {
      return KILN_ERROR(kInvalidModel, "step '{}' has kind {}, which this kiln cannot run", s.label, s.kind);
    }
    Params in(s, ctx.plan);
    Expected<StepFn> fn = it->second(in, ctx);
    if (!fn) return fn.status().code() == ErrorCode::kInvalidModel ? fn.status() : fn.status().with_context(s.label);
    fns.push_back(std::move(*fn));
  }
  return fns;
}

}  // namespace kiln::cuda
