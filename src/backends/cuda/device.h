// Finding a CUDA device without requiring one: the CPU-only build and a machine with no driver
// both answer "no device" with the reason, which the CLI prints once as a warning.
#pragma once

#include <memory>
#include <mutex>
#include <string>

namespace kiln::cuda {

// Held while a session captures a CUDA graph, and while anything allocates, frees or builds on the
// device (a session's arena made or released, an engine lowered): a cudaFree or a synchronizing
// call on one thread while another thread's stream is capturing invalidates that capture, and the
// capturing thread's next launch fails (kiln serve's sessions answered CUDNN_STATUS_EXECUTION_FAILED
// under load: bench/RESULTS.md, twenty-sixth session). Replaying captured graphs does not take it. Recursive: a build may make a
// session.
std::recursive_mutex& device_mutation_mutex();

struct DeviceInfo {
  bool available = false;
  std::string reason;  // why not, when !available ("no CUDA driver", "no device", ...)
  std::string name;    // "NVIDIA H100 80GB HBM3"
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  size_t total_memory = 0;
};

// Queries device 0. Never fails: a missing driver or device is reported in the result.
DeviceInfo probe_device();
// Devices this process sees (0 without a driver), and making `ordinal` the calling thread's current
// device (the ranks of a tensor-parallel engine build and run on GPUs 0..n-1); false when it cannot.
int device_count();
bool select_device(int ordinal);

}  // namespace kiln::cuda

namespace kiln::cuda {

// Copies `bytes` from device memory to host memory on `stream` (a cudaStream_t; null: the legacy
// stream) and waits for it; "" on success, else the CUDA error. Dynamic engines read value inputs
// a caller passed on the device this way.
std::string copy_to_host(void* dst, const void* src, size_t bytes, void* stream);
// The other way, host to device, waiting likewise (a staged engine's outputs into a caller's buffers).
std::string copy_to_device(void* dst, const void* src, size_t bytes, void* stream);
// `bytes` of device memory, freed when its last owner goes (both under device_mutation_mutex); null
// with `err` set when CUDA cannot give it.
std::shared_ptr<void> device_buffer(size_t bytes, std::string* err);

}  // namespace kiln::cuda
