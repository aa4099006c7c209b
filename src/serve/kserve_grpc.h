// The KServe v2 protocol over gRPC (src/serve/proto/grpc_service.proto, Triton's service and
// messages): server and model liveness, readiness and metadata, the model configuration, inference
// with raw or typed tensor contents or shared memory regions (registered here or over HTTP: one
// SharedMemory), and the repository index, load and unload. Every request goes
// through the same Repository and schedulers as HTTP; every error is a gRPC status naming what was
// wrong (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE for a full queue, DEADLINE_EXCEEDED for a timeout).
// A client's deadline bounds how long its request may wait in the queue.
#pragma once

#include <memory>
#include <string>

#include "serve/repository.h"
#include "serve/shared_memory.h"

namespace kiln::serve {

class GrpcServer {
 public:
  GrpcServer(Repository& repo, SharedMemory& shm);
  ~GrpcServer();
  // Starts serving on "host:port" on gRPC's own threads; false when the address cannot be bound.
  bool start(const std::string& address);
  // Stops accepting calls and returns once the calls in flight are answered.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serve
