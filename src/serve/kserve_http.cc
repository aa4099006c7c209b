#include "serve/kserve_http.h"

#include "serve/gpu_metrics.h"
#include "serve/kserve_codec.h"
#include "serve/model_config.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

namespace kiln::serve {

using nlohmann::json;

struct HttpServer::Impl {
  Repository& repo;
  SharedMemory& shm;
  httplib::Server http, metrics;

  Impl(Repository& r, SharedMemory& s) : repo(r), shm(s) {
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

  // guarded(f) for a POST whose body kiln does not use (see routes()): a declared body is read and
  // dropped, so the next request on the kept-alive connection starts where this one ends.
  template <typename F>
  static httplib::Server::HandlerWithContentReader bodyless(F f) {
    return [g = guarded(f)](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
      if (req.has_header("Content-Length") || req.get_header_value("Transfer-Encoding") == "chunked") {
        read([](const char*, size_t) { return true; });
      }
      g(req, res);
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
    shm.attach(inputs);
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
    const auto& onfo = m->engine().outputs();
    bool all_binary = r.contains("parameters") && r["parameters"].is_object() &&
                      r["parameters"].value("binary_data_output", false);
    struct Wanted {
      size_t k;
      bool binary;
      std::optional<ShmRef> shm;  // written into a shared memory region
    };
    std::vector<Wanted> wanted;
    if (r.contains("outputs") && r["outputs"].is_array()) {
      for (const json& jo : r["outputs"]) {
        const std::string n = jo.is_object() && jo.contains("name") && jo["name"].is_string() ? jo["name"].get<std::string>() : "";
        size_t k = 0;
        while (k < onfo.size() && onfo[k].name != n) ++k;
        if (k == onfo.size()) throw HttpError{400, "unknown output '" + n + "' for model '" + name + "'"};
        for (const Wanted& w : wanted) {
          if (w.k == k) throw HttpError{400, "output '" + n + "' is requested twice"};
        }
        bool binary = all_binary;
        const json* params = jo.contains("parameters") && jo["parameters"].is_object() ? &jo["parameters"] : nullptr;
        if (params) binary = params->value("binary_data", binary);
        wanted.push_back({k, binary, shm_ref_json(params, "output '" + n + "'")});
      }
    } else {
      for (size_t k = 0; k < onfo.size(); ++k) wanted.push_back({k, all_binary, std::nullopt});
    }
    // Outputs that name a region are written there by the worker that runs the request.
    std::vector<std::pair<size_t, const ShmRef*>> in_shm;
    for (const auto& w : wanted) in_shm.emplace_back(w.k, w.shm ? &*w.shm : nullptr);
    std::vector<std::shared_ptr<const void>> keep;
    const std::vector<OutputTarget> targets = shm.targets(in_shm, onfo, keep);
    auto out = m->infer(views, timeout_us, Clock::time_point::max(), &targets);
    if (!out) throw HttpError{status_of(out.status()), out.status().message()};
    json resp = {{"model_name", name}, {"model_version", std::to_string(m->version())}, {"outputs", json::array()}};
    if (r.contains("id")) resp["id"] = r["id"];
    std::string blobs;
    for (const auto& [k, binary, ref] : wanted) {
      const HostTensor& t = (*out)[k];
      json jo = {{"name", onfo[k].name}, {"datatype", kserve_type(t.dtype()).value_or("?")}, {"shape", t.shape()}};
      if (ref) {
        const uint64_t written = shm.written(*ref, targets[k], t, onfo[k].name);
        jo["parameters"] = {{"shared_memory_region", ref->region}, {"shared_memory_byte_size", written}};
        if (ref->offset) jo["parameters"]["shared_memory_offset"] = ref->offset;
      } else if (binary) {
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

  // /v2/systemsharedmemory/... and /v2/cudasharedmemory/...: [region/{name}/]status, register,
  // [region/{name}/]unregister, as Triton answers them.
  void shared_memory_routes() {
    for (auto kind : {SharedMemory::Kind::kSystem, SharedMemory::Kind::kCuda}) {
      const bool sys = kind == SharedMemory::Kind::kSystem;
      const std::string base = sys ? "/v2/systemsharedmemory" : "/v2/cudasharedmemory";
      auto status = guarded([this, kind, sys](const httplib::Request& req, httplib::Response& res) {
        json a = json::array();
        for (const auto& st : shm.status(kind, req.matches.size() > 1 ? std::string(req.matches[1]) : "")) {
          a.push_back(sys ? json{{"name", st.name}, {"key", st.key}, {"offset", st.offset}, {"byte_size", st.byte_size}}
                          : json{{"name", st.name}, {"device_id", st.device_id}, {"byte_size", st.byte_size}});
        }
        reply(res, 200, a);
      });
      http.Get(base + "/status", status);
      http.Get(base + "/region/([^/]+)/status", status);
      auto unregister = guarded([this, kind](const httplib::Request& req, httplib::Response& res) {
        shm.unregister(kind, req.matches.size() > 1 ? std::string(req.matches[1]) : "");
        reply(res, 200, json::object());
      });
      http.Post(base + "/unregister", unregister);
      http.Post(base + "/region/([^/]+)/unregister", unregister);
      http.Post(base + "/region/([^/]+)/register", guarded([this, sys](const httplib::Request& req, httplib::Response& res) {
        const std::string name = req.matches[1];
        json b = json::parse(req.body, nullptr, false);
        if (b.is_discarded() || !b.is_object()) throw HttpError{400, "register '" + name + "': the body is not a JSON object"};
        auto count = [&](const char* key, bool required) -> uint64_t {
          if (!b.contains(key)) {
            if (required) throw HttpError{400, "register '" + name + "': the body has no \"" + key + "\""};
            return 0;
          }
          if (!b[key].is_number_unsigned()) throw HttpError{400, "register '" + name + "': \"" + key + "\" is not a count"};
          return b[key].get<uint64_t>();
        };
        if (sys) {
          if (!b.contains("key") || !b["key"].is_string()) throw HttpError{400, "register '" + name + "': the body has no \"key\" string"};
          shm.register_system(name, b["key"].get<std::string>(), count("offset", false), count("byte_size", true));
        } else {
          const json* h = b.contains("raw_handle") && b["raw_handle"].is_object() ? &b["raw_handle"] : nullptr;
          if (!h || !h->contains("b64") || !(*h)["b64"].is_string()) {
            throw HttpError{400, "register '" + name + "': the body has no raw_handle {\"b64\": ...}"};
          }
          std::string handle = base64_decode((*h)["b64"].get<std::string>(), "register '" + name + "': raw_handle");
          shm.register_cuda(name, handle, int64_t(count("device_id", false)), count("byte_size", true));
        }
        reply(res, 200, json::object());
      }));
    }
  }

  void routes() {
    http.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
    http.Get("/v2/health/ready", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
    http.Get("/v2", [](const httplib::Request&, httplib::Response& res) {
      json ext = {"binary_tensor_data", "model_repository", "model_configuration", "system_shared_memory"};
      if (cuda_shared_memory_supported()) ext.push_back("cuda_shared_memory");
      reply(res, 200, {{"name", "kiln"}, {"version", KILN_SERVE_VERSION}, {"extensions", ext}});
    });
    shared_memory_routes();
    // /v2/models/{name}[/versions/{v}][/ready|/infer]
    const std::string m = R"(/v2/models/([^/]+)(?:/versions/([0-9]+))?)";
    http.Get(m + "/ready", guarded([this](const httplib::Request& req, httplib::Response& res) {
      try {
        repo.find(req.matches[1], req.matches[2]);
        res.status = 200;
      } catch (const HttpError& e) {  // not ready: 400, saying why (not loaded, which versions are)
        fail(res, {400, e.message});
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
    // The repository's POSTs take an optional body that kiln does not read: registered with a content
    // reader, they also answer a POST that has no body and no Content-Length (`curl -X POST`, as
    // Triton's documentation writes it), which cpp-httplib otherwise refuses before routing.
    http.Post("/v2/repository/index", bodyless([this](const httplib::Request&, httplib::Response& res) {
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
    http.Post(R"(/v2/repository/models/([^/]+)/load)", bodyless([this](const httplib::Request& req, httplib::Response& res) {
      if (Status s = repo.load(req.matches[1]); !s) throw HttpError{400, s.message()};
      reply(res, 200, json::object());
    }));
    http.Post(R"(/v2/repository/models/([^/]+)/unload)", bodyless([this](const httplib::Request& req, httplib::Response& res) {
      if (Status s = repo.unload(req.matches[1]); !s) throw HttpError{400, s.message()};
      reply(res, 200, json::object());
    }));
    http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string what = req.method + " " + req.path;
      reply(res, res.status,
            {{"error", res.status == 404   ? "no route for " + what
                       : res.status == 400 ? "cannot read " + what + " (a body needs a Content-Length or chunked encoding)"
                                           : "HTTP " + std::to_string(res.status) + " for " + what}});
    });
    http.set_payload_max_length(size_t(1) << 31);
    // Responses go out as soon as they are written: with Nagle's algorithm a reply's last segment
    // waits for the client's delayed ACK, 40 ms per request on Linux.
    http.set_tcp_nodelay(true);
    // A client's connection serves 1,000 requests before the server closes it, as nginx's
    // keepalive_requests (cpp-httplib's default, 5, made a new TCP connection every fifth request: a
    // tail under load). Not unbounded: a connection holds one of the --http-thread-count threads
    // while it lives, and a client past that many waits for one to close.
    http.set_keep_alive_max_count(1000);
  }
};

namespace {

// Listens with the kernel's largest backlog. cpp-httplib 0.11 listens with a backlog of 5 (compiled
// into Debian's library): 64 clients connecting at once overflowed it, and connections the kernel
// then completed with SYN cookies were reset at their first request (a client's "Read" error).
bool listen_deep(httplib::Server& server, const std::string& host, int port) {
  auto fd = std::make_shared<int>(-1);
  server.set_socket_options([fd](socket_t sock) {  // on each socket tried, before its bind
    httplib::default_socket_options(sock);
    *fd = sock;
  });
  const bool bound = server.bind_to_port(host, port);
  server.set_socket_options(httplib::default_socket_options);
  if (!bound) return false;
  // A second listen() on a listening socket sets its backlog anew.
  if (::listen(*fd, SOMAXCONN) != 0) {
    std::fprintf(stderr, "kiln serve: warning: port %d keeps cpp-httplib's backlog of 5 (listen: %s)\n", port,
                 std::strerror(errno));
  }
  return server.listen_after_bind();
}

}  // namespace

HttpServer::HttpServer(Repository& repo, SharedMemory& shm, int threads) : impl_(std::make_unique<Impl>(repo, shm)) {
  impl_->http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
}
HttpServer::~HttpServer() = default;
bool HttpServer::listen(const std::string& host, int port) { return listen_deep(impl_->http, host, port); }
void HttpServer::stop() {
  impl_->http.stop();
  impl_->metrics.stop();
}
bool HttpServer::listen_metrics(const std::string& host, int port) { return listen_deep(impl_->metrics, host, port); }

}  // namespace kiln::serve
