// FusedElementwise (made by the fuse-elementwise pass), and QuantizeLinear / DequantizeLinear with
// one scale on their own, -> one generated kernel: the body becomes
// CUDA C (codegen_elementwise.cc), compiled by NVRTC once per source and cached on disk
// (nvrtc.h), loaded as a CUDA library at build time and launched by the step like any kernel, so
// it is captured in the CUDA graph. Inputs are read through their broadcast, layout-aware
// strides; the output is row-major. Without NVRTC the node is declined with the reason (it then
// runs on the CPU, as any node the backend lacks).
#include <algorithm>
#include <functional>

#include "backends/cuda/codegen_elementwise.h"
#include "backends/cuda/lower.h"
#include "backends/cuda/nvrtc.h"
#include "ops/quantize_util.h"

namespace kiln::cuda {

namespace {

struct Library {
  std::string image;  // the cubin, kept while the library lives (lazy loading may read it later)
  cudaLibrary_t lib = nullptr;
  ~Library() { if (lib) cudaLibraryUnload(lib); }
};

}  // namespace

Status lower_generated(Lowering& L, const Node& n, const Graph* body, const std::vector<std::vector<int64_t>>& strides) {
  const Value* out = n.outputs[0];
  auto dims = out->type.shape ? out->type.shape->static_dims() : std::nullopt;
  if (!body || !dims) KILN_UNSUPPORTED("{} with a dynamic output shape", n.describe());
  EwKernelSpec spec;
  spec.dims = *dims;
  std::vector<Ref> ins;
  std::vector<int> reads;
  for (size_t i = 0; i < body->inputs.size() && i < n.inputs.size(); ++i) {
    const Value* v = n.inputs[i];
    KILN_ASSIGN_OR_RETURN(const DevValue* d, L.value(v));
    if (!d) KILN_UNSUPPORTED("input '{}' has no device value", v->name);
    if (d->dims.size() > spec.dims.size()) KILN_UNSUPPORTED("input '{}' of higher rank than the output", v->name);
    const bool given = i < strides.size() && strides[i].size() == spec.dims.size();
    spec.inputs.push_back({d->dt, given ? strides[i] : broadcast_strides(*d, spec.dims)});
    ins.push_back(d->ref);
    if (!d->ref.weight) reads.push_back(d->ref.id);
  }
  auto odt = L.device_dt(out->type.dtype);
  if (!odt) KILN_UNSUPPORTED("output dtype {}", dtype_name(out->type.dtype));
  spec.out_dt = *odt;
  spec.runtime_dims = L.options().runtime_dim_kernels;
  spec.name = "kiln_ew";  // the source names one kernel; its cache entry is keyed by the whole text
  KILN_ASSIGN_OR_RETURN(std::string src, generate_elementwise(*body, spec));
  std::string why;
  if (!nvrtc_available(&why)) KILN_UNSUPPORTED("generated kernels need NVRTC: {}", why);
  // A kernel that does not compile or load leaves the node to the CPU, naming why (never a failed build).
  Expected<CompiledKernel> ck = compile_cached(src);
  if (!ck) KILN_UNSUPPORTED("its generated kernel did not compile: {}", ck.status().message());
  auto lib = std::make_shared<Library>();
  cudaKernel_t kern = nullptr;
  lib->image = ck->cubin;
  if (cudaError_t e = cudaLibraryLoadData(&lib->lib, lib->image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
      e != cudaSuccess || (e = cudaLibraryGetKernel(&kern, lib->lib, spec.name.c_str())) != cudaSuccess) {
    cudaGetLastError();
    KILN_UNSUPPORTED("its generated kernel did not load: {}", cudaGetErrorString(e));
  }
  // The packed variant (codegen_elementwise.h), taken at launch when the pointers allow it.
  const int vw = ew_vector_width(spec);
  cudaKernel_t vkern = nullptr;
  if (vw > 1 && cudaLibraryGetKernel(&vkern, lib->lib, (spec.name + "_v").c_str()) != cudaSuccess) {
    cudaGetLastError();
    vkern = nullptr;
  }
  L.keep_alive.push_back(lib);  // loaded here only to know that it loads: the step's binder loads its own

  const DevValue& y = L.define(out);
  int64_t numel = 1;
  for (int64_t d : spec.dims) numel *= d;
  auto grid_for = [](int64_t threads) {
    return int64_t(std::max<int64_t>(1, std::min<int64_t>((threads + kEwBlock - 1) / kEwBlock, 132 * 16)));
  };
  std::string impl = fmt::format("generated kernel {} nodes ({:016x}, {}{}{})", body->nodes.size(),
                                 std::hash<std::string>{}(src), ck->from_cache ? "from the disk cache" : "compiled by NVRTC",
                                 vkern ? fmt::format(", {} per thread when aligned", vw) : "",
                                 spec.runtime_dims ? ", dims as an argument" : "");
  ByteWriter w;
  w.str(ck->cubin);
  w.str(spec.name);
  w.u8(vkern != nullptr);
  w.i64(grid_for(numel));
  w.i64(grid_for(vkern ? numel / vw : numel));
  w.put(int32_t(ins.size()));
  for (size_t i = 0; i < ins.size(); ++i) {
    put(w, ins[i]);
    w.put(int32_t(std::max(1, ew_pack_alignment(spec, i))));  // the bytes its pointer must be aligned to when packed
  }
  put(w, y.ref);
  w.put(int32_t(std::min(16, std::max(1, vw * k::dt_size(spec.out_dt)))));
  w.str(ew_shape_arg(spec));  // empty: the dims are in the source
  L.emit(&n, impl, reads, {y.ref.id}, StepOp::kGenerated, std::move(w));
  return Status::ok();
}

namespace {

Status lower_fused_elementwise(Lowering& L, const Node& n) { return lower_generated(L, n, n.attr_graph("body")); }

// A QuantizeLinear or DequantizeLinear whose scale is not one constant (is_scalar_int8_qdq): a
// per-axis scale and zero point (1-D along `axis`) or computed scalar ones. The same one-node
// body, its scale and zero point read as kernel inputs, a per-axis one with stride 1 on the axis.
// A computed scale is not checked to be positive and finite here as the CPU checks it: a zero
// scale quantizes to the saturated values and dequantizes to zeros.
Status lower_qdq_fed(Lowering& L, const Node& n) {
  const bool q = n.op == OpKind::kQuantizeLinear;
  if (n.inputs.size() < 2 || !n.inputs[0] || !n.inputs[1]) KILN_UNSUPPORTED("missing inputs");
  if (n.attr_int("block_size", 0) != 0) KILN_UNSUPPORTED("blocked scales");
  if (q && n.attr_int("precision", 0) != 0) KILN_UNSUPPORTED("a precision attribute");
  const Value* x = n.inputs[0];
  const DType f = (q ? x : n.outputs[0])->type.dtype, i = (q ? n.outputs[0] : x)->type.dtype;
  if (i != DType::kInt8 && i != DType::kUInt8) KILN_UNSUPPORTED("quantized type {}", dtype_name(i));
  if (f != DType::kFloat32 && f != DType::kFloat16 && f != DType::kBFloat16) KILN_UNSUPPORTED("float type {}", dtype_name(f));
  // A 16-bit scale would round x / scale to 16 bits first, as the CPU does and this kernel does not.
  if (n.inputs[1]->type.dtype != DType::kFloat32) KILN_UNSUPPORTED("a {} scale", dtype_name(n.inputs[1]->type.dtype));
  auto xd = x->type.shape ? x->type.shape->static_dims() : std::nullopt;
  if (!xd) KILN_UNSUPPORTED("{} with a dynamic input shape", n.describe());
  const int64_t rank = int64_t(xd->size());
  int64_t axis = n.attr_int("axis", 1);
  if (axis < 0) axis += rank;
  if (n.inputs.size() > 2 && n.inputs[2]) {  // the CPU reference wants the zero point shaped as the scale
    auto sd = n.inputs[1]->type.shape ? n.inputs[1]->type.shape->static_dims() : std::nullopt;
    auto zd = n.inputs[2]->type.shape ? n.inputs[2]->type.shape->static_dims() : std::nullopt;
    if (!sd || !zd || prod_of(*sd, 0, sd->size()) != prod_of(*zd, 0, zd->size())) {
      KILN_UNSUPPORTED("a zero point shaped unlike its scale");
    }
  }
  std::vector<std::vector<int64_t>> strides(n.inputs.size());
  for (size_t k = 1; k < n.inputs.size(); ++k) {
    const Value* v = n.inputs[k];
    if (!v) continue;
    auto vd = v->type.shape ? v->type.shape->static_dims() : std::nullopt;
    if (!vd) KILN_UNSUPPORTED("'{}' of a dynamic shape", v->name);
    if (prod_of(*vd, 0, vd->size()) == 1) {
      strides[k].assign(size_t(rank), 0);  // one value for every element
    } else if (vd->size() == 1 && axis >= 0 && axis < rank && (*vd)[0] == (*xd)[size_t(axis)]) {
      strides[k].assign(size_t(rank), 0);
      strides[k][size_t(axis)] = 1;
    } else {
      KILN_UNSUPPORTED("'{}' of shape {} does not fit per-axis on axis {} of {}", v->name, dims_to_string(*vd), axis,
                       dims_to_string(*xd));
    }
  }
  Graph body;
  body.name = "qdq_body";
  std::vector<Value*> ins;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    ins.push_back(n.inputs[k] ? body.add_input(fmt::format("in{}", k), n.inputs[k]->type) : nullptr);
  }
  Node* c = body.add_node(n.op, std::move(ins), 1);
  c->attrs = n.attrs;
  c->outputs[0]->type = n.outputs[0]->type;
  body.outputs.push_back(c->outputs[0]);
  return lower_generated(L, n, &body, strides);
}

// A QuantizeLinear or DequantizeLinear with one scale (is_scalar_int8_qdq) that fuse-elementwise
// left alone (its neighbours are convolutions or GEMMs, say): a one-node body, generated the same
// way, its input the tensor and the scale and zero point baked in as literals.
Status lower_qdq_alone(Lowering& L, const Node& n) {
  if (!is_scalar_int8_qdq(n, [&L](const Value* v) { return L.constant(v); }, nullptr)) return lower_qdq_fed(L, n);
  Graph body;
  body.name = "qdq_body";
  std::vector<Value*> ins{body.add_input("x", n.inputs[0]->type)};
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    ins.push_back(n.inputs[i] ? body.add_constant(fmt::format("c{}", i), *L.constant(n.inputs[i])) : nullptr);
  }
  Node* c = body.add_node(n.op, std::move(ins), 1);
  c->attrs = n.attrs;
  c->outputs[0]->type = n.outputs[0]->type;
  body.outputs.push_back(c->outputs[0]);
  return lower_generated(L, n, &body);
}

// Loads the cubin as a CUDA library (kept with the engine) and launches its kernel, the packed
// variant when every pointer is aligned for it.
Expected<StepFn> bind_generated(Params& in, BindCtx& bc) {
  const std::string_view cubin = in.bytes();
  const std::string name(in.bytes());
  const bool has_packed = in.flag();
  const int64_t grid = in.i64(), vgrid = in.i64();
  std::vector<Ref> ins;
  std::vector<int> align;
  const int64_t n_in = in.i32();
  for (int64_t i = 0; i < n_in && i < 4096; ++i) {
    ins.push_back(in.ref());
    align.push_back(in.i32());
  }
  const Ref yr = in.ref();
  const int out_align = in.i32();
  const std::string shape_arg(in.bytes());  // the kernels' last argument, when they take one
  KILN_RETURN_IF_ERROR(in.done());
  if (grid < 1 || vgrid < 1 || grid > INT32_MAX || vgrid > INT32_MAX || out_align < 1 ||
      std::any_of(align.begin(), align.end(), [](int a) { return a < 1; })) {
    return KILN_ERROR(kInvalidModel, "step '{}': malformed launch parameters", in.step().label);
  }
  auto lib = std::make_shared<Library>();
  lib->image.assign(cubin);  // the engine file's bytes need not outlive the load
  cudaKernel_t kern = nullptr, vkern = nullptr;
  if (cudaError_t e = cudaLibraryLoadData(&lib->lib, lib->image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
      e != cudaSuccess || (e = cudaLibraryGetKernel(&kern, lib->lib, name.c_str())) != cudaSuccess ||
      (has_packed && (e = cudaLibraryGetKernel(&vkern, lib->lib, (name + "_v").c_str())) != cudaSuccess)) {
    cudaGetLastError();
    return KILN_ERROR(kInvalidModel, "step '{}': its generated kernel did not load: {}", in.step().label,
                      cudaGetErrorString(e));
  }
  bc.keep_alive.push_back(lib);
  // The launch passes one pointer per input, the output's, and the shape argument when there is one:
  // the kernel must take exactly those (a damaged record would otherwise have the launch read past
  // the arguments it was given).
  const size_t count = ins.size() + 1 + (shape_arg.empty() ? 0 : 1);
  auto params_fit = [&](cudaKernel_t k) {
    const void* f = reinterpret_cast<const void*>(k);
    size_t offset = 0, size = 0;
    for (size_t i = 0; i < count; ++i) {
      const size_t want = i < ins.size() + 1 ? sizeof(void*) : shape_arg.size();
      if (cudaFuncGetParamInfo(f, i, &offset, &size) != cudaSuccess || size != want) {
        cudaGetLastError();
        return false;
      }
    }
    const bool more = cudaFuncGetParamInfo(f, count, &offset, &size) == cudaSuccess;  // fails past the last one
    cudaGetLastError();
    return !more;
  };
  if (!params_fit(kern) || (vkern && !params_fit(vkern))) {
    return KILN_ERROR(kInvalidModel, "step '{}': its generated kernel does not take the {} arguments the step passes",
                      in.step().label, count);
  }
  return StepFn([=](const RunCtx& c) -> Status {
    std::vector<void*> ptrs;
    for (const Ref& r : ins) ptrs.push_back(c.ptr(r));
    ptrs.push_back(c.ptr(yr));
    std::vector<void*> args;
    for (void*& p : ptrs) args.push_back(&p);
    if (!shape_arg.empty()) args.push_back(const_cast<char*>(shape_arg.data()));  // read by the launch, not kept
    bool packed = vkern != nullptr && reinterpret_cast<uintptr_t>(ptrs.back()) % uintptr_t(out_align) == 0;
    for (size_t i = 0; packed && i < align.size(); ++i) packed = reinterpret_cast<uintptr_t>(ptrs[i]) % uintptr_t(align[i]) == 0;
    KILN_CUDA_TRY(cudaLaunchKernel(reinterpret_cast<const void*>(packed ? vkern : kern), dim3(unsigned(packed ? vgrid : grid)),
                                   dim3(kEwBlock), args.data(), 0, c.stream));
    return Status::ok();
  });
}

}  // namespace

void register_fused_lowerings(std::map<OpKind, LowerFn>& t) {
  t[OpKind::kFusedElementwise] = lower_fused_elementwise;
  t[OpKind::kQuantizeLinear] = lower_qdq_alone;
  t[OpKind::kDequantizeLinear] = lower_qdq_alone;
}
void register_fused_binders(std::map<StepOp, BindFn>& t) { t[StepOp::kGenerated] = bind_generated; }

}  // namespace kiln::cuda
