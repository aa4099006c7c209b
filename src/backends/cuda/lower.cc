// Lowering state: device values, layout conversions, weights and step emission.
#include "backends/cuda/lower.h"
#include "backends/cuda/weight_pool.h"

#include <algorithm>
#include <cstring>

#include <fmt/ranges.h>

#include "ops/create_cast.h"
#include "ops/op_registry.h"

namespace kiln::cuda {

int64_t DevValue::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

std::vector<int64_t> DevValue::strides() const {
  if (layout == Layout::kRowMajor) return contiguous_strides(dims);
  // Logical [N,C,H,W] stored as N,H,W,C.
  int64_t c = dims[1], h = dims[2], w = dims[3];
  return {h * w * c, 1, w * c, c};
}

k::NdStrides nd(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  k::NdStrides r;
  r.rank = int(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    r.dims[i] = dims[i];
    r.strides[i] = strides[i];
  }
  return r;
}

std::vector<int64_t> broadcast_strides(const DevValue& v, const std::vector<int64_t>& out_dims) {
  std::vector<int64_t> vs = v.strides();
  std::vector<int64_t> s(out_dims.size(), 0);
  size_t off = out_dims.size() - v.dims.size();
  for (size_t i = 0; i < v.dims.size(); ++i) s[off + i] = v.dims[i] == 1 ? 0 : vs[i];
  return s;
}

std::optional<k::DT> to_kdt(DType d) {
  switch (d) {
    case DType::kFloat32: return k::DT::kF32;
    case DType::kFloat16: return k::DT::kF16;
    case DType::kBFloat16: return k::DT::kBF16;
    case DType::kFloat64: return k::DT::kF64;
    case DType::kInt64: return k::DT::kI64;
    case DType::kInt32: return k::DT::kI32;
    case DType::kInt8: return k::DT::kI8;
    case DType::kUInt8: return k::DT::kU8;
    case DType::kBool: return k::DT::kBool;
    case DType::kInt16: return k::DT::kI16;
    case DType::kUInt16: return k::DT::kU16;
    case DType::kUInt32: return k::DT::kU32;
    case DType::kUInt64: return k::DT::kU64;
    default: return std::nullopt;
  }
}

Expected<std::vector<int64_t>> exact_dims(const Value* v) {
  if (!v->type.shape) KILN_UNSUPPORTED("'{}' has no known shape", v->name);
  auto d = v->type.shape->static_dims();
  if (!d) KILN_UNSUPPORTED("'{}' has shape {}", v->name, v->type.shape->to_string());
  return *d;
}

DType ir_dtype_of(k::DT d) {
  switch (d) {
    case k::DT::kF32: return DType::kFloat32;
    case k::DT::kF16: return DType::kFloat16;
    case k::DT::kBF16: return DType::kBFloat16;
    case k::DT::kF64: return DType::kFloat64;
    case k::DT::kI64: return DType::kInt64;
    case k::DT::kI32: return DType::kInt32;
    case k::DT::kI8: return DType::kInt8;
    case k::DT::kU8: return DType::kUInt8;
    case k::DT::kBool: return DType::kBool;
    case k::DT::kI16: return DType::kInt16;
    case k::DT::kU16: return DType::kUInt16;
    case k::DT::kU32: return DType::kUInt32;
    case k::DT::kU64: return DType::kUInt64;
  }
  return DType::kFloat32;
}

Expected<Tensor> convert_tensor(const Tensor& t, DType to) {
  if (t.dtype() == to) return t;
  KILN_ASSIGN_OR_RETURN(Tensor c, Tensor::create(to, t.dims()));
  // Weights of a half build (f32 -> f16/bf16) are most of a model's bytes: a typed loop on the
  // thread pool, not the per-element dispatch of the general path below.
  if (t.dtype() == DType::kFloat32 && (to == DType::kFloat16 || to == DType::kBFloat16)) {
    const float* x = t.data<float>();
    void* out = c.raw();
    parallel_for(t.numel(), int64_t(1) << 16, [&](int64_t begin, int64_t end) {
      if (to == DType::kFloat16) {
        half* o = static_cast<half*>(out);
        for (int64_t i = begin; i < end; ++i) o[i] = half(x[i]);
      } else {
        bfloat16* o = static_cast<bfloat16*>(out);
        for (int64_t i = begin; i < end; ++i) o[i] = bfloat16(x[i]);
      }
    });
    return c;
  }
  bool ok = true;
  visit_dtype(to, [&]<typename To>() {
    if constexpr (std::is_arithmetic_v<To> || std::is_same_v<To, half> || std::is_same_v<To, bfloat16>) {
      To* o = c.data<To>();
      if (dtype_is_int(t.dtype())) {
        for (int64_t i = 0; i < t.numel(); ++i) o[i] = cast_value<To>(t.as_int(i));
      } else {
        for (int64_t i = 0; i < t.numel(); ++i) o[i] = cast_value<To>(t.as_double(i));
      }
    } else {
      ok = false;
    }
  });
  if (!ok) return KILN_ERROR(kUnsupported, "cannot convert {} to {} for the GPU", t.summary(), dtype_name(to));
  return c;
}

Lowering::Lowering(const Graph& g, const BuildOptions& opt) : g_(g), opt_(opt) {
  for (size_t i = 0; i < g.nodes.size(); ++i) node_index_[g.nodes[i].get()] = int(i);
  for (const auto& n : g.nodes) {
    for (const Value* in : n->inputs) {
      if (in) readers_[in].push_back(n.get());
    }
    for (const Value* in : outer_reads(g, *n)) readers_[in].push_back(n.get());  // If/Loop bodies' reads
  }
}

std::optional<k::DT> Lowering::device_dt(DType d) const {
  if (d == DType::kFloat32) {
    if (opt_.precision == Precision::kFp16) return k::DT::kF16;
    if (opt_.precision == Precision::kBf16) return k::DT::kBF16;
  }
  return to_kdt(d);
}

const Tensor* Lowering::constant(const Value* v) const {
  if (!v) return nullptr;
  if (auto it = consts_.find(v); it != consts_.end()) return &it->second;
  return v->constant ? &*v->constant : nullptr;
}

int Lowering::consumers(const Value* v) const {
  auto it = readers_.find(v);
  return it == readers_.end() ? 0 : int(it->second.size());
}

const std::vector<const Node*>& Lowering::readers(const Value* v) const {
  static const std::vector<const Node*> kNone;
  auto it = readers_.find(v);
  return it == readers_.end() ? kNone : it->second;
}

bool Lowering::is_graph_output(const Value* v) const {
  for (const Value* o : g_.outputs) {
    if (o == v) return true;
  }
  return false;
}

const Node* Lowering::only_consumer(const Value* v) const {
  auto it = readers_.find(v);
  if (it == readers_.end() || it->second.size() != 1 || is_graph_output(v)) return nullptr;
  const Node* n = it->second[0];
  int uses = 0;
  for (const Value* in : n->inputs) uses += in == v;
  return uses == 1 ? n : nullptr;
}

Expected<const DevValue*> Lowering::value(const Value* v) {
  if (auto it = values.find(v); it != values.end()) return &it->second;
  const Tensor* c = constant(v);
  if (!c) return KILN_ERROR(kInternal, "value '{}' has no device buffer", v->name);
  auto dt = device_dt(c->dtype());
  if (!dt) KILN_UNSUPPORTED("constant '{}' has dtype {}, which the CUDA backend does not hold", v->name,
                            dtype_name(c->dtype()));
  // A graph constant: the pool knows it by its tensor, converted once for all shape plans.
  KILN_ASSIGN_OR_RETURN(Ref r, upload_constant(*c, *dt));
  DevValue dv;
  dv.ref = r;
  dv.dt = *dt;
  dv.ir_dtype = c->dtype();
  dv.dims = c->dims();
  return &(values[v] = dv);
}

Expected<const DevValue*> Lowering::rowmajor(const Value* v) {
  KILN_ASSIGN_OR_RETURN(const DevValue* d, value(v));
  if (d->layout == Layout::kRowMajor) return d;
  return convert(v, Layout::kRowMajor);
}

Expected<const DevValue*> Lowering::nhwc(const Value* v) {
  KILN_ASSIGN_OR_RETURN(const DevValue* d, value(v));
  if (d->layout == Layout::kNHWC) return d;
  if (d->dims.size() != 4) return KILN_ERROR(kInternal, "NHWC needs rank 4, '{}' is {}", v->name, d->dims.size());
  return convert(v, Layout::kNHWC);
}

Expected<const DevValue*> Lowering::convert(const Value* v, Layout to) {
  if (auto it = converted_.find(v); it != converted_.end() && it->second.layout == to) return &it->second;
  const DevValue src = values.at(v);
  DevValue dst = src;
  dst.layout = to;
  dst.ref = Ref{false, scratch(src.bytes())};
  // Read src through its own logical strides, write dst through its own: one strided copy.
  k::NdStrides s = nd(src.dims, src.strides()), d = nd(dst.dims, dst.strides());
  const Node* producer = v->producer;
  emit_copy_nd(*this, producer, fmt::format("kernel copy_nd ({} -> {})", to == Layout::kNHWC ? "NCHW" : "NHWC",
                                            to == Layout::kNHWC ? "NHWC" : "NCHW"),
               k::dt_size(src.dt), src.ref, 0, s, dst.ref, 0, d);
  converted_[v] = dst;
  return &converted_[v];
}

const DevValue& Lowering::define(const Value* v, Layout layout, std::optional<k::DT> dt) {
  DevValue dv;
  dv.ir_dtype = v->type.dtype;
  dv.dt = dt ? *dt : device_dt(v->type.dtype).value_or(k::DT::kF32);
  for (const Dim& d : v->type.shape->dims) dv.dims.push_back(d.value());
  // A value with H*W == 1 is the same bytes either way; keep it row-major.
  if (layout == Layout::kNHWC && dv.dims.size() == 4 && dv.dims[2] * dv.dims[3] == 1) layout = Layout::kRowMajor;
  dv.layout = layout;
  dv.ref = Ref{false, scratch(dv.bytes())};
  buffer_dtype[size_t(dv.ref.id)] = uint8_t(dv.dt);
  return values[v] = dv;
}

void Lowering::define_alias(const Value* v, const DevValue& src) {
  DevValue dv = src;
  dv.dims.clear();
  for (const Dim& d : v->type.shape->dims) dv.dims.push_back(d.value());
  dv.ir_dtype = v->type.dtype;
  values[v] = dv;
}

int Lowering::scratch(size_t bytes) {
  buffer_bytes.push_back(bytes);
  buffer_dtype.push_back(DevicePlan::kNoDtype);
  return int(buffer_bytes.size() - 1);
}

Expected<Ref> Lowering::upload(const Tensor& t, k::DT dt) {
  KILN_ASSIGN_OR_RETURN(Tensor c, convert_tensor(t, ir_dtype_of(dt)));
  return upload_raw(c.raw(), c.nbytes());
}

std::string_view Lowering::weight_host(int id) const {
  if (id < 0 || size_t(id) >= weight_data.size()) return {};
  if (opt_.weight_pool) return opt_.weight_pool->host(pooled.at(size_t(id)));
  return std::string_view(weight_data[size_t(id)].data(), weight_data[size_t(id)].size());
}

Expected<Ref> Lowering::upload_derived(const Tensor& src, std::string_view form, k::DT dt,
                                       const std::function<Expected<Tensor>()>& make) {
  // A tensor this lowering made (set_constant) lives as long as the plan: the pool, which keeps
  // what it keys by identity, would keep it forever; it is found by its bytes instead.
  bool lowering_made = false;
  for (const auto& [v, t] : consts_) lowering_made |= t.raw() == src.raw();
  if (!opt_.weight_pool || lowering_made) {
    KILN_ASSIGN_OR_RETURN(Tensor t, make());
    return upload(t, dt);
  }
  // Views of one storage share its address: a rearrangement also depends on the view's dims.
  const std::string key = form.empty() ? std::string() : fmt::format("{} [{}]", form, fmt::join(src.dims(), ","));
  KILN_ASSIGN_OR_RETURN(int id, opt_.weight_pool->intern_tensor(src, int(dt), key, [&]() -> Expected<std::string> {
    KILN_ASSIGN_OR_RETURN(Tensor t, make());
    KILN_ASSIGN_OR_RETURN(Tensor c, convert_tensor(t, ir_dtype_of(dt)));
    return std::string(static_cast<const char*>(c.raw()), c.nbytes());
  }));
  weight_data.emplace_back();
  pooled.push_back(id);
  return Ref{true, int(weight_data.size() - 1)};
}

Expected<Ref> Lowering::upload_constant(const Tensor& t, k::DT dt) {
  return upload_derived(t, "", dt, [&t]() -> Expected<Tensor> { return t; });
}

Expected<Ref> Lowering::upload_raw(const void* data, size_t bytes) {
  if (opt_.weight_pool) {
    pooled.push_back(opt_.weight_pool->intern_bytes(std::string_view(static_cast<const char*>(data), bytes)));
    weight_data.emplace_back();
    return Ref{true, int(weight_data.size() - 1)};
  }
  weight_data.emplace_back(bytes);
  if (bytes) std::memcpy(weight_data.back().data(), data, bytes);
  return Ref{true, int(weight_data.size() - 1)};
}

void Lowering::emit(const Node* n, std::string impl, std::vector<int> reads, std::vector<int> writes, StepOp op,
                    ByteWriter params, bool host) {
  Step s;
  s.kind = uint16_t(op);
  s.node = n ? n->describe() : std::string();
  s.node_index = node_index(n);
  s.label = (n ? s.node + ": " : std::string()) + impl;
  s.host = host;
  for (int r : reads) {
    if (r >= 0) s.reads.push_back(r);
  }
  s.writes.assign(writes.begin(), writes.end());
  s.params = std::move(params.bytes());
  steps.push_back(std::move(s));
}

int Lowering::node_index(const Node* n) const {
  auto it = node_index_.find(n);
  return it == node_index_.end() ? -1 : it->second;
}

void Lowering::mark_fused(const Node* n, const Node* into) { fused_[n] = into; }

void Lowering::drop_steps_from(size_t first) {
  steps.resize(std::min(first, steps.size()));
  for (auto it = copy_records.begin(); it != copy_records.end();) {
    it = it->first >= first ? copy_records.erase(it) : std::next(it);
  }
}

std::string_view act_name(Act a) {
  switch (a) {
    case Act::kNone: return "";
    case Act::kRelu: return "relu";
    case Act::kGelu: return "gelu";
  }
  return "?";
}

const std::map<OpKind, LowerFn>& lowering_table() {
  static const std::map<OpKind, LowerFn> table = [] {
    std::map<OpKind, LowerFn> t;
    register_gemm_lowerings(t);
    register_conv_lowerings(t);
    register_elementwise_lowerings(t);
    register_data_lowerings(t);
    register_norm_lowerings(t);
    register_attention_lowerings(t);
    register_fused_lowerings(t);
    register_resample_lowerings(t);
    register_conv_transpose_lowerings(t);
    register_pool_lowerings(t);
    register_rnn_lowerings(t);
    register_classic_lowerings(t);
    register_random_lowerings(t);
    register_fft_lowerings(t);
    register_integer_lowerings(t);
    register_quant_lowerings(t);
    register_loss_lowerings(t);
    register_collective_lowerings(t);
    return t;
  }();
  return table;
}

}  // namespace kiln::cuda
