// Multi-node patterns the lowering runs as one kernel, found before lowering starts (so the inner
// nodes are skipped as they come up in topological order): Attention nodes with the views that
// feed them (lower_attention.cc), an activation read by a depthwise convolution
// (lower_conv_depthwise.cc), a broadcast Add read by a GroupNorm (lower_norm.cc) and a
// squeeze-and-excitation gate (lower_squeeze_excite.cc). Which nodes fuse is mostly the graph passes' decision (fuse-gelu,
// fuse-attention...) and these choose how a fused node is run; the squeeze-excite gate is a chain of
// plain nodes that the CUDA lowering runs as one kernel.
#include "backends/cuda/lower.h"

namespace kiln::cuda {

void find_patterns(Lowering& L) {
  find_attention(L);
  find_conv_input_acts(L);
  find_norm_input_bias(L);
  find_squeeze_excite(L);
}

Status lower_replacement(Lowering& L, const Node& n, const Replacement& r) {
  return r.squeeze_excite ? lower_squeeze_excite(L, n, *r.squeeze_excite) : lower_attention(L, n, *r.attention);
}

}  // namespace kiln::cuda
