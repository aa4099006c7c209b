// The shared memory extensions of the KServe v2 protocol, as Triton serves them: a client registers
// a region (a POSIX shared memory object by its key, or device memory by a CUDA IPC handle) and then
// names it in a request instead of sending the tensor's bytes; requested outputs may be written into
// a region too. One registry serves HTTP and gRPC (a region registered over one is usable over the
// other), and system and CUDA regions share its names.
//
// Inputs are read in place: a system region's mapping or a CUDA region's device pointer becomes the
// TensorView the session reads (a GPU engine reads device memory where it lies). A region stays
// mapped while a request uses it, even once it is unregistered.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "serve/kserve_codec.h"

namespace kiln::serve {

struct ShmRegion;  // a mapped region (shared_memory.cc)

// Where a request wants an output written (a shared memory region) instead of returned: the worker
// that runs it writes it there (a GPU engine in place when the request runs alone). The HostTensor
// returned for such an output then carries its dtype and shape, and no data when it was written in
// place on the device.
struct OutputTarget {
  void* data = nullptr;  // null: returned
  size_t capacity = 0;   // bytes there
  bool on_device = false;
};

class SharedMemory {
 public:
  enum class Kind { kSystem, kCuda };
  SharedMemory();
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // Maps [offset, offset + byte_size) of the shared memory object `key` (shm_open), read and write.
  // Throws HttpError 400 naming what was wrong (a name taken, no such key, a range past its end).
  void register_system(const std::string& name, const std::string& key, uint64_t offset, uint64_t byte_size);
  // Opens a cudaIpcMemHandle_t's 64 bytes on GPU `device_id` (the one kiln runs on); the
  // allocation must hold byte_size bytes. Throws HttpError 400; a server built without CUDA says so.
  void register_cuda(const std::string& name, const std::string& raw_handle, int64_t device_id, uint64_t byte_size);
  // Forgets the region `name` of `kind` (empty: every region of that kind). Throws HttpError 400 for
  // a name not registered as that kind.
  void unregister(Kind kind, const std::string& name);

  struct Status {
    std::string name, key;  // key: system regions only
    uint64_t offset = 0, byte_size = 0;
    int64_t device_id = 0;  // CUDA regions only
  };
  // The regions of `kind` (empty name: all of them, by name). Throws HttpError 400 for a name not
  // registered as that kind.
  std::vector<Status> status(Kind kind, const std::string& name) const;

  // Points every input that names a region (Input::shm) at its bytes there, checking the range lies
  // in the region and holds exactly the input's elements (BYTES inputs are decoded out of it).
  void attach(std::vector<Input>& inputs) const;
  // Where an output named `ref` goes: the range, checked to lie in its region, which `keep` holds
  // mapped while the request uses it. Throws HttpError 400.
  OutputTarget target(const ShmRef& ref, std::shared_ptr<const void>& keep, const std::string& output_name) const;
  // Targets (one per engine output in `outputs`) for the requested outputs that name a region
  // (`wanted`: output index and its region, or none); BYTES outputs get none (written() takes them).
  std::vector<OutputTarget> targets(const std::vector<std::pair<size_t, const ShmRef*>>& wanted,
                                    const std::vector<TensorInfo>& outputs, std::vector<std::shared_ptr<const void>>& keep) const;
  // After the run: puts an output that names a region there unless the worker did (a target), and
  // returns the bytes it takes.
  uint64_t written(const ShmRef& ref, const OutputTarget& target, const HostTensor& t, const std::string& output_name) const {
    return target.data ? t.bytes() : write(ref, t, output_name);
  }
  // Writes an output into the region `ref` names; the bytes written. Throws HttpError 400 when the
  // range does not hold them.
  uint64_t write(const ShmRef& ref, const HostTensor& t, const std::string& output_name) const;

 private:
  std::shared_ptr<ShmRegion> find(const std::string& name, const std::string& what) const;
  // The region's bytes [offset, offset + size), checked to lie in it.
  unsigned char* range(const ShmRegion& r, const ShmRef& ref, uint64_t size, const std::string& what) const;
  void add(std::shared_ptr<ShmRegion> r);
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<ShmRegion>> regions_;
};

// Device memory for the batcher's concatenated inputs and the copies into and out of CUDA regions,
// on a stream of its own (the sessions' captured graphs never wait for it). Without CUDA in the
// build every call throws HttpError 400 (no CUDA region can exist to need it).
// Device-to-device copies collected for one DeviceStaging::copy_all; empty ones are left out.
struct DeviceCopies {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  void add(void* dst, const void* src, size_t bytes) {
    if (!bytes) return;
    dsts.push_back(dst);
    srcs.push_back(src);
    sizes.push_back(bytes);
  }
};

class DeviceStaging {
 public:
  DeviceStaging();
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;
  // Device memory of at least `bytes` for slot k, kept from call to call (the batcher's inputs
  // 0..n-1, then its outputs).
  unsigned char* buffer(size_t k, size_t bytes);
  // Copies on the staging stream (any direction: unified addressing tells host from device);
  // sync() waits for them.
  void copy(void* dst, const void* src, size_t bytes);
  // Copies dsts[i] <- srcs[i] (sizes[i] bytes), all device memory, on the staging stream (a batch's
  // requests gathered or scattered): a kernel launch per 64 copies, in no order among themselves.
  void copy_all(const DeviceCopies& c);
  void sync();
  // Marks the stream's current point; wait() returns once the stream has passed the last mark.
  void mark();
  void wait();
  void* stream() const { return stream_; }

 private:
  void* stream_ = nullptr;
  void* mark_ = nullptr;  // cudaEvent_t
  std::vector<std::pair<void*, size_t>> buffers_;
};

// Whether this server can read CUDA regions (built with CUDA).
bool cuda_shared_memory_supported();

}  // namespace kiln::serve
