// Multi-node patterns the lowering runs as one kernel, found before lowering starts (so the inner
// nodes are skipped as they come up in topological order): Attention nodes with the views that
// feed them (lower_attention.cc), a Clip read by a depthwise convolution (lower_conv.cc) and a
// broadcast Add read by a GroupNorm (lower_norm.cc), a squeeze-and-excitation gate
// (lower_squeeze_excite.cc). Which
// nodes fuse is the graph passes' decision (fuse-gelu, fuse-attention...); these only choose how
// a fused node is run.
#include "backends/cuda/lower.h"

namespace kiln::cuda {

void find_patterns(Lowering& L) {
  find_attention(L);
  find_conv_input_clips(L);
  find_norm_input_bias(L);
  find_squeeze_excite(L);
}

Status lower_replacement(Lowering& L, const Node& n, const Replacement& r) {
  return r.squeeze_excite ? lower_squeeze_excite(L, n, *r.squeeze_excite) : lower_attention(L, n, *r.attention);
}

}  // namespace kiln::cuda
