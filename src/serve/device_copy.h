// Many device-to-device copies in a kernel launch (per 64 of them): the batcher gathers a batch's
// requests from their CUDA shared memory regions and scatters the outputs back to them. A
// cudaMemcpyAsync per request (or cudaMemcpyBatchAsync) cost host time per copy that grew with the
// batch (bench/RESULTS.md, thirty-eighth session).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kiln::serve {

// dsts[i] <- srcs[i], sizes[i] bytes, for every i, on `stream` (a cudaStream_t), in no order among
// themselves; every pointer is device memory on the current device (regions from other processes
// opened with cudaIpcOpenMemHandle included). Returns an empty string or the launch's error.
std::string copy_on_device(const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                           const std::vector<size_t>& sizes, void* stream);

// Loads the copy kernel's module (CUDA loads modules lazily, at a kernel's first launch), so that a
// batch's first copy does not load it while a session may be capturing a graph. Call with the
// device mutation lock held.
void load_device_copy();

}  // namespace kiln::serve
