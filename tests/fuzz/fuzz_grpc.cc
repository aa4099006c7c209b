// libFuzzer target for the KServe v2 gRPC request decoder of `kiln serve`
// (src/serve/kserve_grpc_codec.h): bytes -> inference.ModelInferRequest (protobuf) ->
// decode_grpc_inputs and grpc_timeout_us, against the model signature fuzz_kserve.cc uses (float with
// an open batch, int64, BYTES, BOOL, FP16), through raw_input_contents and typed contents.
//
//   bash tests/fuzz/run.sh build-fuzz 60        (or: make fuzz; this target gets a quarter of the time)
//   build-fuzz/tests/kiln_fuzz_grpc build-fuzz/artifacts-grpc/crash-...   (replay one input)
//
// Bytes that are not a message are skipped (protobuf's own parser is not what is tested). An
// HttpError is the expected answer to a bad request; the findings are crashes, sanitizer reports,
// timeouts, allocations past -rss_limit_mb (a shape's element count must be checked against the data
// present before anything is allocated), and a decoded input whose bytes do not match its shape.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kserve_fuzz_common.h"
#include "serve/kserve_grpc_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<kiln::TensorInfo> infos = kiln::fuzz::kserve_signature();
  inference::ModelInferRequest q;
  if (!q.ParseFromArray(data, int(size))) return 0;
  try {
    (void)kiln::serve::grpc_timeout_us(q);
    std::vector<kiln::serve::Input> inputs = kiln::serve::decode_grpc_inputs(q, infos);
    kiln::fuzz::check_decoded(inputs, "kiln_fuzz_grpc");
  } catch (const kiln::serve::HttpError&) {
  }
  return 0;
}
