// bench/pdl_chain (build.sh): CUTLASS sm90 GEMMs with PDL vs cuBLASLt on BERT-base b1 shapes.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <functional>
#include <memory>
#include <string>
#include <vector>
struct Prob {
  int m, n, k;
  const __half* A; int lda;     // [M,K] row-major
  const __half* B;              // [K,N] row-major
  const __half* bias;           // [N]
  const __half* C;              // residual [M,N] or null
  __half* D;                    // [M,N]
  int ep;                       // 0 bias, 1 bias+gelu, 2 bias+residual
};
using Launch = std::function<cudaError_t(cudaStream_t, bool)>;
struct Runner { std::string name; int ep; std::function<Launch(const Prob&)> make; };
void add_runners_0(std::vector<Runner>&);
void add_runners_1(std::vector<Runner>&);
void add_runners_2(std::vector<Runner>&);
