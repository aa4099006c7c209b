// The KServe v2 protocol over HTTP/REST (cpp-httplib), as Triton speaks it: health, server and model
// metadata, readiness, inference with JSON tensors and the binary tensor data extension, and the
// model repository extension (index, load, unload), the system and CUDA shared memory extensions,
// and Triton's model configuration (GET /v2/models/{m}/config). Every error is a 4xx/5xx with {"error": "..."}
// naming what was wrong; nothing a request does disturbs another.
//
//   serve::Repository repo(config);  repo.load_all();
//   serve::SharedMemory shm;         // regions registered over HTTP or gRPC
//   serve::HttpServer http(repo, shm);
//   http.listen("0.0.0.0", 8000);     // until stop(): in-flight requests finish first
#pragma once

#include <memory>
#include <string>

#include "serve/repository.h"
#include "serve/shared_memory.h"

namespace kiln::serve {

class HttpServer {
 public:
  // `threads` serve connections (cpp-httplib holds a thread per open keep-alive connection, so a
  // client with more connections than threads waits for one to close).
  HttpServer(Repository& repo, SharedMemory& shm, int threads = 128);
  ~HttpServer();
  // Serves until stop(); false when the address cannot be bound.
  bool listen(const std::string& host, int port);
  // Stops accepting connections; listen() returns once the requests in flight are answered.
  void stop();
  // Prometheus text at GET /metrics on its own port (Triton's --metrics-port), until stop().
  bool listen_metrics(const std::string& host, int port);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serve
