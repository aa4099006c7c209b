#include "serve/kserve_codec.h"

#include <cstring>

#include "support/float_types.h"

namespace kiln::serve {

using nlohmann::json;

std::optional<std::string> kserve_type(DType t) {
  switch (t) {
    case DType::kBool: return "BOOL";
    case DType::kUInt8: return "UINT8";
    case DType::kUInt16: return "UINT16";
    case DType::kUInt32: return "UINT32";
    case DType::kUInt64: return "UINT64";
    case DType::kInt8: return "INT8";
    case DType::kInt16: return "INT16";
    case DType::kInt32: return "INT32";
    case DType::kInt64: return "INT64";
    case DType::kFloat16: return "FP16";
    case DType::kFloat32: return "FP32";
    case DType::kFloat64: return "FP64";
    case DType::kBFloat16: return "BF16";
    case DType::kString: return "BYTES";
    default: return std::nullopt;
  }
}

json tensor_metadata(const TensorInfo& t) {
  json shape = json::array();
  for (int64_t d : t.shape) shape.push_back(d < 0 ? -1 : d);
  return {{"name", t.name}, {"datatype", kserve_type(t.dtype).value_or(std::string(dtype_name(t.dtype)))}, {"shape", shape}};
}

namespace {

// Flattens nested JSON arrays (row-major), as clients may send data nested or flat.
void flatten(const json& j, std::vector<const json*>& out, int depth = 0) {
  if (depth > 64) throw HttpError{400, "data is nested more than 64 levels deep"};
  if (j.is_array()) {
    for (const json& e : j) flatten(e, out, depth + 1);
  } else {
    out.push_back(&j);
  }
}

int64_t element_count(const std::vector<int64_t>& shape, const std::string& name) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw HttpError{400, "input '" + name + "': shape has a negative dim"};
    if (d != 0 && n > (int64_t(1) << 40) / d) throw HttpError{400, "input '" + name + "': shape holds over 2^40 elements"};
    n *= d;
  }
  return n;
}

template <typename T>
void put_numbers(Input& in, const std::vector<const json*>& v) {
  in.bytes.resize(v.size() * sizeof(T));
  T* p = reinterpret_cast<T*>(in.bytes.data());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& x = *v[i];
    if constexpr (std::is_same_v<T, bool>) {
      if (!x.is_boolean()) throw HttpError{400, "input '" + in.info->name + "': element " + std::to_string(i) + " is not a boolean"};
      p[i] = x.get<bool>();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!x.is_number()) throw HttpError{400, "input '" + in.info->name + "': element " + std::to_string(i) + " is not a number"};
      p[i] = x.get<T>();
    } else {
      if (!x.is_number_integer()) {
        throw HttpError{400, "input '" + in.info->name + "': element " + std::to_string(i) + " is not an integer"};
      }
      p[i] = x.get<T>();
    }
  }
}

void decode_json_data(Input& in, const json& data, int64_t n) {
  std::vector<const json*> v;
  flatten(data, v);
  if (int64_t(v.size()) != n) {
    throw HttpError{400, "input '" + in.info->name + "': shape holds " + std::to_string(n) + " elements, data has " +
                             std::to_string(v.size())};
  }
  switch (in.info->dtype) {
    case DType::kBool: return put_numbers<bool>(in, v);
    case DType::kUInt8: return put_numbers<uint8_t>(in, v);
    case DType::kUInt16: return put_numbers<uint16_t>(in, v);
    case DType::kUInt32: return put_numbers<uint32_t>(in, v);
    case DType::kUInt64: return put_numbers<uint64_t>(in, v);
    case DType::kInt8: return put_numbers<int8_t>(in, v);
    case DType::kInt16: return put_numbers<int16_t>(in, v);
    case DType::kInt32: return put_numbers<int32_t>(in, v);
    case DType::kInt64: return put_numbers<int64_t>(in, v);
    case DType::kFloat32: return put_numbers<float>(in, v);
    case DType::kFloat64: return put_numbers<double>(in, v);
    case DType::kFloat16:
    case DType::kBFloat16: {
      std::vector<float> f(v.size());
      in.bytes.resize(v.size() * 2);
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i]->is_number()) throw HttpError{400, "input '" + in.info->name + "': element " + std::to_string(i) + " is not a number"};
        uint16_t b = in.info->dtype == DType::kFloat16 ? float_to_half_bits(v[i]->get<float>())
                                                       : float_to_bf16_bits(v[i]->get<float>());
        std::memcpy(in.bytes.data() + 2 * i, &b, 2);
      }
      return;
    }
    case DType::kString:
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i]->is_string()) throw HttpError{400, "input '" + in.info->name + "': element " + std::to_string(i) + " is not a string"};
        in.strings.push_back(v[i]->get<std::string>());
      }
      return;
    default:
      throw HttpError{400, "input '" + in.info->name + "' has a type the protocol cannot carry"};
  }
}

}  // namespace

// Binary tensor data: raw little-endian elements; BYTES as a 4-byte length before each string.
void decode_raw(Input& in, const char* p, size_t size, int64_t n) {
  if (in.info->dtype == DType::kString) {
    size_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (size - at < 4) throw HttpError{400, "input '" + in.info->name + "': BYTES data ends inside element " + std::to_string(i)};
      uint32_t len;
      std::memcpy(&len, p + at, 4);
      at += 4;
      if (size - at < len) throw HttpError{400, "input '" + in.info->name + "': BYTES data ends inside element " + std::to_string(i)};
      in.strings.emplace_back(p + at, len);
      at += len;
    }
    if (at != size) throw HttpError{400, "input '" + in.info->name + "': BYTES data is longer than its elements"};
    return;
  }
  const size_t want = size_t(n) * dtype_size(in.info->dtype);
  if (size != want) {
    throw HttpError{400, "input '" + in.info->name + "': binary_data_size is " + std::to_string(size) + " bytes, shape and " +
                             "datatype need " + std::to_string(want)};
  }
  in.bytes.assign(p, p + size);
}

Input& bind_input(std::vector<Input>& inputs, const std::vector<TensorInfo>& infos, const std::string& n,
                  const std::string* datatype, std::vector<int64_t> shape) {
  size_t k = 0;
  while (k < infos.size() && infos[k].name != n) ++k;
  if (k == infos.size()) {
    std::string names;
    for (const auto& i : infos) names += (names.empty() ? "'" : ", '") + i.name + "'";
    throw HttpError{400, "unknown input '" + n + "'; the model's inputs are " + names};
  }
  Input& in = inputs[k];
  if (in.info) throw HttpError{400, "input '" + n + "' is given twice"};
  in.info = &infos[k];
  const std::string want = kserve_type(infos[k].dtype).value_or("?");
  if (!datatype || *datatype != want) {
    throw HttpError{400, "input '" + n + "': datatype " + (datatype ? "\"" + *datatype + "\"" : std::string("missing")) +
                             ", the model takes " + want};
  }
  in.shape = std::move(shape);
  in.count = element_count(in.shape, n);
  return in;
}

json encode_json_data(const HostTensor& t) {
  json a = json::array();
  const int64_t n = t.numel();
  auto put = [&]<typename T>() {
    for (int64_t i = 0; i < n; ++i) a.push_back(t.data<T>()[i]);
  };
  switch (t.dtype()) {
    case DType::kBool: put.operator()<bool>(); break;
    case DType::kUInt8: put.operator()<uint8_t>(); break;
    case DType::kUInt16: put.operator()<uint16_t>(); break;
    case DType::kUInt32: put.operator()<uint32_t>(); break;
    case DType::kUInt64: put.operator()<uint64_t>(); break;
    case DType::kInt8: put.operator()<int8_t>(); break;
    case DType::kInt16: put.operator()<int16_t>(); break;
    case DType::kInt32: put.operator()<int32_t>(); break;
    case DType::kInt64: put.operator()<int64_t>(); break;
    case DType::kFloat32: put.operator()<float>(); break;
    case DType::kFloat64: put.operator()<double>(); break;
    case DType::kString: put.operator()<std::string>(); break;
    case DType::kFloat16:
    case DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b = t.data<uint16_t>()[i];
        a.push_back(t.dtype() == DType::kFloat16 ? half_bits_to_float(b) : bf16_bits_to_float(b));
      }
      break;
    default: throw HttpError{500, "an output has a type the protocol cannot carry"};
  }
  return a;
}

std::string encode_binary(const HostTensor& t) {
  if (t.dtype() != DType::kString) return std::string(static_cast<const char*>(t.raw()), t.bytes());
  std::string out;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const std::string& s = t.data<std::string>()[i];
    uint32_t len = uint32_t(s.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += s;
  }
  return out;
}

std::optional<ShmRef> shm_ref_json(const json* params, const std::string& what) {
  if (!params || !params->is_object() || !params->contains("shared_memory_region")) return std::nullopt;
  const json& p = *params;
  if (!p["shared_memory_region"].is_string()) throw HttpError{400, what + ": shared_memory_region is not a string"};
  ShmRef r;
  r.region = p["shared_memory_region"].get<std::string>();
  if (!p.contains("shared_memory_byte_size") || !p["shared_memory_byte_size"].is_number_unsigned()) {
    throw HttpError{400, what + ": shared_memory_region '" + r.region + "' needs shared_memory_byte_size, a byte count"};
  }
  r.byte_size = p["shared_memory_byte_size"].get<uint64_t>();
  if (p.contains("shared_memory_offset")) {
    if (!p["shared_memory_offset"].is_number_unsigned()) throw HttpError{400, what + ": shared_memory_offset is not a byte count"};
    r.offset = p["shared_memory_offset"].get<uint64_t>();
  }
  return r;
}

std::string base64_decode(const std::string& in, const std::string& what) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  size_t n = in.size();
  while (n > 0 && in[n - 1] == '=') --n;
  if (in.size() - n > 2 || n % 4 == 1) throw HttpError{400, what + " is not base64"};
  std::string out;
  out.reserve(n * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    const int v = value(in[i]);
    if (v < 0) throw HttpError{400, what + " is not base64 (character " + std::to_string(i) + ")"};
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xff));
    }
  }
  return out;
}

int status_of(const Status& s) { return s.code() == ErrorCode::kInternal || s.code() == ErrorCode::kOutOfMemory ? 500 : 400; }

size_t header_length(const std::string& body, const std::string* value) {
  if (!value) return body.size();
  const std::string& h = *value;
  if (h.empty() || h.size() > 18 || h.find_first_not_of("0123456789") != std::string::npos || std::stoull(h) > body.size()) {
    throw HttpError{400, "Inference-Header-Content-Length '" + h + "' is not a length within the " +
                             std::to_string(body.size()) + "-byte body"};
  }
  return std::stoull(h);
}

json parse_request(const std::string& body, size_t header_len) {
  json r = json::parse(body.begin(), body.begin() + long(header_len), nullptr, false);
  if (r.is_discarded() || !r.is_object()) throw HttpError{400, "the request is not a JSON object"};
  if (!r.contains("inputs") || !r["inputs"].is_array()) throw HttpError{400, "the request has no \"inputs\" array"};
  return r;
}

std::vector<Input> decode_inputs(const std::string& body, size_t header_len, const json& r,
                                 const std::vector<TensorInfo>& infos) {
  std::vector<Input> inputs(infos.size());
  size_t at = header_len;
  for (const json& ji : r["inputs"]) {
    if (!ji.is_object() || !ji.contains("name") || !ji["name"].is_string()) throw HttpError{400, "an input has no name"};
    const std::string n = ji["name"].get<std::string>();
    const std::string datatype = !ji.contains("datatype") ? ""
                                 : ji["datatype"].is_string() ? ji["datatype"].get<std::string>() : ji["datatype"].dump();
    if (!ji.contains("shape") || !ji["shape"].is_array()) throw HttpError{400, "input '" + n + "' has no shape"};
    std::vector<int64_t> shape;
    for (const json& d : ji["shape"]) {
      if (!d.is_number_integer()) throw HttpError{400, "input '" + n + "': shape " + ji["shape"].dump() + " is not integers"};
      shape.push_back(d.get<int64_t>());
    }
    Input& in = bind_input(inputs, infos, n, ji.contains("datatype") ? &datatype : nullptr, std::move(shape));
    const int64_t count = in.count;
    const json* params = ji.contains("parameters") && ji["parameters"].is_object() ? &ji["parameters"] : nullptr;
    if ((in.shm = shm_ref_json(params, "input '" + n + "'"))) {
      if (params->contains("binary_data_size") || ji.contains("data")) {
        throw HttpError{400, "input '" + n + "' gives a shared memory region and data too"};
      }
    } else if (params && params->contains("binary_data_size")) {
      const json& s = (*params)["binary_data_size"];
      if (!s.is_number_unsigned() || s.get<uint64_t>() > body.size() - at) {
        throw HttpError{400, "input '" + n + "': binary_data_size " + s.dump() + " is more than the " +
                                 std::to_string(body.size() - at) + " bytes left in the request"};
      }
      size_t size = s.get<size_t>();
      decode_raw(in, body.data() + at, size, count);
      at += size;
    } else if (ji.contains("data")) {
      decode_json_data(in, ji["data"], count);
    } else {
      throw HttpError{400, "input '" + n + "' has neither data nor binary_data_size"};
    }
  }
  if (at != body.size()) {
    throw HttpError{400, std::to_string(body.size() - at) + " bytes of binary data follow the inputs that use it"};
  }
  return inputs;
}

}  // namespace kiln::serve
