// libFuzzer target for the .npy reader (`kiln run --input NAME=FILE.npy`, `kiln compare`):
// bytes -> parse_npy -> serialize_npy -> parse_npy, which must give back the same tensor.
//
//   bash tests/fuzz/run.sh build-fuzz 60        (or: make fuzz; this target gets a quarter of the time)
//   build-fuzz/tests/kiln_fuzz_npy build-fuzz/artifacts-npy/crash-...   (replay one input)
//
// An error Status is the expected answer to a corrupt file; the findings are crashes, sanitizer
// reports, timeouts, allocations past -rss_limit_mb (the reader must check the header's shape
// against the bytes present before allocating) and a tensor that does not survive the round trip.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ir/tensor.h"
#include "passes/rewrite.h"
#include "support/npy.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  kiln::set_max_tensor_bytes(int64_t{64} << 20);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  kiln::Expected<kiln::Tensor> t = kiln::parse_npy(bytes, "fuzz.npy");
  if (!t) return 0;
  // bfloat16/float8 are written as float32 (no numpy dtype): the reader never makes them, so every
  // tensor it returns must serialize to itself.
  kiln::Expected<kiln::Tensor> again = kiln::parse_npy(kiln::serialize_npy(*t), "round-trip.npy");
  if (!again || !kiln::same_tensor(*t, *again)) {
    std::fprintf(stderr, "kiln_fuzz_npy: parse -> serialize -> parse changed the tensor: %s vs %s\n",
                 t->summary().c_str(), again ? again->summary().c_str() : again.status().message().c_str());
    std::abort();
  }
  return 0;
}
