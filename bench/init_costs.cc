// What a cold process pays before kiln does any work of its own on the GPU: CUDA context creation,
// cuBLASLt and cuDNN handles, a first cudaMalloc, NVRTC's library. Separates those fixed costs from
// an engine's load time (bench/RESULTS.md, thirteenth session).
//
//   nvcc -O2 -std=c++17 bench/init_costs.cc -o init_costs -lcublasLt -lcudnn -ldl   (here)
//   ./init_costs                                                                    (GPU machine)
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>

int main() {
  using clk = std::chrono::steady_clock;
  auto ms = [](clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  auto t0 = clk::now();
  cudaFree(nullptr);  // creates the primary context
  auto t1 = clk::now();
  void* p = nullptr;
  cudaMalloc(&p, size_t(64) << 20);
  auto t2 = clk::now();
  cublasLtHandle_t lt = nullptr;
  cublasLtCreate(&lt);
  auto t3 = clk::now();
  cudnnHandle_t dnn = nullptr;
  cudnnCreate(&dnn);
  auto t4 = clk::now();
  cudnnHandle_t dnn2 = nullptr;
  cudnnCreate(&dnn2);
  auto t5 = clk::now();
  void* nvrtc = dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
  auto t6 = clk::now();
  std::printf("context %.1f ms, cudaMalloc 64 MiB %.1f ms, cublasLtCreate %.1f ms, cudnnCreate %.1f ms (second %.1f ms), "
              "dlopen nvrtc %.1f ms (%s)\n",
              ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t3, t4), ms(t4, t5), ms(t5, t6), nvrtc ? "found" : "not found");
  return 0;
}
