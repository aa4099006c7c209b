// libFuzzer target for the engine-file loader (`kiln run model.kiln`, kiln::Engine::load): bytes ->
// Engine::load_bytes -> when it loads, one run on zero inputs. Engine files come from outside (a
// deployment, a download); an error Status is a fine answer, a crash, sanitizer report or hang is
// a finding. The checksum would turn away nearly every mutation before the parser saw it, so each
// input is also loaded once with its checksum recomputed: the parser, the weight table and the
// plan verifier then meet the damage.
//
//   bash tests/fuzz/run.sh build-fuzz 60        (or: make fuzz; this target gets a quarter of the time)
//   build-fuzz/tests/kiln_fuzz_engine build-fuzz/artifacts-engine/crash-...   (replay one input)
//
// A GPU engine cannot load on the machine that fuzzes (no GPU), so its device plan (DPLN, DWGT
// sections: runtime/device_plan.h) is also read directly whenever the file parses.
//
// Seeds: tests/fuzz/corpus-engine (small CPU engines written by `kiln build --device cpu`, and one
// with a device plan appended).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/engine.h"
#include "runtime/device_plan.h"
#include "runtime/engine_file.h"

namespace {

void try_load(const std::string& bytes) {
  auto e = kiln::Engine::load_bytes(bytes.data(), bytes.size(), "fuzz.kiln");
  if (!e) return;
  auto s = e->create_session();
  if (!s) return;
  std::vector<std::vector<char>> storage;
  std::vector<kiln::TensorView> in;
  for (const kiln::TensorInfo& t : e->inputs()) {
    kiln::TensorView v{t.dtype, t.shape, nullptr, false};
    int64_t n = 1;
    for (int64_t& d : v.shape) {
      if (d < 0) d = 2;
      n *= d;
    }
    if (t.dtype == kiln::DType::kString || n > (1 << 16)) return;  // keep each run small
    storage.emplace_back(size_t(n) * kiln::dtype_size(t.dtype) + 1, '\0');
    v.data = storage.back().data();
    in.push_back(v);
  }
  (void)s->run(in);
}

void try_device_plan(const std::string& bytes) {
  auto f = kiln::read_engine_file(std::string_view(bytes), nullptr, "fuzz.kiln");
  if (!f) return;
  auto dpln = f->extra.find("DPLN");
  auto dwgt = f->extra.find("DWGT");
  if (dpln == f->extra.end() || dwgt == f->extra.end()) return;
  (void)kiln::read_device_plan(dpln->second, dwgt->second, "fuzz.kiln");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try_load(bytes);
  try_device_plan(bytes);
  if (bytes.size() >= 32) {  // the same bytes with a checksum that matches them
    uint64_t sum = kiln::engine_checksum(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
    uint64_t size_field = bytes.size();
    std::memcpy(bytes.data() + 16, &size_field, 8);
    sum = kiln::engine_checksum(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);
    try_load(bytes);
    try_device_plan(bytes);
  }
  return 0;
}
