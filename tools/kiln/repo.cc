// `kiln repo list|promote|rollback`: what a model repository serves, changed without downtime.
//
//   kiln repo list DIR [--name M]                     every version: status, precision, error, latency
//   kiln repo promote DIR M V [--server HOST:PORT]    serve version V (validated ones only)
//   kiln repo rollback DIR M [--server HOST:PORT]     serve the version promoted before the current one
//
// Promoting writes `version_policy { specific { versions: [V] } }` into DIR/M/config.pbtxt (the rest
// of the file kept; written to a temporary file and renamed, so a server never reads half of it) and
// records the promotion in DIR/M/registry.json. With --server, the running `kiln serve` is asked to
// load the model again (POST /v2/repository/models/M/load): it loads V while the old version keeps
// answering, then switches; requests in flight finish on the old one. When the server cannot load V,
// the repository is put back as it was and the command fails, naming the server's reason.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"

namespace kiln::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

Expected<std::string> read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return KILN_ERROR(kIo, "{}: cannot be read", p.string());
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Status write_atomically(const fs::path& p, const std::string& text) {
  // A name of this process's own, so two commands never write one temporary file.
  const fs::path tmp = p.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();  // flushed and checked before the rename: a full disk never replaces the file
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return KILN_ERROR(kIo, "{}: cannot be written", tmp.string());
    }
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  if (ec) return KILN_ERROR(kIo, "{}: {}", p.string(), ec.message());
  return Status::ok();
}

// config.pbtxt with its top-level version_policy block (if any) replaced by `specific { V }`.
std::string with_policy(const std::string& text, int64_t v) {
  std::string out;
  size_t i = 0;
  const std::string key = "version_policy";
  while (i < text.size()) {
    if (text[i] == '#') {  // a comment runs to the end of the line
      size_t e = text.find('\n', i);
      e = e == std::string::npos ? text.size() : e + 1;
      out += text.substr(i, e - i);
      i = e;
    } else if (text.compare(i, key.size(), key) == 0 && (i == 0 || !std::isalnum(static_cast<unsigned char>(text[i - 1])))) {
      size_t open = text.find('{', i);
      if (open == std::string::npos) break;
      int depth = 0;
      size_t j = open;
      for (; j < text.size(); ++j) {
        if (text[j] == '{') ++depth;
        if (text[j] == '}' && --depth == 0) break;
      }
      i = j + 1;
    } else {
      out += text[i++];
    }
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  if (!out.empty()) out += "\n";
  return out + "version_policy { specific { versions: [ " + std::to_string(v) + " ] } }\n";
}

// A POST with no body to a KServe v2 server; the status and body of its answer.
Expected<std::pair<int, std::string>> post(const std::string& server, const std::string& path) {
  const size_t colon = server.rfind(':');
  if (colon == std::string::npos) return KILN_ERROR(kInvalidArgument, "--server '{}' is not HOST:PORT", server);
  const std::string host = server.substr(0, colon), port = server.substr(colon + 1);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res) {
    return KILN_ERROR(kIo, "--server {}: cannot resolve {}", server, host);
  }
  int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  const bool connected = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  if (!connected) {
    if (fd >= 0) close(fd);
    return KILN_ERROR(kIo, "--server {}: cannot connect (is kiln serve running there?)", server);
  }
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  bool sent = ::send(fd, req.data(), req.size(), 0) == ssize_t(req.size());
  std::string reply;
  char buf[4096];
  for (ssize_t n; sent && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, size_t(n));
  close(fd);
  int status = 0;
  if (!sent || std::sscanf(reply.c_str(), "HTTP/%*s %d", &status) != 1) {
    return KILN_ERROR(kIo, "--server {}: no HTTP answer to POST {}", server, path);
  }
  const size_t body = reply.find("\r\n\r\n");
  return std::make_pair(status, body == std::string::npos ? std::string() : reply.substr(body + 4));
}

fs::path registry_path(const std::string& repo, const std::string& name) { return fs::path(repo) / name / "registry.json"; }

json read_registry(const std::string& repo, const std::string& name) {
  auto t = read_text(registry_path(repo, name));
  json j = t ? json::parse(*t, nullptr, false) : json();
  if (!j.is_object()) j = json::object();
  if (!j.contains("history") || !j["history"].is_array()) j["history"] = json::array();
  return j;
}

json read_report(const fs::path& vdir) {
  auto t = read_text(vdir / "report.json");
  json j = t ? json::parse(*t, nullptr, false) : json();
  return j.is_object() ? j : json();
}

}  // namespace

std::vector<int64_t> version_folders(const std::string& model_dir) {
  std::vector<int64_t> v;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(model_dir, ec)) {
    const std::string s = d.path().filename().string();
    if (d.is_directory() && !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos) {
      v.push_back(std::stoll(s));
    }
  }
  std::sort(v.begin(), v.end());
  return v;
}

Status promote_version(const std::string& repo, const std::string& name, int64_t version, const std::string& server,
                       bool rollback) {
  const fs::path dir = fs::path(repo) / name, vdir = dir / std::to_string(version);
  const json report = read_report(vdir);
  if (report.is_object() && report.value("status", "") == "failed") {
    return KILN_ERROR(kInvalidArgument, "model '{}' version {} failed validation ({}): it is never promoted", name, version,
                      vdir.string());
  }
  if (!fs::exists(vdir / "model.kiln") && !fs::exists(vdir / "model.onnx")) {
    return KILN_ERROR(kInvalidArgument, "model '{}' has no servable version {} ({} has no model.kiln or model.onnx)", name,
                      version, vdir.string());
  }
  const fs::path cfg = dir / "config.pbtxt";
  std::string old_cfg;
  const bool had_cfg = fs::exists(cfg);
  if (had_cfg) {
    KILN_ASSIGN_OR_RETURN(old_cfg, read_text(cfg));
  }
  json reg = read_registry(repo, name);
  const json old_reg = reg;
  KILN_RETURN_IF_ERROR(write_atomically(cfg, with_policy(old_cfg, version)));
  reg["serving"] = version;
  if (!rollback) reg["history"].push_back(version);
  KILN_RETURN_IF_ERROR(write_atomically(registry_path(repo, name), reg.dump(1) + "\n"));
  if (!server.empty()) {
    auto r = post(server, "/v2/repository/models/" + name + "/load");
    if (!r || r->first != 200) {
      // Back as it was: the server still serves the previous version.
      std::error_code ec;
      if (had_cfg) (void)write_atomically(cfg, old_cfg);
      else fs::remove(cfg, ec);
      (void)write_atomically(registry_path(repo, name), old_reg.dump(1) + "\n");
      if (!r) return r.status();
      return KILN_ERROR(kInvalidArgument, "the server could not load model '{}' version {} (HTTP {}: {}); the repository is "
                        "back as it was", name, version, r->first, r->second);
    }
  }
  std::printf("model '%s': version %lld %s%s\n", name.c_str(), static_cast<long long>(version),
              rollback ? "serves again (rolled back)" : "promoted", server.empty() ? " (the server picks it up at its next load)" : " and serving");
  return Status::ok();
}

int repo_main(const RepoCliOptions& opt) {
  auto go = [&]() -> Status {
    if (opt.action == "promote") return promote_version(opt.repo, opt.name, opt.version, opt.server, false);
    if (opt.action == "rollback") {
      json reg = read_registry(opt.repo, opt.name);
      json& h = reg["history"];
      if (h.size() < 2) {
        return KILN_ERROR(kInvalidArgument, "model '{}' has no earlier promotion to roll back to ({})", opt.name,
                          registry_path(opt.repo, opt.name).string());
      }
      const int64_t previous = h[h.size() - 2].get<int64_t>();
      json popped = h.back();
      h.erase(h.size() - 1);
      KILN_RETURN_IF_ERROR(write_atomically(registry_path(opt.repo, opt.name), reg.dump(1) + "\n"));
      Status s = promote_version(opt.repo, opt.name, previous, opt.server, true);
      if (!s) {  // the promotion stays on record when the rollback could not happen
        h.push_back(popped);
        (void)write_atomically(registry_path(opt.repo, opt.name), reg.dump(1) + "\n");
      }
      return s;
    }
    // list
    std::error_code ec;
    std::vector<std::string> models;
    for (const auto& d : fs::directory_iterator(opt.repo, ec)) {
      if (d.is_directory() && (opt.name.empty() || d.path().filename() == opt.name)) models.push_back(d.path().filename().string());
    }
    if (ec) return KILN_ERROR(kIo, "{}: {}", opt.repo, ec.message());
    std::sort(models.begin(), models.end());
    for (const std::string& m : models) {
      const json reg = read_registry(opt.repo, m);
      std::printf("%s%s\n", m.c_str(), reg.contains("serving") ? "" : "  (no promotion yet: a server serves what its version policy selects)");
      for (int64_t v : version_folders((fs::path(opt.repo) / m).string())) {
        const json r = read_report(fs::path(opt.repo) / m / std::to_string(v));
        std::string what = "unregistered (no report.json)";
        if (r.is_object()) {
          what = r.value("status", "?");
          for (const auto& c : r.value("candidates", json::array())) {
            if (c.value("precision", "") == r.value("chosen", "")) {
              what += fmt::format(": {}, error {:.4g}%, median {:.4f} ms, p99 {:.4f} ms", c.value("precision", "?"),
                                  c["error_percent"].is_number() ? c["error_percent"].get<double>() : -1.0,
                                  c.value("median_ms", 0.0), c.value("p99_ms", 0.0));
            }
          }
          what += ", " + r.value("created", "") + ", source sha256 " + r.value("source_sha256", "").substr(0, 12);
        }
        const bool serving = reg.contains("serving") && reg["serving"] == v;
        std::printf("  %s version %lld: %s\n", serving ? "*" : " ", static_cast<long long>(v), what.c_str());
      }
    }
    return Status::ok();
  };
  Status s = go();
  return s ? 0 : fail(s);
}

}  // namespace kiln::cli
