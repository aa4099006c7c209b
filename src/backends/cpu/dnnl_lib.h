// oneDNN, loaded when the fast CPU backend first needs it. kiln calls oneDNN's C API through this
// table of entry points, resolved with dlopen/dlsym from libdnnl.so.3, so the kiln binary itself
// needs no oneDNN to start: without the library the CPU runs on the reference kernels and the build
// report says why (as ONNX Runtime loads its oneDNN provider as a separate library).
//
//   std::string why;
//   const DnnlLib* d = dnnl_lib(&why);      // null: *why names what was tried
//   if (d) d->primitive_execute(p, stream, n, args);
//
// The library is looked for beside the executable or library that holds kiln, in ../lib from there,
// where scripts/install-deps.sh unpacked it at build time, then on the loader's default path.
#pragma once

#include <string>

#if KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

namespace kiln {

// X(name): one entry point, dnnl_<name>.
#define KILN_DNNL_FUNCTIONS(X)                                                                                   \
  X(version) X(engine_create) X(engine_destroy) X(stream_create) X(stream_destroy) X(stream_wait)               \
  X(memory_desc_create_with_tag) X(memory_desc_create_with_strides) X(memory_desc_destroy)                      \
  X(memory_desc_equal) X(memory_desc_get_size) X(memory_desc_clone) X(memory_create) X(memory_destroy)          \
  X(memory_set_data_handle) X(memory_get_data_handle) X(primitive_attr_create) X(primitive_attr_destroy) X(primitive_attr_set_post_ops)  \
  X(primitive_attr_set_scratchpad_mode) X(post_ops_create) X(post_ops_destroy) X(post_ops_append_eltwise)       \
  X(post_ops_append_binary) X(convolution_forward_primitive_desc_create) X(matmul_primitive_desc_create)        \
  X(pooling_forward_primitive_desc_create) X(reorder_primitive_desc_create) X(primitive_desc_query_md)          \
  X(binary_primitive_desc_create) X(concat_primitive_desc_create) X(batch_normalization_forward_primitive_desc_create) \
  X(deconvolution_forward_primitive_desc_create) X(eltwise_forward_primitive_desc_create)                      \
  X(lstm_forward_primitive_desc_create) X(resampling_forward_primitive_desc_create)                           \
  X(memory_desc_create_submemory) X(gru_forward_primitive_desc_create) X(lbr_gru_forward_primitive_desc_create) \
  X(softmax_forward_primitive_desc_create) X(layer_normalization_forward_primitive_desc_create)                 \
  X(primitive_desc_query) X(primitive_desc_destroy) X(primitive_create) X(primitive_destroy)                    \
  X(primitive_execute)

struct DnnlLib {
#define KILN_DNNL_MEMBER(name) decltype(&dnnl_##name) name = nullptr;
  KILN_DNNL_FUNCTIONS(KILN_DNNL_MEMBER)
#undef KILN_DNNL_MEMBER
  std::string path;     // the file it was loaded from
  std::string version_text;  // "3.2.0"
};

// The loaded library (once per process), or null with *why saying what was tried.
const DnnlLib* dnnl_lib(std::string* why);

}  // namespace kiln

#else

namespace kiln {
struct DnnlLib;
// This kiln was built without oneDNN's headers: never a library.
inline const DnnlLib* dnnl_lib(std::string* why) {
  if (why) *why = "this kiln was built without oneDNN (scripts/install-deps.sh fetches it)";
  return nullptr;
}
}  // namespace kiln

#endif
