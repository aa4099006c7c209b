// kiln_conformance: runs ONNX backend test folders (model.onnx + test_data_set_N/*.pb) on the CPU
// backend (or, with --device cuda, the CUDA one) and prints, per suite, exactly "SUITE: N passed, M failed, K skipped".
//
// Each test runs in a forked child with a time limit, so a crash or hang in one test is reported
// as that test's failure instead of ending the run. Exceptions (training ops, random outputs) are
// listed with their reasons in tests/conformance/exceptions.txt. With --pipeline, each model goes
// through the default pass pipeline (verifier on between passes) before the backend, so the suite
// checks the passes keep every model's results. With --device cuda the backend under test is the
// CUDA one (tests/conformance/cuda_run.h): fp32, every node on the GPU or the test fails, models
// with symbolic input dims built for each test set's shapes (`make conformance-gpu`).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backends/backend.h"
#include "backends/cpu/fast_session.h"
#include "compare.h"
#include "cuda_run.h"
#include "frontend/onnx/importer.h"
#include "runtime/engine_file.h"
#include "runtime/plan.h"
#include "frontend/onnx/onnx_tensor.h"
#include "ops/infer.h"
#include "passes/pipeline.h"
#include "passes/value_inputs.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

struct Exception {
  std::string kind;  // "skip" or "random"
  double lo = -INFINITY, hi = INFINITY;
  std::string reason;
};

struct Result {
  std::string name;
  std::string status;  // pass, fail, skip
  std::string reason;
};

std::map<std::string, Exception> load_exceptions(const std::string& path) {
  std::map<std::string, Exception> ex;
  std::ifstream f(path);
  if (!f) {
    std::cerr << "kiln_conformance: cannot read the exceptions file " << path << "\n";
    std::exit(2);
  }
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::string reason;
    if (auto h = line.find('#'); h != std::string::npos) {
      reason = line.substr(h + 1);
      reason.erase(0, reason.find_first_not_of(' '));
      line = line.substr(0, h);
    }
    std::istringstream in(line);
    std::string key;
    Exception e;
    in >> key >> e.kind;
    if (e.kind == "random") {
      std::string lo, hi;
      if (in >> lo >> hi) { e.lo = std::stod(lo); e.hi = std::stod(hi); }
    }
    e.reason = reason;
    if (!key.empty()) ex[key] = e;
  }
  return ex;
}

Expected<Data> read_pb(const std::string& path, const Type& t) {
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (t.kind == Type::Kind::kSequence) {
    onnx::SequenceProto p;
    if (!p.ParseFromString(bytes)) return KILN_ERROR(kIo, "{}: not a SequenceProto", path);
    return onnx_io::data_from_sequence(p, path);
  }
  if (t.kind == Type::Kind::kOptional) {
    onnx::OptionalProto p;
    if (!p.ParseFromString(bytes)) return KILN_ERROR(kIo, "{}: not an OptionalProto", path);
    return onnx_io::data_from_optional(p, path);
  }
  onnx::TensorProto p;
  if (!p.ParseFromString(bytes)) return KILN_ERROR(kIo, "{}: not a TensorProto", path);
  KILN_ASSIGN_OR_RETURN(Tensor x, onnx_io::tensor_from_proto(p, {}, path));
  if (t.kind == Type::Kind::kTensor && t.dtype == DType::kBFloat16 && x.dtype() == DType::kUInt16) {
    // ONNX 1.12's test generator stored bfloat16 test data as its raw bits in a UINT16 tensor
    // (test_cast_*BFLOAT16*); the bits are the value, so reinterpret rather than convert.
    KILN_ASSIGN_OR_RETURN(Tensor b, Tensor::create(DType::kBFloat16, x.dims()));
    std::memcpy(b.raw(), x.raw(), x.nbytes());
    x = std::move(b);
  }
  return Data(std::move(x));
}

std::string check_range(const Tensor& got, const Exception& e) {
  for (int64_t i = 0; i < got.numel(); ++i) {
    double v = got.as_double(i);
    if (!(v >= e.lo && v <= e.hi)) return fmt::format("value {} at {} is outside [{}, {}]", v, i, e.lo, e.hi);
  }
  return "";
}

std::string compare_data(const Data& want, const Data& got, const Exception* random) {
  if (want.kind != got.kind) return fmt::format("expected {}, got {}", want.summary(), got.summary());
  auto cmp = [&](const Tensor& a, const Tensor& b) {
    if (random) {
      std::string r = conformance::compare_shape_only(a, b);
      return r.empty() ? check_range(b, *random) : r;
    }
    return conformance::compare_tensors(a, b, conformance::tolerance_for(a.dtype()));
  };
  switch (want.kind) {
    case Data::Kind::kNone: return "";
    case Data::Kind::kTensor: return cmp(want.tensor, got.tensor);
    case Data::Kind::kSequence:
      if (want.sequence.size() != got.sequence.size()) {
        return fmt::format("sequence length: expected {}, got {}", want.sequence.size(), got.sequence.size());
      }
      for (size_t i = 0; i < want.sequence.size(); ++i) {
        std::string r = cmp(want.sequence[i], got.sequence[i]);
        if (!r.empty()) return fmt::format("sequence item {}: {}", i, r);
      }
      return "";
  }
  return "";
}

// Imports a test's model, its symbolic input dims bound to `shapes` when given (the CUDA backend
// builds for static shapes), and runs the default pipeline on it when asked. With `inputs`, its
// value inputs (passes/value_inputs.h) are bound to theirs, as a GPU engine's plan for them is, and
// `value_key` gets their bytes.
Expected<Model> load_model(const fs::path& dir, bool pipeline, const std::map<std::string, std::vector<int64_t>>& shapes,
                           const std::vector<Data>* inputs = nullptr, std::string* value_key = nullptr) {
  ImportOptions io;
  io.input_shapes = shapes;
  KILN_ASSIGN_OR_RETURN(Model model, import_onnx_file((dir / "model.onnx").string(), io));
  if (inputs) {
    std::vector<std::pair<size_t, Tensor>> values;
    for (size_t i : value_inputs(*model.graph)) {
      if (i >= inputs->size() || !(*inputs)[i].is_tensor()) continue;
      const Tensor& t = (*inputs)[i].tensor;
      values.emplace_back(i, t);
      if (value_key) value_key->append(static_cast<const char*>(t.raw()), t.nbytes()).push_back('|');
    }
    KILN_RETURN_IF_ERROR(bind_value_inputs(*model.graph, values));
    KILN_RETURN_IF_ERROR(infer_types(*model.graph));
  }
  if (pipeline) {
    PassOptions po;
    po.verify = true;
    KILN_RETURN_IF_ERROR(run_passes(*model.graph, default_pipeline(), po).status());
  }
  return model;
}

// The backend under test: the CPU reference kernels (the oracle), the fast CPU backend (oneDNN
// steps with the reference kernels between them, as `kiln run --device cpu` runs), or CUDA.
enum class Dev { kCpuRef, kCpuFast, kCuda };

// The graph compiled for the device under test.
Expected<conformance::RunFn> compile_for(const Graph& g, Dev dev) {
  if (dev == Dev::kCpuFast) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> copy, clone_graph(g));
    KILN_ASSIGN_OR_RETURN(Plan plan, plan_host(std::move(copy)));
    auto p = std::make_shared<const Plan>(std::move(plan));
    KILN_ASSIGN_OR_RETURN(CpuPlan cp, plan_fast_cpu(*p));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<CpuRunner> r, CpuRunner::create(p, std::make_shared<const CpuPlan>(std::move(cp))));
    std::shared_ptr<CpuRunner> runner = std::move(r);
    return conformance::RunFn([runner](const std::vector<Data>& in) { return runner->run(in); });
  }
  if (dev == Dev::kCuda) {
#ifdef KILN_CONFORMANCE_CUDA
    return conformance::compile_cuda(g);
#else
    return KILN_ERROR(kUnsupported, "this kiln_conformance was built without the CUDA backend");
#endif
  }
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Executable> exe, make_cpu_backend()->compile(g));
  return conformance::RunFn([exe](const std::vector<Data>& in) { return exe->run(in); });
}

bool inputs_static(const Graph& g) {
  for (const Value* v : g.inputs) {
    if (v->type.kind == Type::Kind::kTensor && (!v->type.shape || !v->type.shape->is_static())) return false;
  }
  return true;
}

// Runs one test folder in this process; returns "" on success or the failure reason.
std::string run_test(const fs::path& dir, const Exception* random, bool pipeline, Dev dev) {
  const bool cuda = dev == Dev::kCuda;
  auto model = load_model(dir, pipeline, {});
  if (!model) return model.status().message();
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  }
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) return "no test_data_set folders";
  // On the GPU a model with symbolic input dims is built for each test set's input shapes, and one
  // with value inputs for each set's values (as a GPU engine makes a plan per value).
  const bool rebind = cuda && !inputs_static(*model->graph);
  std::map<std::string, std::vector<int64_t>> bound;
  std::string bound_values;
  conformance::RunFn run;
  for (const fs::path& s : sets) {
    std::vector<Data> inputs;
    std::map<std::string, std::vector<int64_t>> shapes;
    for (size_t i = 0; i < model->graph->inputs.size(); ++i) {
      const Value* v = model->graph->inputs[i];
      fs::path p = s / fmt::format("input_{}.pb", i);
      if (!fs::exists(p)) return fmt::format("{}: missing {}", s.filename().string(), p.filename().string());
      auto d = read_pb(p.string(), v->type);
      if (!d) return d.status().message();
      if (d->kind == Data::Kind::kTensor) shapes[v->name] = d->tensor.dims();
      inputs.push_back(std::move(*d));
    }
    if (cuda) {
      std::string key;
      auto m = load_model(dir, pipeline, rebind ? shapes : std::map<std::string, std::vector<int64_t>>{}, &inputs, &key);
      if (!m) return m.status().message();
      if (!run || shapes != bound || key != bound_values) {
        run = nullptr;  // the engine goes before the graph its host steps read
        model = std::move(m);
        bound = shapes;
        bound_values = key;
      }
    }
    if (!run) {
      auto r = compile_for(*model->graph, dev);
      if (!r) return r.status().message();
      run = std::move(*r);
    }
    const Graph& g = *model->graph;
    auto outs = run(inputs);
    if (!outs) return outs.status().message();
    for (size_t i = 0; i < g.outputs.size(); ++i) {
      fs::path p = s / fmt::format("output_{}.pb", i);
      if (!fs::exists(p)) continue;
      auto want = read_pb(p.string(), g.outputs[i]->type);
      if (!want) return want.status().message();
      std::string r = compare_data(*want, (*outs)[i], random);
      if (!r.empty()) return fmt::format("{} output {} ('{}'): {}", s.filename().string(), i, g.outputs[i]->name, r);
    }
  }
  return "";
}

// Forks a child per test so crashes and hangs are contained; the child writes its reason to a pipe.
struct Child {
  pid_t pid;
  int fd;
  std::string name;
  std::chrono::steady_clock::time_point start;
  std::string out;
};

Result finish(Child& c, int status, bool timed_out, int timeout_s) {
  Result r{c.name, "fail", ""};
  if (timed_out) r.reason = fmt::format("timed out after {} s", timeout_s);
  else if (WIFSIGNALED(status)) r.reason = fmt::format("crashed with signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) r.status = "pass";
  else r.reason = c.out.empty() ? fmt::format("exited with {}", WEXITSTATUS(status)) : c.out;
  return r;
}

// Whether a GPU is usable, asked in a child process: the parent forks a child per test and must
// not have started the CUDA runtime itself. "" when one is.
std::string gpu_probe() {
#ifdef KILN_CONFORMANCE_CUDA
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string why;
    bool ok = conformance::cuda_usable(&why);
    if (!ok) { ssize_t w = write(fds[1], why.data(), why.size()); (void)w; }
    _exit(ok ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return out.empty() ? "the GPU probe failed" : out;
#else
  return "this kiln_conformance was built without the CUDA backend";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<std::string, std::string>> suites;  // name, folder
  std::string filter, json_path, exceptions_path = "tests/conformance/exceptions.txt";
  std::string root12 = "/usr/share/libonnx-testdata/data", root123, targets_path;
  bool verbose = false, pipeline = false;
  Dev dev = Dev::kCpuRef;
  int jobs = std::max(1u, std::thread::hardware_concurrency());
  int timeout_s = 120;
  std::vector<std::string> want_suites;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::cerr << "kiln_conformance: " << a << " needs a value\n"; std::exit(2); }
      return argv[++i];
    };
    if (a == "--suite") want_suites.push_back(next());
    else if (a == "--filter") filter = next();
    else if (a == "--json") json_path = next();
    else if (a == "--exceptions") exceptions_path = next();
    else if (a == "--onnx-1.12") root12 = next();
    else if (a == "--onnx-1.23-node") root123 = next();
    else if (a == "--jobs" || a == "-j") jobs = std::max(1, std::stoi(next()));
    else if (a == "--timeout") timeout_s = std::stoi(next());
    else if (a == "--check-targets") targets_path = next();
    else if (a == "--verbose" || a == "-v") verbose = true;
    else if (a == "--pipeline") pipeline = true;
    else if (a == "--device") {
      std::string d = next();
      if (d != "cpu" && d != "cpu-fast" && d != "cuda") {
        std::cerr << "kiln_conformance: --device is cpu, cpu-fast or cuda, not '" << d << "'\n";
        return 2;
      }
      dev = d == "cuda" ? Dev::kCuda : d == "cpu-fast" ? Dev::kCpuFast : Dev::kCpuRef;
    }
    else {
      std::cout << "usage: kiln_conformance [--suite NAME]... [--filter SUBSTRING] [--verbose] [--json FILE]\n"
                   "  [--onnx-1.12 DIR (default /usr/share/libonnx-testdata/data)] [--onnx-1.23-node DIR]\n"
                   "  [--exceptions FILE (default tests/conformance/exceptions.txt)] [--jobs N] [--timeout S]\n"
                   "  [--check-targets FILE: exit 0 iff every suite meets its minimum pass count there]\n"
                   "  [--pipeline: run the default pass pipeline on each model first]\n"
                   "  [--device cpu|cpu-fast|cuda: the backend under test (cpu: the reference kernels; cpu-fast: oneDNN\n"
                   "   steps as `kiln run --device cpu` runs; cuda: fp32, CPU fallback forbidden)]\n"
                   "suites: onnx-1.12/node onnx-1.12/pytorch-converted onnx-1.12/pytorch-operator onnx-1.12/simple onnx-1.23/node\n";
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  for (const char* s : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    suites.emplace_back(std::string("onnx-1.12/") + s, root12 + "/" + s);
  }
  if (!root123.empty()) suites.emplace_back("onnx-1.23/node", root123);
  if (!want_suites.empty()) {
    std::erase_if(suites, [&](const auto& s) { return std::find(want_suites.begin(), want_suites.end(), s.first) == want_suites.end(); });
    if (suites.empty()) { std::cerr << "kiln_conformance: no such suite\n"; return 2; }
  }
  const bool cuda = dev == Dev::kCuda;
  if (cuda) {
    std::string why = gpu_probe();
    if (!why.empty()) { std::cerr << "kiln_conformance: --device cuda: " << why << "\n"; return 2; }
  }
  auto exceptions = load_exceptions(exceptions_path);
  std::map<std::string, int> targets;  // suite -> minimum passed
  if (!targets_path.empty()) {
    std::ifstream f(targets_path);
    if (!f) { std::cerr << "kiln_conformance: cannot read " << targets_path << "\n"; return 2; }
    for (std::string line; std::getline(f, line);) {
      if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
      std::istringstream in(line);
      std::string suite;
      int min_passed;
      if (in >> suite >> min_passed) targets[suite] = min_passed;
    }
  }
  nlohmann::json report = nlohmann::json::object();
  bool any_fail = false;
  std::vector<std::string> summary;
  for (const auto& [suite, folder] : suites) {
    if (!fs::is_directory(folder)) {
      std::cerr << "kiln_conformance: " << suite << ": no test data at " << folder << "\n";
      return 2;
    }
    std::vector<fs::path> tests;
    for (const auto& e : fs::directory_iterator(folder)) {
      if (e.is_directory() && fs::exists(e.path() / "model.onnx") &&
          (filter.empty() || e.path().filename().string().find(filter) != std::string::npos)) {
        tests.push_back(e.path());
      }
    }
    std::sort(tests.begin(), tests.end());
    std::vector<Result> results;
    std::vector<Child> running;
    size_t next = 0;
    auto reap = [&](bool block) {
      for (size_t k = 0; k < running.size();) {
        Child& c = running[k];
        char buf[4096];
        ssize_t n;
        while ((n = read(c.fd, buf, sizeof buf)) > 0) c.out.append(buf, size_t(n));
        int status = 0;
        pid_t p = waitpid(c.pid, &status, WNOHANG);
        bool timed_out = std::chrono::steady_clock::now() - c.start > std::chrono::seconds(timeout_s);
        if (p == 0 && timed_out) { kill(c.pid, SIGKILL); waitpid(c.pid, &status, 0); p = c.pid; }
        if (p == c.pid) {
          while ((n = read(c.fd, buf, sizeof buf)) > 0) c.out.append(buf, size_t(n));
          close(c.fd);
          results.push_back(finish(c, status, timed_out, timeout_s));
          running.erase(running.begin() + long(k));
          continue;
        }
        ++k;
      }
      if (block) usleep(2000);
    };
    while (next < tests.size() || !running.empty()) {
      while (next < tests.size() && int(running.size()) < jobs) {
        const fs::path& t = tests[next++];
        std::string name = t.filename().string();
        auto ex = exceptions.find(suite + "/" + name);
        if (ex != exceptions.end() && ex->second.kind == "skip") {
          results.push_back({name, "skip", ex->second.reason});
          continue;
        }
        const Exception* random = ex != exceptions.end() && ex->second.kind == "random" ? &ex->second : nullptr;
        int fds[2];
        if (pipe(fds) != 0) { perror("pipe"); return 2; }
        std::cout.flush();
        pid_t pid = fork();
        if (pid == 0) {
          close(fds[0]);
          std::string r = run_test(t, random, pipeline, dev);
          if (!r.empty()) { ssize_t w = write(fds[1], r.data(), r.size()); (void)w; }
          _exit(r.empty() ? 0 : 1);
        }
        close(fds[1]);
        fcntl(fds[0], F_SETFL, O_NONBLOCK);
        running.push_back({pid, fds[0], name, std::chrono::steady_clock::now(), ""});
      }
      reap(true);
    }
    std::sort(results.begin(), results.end(), [](const Result& a, const Result& b) { return a.name < b.name; });
    int passed = 0, failed = 0, skipped = 0;
    nlohmann::json js = nlohmann::json::array();
    for (const Result& r : results) {
      if (r.status == "pass") ++passed;
      else if (r.status == "fail") ++failed;
      else ++skipped;
      if (verbose && r.status != "pass") std::cout << "  " << r.status << " " << r.name << ": " << r.reason << "\n";
      else if (verbose) std::cout << "  pass " << r.name << "\n";
      nlohmann::json j = {{"test", r.name}, {"status", r.status}};
      if (!r.reason.empty()) j["reason"] = r.reason;
      js.push_back(j);
    }
    if (!targets_path.empty()) {
      auto t = targets.find(suite);
      if (t == targets.end()) {
        std::cerr << "kiln_conformance: " << suite << " has no target in " << targets_path << "\n";
        any_fail = true;
      } else if (passed < t->second) {
        std::cerr << "kiln_conformance: " << suite << ": " << passed << " passed, below the target of " << t->second << "\n";
        any_fail = true;
      }
    } else if (failed) {
      any_fail = true;
    }
    report[suite] = {{"passed", passed}, {"failed", failed}, {"skipped", skipped}, {"tests", js}};
    summary.push_back(fmt::format("{}: {} passed, {} failed, {} skipped", suite, passed, failed, skipped));
    std::cout << summary.back() << std::endl;
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << report.dump(1) << "\n";
  }
  return any_fail ? 1 : 0;
}
