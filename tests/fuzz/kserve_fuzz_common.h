// What the two KServe v2 request fuzz targets (fuzz_kserve.cc: HTTP/JSON and binary tensors;
// fuzz_grpc.cc: gRPC messages) share: the model signature they decode against, with every kind of
// input the decoders treat differently (float with an open batch, int64, BYTES, BOOL, FP16), and
// the check every decoded input must pass (its data holds exactly the elements its shape says).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "serve/kserve_codec.h"

namespace kiln::fuzz {

inline std::vector<TensorInfo> kserve_signature() {
  auto info = [](std::string name, DType dt, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = std::move(name);
    t.dtype = dt;
    t.shape = std::move(shape);
    return t;
  };
  return {info("x", DType::kFloat32, {-1, 4}), info("ids", DType::kInt64, {1, 3}), info("text", DType::kString, {2}),
          info("flag", DType::kBool, {-1}), info("h", DType::kFloat16, {2})};
}

// Aborts (a finding) when an input's data does not hold exactly its shape's elements.
inline void check_decoded(const std::vector<serve::Input>& inputs, const char* target) {
  for (const serve::Input& in : inputs) {
    if (!in.info) continue;
    int64_t n = 1;
    for (int64_t d : in.shape) n *= d;
    // An input in a shared memory region carries no bytes here (the server attaches the region).
    const bool ok = in.shm ? in.bytes.empty() && in.strings.empty()
                    : in.info->dtype == DType::kString ? int64_t(in.strings.size()) == n
                                                       : in.bytes.size() == size_t(n) * dtype_size(in.info->dtype);
    if (!ok || n != in.count) {
      std::fprintf(stderr, "%s: input '%s' decoded to the wrong number of elements\n", target, in.info->name.c_str());
      std::abort();
    }
  }
}

}  // namespace kiln::fuzz
