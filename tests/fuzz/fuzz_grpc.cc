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

#include "serve/kserve_grpc_codec.h"

namespace {

std::vector<kiln::TensorInfo> signature() {
  using kiln::DType;
  auto info = [](std::string name, DType dt, std::vector<int64_t> shape) {
    kiln::TensorInfo t;
    t.name = std::move(name);
    t.dtype = dt;
    t.shape = std::move(shape);
    return t;
  };
  return {info("x", DType::kFloat32, {-1, 4}), info("ids", DType::kInt64, {1, 3}), info("text", DType::kString, {2}),
          info("flag", DType::kBool, {-1}), info("h", DType::kFloat16, {2})};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<kiln::TensorInfo> infos = signature();
  inference::ModelInferRequest q;
  if (!q.ParseFromArray(data, int(size))) return 0;
  try {
    (void)kiln::serve::grpc_timeout_us(q);
    std::vector<kiln::serve::Input> inputs = kiln::serve::decode_grpc_inputs(q, infos);
    for (kiln::serve::Input& in : inputs) {
      if (!in.info) continue;
      int64_t n = 1;
      for (int64_t d : in.shape) n *= d;
      const bool ok = in.info->dtype == kiln::DType::kString
                          ? int64_t(in.strings.size()) == n
                          : in.bytes.size() == size_t(n) * kiln::dtype_size(in.info->dtype);
      if (!ok || n != in.count) {
        std::fprintf(stderr, "input '%s' decoded to the wrong size\n", in.info->name.c_str());
        std::abort();
      }
    }
  } catch (const kiln::serve::HttpError&) {
  }
  return 0;
}
