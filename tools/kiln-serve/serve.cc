// kiln-serve (what `kiln serve` runs): `kiln serve --model-repository DIR [--http-port 8000]
// [--grpc-port 8001] [--metrics-port 8002] [--device D] [--sessions N]`, the KServe v2 protocol over
// HTTP and gRPC (src/serve) and Prometheus metrics. SIGTERM or SIGINT stops accepting connections,
// answers what is in flight and queued, and exits 0.
//
// A binary of its own because Debian's cpp-httplib and gRPC are shared libraries (with OpenSSL,
// brotli and the shared protobuf behind them): the kiln CLI stays free of shared libraries beyond the
// C runtime and CUDA, and execs this one, found beside it, for `kiln serve`.
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "../kiln/cli.h"
#include "serve/kserve_grpc.h"
#include "serve/kserve_http.h"

namespace kiln::cli {

namespace {

int serve_main(const ServeOptions& opt) {
  serve::ServeConfig c;
  c.repository = opt.repository;
  auto device = parse_device(opt.device);
  if (!device) return fail(device.status());
  auto precision = parse_precision(opt.precision);
  if (!precision) return fail(precision.status());
  c.device = *device;
  c.precision = *precision;
  c.sessions = opt.sessions;
  if (opt.sessions < 1) return fail(KILN_ERROR(kInvalidArgument, "--sessions must be at least 1"));
  // Signals go to the thread below alone, which stops the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  serve::Repository repo(c);
  for (const std::string& e : repo.load_all()) std::fprintf(stderr, "kiln: warning: %s\n", e.c_str());
  for (const auto& e : repo.index()) {
    for (int64_t v : e.loaded) std::printf("model '%s' version %lld: ready\n", e.name.c_str(), static_cast<long long>(v));
  }
  serve::SharedMemory shm;  // before the servers: they use it until they stop
  serve::HttpServer http(repo, shm, opt.http_threads);
  serve::GrpcServer grpc(repo, shm);
  if (opt.grpc_port && !grpc.start(opt.host + ":" + std::to_string(opt.grpc_port))) {
    return fail(KILN_ERROR(kIo, "cannot listen for gRPC on {}:{} (in use?)", opt.host, opt.grpc_port));
  }
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::printf("kiln serve: signal %d: stopping (requests in flight finish first)\n", sig);
    std::fflush(stdout);
    http.stop();
    grpc.stop();
  });
  std::atomic<bool> metrics_done{opt.metrics_port == 0}, metrics_failed{false};
  std::thread metrics;
  if (opt.metrics_port) {
    metrics = std::thread([&] {
      metrics_failed = !http.listen_metrics(opt.host, opt.metrics_port);
      metrics_done = true;
    });
  }
  std::printf("kiln serve: KServe v2 HTTP on port %d, gRPC on %d, metrics on %d (repository %s)\n", opt.http_port,
              opt.grpc_port, opt.metrics_port, opt.repository.c_str());
  std::fflush(stdout);
  bool ok = http.listen(opt.host, opt.http_port);
  // The metrics server may have started listening after a stop: stop again until it has returned.
  while (!metrics_done) {
    http.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (metrics.joinable()) metrics.join();
  if (metrics_failed && ok) std::fprintf(stderr, "kiln: warning: cannot listen on metrics port %d\n", opt.metrics_port);
  if (!ok) {
    pthread_kill(stopper.native_handle(), SIGTERM);
    stopper.join();
    return fail(KILN_ERROR(kIo, "cannot listen on {}:{} (in use?)", opt.host, opt.http_port));
  }
  stopper.join();
  std::printf("kiln serve: stopped\n");
  return 0;
}

}  // namespace

}  // namespace kiln::cli

int main(int argc, char** argv) {
  kiln::cli::ServeOptions serve;
  CLI::App app{"kiln serve: a model repository over the KServe v2 protocol, HTTP and gRPC (Triton's)"};
  app.name("kiln serve");
  app.add_option("--model-repository", serve.repository, "DIR/<model>/<version>/model.kiln or model.onnx")->required();
  app.add_option("--http-port", serve.http_port, "HTTP port")->default_val(8000)->check(CLI::Range(1, 65535));
  app.add_option("--http-thread-count", serve.http_threads, "HTTP connections served at once (keep-alive holds one each)")
      ->default_val(128)->check(CLI::Range(1, 4096));
  app.add_option("--grpc-port", serve.grpc_port, "gRPC port (0: none)")->default_val(8001)->check(CLI::Range(0, 65535));
  app.add_option("--metrics-port", serve.metrics_port, "Prometheus metrics at /metrics on this port (0: none)")
      ->default_val(8002)->check(CLI::Range(0, 65535));
  app.add_option("--host", serve.host, "address to listen on")->default_val("0.0.0.0");
  app.add_option("--sessions", serve.sessions, "sessions per model version (requests that run at once), unless its config.pbtxt has an instance_group")->default_val(2)
      ->check(CLI::Range(1, 1024));
  app.add_option("--device", serve.device, "for model.onnx built at load: auto, cpu or cuda")->default_val("auto");
  app.add_option("--precision", serve.precision, "for model.onnx built at load: fp32, tf32, fp16, bf16")->default_val("fp32");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kiln: error: %s\nRun with --help for more information.\n", e.what());
    return e.get_exit_code();
  }
  try {
    return kiln::cli::serve_main(serve);
  } catch (const std::exception& e) {
    return kiln::cli::fail(KILN_ERROR(kInternal, "internal error: {}", e.what()));
  }
}
