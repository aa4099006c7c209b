// libFuzzer target for kiln's IR text parser (docs/ir.md): bytes -> parse_graph. Graphs come in as
// text from users (`--dump-ir-after`, pass goldens) and inside every engine file (GRPH). An error
// Status is a fine answer; a crash, sanitizer report or hang is a finding. A graph that parses and
// verifies must print and parse again (the printer and parser agree on everything they accept),
// and the tensor-parallel pass (which reasons about every op's dims to follow a split) must take it
// for 2 and 3 ranks without a crash; a result it returns must verify. A graph with shapes left open
// is cut as a staged GPU engine cuts one (api/staged_split.h): each stage graph it returns must
// verify.
//
//   bash tests/fuzz/run.sh build-fuzz 60     (make fuzz; this target gets a quarter of the time)
//   build-fuzz/tests/kiln_fuzz_ir_text FILE   (replay one input)
//
// Seeds: each graph of the pass goldens (tests/passes/*.kir), split by run.sh. Tensors are capped at
// 64 MB, as in the importer's target: a splat `dense<i64[2,1,111111111,3]> [0]` is a valid 5 GB request
// (kiln allocates it, or says the allocation failed), which libFuzzer's memory limit reports instead.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ir/tensor.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "api/staged_split.h"
#include "passes/tensor_parallel.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  kiln::set_max_tensor_bytes(int64_t{64} << 20);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto g = kiln::parse_graph(text);
  if (!g) return 0;
  if (!kiln::verify_graph(**g)) return 0;
  std::string printed = kiln::print_graph(**g);
  if (!kiln::parse_graph(printed)) __builtin_trap();  // a verified graph the parser refuses once printed
  for (int ranks : {2, 3}) {
    auto split = kiln::parse_graph(text);
    if (!split) continue;
    auto changed = kiln::shard_tensor_parallel(**split, ranks, ranks - 1);
    if (changed && *changed && !kiln::verify_graph(**split)) __builtin_trap();  // a split graph that does not verify
  }
  if (kiln::has_open_shapes(**g)) {
    auto cut = kiln::split_at_open_shapes(**g);
    if (cut) {
      for (const kiln::Graph* stage : {cut->before.get(), cut->host.get(), cut->after.get()}) {
        if (stage && !kiln::verify_graph(*stage)) __builtin_trap();  // a stage graph that does not verify
      }
    }
  }
  return 0;
}
