#include "serve/kserve_http.h"

#include "serve/gpu_metrics.h"
#include "serve/kserve_codec.h"
#include "serve/model_config.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace kiln::serve {

using nlohmann::json;

struct HttpServer::Impl {
  Repository& repo;
  httplib::Server http, metrics;

  explicit Impl(Repository& r) : repo(r) {
    routes();
    metrics.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(repo.prometheus() + gpu_metrics_text(), "text/plain; version=0.0.4");
    });
  }

  static void reply(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(), "application/json");
  }
  static void fail(httplib::Response& res, const HttpError& e) { reply(res, e.status, {{"error", e.message}}); }

  template <typename F>
  static auto guarded(F f) {
    return [f](const httplib::Request& req, httplib::Response& res) {
      try {
        f(req, res);
      } catch (const HttpError& e) {
        fail(res, e);
      } catch (const std::bad_alloc&) {
        fail(res, {500, "out of host memory"});
      } catch (const std::exception& e) {
        fail(res, {500, std::string("internal error: ") + e.what()});
      }
    };
  }

  void infer(const httplib::Request& req, httplib::Response& res) {
    std::shared_ptr<LoadedModel> m = repo.find(req.matches[1], req.matches[2]);
    CountedRequest counted(*m);
    const std::string& name = m->name();
    const std::string& body = req.body;
    const std::string h = req.get_header_value("Inference-Header-Content-Length");
    const size_t header_len = header_length(body, req.has_header("Inference-Header-Content-Length") ? &h : nullptr);
    json r = parse_request(body, header_len);
    const auto& infos = m->engine().inputs();
    std::vector<Input> inputs = decode_inputs(body, header_len, r, infos);
    std::vector<TensorView> views;
    for (Input& in : inputs) {
      if (!in.info) {
        throw HttpError{400, "input '" + infos[size_t(&in - inputs.data())].name + "' of model '" + name + "' is missing"};
      }
      views.push_back(in.view());
    }
    // The request's own timeout (microseconds), as Triton's clients send it.
    uint64_t timeout_us = 0;
    if (r.contains("parameters") && r["parameters"].is_object() && r["parameters"].contains("timeout")) {
      const json& t = r["parameters"]["timeout"];
      if (!t.is_number_unsigned()) throw HttpError{400, "parameter 'timeout' is not a count of microseconds"};
      timeout_us = t.get<uint64_t>();
    }
    auto out = m->infer(views, timeout_us);
    if (!out) throw HttpError{status_of(out.status()), out.status().message()};

    const auto& onfo = m->engine().outputs();
    bool all_binary = r.contains("parameters") && r["parameters"].is_object() &&
                      r["parameters"].value("binary_data_output", false);
    std::vector<std::pair<size_t, bool>> wanted;  // output index, binary
    if (r.contains("outputs") && r["outputs"].is_array()) {
      for (const json& jo : r["outputs"]) {
        const std::string n = jo.is_object() && jo.contains("name") && jo["name"].is_string() ? jo["name"].get<std::string>() : "";
        size_t k = 0;
        while (k < onfo.size() && onfo[k].name != n) ++k;
        if (k == onfo.size()) throw HttpError{400, "unknown output '" + n + "' for model '" + name + "'"};
        bool binary = all_binary;
        if (jo.contains("parameters") && jo["parameters"].is_object()) binary = jo["parameters"].value("binary_data", binary);
        wanted.emplace_back(k, binary);
      }
    } else {
      for (size_t k = 0; k < onfo.size(); ++k) wanted.emplace_back(k, all_binary);
    }
    json resp = {{"model_name", name}, {"model_version", std::to_string(m->version())}, {"outputs", json::array()}};
    if (r.contains("id")) resp["id"] = r["id"];
    std::string blobs;
    for (auto [k, binary] : wanted) {
      const HostTensor& t = (*out)[k];
      json jo = {{"name", onfo[k].name}, {"datatype", kserve_type(t.dtype()).value_or("?")}, {"shape", t.shape()}};
      if (binary) {
        std::string b = encode_binary(t);
        jo["parameters"] = {{"binary_data_size", b.size()}};
        blobs += b;
      } else {
        jo["data"] = encode_json_data(t);
      }
      resp["outputs"].push_back(std::move(jo));
    }
    std::string head = resp.dump();
    counted.answered();
    if (blobs.empty()) {
      res.set_content(head, "application/json");
      return;
    }
    res.set_header("Inference-Header-Content-Length", std::to_string(head.size()));
    res.set_content(head + blobs, "application/octet-stream");
  }

  void routes() {
    http.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
    http.Get("/v2/health/ready", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
    http.Get("/v2", [](const httplib::Request&, httplib::Response& res) {
      reply(res, 200, {{"name", "kiln"}, {"version", KILN_SERVE_VERSION},
                      {"extensions", {"binary_tensor_data", "model_repository", "model_configuration"}}});
    });
    // /v2/models/{name}[/versions/{v}][/ready|/infer]
    const std::string m = R"(/v2/models/([^/]+)(?:/versions/([0-9]+))?)";
    http.Get(m + "/ready", guarded([this](const httplib::Request& req, httplib::Response& res) {
      try {
        repo.find(req.matches[1], req.matches[2]);
        res.status = 200;
      } catch (const HttpError&) {
        res.status = 400;
      }
    }));
    http.Get(m, guarded([this](const httplib::Request& req, httplib::Response& res) {
      auto mod = repo.find(req.matches[1], req.matches[2]);
      json in = json::array(), out = json::array(), versions = json::array();
      for (const auto& t : mod->engine().inputs()) in.push_back(tensor_metadata(t));
      for (const auto& t : mod->engine().outputs()) out.push_back(tensor_metadata(t));
      for (int64_t v : repo.loaded_versions(mod->name())) versions.push_back(std::to_string(v));
      reply(res, 200, {{"name", mod->name()}, {"versions", versions}, {"platform", "kiln"}, {"inputs", in}, {"outputs", out}});
    }));
    http.Get(m + "/config", guarded([this](const httplib::Request& req, httplib::Response& res) {
      res.set_content(config_json(repo.find(req.matches[1], req.matches[2])->config()), "application/json");
    }));
    http.Post(m + "/infer", guarded([this](const httplib::Request& req, httplib::Response& res) { infer(req, res); }));
    http.Post("/v2/repository/index", guarded([this](const httplib::Request&, httplib::Response& res) {
      json a = json::array();
      // One entry per version on disk: READY when it serves.
      for (const auto& e : repo.index()) {
        for (int64_t v : e.versions) {
          const bool ready = std::find(e.loaded.begin(), e.loaded.end(), v) != e.loaded.end();
          json j = {{"name", e.name}, {"version", std::to_string(v)}, {"state", ready ? "READY" : "UNAVAILABLE"}};
          if (!ready && !e.reason.empty()) j["reason"] = e.reason;
          a.push_back(j);
        }
        if (e.versions.empty()) a.push_back({{"name", e.name}, {"state", "UNAVAILABLE"}, {"reason", e.reason}});
      }
      reply(res, 200, a);
    }));
    http.Post(R"(/v2/repository/models/([^/]+)/load)", guarded([this](const httplib::Request& req, httplib::Response& res) {
      if (Status s = repo.load(req.matches[1]); !s) throw HttpError{400, s.message()};
      reply(res, 200, json::object());
    }));
    http.Post(R"(/v2/repository/models/([^/]+)/unload)", guarded([this](const httplib::Request& req, httplib::Response& res) {
      if (Status s = repo.unload(req.matches[1]); !s) throw HttpError{400, s.message()};
      reply(res, 200, json::object());
    }));
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (res.body.empty()) reply(res, res.status, {{"error", "no route for " + req.method + " " + req.path}});
    });
    http.set_payload_max_length(size_t(1) << 31);
    // Responses go out as soon as they are written: with Nagle's algorithm a reply's last segment
    // waits for the client's delayed ACK, 40 ms per request on Linux.
    http.set_tcp_nodelay(true);
  }
};

HttpServer::HttpServer(Repository& repo, int threads) : impl_(std::make_unique<Impl>(repo)) {
  impl_->http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
}
HttpServer::~HttpServer() = default;
bool HttpServer::listen(const std::string& host, int port) { return impl_->http.listen(host, port); }
void HttpServer::stop() {
  impl_->http.stop();
  impl_->metrics.stop();
}
bool HttpServer::listen_metrics(const std::string& host, int port) { return impl_->metrics.listen(host, port); }

}  // namespace kiln::serve
