// Load a saved engine and run it, several times in one process: how long a deployed model takes
// to become ready (load + session + first inference), in a fresh process and again once the
// process's runtime (for a GPU engine, the CUDA context) is up.
//
//   load_engine ENGINE.kiln [TIMES]
//
// Inputs are zeros of each input's declared dtype and shape. Prints one line per load; exits 1 on
// any error, or if a later load's outputs differ in any bit from the first one's.
#include <kiln/kiln.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int fail(const kiln::Status& s) {
  std::fprintf(stderr, "load_engine: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: load_engine ENGINE.kiln [TIMES]\n");
    return 2;
  }
  const int times = argc == 3 ? std::atoi(argv[2]) : 3;
  if (times < 1) {
    std::fprintf(stderr, "load_engine: TIMES must be a positive number\n");
    return 2;
  }
  std::vector<std::vector<char>> first;  // the first load's outputs, bytes
  for (int i = 0; i < times; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    kiln::Expected<kiln::Engine> engine = kiln::Engine::load(argv[1]);
    if (!engine) return fail(engine.status());
    const double load_ms = ms_since(t0);
    kiln::Expected<kiln::Session> session = engine->create_session();
    if (!session) return fail(session.status());
    const double session_ms = ms_since(t0) - load_ms;
    std::vector<std::vector<char>> buffers;
    std::vector<kiln::TensorView> inputs;
    for (const kiln::TensorInfo& in : engine->inputs()) {
      if (in.dtype == kiln::DType::kString) return fail(kiln::Status(kiln::ErrorCode::kUnsupported, "string inputs"));
      int64_t n = 1;
      for (int64_t d : in.shape) n *= d;
      buffers.emplace_back(size_t(n) * kiln::dtype_size(in.dtype), 0);
      inputs.push_back(kiln::TensorView{in.dtype, in.shape, buffers.back().data()});
    }
    auto t1 = std::chrono::steady_clock::now();
    kiln::Expected<std::vector<kiln::HostTensor>> out = session->run(inputs);
    if (!out) return fail(out.status());
    const double run_ms = ms_since(t1);
    std::vector<std::vector<char>> bytes;
    for (const kiln::HostTensor& t : *out) {
      const char* p = static_cast<const char*>(t.raw());
      bytes.emplace_back(p, p + t.bytes());
    }
    if (i == 0) first = bytes;
    const bool same = bytes == first;
    std::printf("load %d: ready in %.1f ms (load %.1f, session %.1f, first inference %.1f)%s\n", i + 1,
                load_ms + session_ms + run_ms, load_ms, session_ms, run_ms, same ? "" : "  OUTPUTS DIFFER");
    if (!same) return 1;
  }
  return 0;
}
