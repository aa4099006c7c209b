// Many device-to-device copies in one kernel launch: the batcher gathers a batch's requests from
// their CUDA shared memory regions and scatters the outputs back to them. One cudaMemcpyAsync per
// request cost ~5 us of host time each (and cudaMemcpyBatchAsync no less): ~150 us a 30-row batch
// each way (bench/RESULTS.md, thirty-eighth session).
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

}  // namespace kiln::serve
