// CUDA C source for a FusedElementwise body (ops/fused.cc): one kernel that reads each input once
// per output element through its (broadcast, layout-aware) strides, evaluates the body's nodes in
// registers (f32 math for f32/f16/bf16 values, 64/32-bit ints, bools) and writes the output once.
//
//   EwKernelSpec spec{.name = "kiln_ew_1", .dims = {2, 128}, .inputs = {{k::DT::kI64, {0, 1}}},
//                     .out_dt = k::DT::kF16};
//   KILN_ASSIGN_OR_RETURN(std::string src, generate_elementwise(body, spec));
//   // compile_cached(src) (nvrtc.h), then launch `spec.name` with (in0, ..., out) pointers.
//
// When ew_vector_width(spec) > 1 the source also defines `<name>_v`: the same body over packs of
// that many consecutive outputs of the last dim, each thread loading the inputs that are contiguous
// along it as one (up to 16-byte) vector and storing one vector; launch it over numel / width
// threads when every such input pointer and the output are aligned to min(16, width x element
// size) bytes (the scalar kernel otherwise).
//
// Shapes and strides are baked into the source (the divisions by constant dims become multiplies,
// and the disk cache is keyed by the source, so each shape compiles once). With runtime_dims (a
// dynamic engine's shape plans) they are not: the kernels take one more argument, a struct of the
// element count, the output's dims and each strided input's strides (ew_shape_arg), so every shape
// whose inputs are contiguous or not alike, and that packs alike, shares one source and one
// compilation. It costs a division per dim at run time. The source includes no
// header: 16-bit floats are converted with inline PTX, so NVRTC needs no toolkit include folder.
// Ops and dtypes outside what fuse-elementwise groups give an error naming the body node.
#pragma once

#include <string>
#include <vector>

#include "backends/cuda/kernels/kernels.h"
#include "ir/graph.h"

namespace kiln::cuda {

struct EwOperand {
  k::DT dt = k::DT::kF32;        // storage dtype on the device
  std::vector<int64_t> strides;  // element strides over the output's dims (0: broadcast)
};

struct EwKernelSpec {
  std::string name;                // the extern "C" kernel's name
  std::vector<int64_t> dims;       // the output's index space, row-major (the output is contiguous)
  std::vector<EwOperand> inputs;   // one per body input, in order
  k::DT out_dt = k::DT::kF32;      // the output's storage dtype
  bool runtime_dims = false;       // dims and strides as a kernel argument (ew_shape_arg), not in the source
};

inline constexpr int kEwBlock = 256;  // threads per block of the generated kernels

Expected<std::string> generate_elementwise(const Graph& body, const EwKernelSpec& spec);

// The trailing kernel argument of a runtime_dims kernel, as bytes to pass by value: the element
// count, the dims and every input's strides over them, each as a 32-bit unsigned (when the element
// count fits in 31 bits) or a 64-bit integer. Empty when spec.runtime_dims is false.
std::string ew_shape_arg(const EwKernelSpec& spec);

// Outputs per thread of the packed variant: 16 bytes of the output type (at most 8), when the last
// dim divides by it and every input is contiguous along it (with other strides that keep each pack
// aligned) or broadcast over it; 1 otherwise.
int ew_vector_width(const EwKernelSpec& spec);

// The alignment in bytes that input `input`'s pointer needs for the packed variant, which reads it as
// one vector per pack; 0 when it is read once per pack (broadcast along the last dim) or there is
// no packed variant.
int ew_pack_alignment(const EwKernelSpec& spec, size_t input);

}  // namespace kiln::cuda
