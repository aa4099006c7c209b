// libFuzzer target for the KServe v2 request decoder of `kiln serve` (src/serve/kserve_codec.h):
// bytes -> (Inference-Header-Content-Length, body) -> parse_request -> decode_inputs, against a fixed
// model signature with every kind of input the codec decodes differently (float with an open batch,
// int64, BYTES, BOOL, FP16).
//
//   bash tests/fuzz/run.sh build-fuzz 60        (or: make fuzz; this target gets a quarter of the time)
//   build-fuzz/tests/kiln_fuzz_kserve build-fuzz/artifacts-kserve/crash-...   (replay one input)
//
// Input layout: byte 0 bit 0 says whether the header-length header is present; if so, bytes 1..6
// are its value as text (a request may send any text there), and the body is the rest. An HttpError
// is the expected answer to a bad request; the findings are crashes, sanitizer reports, timeouts,
// allocations past -rss_limit_mb (a declared size must be checked against the bytes present), and
// a decoded input whose bytes do not match its shape and datatype.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kserve_fuzz_common.h"
#include "serve/kserve_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<kiln::TensorInfo> infos = kiln::fuzz::kserve_signature();
  if (size < 1) return 0;
  const bool has_header = data[0] & 1;
  size_t at = 1;
  std::string header;
  if (has_header) {
    if (size < 7) return 0;
    header.assign(reinterpret_cast<const char*>(data + 1), 6);
    header.erase(header.find_last_not_of(' ') + 1);
    at = 7;
  }
  const std::string body(reinterpret_cast<const char*>(data + at), size - at);
  try {
    const size_t len = kiln::serve::header_length(body, has_header ? &header : nullptr);
    nlohmann::json r = kiln::serve::parse_request(body, len);
    std::vector<kiln::serve::Input> inputs = kiln::serve::decode_inputs(body, len, r, infos);
    kiln::fuzz::check_decoded(inputs, "kiln_fuzz_kserve");
  } catch (const kiln::serve::HttpError&) {
  }
  return 0;
}
