// KServe v2 tensors as JSON and binary data (the binary tensor data extension), without the HTTP:
// what kserve_http.cc answers requests with, and what the kserve fuzz target feeds hostile bytes.
// Every decoding error is an HttpError naming the input; nothing is allocated beyond what the
// request's own bytes hold.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::serve {

// An error answered as {"error": message} with an HTTP status.
struct HttpError {
  int status;
  std::string message;
};

// The protocol's datatype name of a kiln dtype ("FP32", "INT64", "BYTES"...), nullopt when it has none.
std::optional<std::string> kserve_type(DType t);
// {"name", "datatype", "shape"} of an engine input or output (-1 for dims the engine leaves open).
nlohmann::json tensor_metadata(const TensorInfo& t);

// One input of a request, decoded into memory the request owns.
struct Input {
  const TensorInfo* info = nullptr;  // null: the request did not give this input
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  std::vector<std::string> strings;
  TensorView view() {
    void* p = info->dtype == DType::kString ? static_cast<void*>(strings.data()) : static_cast<void*>(bytes.data());
    return TensorView{info->dtype, shape, p, false};
  }
};

// The JSON header's length: the Inference-Header-Content-Length value when given (null: none, the
// whole body is JSON).
size_t header_length(const std::string& body, const std::string* value);
// The JSON header as an object with an "inputs" array.
nlohmann::json parse_request(const std::string& body, size_t header_len);
// The request's inputs in `infos` order (unnamed ones have a null info), their data from JSON
// "data" or from the binary part after the header (binary_data_size each, in request order, which
// must use every byte).
std::vector<Input> decode_inputs(const std::string& body, size_t header_len, const nlohmann::json& request,
                                 const std::vector<TensorInfo>& infos);

nlohmann::json encode_json_data(const HostTensor& t);  // flat, row-major
std::string encode_binary(const HostTensor& t);        // raw elements; BYTES with 4-byte lengths
// 500 for kiln's internal and out-of-memory errors, else 400.
int status_of(const Status& s);

}  // namespace kiln::serve
