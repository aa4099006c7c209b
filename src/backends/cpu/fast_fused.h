// A FusedElementwise (fuse-elementwise's chains of elementwise nodes) on the fast CPU backend, as
// one loop over the output instead of the reference's node-by-node pass over whole tensors: the
// output is walked a row of its last dim at a time in blocks; each body input is read into a block
// through its broadcast strides, each body node runs over the block (plain loops the compiler
// vectorizes; the transcendental ones call the C library per element) and the last one is written
// out. Rows are spread over the threads. fp32 bodies of the ops listed in fast_fused.cc, whose
// constants are scalars; anything else stays on the reference kernels.
//
//   if (FusedKernel::supported(node)) {
//     KILN_ASSIGN_OR_RETURN(FusedKernel k, FusedKernel::compile(node));
//     k.run({x, y}, out);   // row-major inputs of the node's own dims, the output's dims
//   }
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "support/status.h"

namespace kiln {

class FusedKernel {
 public:
  static bool supported(const Node& n);
  static Expected<FusedKernel> compile(const Node& n);
  void run(const std::vector<const float*>& inputs, float* out) const;

  enum class Op : uint8_t;
  struct Instr {
    Op op;
    int out = 0;
    int a = -1, b = -1;      // registers (-1: the immediate)
    float ia = 0, ib = 0;    // immediates (scalar constants), and an op's parameters
    float alpha = 0, beta = 0;
  };

 private:
  std::vector<int64_t> dims_;                  // the output's
  std::vector<std::vector<int64_t>> strides_;  // per input, over the output's dims (0: broadcast)
  std::vector<Instr> code_;
  int regs_ = 0, result_ = 0;
};

}  // namespace kiln
