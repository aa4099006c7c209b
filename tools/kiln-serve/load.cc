// kiln-serve-load: a closed-loop load generator for a KServe v2 server (kiln serve, or Triton), the
// client half of bench/serve_load.py where Python clients would be the bottleneck (GPU rates).
//
//   kiln-serve-load --url 127.0.0.1:8001 --protocol grpc|http --model M [--version V]
//                   [--concurrency 64] [--seconds 10] [--batch 1]
//
// Reads the model's inputs from its metadata, makes one request of `batch` rows per input (random
// values), then runs `concurrency` threads, each on its own connection, each sending the request and
// waiting for the answer until the time is up. Prints one JSON line: requests, failures (with the
// first error), throughput (requests/s and rows/s) and latency percentiles in ms.
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

#include "grpc_service.grpc.pb.h"

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

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = size_t(std::ceil(q / 100.0 * double(v.size())));
  return v[std::min(v.size() - 1, k ? k - 1 : 0)];
}

}  // namespace

int main(int argc, char** argv) {
  std::string url = "127.0.0.1:8001", protocol = "grpc", model, version;
  int concurrency = 1, batch = 1;
  double seconds = 10;
  CLI::App app{"kiln-serve-load: closed-loop load on a KServe v2 server (gRPC or HTTP binary tensors)"};
  app.add_option("--url", url, "host:port");
  app.add_option("--protocol", protocol)->check(CLI::IsMember({"grpc", "http"}));
  app.add_option("--model", model)->required();
  app.add_option("--version", version);
  app.add_option("--concurrency", concurrency)->check(CLI::Range(1, 4096));
  app.add_option("--seconds", seconds)->check(CLI::Range(0.1, 3600.0));
  app.add_option("--batch", batch, "rows per request (the first dim of every input)")->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);

  // The model's inputs, from its metadata.
  std::vector<Tensor> meta;
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

  // One request, built once: a gRPC message with raw contents, or an HTTP body with a JSON header and
  // the binary tensors after it.
  inference::ModelInferRequest grpc_request;
  grpc_request.set_model_name(model);
  grpc_request.set_model_version(version);
  nlohmann::json head = {{"inputs", nlohmann::json::array()}, {"parameters", {{"binary_data_output", true}}}};
  std::string blobs;
  for (const Tensor& t : inputs) {
    auto* i = grpc_request.add_inputs();
    i->set_name(t.name);
    i->set_datatype(t.datatype);
    for (int64_t d : t.shape) i->add_shape(d);
    grpc_request.add_raw_input_contents(t.bytes);
    head["inputs"].push_back({{"name", t.name}, {"datatype", t.datatype}, {"shape", t.shape},
                              {"parameters", {{"binary_data_size", t.bytes.size()}}}});
    blobs += t.bytes;
  }
  const std::string header = head.dump();
  const std::string body = header + blobs;
  const std::string path = "/v2/models/" + model + (version.empty() ? "" : "/versions/" + version) + "/infer";

  Totals totals;
  const Clock::time_point stop = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<std::thread> threads;
  const Clock::time_point t0 = Clock::now();
  for (int k = 0; k < concurrency; ++k) {
    threads.emplace_back([&, k] {
      std::vector<double> mine;
      if (protocol == "grpc") {
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(INT32_MAX);
        args.SetInt("kiln.load.thread", k);  // a channel (connection) of its own per thread
        auto stub = inference::GRPCInferenceService::NewStub(
            grpc::CreateCustomChannel(url, grpc::InsecureChannelCredentials(), args));
        while (Clock::now() < stop) {
          grpc::ClientContext ctx;
          inference::ModelInferResponse r;
          const auto a = Clock::now();
          grpc::Status s = stub->ModelInfer(&ctx, grpc_request, &r);
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
        httplib::Headers h = {{"Inference-Header-Content-Length", std::to_string(header.size())}};
        while (Clock::now() < stop) {
          const auto a = Clock::now();
          auto res = c.Post(path, h, body, "application/octet-stream");
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
  nlohmann::json out = {{"protocol", protocol},
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
