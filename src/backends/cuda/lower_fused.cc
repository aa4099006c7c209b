// FusedElementwise (made by the fuse-elementwise pass) -> one generated kernel: the body becomes
// CUDA C (codegen_elementwise.cc), compiled by NVRTC once per source and cached on disk
// (nvrtc.h), loaded as a CUDA library at build time and launched by the step like any kernel, so
// it is captured in the CUDA graph. Inputs are read through their broadcast, layout-aware
// strides; the output is row-major. Without NVRTC the node is declined with the reason (it then
// runs on the CPU, as any node the backend lacks).
#include <functional>

#include "backends/cuda/codegen_elementwise.h"
#include "backends/cuda/lower.h"
#include "backends/cuda/nvrtc.h"

namespace kiln::cuda {

namespace {

struct Library {
  cudaLibrary_t lib = nullptr;
  ~Library() { if (lib) cudaLibraryUnload(lib); }
};

Status lower_fused_elementwise(Lowering& L, const Node& n) {
  const Graph* body = n.attr_graph("body");
  const Value* out = n.outputs[0];
  auto dims = out->type.shape ? out->type.shape->static_dims() : std::nullopt;
  if (!body || !dims) KILN_UNSUPPORTED("FusedElementwise with a dynamic output shape");
  EwKernelSpec spec;
  spec.dims = *dims;
  std::vector<Ref> ins;
  std::vector<int> reads;
  for (const Value* v : n.inputs) {
    KILN_ASSIGN_OR_RETURN(const DevValue* d, L.value(v));
    if (!d) KILN_UNSUPPORTED("input '{}' has no device value", v->name);
    if (d->dims.size() > spec.dims.size()) KILN_UNSUPPORTED("input '{}' of higher rank than the output", v->name);
    spec.inputs.push_back({d->dt, broadcast_strides(*d, spec.dims)});
    ins.push_back(d->ref);
    if (!d->ref.weight) reads.push_back(d->ref.id);
  }
  auto odt = L.device_dt(out->type.dtype);
  if (!odt) KILN_UNSUPPORTED("output dtype {}", dtype_name(out->type.dtype));
  spec.out_dt = *odt;
  spec.name = "kiln_ew";  // the source names one kernel; its cache entry is keyed by the whole text
  KILN_ASSIGN_OR_RETURN(std::string src, generate_elementwise(*body, spec));
  std::string why;
  if (!nvrtc_available(&why)) KILN_UNSUPPORTED("generated kernels need NVRTC: {}", why);
  // A kernel that does not compile or load leaves the node to the CPU, naming why (never a failed build).
  Expected<CompiledKernel> ck = compile_cached(src);
  if (!ck) KILN_UNSUPPORTED("its generated kernel did not compile: {}", ck.status().message());
  auto lib = std::make_shared<Library>();
  cudaKernel_t kern = nullptr;
  if (cudaError_t e = cudaLibraryLoadData(&lib->lib, ck->cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
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
  std::vector<int> align;  // per input: the bytes its pointer must be aligned to for the packed kernel
  for (size_t i = 0; i < spec.inputs.size(); ++i) align.push_back(std::max(1, ew_pack_alignment(spec, i)));
  const int out_align = std::min(16, std::max(1, vw * k::dt_size(spec.out_dt)));
  L.keep_alive.push_back(lib);  // unloaded with the engine

  const DevValue& y = L.define(out);
  Ref yr = y.ref;
  int64_t numel = 1;
  for (int64_t d : spec.dims) numel *= d;
  auto grid_for = [](int64_t threads) {
    return unsigned(std::max<int64_t>(1, std::min<int64_t>((threads + kEwBlock - 1) / kEwBlock, 132 * 16)));
  };
  const unsigned grid = grid_for(numel), vgrid = grid_for(vkern ? numel / vw : numel);
  std::string impl = fmt::format("generated kernel {} nodes ({:016x}, {}{})", body->nodes.size(), std::hash<std::string>{}(src),
                                 ck->from_cache ? "from the disk cache" : "compiled by NVRTC",
                                 vkern ? fmt::format(", {} per thread when aligned", vw) : "");
  L.emit(&n, impl, reads, {yr.id}, [=](const RunCtx& c) -> Status {
    std::vector<void*> ptrs;
    for (const Ref& r : ins) ptrs.push_back(c.ptr(r));
    ptrs.push_back(c.ptr(yr));
    std::vector<void*> args;
    for (void*& p : ptrs) args.push_back(&p);
    bool packed = vkern != nullptr && reinterpret_cast<uintptr_t>(ptrs.back()) % uintptr_t(out_align) == 0;
    for (size_t i = 0; packed && i < align.size(); ++i) packed = reinterpret_cast<uintptr_t>(ptrs[i]) % uintptr_t(align[i]) == 0;
    KILN_CUDA_TRY(cudaLaunchKernel(reinterpret_cast<const void*>(packed ? vkern : kern), dim3(packed ? vgrid : grid),
                                   dim3(kEwBlock), args.data(), 0, c.stream));
    return Status::ok();
  });
  return Status::ok();
}

}  // namespace

void register_fused_lowerings(std::map<OpKind, LowerFn>& t) { t[OpKind::kFusedElementwise] = lower_fused_elementwise; }

}  // namespace kiln::cuda
