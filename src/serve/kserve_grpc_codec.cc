#include "serve/kserve_grpc_codec.h"

#include <limits>
#include <string>
#include <type_traits>

namespace kiln::serve {

namespace {

// A typed contents list into the input's bytes (or strings), checking its length.
template <typename T, typename List>
void put_list(Input& in, const List& list, const char* field) {
  if (int64_t(list.size()) != in.count) {
    throw HttpError{400, "input '" + in.info->name + "': shape holds " + std::to_string(in.count) + " elements, " + field +
                             " has " + std::to_string(list.size())};
  }
  in.bytes.resize(list.size() * sizeof(T));
  T* p = reinterpret_cast<T*>(in.bytes.data());
  for (int i = 0; i < list.size(); ++i) {
    const auto v = list.Get(i);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
        throw HttpError{400, "input '" + in.info->name + "': element " + std::to_string(i) + " is out of range for its datatype"};
      }
    }
    p[i] = T(v);
  }
}

void decode_contents(Input& in, const inference::InferTensorContents& c) {
  switch (in.info->dtype) {
    case DType::kBool: return put_list<bool>(in, c.bool_contents(), "bool_contents");
    case DType::kUInt8: return put_list<uint8_t>(in, c.uint_contents(), "uint_contents");
    case DType::kUInt16: return put_list<uint16_t>(in, c.uint_contents(), "uint_contents");
    case DType::kUInt32: return put_list<uint32_t>(in, c.uint_contents(), "uint_contents");
    case DType::kUInt64: return put_list<uint64_t>(in, c.uint64_contents(), "uint64_contents");
    case DType::kInt8: return put_list<int8_t>(in, c.int_contents(), "int_contents");
    case DType::kInt16: return put_list<int16_t>(in, c.int_contents(), "int_contents");
    case DType::kInt32: return put_list<int32_t>(in, c.int_contents(), "int_contents");
    case DType::kInt64: return put_list<int64_t>(in, c.int64_contents(), "int64_contents");
    case DType::kFloat32: return put_list<float>(in, c.fp32_contents(), "fp32_contents");
    case DType::kFloat64: return put_list<double>(in, c.fp64_contents(), "fp64_contents");
    case DType::kString:
      if (int64_t(c.bytes_contents_size()) != in.count) {
        throw HttpError{400, "input '" + in.info->name + "': shape holds " + std::to_string(in.count) +
                                 " elements, bytes_contents has " + std::to_string(c.bytes_contents_size())};
      }
      in.strings.assign(c.bytes_contents().begin(), c.bytes_contents().end());
      return;
    default:
      throw HttpError{400, "input '" + in.info->name + "': its datatype has no typed contents; send raw_input_contents"};
  }
}

// A byte count parameter: int64_param (what tritonclient sends) or uint64_param, never negative.
uint64_t byte_count(const inference::InferParameter& p, const std::string& what, const char* key) {
  if (p.has_int64_param() && p.int64_param() >= 0) return uint64_t(p.int64_param());
  if (p.has_uint64_param()) return p.uint64_param();
  throw HttpError{400, what + ": " + key + " is not a byte count"};
}

}  // namespace

std::optional<ShmRef> shm_ref_grpc(const google::protobuf::Map<std::string, inference::InferParameter>& params,
                                   const std::string& what) {
  auto region = params.find("shared_memory_region");
  if (region == params.end()) return std::nullopt;
  if (!region->second.has_string_param()) throw HttpError{400, what + ": shared_memory_region is not a string"};
  ShmRef r;
  r.region = region->second.string_param();
  auto size = params.find("shared_memory_byte_size");
  if (size == params.end()) {
    throw HttpError{400, what + ": shared_memory_region '" + r.region + "' needs shared_memory_byte_size, a byte count"};
  }
  r.byte_size = byte_count(size->second, what, "shared_memory_byte_size");
  if (auto off = params.find("shared_memory_offset"); off != params.end()) {
    r.offset = byte_count(off->second, what, "shared_memory_offset");
  }
  return r;
}

std::vector<Input> decode_grpc_inputs(const inference::ModelInferRequest& q, const std::vector<TensorInfo>& infos) {
  // raw_input_contents holds an entry per input not in shared memory (what tritonclient sends), or
  // one per input, those in shared memory ignored.
  const bool raw = q.raw_input_contents_size() > 0;
  int in_shm = 0;
  for (const auto& t : q.inputs()) in_shm += t.parameters().count("shared_memory_region") ? 1 : 0;
  const bool one_per_input = q.raw_input_contents_size() == q.inputs_size();
  if (raw && !one_per_input && q.raw_input_contents_size() != q.inputs_size() - in_shm) {
    throw HttpError{400, "the request has " + std::to_string(q.inputs_size() - in_shm) + " inputs outside shared memory and " +
                             std::to_string(q.raw_input_contents_size()) + " raw_input_contents"};
  }
  std::vector<Input> inputs(infos.size());
  int next_raw = 0;
  for (int k = 0; k < q.inputs_size(); ++k) {
    const auto& t = q.inputs(k);
    Input& in = bind_input(inputs, infos, t.name(), &t.datatype(), {t.shape().begin(), t.shape().end()});
    const bool shm = bool(in.shm = shm_ref_grpc(t.parameters(), "input '" + t.name() + "'"));
    if (one_per_input) next_raw = k;
    if (shm) continue;
    if (raw) {
      const std::string& b = q.raw_input_contents(next_raw++);
      decode_raw(in, b.data(), b.size(), in.count);
    } else {
      decode_contents(in, t.contents());
    }
  }
  return inputs;
}

uint64_t grpc_timeout_us(const inference::ModelInferRequest& q) {
  auto it = q.parameters().find("timeout");
  if (it == q.parameters().end()) return 0;
  const auto& p = it->second;
  if (p.has_int64_param() && p.int64_param() >= 0) return uint64_t(p.int64_param());
  if (p.has_uint64_param()) return p.uint64_param();
  throw HttpError{400, "parameter 'timeout' is not a count of microseconds"};
}

}  // namespace kiln::serve
