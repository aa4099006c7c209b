// kiln-serve-load: a closed-loop load generator for a KServe v2 server (kiln serve, or Triton), the
// client half of bench/serve_load.py where Python clients would be the bottleneck (GPU rates).
//
//   kiln-serve-load --url 127.0.0.1:8001 --protocol grpc|http --model M [--version V]
//                   [--concurrency 64] [--seconds 10] [--batch 1] [--async [--client-threads 4]]
//                   [--shared-memory none|system|cuda [--output-shared-memory-size BYTES]]
//
// Reads the model's inputs from its metadata, makes one request of `batch` rows per input (random
// values), then runs `concurrency` threads, each on its own connection, each sending the request and
// waiting for the answer until the time is up. Prints one JSON line: requests, failures (with the
// first error), throughput (requests/s and rows/s) and latency percentiles in ms.
//
// --shared-memory (perf_analyzer's option): the inputs are written once into a region registered
// with the server (a POSIX shared memory object, or device memory through a CUDA IPC handle) and
// requests name it instead of carrying them; with --output-shared-memory-size each thread's outputs
// are written into a region of its own too (that many bytes per output), else they come back in the
// response.
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "grpc_service.grpc.pb.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Tensor {
  std::string name, datatype;
  std::vector<int64_t> shape;
  std::string bytes;
};

size_t element_size(const std::string& t) {
  if (t == "FP64" || t == "INT64" || t == "UINT64") return 8;
  if (t == "FP32" || t == "INT32" || t == "UINT32") return 4;
  if (t == "FP16" || t == "BF16" || t == "INT16" || t == "UINT16") return 2;
  if (t == "INT8" || t == "UINT8" || t == "BOOL") return 1;
  return 0;
}

// Random elements: uniform floats in [-1, 1) for FP32, small bytes otherwise (indices stay in range).
void fill(Tensor& t, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  const size_t es = element_size(t.datatype);
  t.bytes.assign(size_t(n) * es, '\0');
  if (t.datatype == "FP32") {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < n; ++i) {
      float v = u(rng);
      std::memcpy(t.bytes.data() + i * 4, &v, 4);
    }
  } else if (t.datatype == "FP16") {
    for (int64_t i = 0; i < n; ++i) t.bytes[size_t(i) * 2 + 1] = char(0x38 + (rng() & 3));  // 0.5 .. 1.0
  }
}

std::vector<Tensor> from_shapes(const std::vector<Tensor>& meta, int batch) {
  std::vector<Tensor> out = meta;
  std::mt19937 rng(7);
  for (Tensor& t : out) {
    for (size_t k = 0; k < t.shape.size(); ++k) {
      if (t.shape[k] < 0) t.shape[k] = k == 0 ? batch : 1;
    }
    fill(t, rng);
  }
  return out;
}

struct Totals {
  std::mutex mu;
  std::vector<double> ms;
  std::atomic<long> failures{0};
  std::string first_error;
  void fail(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.empty()) first_error = e;
    ++failures;
  }
};

// A region of `size` bytes that the server can read: a POSIX shared memory object (system) or device
// memory exported through a CUDA IPC handle (cuda), holding `init` at its start.
struct Region {
  std::string kind, name, key, handle;  // handle: the cudaIpcMemHandle_t's bytes
  size_t size = 0;
  void* p = nullptr;
  bool make(const std::string& k, const std::string& n, size_t bytes, const std::string& init, std::string& err) {
    kind = k;
    name = n;
    size = std::max<size_t>(bytes, 1);
    if (kind == "system") {
      key = "/" + n + "_" + std::to_string(getpid());
      const int fd = shm_open(key.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
      if (fd < 0 || ftruncate(fd, off_t(size)) != 0) {
        err = "cannot make shared memory object " + key;
        return false;
      }
      p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) {
        err = "cannot map " + key;
        return false;
      }
      std::memcpy(p, init.data(), init.size());
      return true;
    }
#ifdef KILN_HAVE_CUDA
    cudaIpcMemHandle_t h;
    if (cudaMalloc(&p, size) != cudaSuccess || cudaMemcpy(p, init.data(), init.size(), cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaIpcGetMemHandle(&h, p) != cudaSuccess) {
      err = "cannot make a CUDA IPC region of " + std::to_string(size) + " bytes";
      return false;
    }
    handle.assign(reinterpret_cast<const char*>(&h), sizeof h);
    return true;
#else
    err = "this kiln-serve-load was built without CUDA";
    return false;
#endif
  }
  ~Region() {
    if (!p) return;
    if (kind == "system") {
      munmap(p, size);
      shm_unlink(key.c_str());
    }
#ifdef KILN_HAVE_CUDA
    if (kind == "cuda") cudaFree(p);
#endif
  }
};

std::string base64(const std::string& in) {
  static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : in) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(a[(acc >> bits) & 63]);
    }
  }
  if (bits) out.push_back(a[(acc << (6 - bits)) & 63]);
  while (out.size() % 4) out.push_back('=');
  return out;
}

// Registers (or, with `unregister`, forgets) a region with the server over the protocol in use;
// false with the server's reason in `err`.
bool registration(const std::string& url, const std::string& protocol, const Region& r, bool unregister, std::string& err) {
  const bool sys = r.kind == "system";
  if (protocol == "http") {
    httplib::Client c("http://" + url);
    const std::string base = std::string(sys ? "/v2/systemsharedmemory" : "/v2/cudasharedmemory") + "/region/" + r.name;
    nlohmann::json b = sys ? nlohmann::json{{"key", r.key}, {"offset", 0}, {"byte_size", r.size}}
                           : nlohmann::json{{"raw_handle", {{"b64", base64(r.handle)}}}, {"device_id", 0}, {"byte_size", r.size}};
    auto res = unregister ? c.Post(base + "/unregister") : c.Post(base + "/register", b.dump(), "application/json");
    if (!res || res->status != 200) err = res ? res->body : httplib::to_string(res.error());
    return err.empty();
  }
  auto stub = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(url, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::Status s;
  if (sys && unregister) {
    inference::SystemSharedMemoryUnregisterRequest q;
    inference::SystemSharedMemoryUnregisterResponse a;
    q.set_name(r.name);
    s = stub->SystemSharedMemoryUnregister(&ctx, q, &a);
  } else if (sys) {
    inference::SystemSharedMemoryRegisterRequest q;
    inference::SystemSharedMemoryRegisterResponse a;
    q.set_name(r.name);
    q.set_key(r.key);
    q.set_byte_size(r.size);
    s = stub->SystemSharedMemoryRegister(&ctx, q, &a);
  } else if (unregister) {
    inference::CudaSharedMemoryUnregisterRequest q;
    inference::CudaSharedMemoryUnregisterResponse a;
    q.set_name(r.name);
    s = stub->CudaSharedMemoryUnregister(&ctx, q, &a);
  } else {
    inference::CudaSharedMemoryRegisterRequest q;
    inference::CudaSharedMemoryRegisterResponse a;
    q.set_name(r.name);
    q.set_raw_handle(r.handle);
    q.set_device_id(0);
    q.set_byte_size(r.size);
    s = stub->CudaSharedMemoryRegister(&ctx, q, &a);
  }
  if (!s.ok()) err = s.error_message();
  return s.ok();
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = size_t(std::ceil(q / 100.0 * double(v.size())));
  return v[std::min(v.size() - 1, k ? k - 1 : 0)];
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = "127.0.0.1:8001", protocol = "grpc", model, version, shared_memory = "none";
  int concurrency = 1, batch = 1;
  size_t output_shm_size = 0;
  double seconds = 10;
  bool async = false;
  int client_threads = 4;
  CLI::App app{"kiln-serve-load: closed-loop load on a KServe v2 server (gRPC or HTTP binary tensors)"};
  app.add_option("--url", url, "host:port");
  app.add_option("--protocol", protocol)->check(CLI::IsMember({"grpc", "http"}));
  app.add_option("--model", model)->required();
  app.add_option("--version", version);
  app.add_option("--concurrency", concurrency)->check(CLI::Range(1, 4096));
  app.add_option("--seconds", seconds)->check(CLI::Range(0.1, 3600.0));
  app.add_option("--batch", batch, "rows per request (the first dim of every input)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--shared-memory", shared_memory, "inputs in a registered region instead of the requests")
      ->check(CLI::IsMember({"none", "system", "cuda"}));
  app.add_option("--output-shared-memory-size", output_shm_size, "with --shared-memory: bytes per output in a region per thread");
  app.add_flag("--async", async, "gRPC: requests driven by completion queues, not a thread each");
  app.add_option("--client-threads", client_threads, "with --async: threads driving the requests")->check(CLI::Range(1, 256));
  CLI11_PARSE(app, argc, argv);
  if (async && protocol != "grpc") {
    std::fprintf(stderr, "kiln-serve-load: error: --async is for --protocol grpc\n");
    return 2;
  }

  // The model's inputs and outputs, from its metadata.
  std::vector<Tensor> meta;
  std::vector<std::string> output_names;
  {
    auto stub = inference::GRPCInferenceService::NewStub(grpc::CreateChannel(url, grpc::InsecureChannelCredentials()));
    inference::ModelMetadataRequest q;
    q.set_name(model);
    q.set_version(version);
    inference::ModelMetadataResponse r;
    grpc::ClientContext ctx;
    if (protocol == "grpc") {
      grpc::Status s = stub->ModelMetadata(&ctx, q, &r);
      if (!s.ok()) {
        std::fprintf(stderr, "kiln-serve-load: error: metadata of '%s': %s\n", model.c_str(), s.error_message().c_str());
        return 1;
      }
      for (const auto& i : r.inputs()) meta.push_back({i.name(), i.datatype(), {i.shape().begin(), i.shape().end()}, {}});
      for (const auto& o : r.outputs()) output_names.push_back(o.name());
    } else {
      httplib::Client c("http://" + url);
      auto res = c.Get("/v2/models/" + model + (version.empty() ? "" : "/versions/" + version));
      if (!res || res->status != 200) {
        std::fprintf(stderr, "kiln-serve-load: error: metadata of '%s': %s\n", model.c_str(),
                     res ? res->body.c_str() : httplib::to_string(res.error()).c_str());
        return 1;
      }
      const nlohmann::json m = nlohmann::json::parse(res->body, nullptr, false);
      if (m.is_discarded() || !m.contains("inputs")) {
        std::fprintf(stderr, "kiln-serve-load: error: metadata of '%s' is not KServe v2 JSON\n", model.c_str());
        return 1;
      }
      for (const auto& i : m["inputs"]) {
        meta.push_back({i["name"], i["datatype"], i["shape"].get<std::vector<int64_t>>(), {}});
      }
      for (const auto& o : m["outputs"]) output_names.push_back(o["name"]);
    }
  }
  for (const Tensor& t : meta) {
    if (!element_size(t.datatype)) {
      std::fprintf(stderr, "kiln-serve-load: error: input '%s' is %s, which this tool cannot fill\n", t.name.c_str(),
                   t.datatype.c_str());
      return 1;
    }
  }
  const std::vector<Tensor> inputs = from_shapes(meta, batch);

  // Shared memory: every input in one region (each at a 256-byte boundary), and a region of each
  // thread's outputs.
  const bool use_shm = shared_memory != "none";
  Region in_region, out_region;
  std::vector<size_t> in_offset;
  if (use_shm) {
    std::string all, err;
    for (const Tensor& t : inputs) {
      in_offset.push_back(all.size());
      all += t.bytes;
      all.resize((all.size() + 255) / 256 * 256, '\0');
    }
    if (!in_region.make(shared_memory, "kiln_load_in", all.size(), all, err) ||
        (output_shm_size && !out_region.make(shared_memory, "kiln_load_out", output_shm_size * output_names.size() * size_t(concurrency),
                                             std::string(), err)) ||
        !registration(url, protocol, in_region, false, err) ||
        (output_shm_size && !registration(url, protocol, out_region, false, err))) {
      std::fprintf(stderr, "kiln-serve-load: error: shared memory: %s\n", err.c_str());
      return 1;
    }
  }

  // Each thread's request, built once: a gRPC message with raw contents, or an HTTP body with a JSON
  // header and the binary tensors after it (or naming the regions that hold them).
  struct Request {
    inference::ModelInferRequest grpc;
    std::string header, body;
  };
  std::vector<Request> requests(static_cast<size_t>(concurrency));
  for (int k = 0; k < concurrency; ++k) {
    Request& q = requests[size_t(k)];
    q.grpc.set_model_name(model);
    q.grpc.set_model_version(version);
    nlohmann::json head = {{"inputs", nlohmann::json::array()}, {"parameters", {{"binary_data_output", true}}}};
    std::string blobs;
    for (size_t j = 0; j < inputs.size(); ++j) {
      const Tensor& t = inputs[j];
      auto* i = q.grpc.add_inputs();
      i->set_name(t.name);
      i->set_datatype(t.datatype);
      for (int64_t d : t.shape) i->add_shape(d);
      nlohmann::json params;
      if (use_shm) {
        (*i->mutable_parameters())["shared_memory_region"].set_string_param(in_region.name);
        (*i->mutable_parameters())["shared_memory_byte_size"].set_int64_param(int64_t(t.bytes.size()));
        (*i->mutable_parameters())["shared_memory_offset"].set_int64_param(int64_t(in_offset[j]));
        params = {{"shared_memory_region", in_region.name}, {"shared_memory_byte_size", t.bytes.size()},
                  {"shared_memory_offset", in_offset[j]}};
      } else {
        q.grpc.add_raw_input_contents(t.bytes);
        params = {{"binary_data_size", t.bytes.size()}};
        blobs += t.bytes;
      }
      head["inputs"].push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape}, {"parameters", params}});
    }
    if (output_shm_size) {
      head["outputs"] = nlohmann::json::array();
      for (size_t j = 0; j < output_names.size(); ++j) {
        const size_t at = (size_t(k) * output_names.size() + j) * output_shm_size;
        auto* o = q.grpc.add_outputs();
        o->set_name(output_names[j]);
        (*o->mutable_parameters())["shared_memory_region"].set_string_param(out_region.name);
        (*o->mutable_parameters())["shared_memory_byte_size"].set_int64_param(int64_t(output_shm_size));
        (*o->mutable_parameters())["shared_memory_offset"].set_int64_param(int64_t(at));
        head["outputs"].push_back({{"name", output_names[j]},
                                   {"parameters", {{"shared_memory_region", out_region.name},
                                                   {"shared_memory_byte_size", output_shm_size},
                                                   {"shared_memory_offset", at}}}});
      }
    }
    q.header = head.dump();
    q.body = q.header + blobs;
  }
  const std::string path = "/v2/models/" + model + (version.empty() ? "" : "/versions/" + version) + "/infer";

  Totals totals;
  const Clock::time_point stop = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  const Clock::time_point t0 = Clock::now();
  // One connection per request in flight (channel arguments that differ keep gRPC from sharing one).
  auto make_stub = [&](int k) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(INT32_MAX);
    args.SetInt("kiln.load.thread", k);
    return inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(url, grpc::InsecureChannelCredentials(), args));
  };
  // --async: thread t drives requests t, t + T, ... on its own completion queue; each answer starts
  // that request again until the time is up.
  struct Call {
    std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientAsyncResponseReader<inference::ModelInferResponse>> reader;
    inference::ModelInferResponse r;
    grpc::Status s;
    Clock::time_point start;
  };
  const int drivers = async ? std::min(client_threads, concurrency) : 0;
  for (int t = 0; t < drivers; ++t) {
    threads.emplace_back([&, t] {
      std::vector<double> mine;
      grpc::CompletionQueue cq;
      std::vector<std::unique_ptr<Call>> calls;
      auto start = [&](Call& c, int k) {
        c.reader.reset();  // it lives in the old call's arena, which the old context frees
        c.ctx = std::make_unique<grpc::ClientContext>();
        c.r.Clear();
        c.start = Clock::now();
        c.reader = c.stub->AsyncModelInfer(c.ctx.get(), requests[size_t(k)].grpc, &cq);
        c.reader->Finish(&c.r, &c.s, reinterpret_cast<void*>(intptr_t(k)));
      };
      for (int k = t; k < concurrency; k += drivers) {
        calls.push_back(std::make_unique<Call>());
        calls.back()->stub = make_stub(k);
      }
      size_t running = 0;
      for (int k = t; k < concurrency; k += drivers, ++running) start(*calls[size_t((k - t) / drivers)], k);
      void* tag = nullptr;
      bool ok = false;
      while (running > 0 && cq.Next(&tag, &ok)) {
        const int k = int(reinterpret_cast<intptr_t>(tag));
        Call& c = *calls[size_t((k - t) / drivers)];
        const Clock::time_point now = Clock::now();
        if (!ok || !c.s.ok()) {
          totals.fail(ok ? c.s.error_message() : "the completion queue failed the call");
        } else {
          mine.push_back(std::chrono::duration<double, std::milli>(now - c.start).count());
        }
        if (now < stop) {
          start(c, k);
        } else {
          --running;
        }
      }
      cq.Shutdown();
      while (cq.Next(&tag, &ok)) {
      }
      std::lock_guard<std::mutex> lock(totals.mu);
      totals.ms.insert(totals.ms.end(), mine.begin(), mine.end());
    });
  }
  for (int k = 0; k < (async ? 0 : concurrency); ++k) {
    threads.emplace_back([&, k] {
      std::vector<double> mine;
      if (protocol == "grpc") {
        auto stub = make_stub(k);
        while (Clock::now() < stop) {
          grpc::ClientContext ctx;
          inference::ModelInferResponse r;
          const auto a = Clock::now();
          grpc::Status s = stub->ModelInfer(&ctx, requests[size_t(k)].grpc, &r);
          if (!s.ok()) {
            totals.fail(s.error_message());
            continue;
          }
          mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
        }
      } else {
        httplib::Client c("http://" + url);
        c.set_keep_alive(true);
        c.set_tcp_nodelay(true);
        c.set_read_timeout(300, 0);
        const Request& q = requests[size_t(k)];
        httplib::Headers h = {{"Inference-Header-Content-Length", std::to_string(q.header.size())}};
        while (Clock::now() < stop) {
          const auto a = Clock::now();
          auto res = c.Post(path, h, q.body, "application/octet-stream");
          if (!res || res->status != 200) {
            totals.fail(res ? res->body : httplib::to_string(res.error()));
            continue;
          }
          mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
        }
      }
      std::lock_guard<std::mutex> lock(totals.mu);
      totals.ms.insert(totals.ms.end(), mine.begin(), mine.end());
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (use_shm) {
    std::string err;
    registration(url, protocol, in_region, true, err);
    if (output_shm_size) registration(url, protocol, out_region, true, err);
  }
  nlohmann::json out = {{"protocol", protocol},
                        {"async", async},
                        {"shared_memory", shared_memory},
                        {"concurrency", concurrency},
                        {"batch", batch},
                        {"requests", totals.ms.size()},
                        {"failures", totals.failures.load()},
                        {"throughput", double(totals.ms.size()) / wall},
                        {"rows_per_s", double(totals.ms.size()) * batch / wall},
                        {"p50_ms", percentile(totals.ms, 50)},
                        {"p90_ms", percentile(totals.ms, 90)},
                        {"p99_ms", percentile(totals.ms, 99)}};
  if (!totals.first_error.empty()) out["first_error"] = totals.first_error;
  std::printf("%s\n", out.dump().c_str());
  return totals.failures ? 1 : 0;
}
