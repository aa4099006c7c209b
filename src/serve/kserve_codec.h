// KServe v2 tensors as JSON and binary data (the binary tensor data extension), without the HTTP:
// what kserve_http.cc answers requests with, and what the kserve fuzz target feeds hostile bytes.
// Every decoding error is an HttpError naming the input; nothing is allocated beyond what the
// request's own bytes hold.
#pragma once

#include <nlohmann/json.hpp>
#include <new>
#include <memory>
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

// 64-byte aligned storage: an engine reads a large input in place only when it is (Session::run).
template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U>
  Aligned64(const Aligned64<U>&) {}  // NOLINT
  T* allocate(size_t n) { return static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete[](p, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const Aligned64<U>&) const { return true; }
};

// A tensor in a registered shared memory region (the system and CUDA shared memory extensions):
// the region's name, and the bytes [offset, offset + byte_size) of it the tensor takes.
struct ShmRef {
  std::string region;
  uint64_t offset = 0, byte_size = 0;
};

// One input of a request, decoded into memory the request owns, or (shm set) in a shared memory
// region that the server attaches (serve/shared_memory.h: `external` then points into it).
struct Input {
  const TensorInfo* info = nullptr;  // null: the request did not give this input
  std::vector<int64_t> shape;
  std::vector<unsigned char, Aligned64<unsigned char>> bytes;
  std::vector<std::string> strings;
  int64_t count = 0;  // elements the shape holds
  std::optional<ShmRef> shm;
  void* external = nullptr;           // the data in place in a region
  bool on_device = false;             // `external` is device memory (a CUDA region)
  std::shared_ptr<const void> keep;   // holds the region mapped while the request uses it
  TensorView view() {
    if (external) return TensorView{info->dtype, shape, external, on_device};
    void* p = info->dtype == DType::kString ? static_cast<void*>(strings.data()) : static_cast<void*>(bytes.data());
    return TensorView{info->dtype, shape, p, false};
  }
};

// The shared memory parameters of an input or a requested output (KServe's "parameters" object or
// map: shared_memory_region, shared_memory_byte_size, shared_memory_offset); nullopt when it names
// no region. `what` names the tensor in errors ("input 'x'").
std::optional<ShmRef> shm_ref_json(const nlohmann::json* params, const std::string& what);

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

// Binds the request's input `name` to the model's input of that name in `inputs` (infos order),
// checking that it exists, comes once and has the model's datatype (null: the request gave none);
// sets its shape and element count.
Input& bind_input(std::vector<Input>& inputs, const std::vector<TensorInfo>& infos, const std::string& name,
                  const std::string* datatype, std::vector<int64_t> shape);
// `size` raw little-endian bytes for `n` elements of the input's dtype (BYTES: a 4-byte length
// before each string), as the binary extension and gRPC's raw_input_contents carry them.
void decode_raw(Input& in, const char* p, size_t size, int64_t n);

// Standard base64 (RFC 4648, padding optional); `what` names the field in the error.
std::string base64_decode(const std::string& in, const std::string& what);

nlohmann::json encode_json_data(const HostTensor& t);  // flat, row-major
std::string encode_binary(const HostTensor& t);        // raw elements; BYTES with 4-byte lengths
// 500 for kiln's internal and out-of-memory errors, else 400.
int status_of(const Status& s);

}  // namespace kiln::serve
