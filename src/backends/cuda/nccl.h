// NCCL, opened at run time (dlopen of libnccl.so.2) like NVRTC: a kiln binary starts, and runs every
// single-GPU engine, where NCCL is not installed; only a tensor-parallel session on several GPUs
// needs it, and fails with a one-line error saying so when it is missing.
//
//   KILN_ASSIGN_OR_RETURN(const Nccl* nccl, nccl_library());
//   KILN_ASSIGN_OR_RETURN(auto comms, nccl_comms(2));             // GPUs 0 and 1 of this process
//   nccl->all_reduce(x, y, count, ncclFloat16, ncclSum, comms[0].get(), stream);
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "support/status.h"

namespace kiln::cuda {

struct Nccl {
  decltype(&::ncclCommInitAll) comm_init_all = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommAbort) comm_abort = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclGetVersion) get_version = nullptr;
  int version = 0;  // NCCL_VERSION_CODE of the loaded library (22703 for 2.27.3)
};

// The library, resolved once; an error saying why it cannot be used.
Expected<const Nccl*> nccl_library();
Status nccl_status(ncclResult_t r, const char* call);

// One communicator per GPU 0..n-1 of this process (ncclCommInitAll), each destroyed when its
// pointer is released. NVLink multicast (NVLS) is left off unless the environment turns it on.
Expected<std::vector<std::shared_ptr<void>>> nccl_comms(int n);

// Aborts each communicator of nccl_comms (ncclCommAbort: collectives waiting on it return) unless
// already aborted; their pointers then free nothing more. For a rank that failed while its peers
// wait in a collective: the communicators cannot be used again.
void nccl_abort(const std::vector<std::shared_ptr<void>>& comms);

// The median time (ms) of an fp16 all-reduce of `bytes` across GPUs 0..n-1, each rank on a thread
// of its own, over `iterations` calls after a warmup (CUDA events on rank 0's stream).
Expected<double> nccl_all_reduce_ms(int n, size_t bytes, int iterations);

}  // namespace kiln::cuda
