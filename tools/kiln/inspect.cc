// `kiln inspect model.onnx [--ir] [--dot FILE]`: what a model takes and gives, and what it is made of;
// `kiln inspect model.kiln`: how an engine was built and what it runs on.
#include <fstream>
#include <map>

#include "cli.h"
#include "ir/dot.h"
#include "ir/text.h"
#include "api/engine_impl.h"
#include "runtime/engine_file.h"

namespace kiln::cli {

namespace {

struct Census {
  std::map<std::string, int64_t> ops;  // op -> count, subgraphs included
  int64_t nodes = 0, subgraph_nodes = 0;
  int64_t params = 0, param_bytes = 0, constants = 0;
};

void count(const Graph& g, Census& c, bool nested) {
  for (const auto& n : g.nodes) {
    ++c.ops[std::string(op_name(n->op))];
    ++(nested ? c.subgraph_nodes : c.nodes);
    for (const auto& [name, a] : n->attrs) {
      if (a.g) count(*a.g, c, true);
      for (const auto& sg : a.graphs) count(*sg, c, true);
    }
  }
  for (const auto& v : g.values) {
    if (!v->constant) continue;
    ++c.constants;
    c.params += v->constant->numel();
    c.param_bytes += int64_t(v->constant->nbytes());
  }
}

std::string human_bytes(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", double(b) / double(int64_t(1) << 30));
  if (b >= (1 << 20)) return fmt::format("{:.2f} MiB", double(b) / (1 << 20));
  if (b >= (1 << 10)) return fmt::format("{:.1f} KiB", double(b) / (1 << 10));
  return fmt::format("{} B", b);
}

}  // namespace

namespace {

// An engine file: what it was built from and for, read from its header without loading it (so it
// works on any machine, GPU engine or not); the file's checksum is verified all the same.
int inspect_engine(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail(KILN_ERROR(kIo, "{}: cannot open", path));
  f.seekg(0, std::ios::end);
  std::string bytes(size_t(std::max<std::streamoff>(f.tellg(), 0)), '\0');
  f.seekg(0);
  if (!f.read(bytes.data(), std::streamsize(bytes.size()))) return fail(KILN_ERROR(kIo, "{}: cannot read", path));
  std::string_view file = bytes;
  nlohmann::json tp;  // a tensor-parallel engine: its header; rank 0's file describes the rest
  if (is_tensor_parallel_file(bytes)) {
    auto ranks = tensor_parallel_ranks(bytes, path, &tp);
    if (!ranks) return fail(ranks.status());
    file = ranks->front();
    std::printf("tensor parallel: %zu ranks, each an engine file of its own (rank 0's below)\n", ranks->size());
    const nlohmann::json mb = tp.contains("micro_batches") ? tp["micro_batches"] : nlohmann::json(1);
    if (mb.is_number_integer() && mb.get<int>() > 1) {
      std::printf("micro-batches: %d at once (the ranks' inputs and outputs below are one micro-batch's)\n", mb.get<int>());
    }
  }
  auto meta = read_engine_meta(file, path);
  if (!meta) return fail(meta.status());
  const nlohmann::json& j = *meta;
  std::printf("engine:    %s (%.1f MiB, format %u, kiln %s)\n", path.c_str(), double(bytes.size()) / (1 << 20),
              j.value("format_version", 0u), j.value("kiln_version", std::string("?")).c_str());
  std::printf("device:    %s\n", j.value("device", std::string("?")).c_str());
  if (j.contains("target")) std::printf("target:    %s\n", j["target"].dump().c_str());
  if (j.contains("config")) std::printf("config:    %s\n", j["config"].dump().c_str());
  for (const char* io : {"inputs", "outputs"}) {
    std::printf("%s:\n", io);
    for (const auto& t : j.value(io, nlohmann::json::array())) {
      std::vector<std::string> dims;
      for (const auto& d : t.value("shape", nlohmann::json::array())) {
        dims.push_back(d.get<int64_t>() < 0 ? std::string("?") : std::to_string(d.get<int64_t>()));
      }
      for (const auto& r : t.value("ranges", nlohmann::json::array())) {  // a dynamic engine's ranged dims
        size_t k = r.value("dim", size_t(0));
        if (k < dims.size()) {
          dims[k] = fmt::format("{} {}..{}", r.value("name", std::string()), r.value("min", int64_t(0)), r.value("max", int64_t(0)));
        }
      }
      std::string shape;
      for (const std::string& d : dims) shape += (shape.empty() ? "" : ",") + d;
      std::printf("  %-24s %s[%s]\n", t.value("name", std::string()).c_str(), t.value("dtype", std::string()).c_str(),
                  shape.c_str());
    }
  }
  if (tp.contains("report")) std::printf("%s", tp["report"].get<std::string>().c_str());
  std::string report = j.value("report", std::string());
  std::printf("%s", report.substr(0, report.find("placement:")).c_str());
  return 0;
}

}  // namespace

int inspect_main(const LoadOptions& load, const InspectOptions& opt) {
  if (is_engine_file(load.model)) return inspect_engine(load.model);
  auto m = load_model(load);
  if (!m) return fail(m.status());
  const Graph& g = *m->graph;
  std::string opsets;
  for (const auto& [domain, v] : m->opsets) opsets += fmt::format("{}{} {}", opsets.empty() ? "" : ", ", domain.empty() ? "ai.onnx" : domain, v);
  std::printf("model:     %s\n", load.model.c_str());
  std::printf("producer:  %s %s, IR version %lld, opsets: %s\n", m->producer_name.empty() ? "(unknown)" : m->producer_name.c_str(),
              m->producer_version.c_str(), static_cast<long long>(m->ir_version), opsets.c_str());
  for (const auto& [k, v] : m->metadata) std::printf("metadata:  %s = %s\n", k.c_str(), v.c_str());
  std::printf("inputs:\n");
  for (const Value* v : g.inputs) std::printf("  %-24s %s\n", v->name.c_str(), v->type.to_string().c_str());
  std::printf("outputs:\n");
  for (const Value* v : g.outputs) std::printf("  %-24s %s\n", v->name.c_str(), v->type.to_string().c_str());
  Census c;
  count(g, c, false);
  std::printf("nodes:     %lld", static_cast<long long>(c.nodes));
  if (c.subgraph_nodes) std::printf(" (+%lld in subgraphs)", static_cast<long long>(c.subgraph_nodes));
  std::printf("\nparams:    %lld in %lld constants, %s\n", static_cast<long long>(c.params),
              static_cast<long long>(c.constants), human_bytes(c.param_bytes).c_str());
  std::vector<std::pair<int64_t, std::string>> hist;
  for (const auto& [op, n] : c.ops) hist.emplace_back(-n, op);
  std::sort(hist.begin(), hist.end());
  std::printf("ops:\n");
  for (const auto& [n, op] : hist) std::printf("  %-24s %lld\n", op.c_str(), static_cast<long long>(-n));
  if (opt.ir) std::printf("\n%s", print_graph(g, PrintOptions{.elide_large_tensors = true}).c_str());
  if (!opt.dot.empty()) {
    std::ofstream f(opt.dot);
    if (!f) return fail(KILN_ERROR(kIo, "cannot write '{}'", opt.dot));
    Status s = write_dot(g, f);
    if (!s) return fail(s.with_context(opt.dot));
    std::printf("wrote %s\n", opt.dot.c_str());
  }
  return 0;
}

}  // namespace kiln::cli
