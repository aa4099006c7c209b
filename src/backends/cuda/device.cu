#include <cuda_runtime.h>

#include "backends/cuda/device.h"

namespace kiln::cuda {

namespace {

// A trivial kernel launched once by the probe: it proves the module loads on this device (the
// binary is built for sm_90a, so an older GPU is reported instead of failing later).
__global__ void probe_kernel(int* out) { *out = 42; }

std::string cuda_reason(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

}  // namespace

DeviceInfo probe_device() {
  DeviceInfo info;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    info.reason = cuda_reason(e);
    return info;
  }
  if (count == 0) {
    info.reason = "no CUDA device";
    return info;
  }
  cudaDeviceProp p{};
  if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) {
    info.reason = cuda_reason(e);
    return info;
  }
  info.name = p.name;
  info.sm_major = p.major;
  info.sm_minor = p.minor;
  info.sm_count = p.multiProcessorCount;
  info.total_memory = p.totalGlobalMem;
  int* d = nullptr;
  int h = 0;
  if ((e = cudaMalloc(&d, sizeof(int))) != cudaSuccess) {
    info.reason = cuda_reason(e);
    return info;
  }
  probe_kernel<<<1, 1>>>(d);
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess || h != 42) {
    info.reason = "the kiln CUDA module does not run on " + info.name + " (built for sm_90a): " +
                  (e != cudaSuccess ? cuda_reason(e) : std::string("wrong result"));
    return info;
  }
  info.available = true;
  return info;
}

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

bool select_device(int ordinal) { return cudaSetDevice(ordinal) == cudaSuccess; }

std::recursive_mutex& device_mutation_mutex() {
  static std::recursive_mutex m;
  return m;
}

}  // namespace kiln::cuda

namespace kiln::cuda {

std::string copy_to_host(void* dst, const void* src, size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? "" : cuda_reason(e);
}

std::shared_ptr<void> device_buffer(size_t bytes, std::string* err) {
  std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    *err = cuda_reason(e);
    return nullptr;
  }
  return std::shared_ptr<void>(p, [](void* q) {
    std::lock_guard<std::recursive_mutex> lock(device_mutation_mutex());
    cudaFree(q);
  });
}

std::string copy_to_device(void* dst, const void* src, size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? "" : cuda_reason(e);
}

}  // namespace kiln::cuda
