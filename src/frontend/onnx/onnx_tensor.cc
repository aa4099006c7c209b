#include "frontend/onnx/onnx_tensor.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <filesystem>

namespace kiln::onnx_io {

namespace fs = std::filesystem;

namespace {

// Copies `n` elements stored in a repeated proto field into the tensor, converting per dtype.
template <typename Field>
Status copy_field(const Field& f, Tensor& t, const std::string& what) {
  if (int64_t(f.size()) != t.numel()) {
    return KILN_ERROR(kInvalidModel, "{} has {} values but its dims {} need {}", what, f.size(),
                      dims_to_string(t.dims()), t.numel());
  }
  return visit_dtype(t.dtype(), [&]<typename T>() -> Status {
    T* out = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      auto v = f.Get(int(i));
      if constexpr (std::is_same_v<T, std::string>) {
        (void)v;  // strings are read from string_data by the caller
      } else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
        out[i].bits = uint16_t(v);  // stored as bit patterns in int32_data
      } else if constexpr (is_reduced_float_v<T>) {
        out[i].bits = uint8_t(v);
      } else {
        out[i] = T(v);
      }
    }
    return Status::ok();
  });
}

// Sub-byte types are packed in ONNX files, low bits first: two int4/uint4/float4 (four int2/uint2)
// per byte. `bytes` holds ceil(n * bits / 8) bytes; each element becomes one byte of t.
void unpack_into(Tensor& t, const uint8_t* bytes) {
  const int bits = dtype_bits(t.dtype());
  const int per_byte = 8 / bits;
  const uint8_t mask = uint8_t((1u << bits) - 1);
  visit_dtype(t.dtype(), [&]<typename T>() {
    if constexpr (is_small_int_v<T> || std::is_same_v<T, float4e2m1>) {
      T* out = t.data<T>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        const uint8_t v = uint8_t(bytes[i / per_byte] >> (bits * (i % per_byte))) & mask;
        out[i] = T::from_bits(v);
      }
    }
  });
}

int64_t packed_bytes(int64_t n, DType dt) { return (n * dtype_bits(dt) + 7) / 8; }

// packed_bytes for a message: only computed where it cannot overflow (the checks below refuse more
// than 2^60 elements before computing it).
std::string packed_need(int64_t n, DType dt) {
  return n > (int64_t(1) << 60) ? std::string("more than 2^57") : std::to_string(packed_bytes(n, dt));
}

// A read-only mapping of part of a file; unmapped when the last tensor viewing it goes away.
struct Mapping {
  void* base = nullptr;
  size_t len = 0;
  ~Mapping() { if (base) munmap(base, len); }
};

Expected<Tensor> read_external(const onnx::TensorProto& p, Tensor t, const TensorReadOptions& opt,
                               const std::string& what) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : p.external_data()) {
    auto parse_int = [&](int64_t* out) -> Status {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(kv.value().c_str(), &end, 10);
      if (kv.value().empty() || *end || errno || v < 0) {
        return KILN_ERROR(kInvalidModel, "{}: external data {} '{}' is not a non-negative integer", what, kv.key(), kv.value());
      }
      *out = v;
      return Status::ok();
    };
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") KILN_RETURN_IF_ERROR(parse_int(&offset));
    else if (kv.key() == "length") KILN_RETURN_IF_ERROR(parse_int(&length));
  }
  if (location.empty()) return KILN_ERROR(kInvalidModel, "{}: external data has no location", what);
  if (opt.base_dir.empty()) {
    return KILN_ERROR(kInvalidModel, "{}: external data '{}' but the model was not loaded from a file", what, location);
  }
  fs::path rel(location);
  if (rel.is_absolute()) {
    return KILN_ERROR(kInvalidModel, "{}: external data location '{}' is absolute; it must be inside the model's folder", what, location);
  }
  for (const auto& part : rel) {
    if (part == "..") {
      return KILN_ERROR(kInvalidModel, "{}: external data location '{}' leaves the model's folder", what, location);
    }
  }
  std::error_code ec;
  fs::path base = fs::canonical(opt.base_dir, ec);
  if (ec) return KILN_ERROR(kIo, "{}: cannot resolve model folder '{}': {}", what, opt.base_dir, ec.message());
  fs::path full = fs::weakly_canonical(base / rel, ec);  // resolves symlinks
  auto [mismatch, _] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
  if (ec || mismatch != base.end()) {
    return KILN_ERROR(kInvalidModel, "{}: external data '{}' resolves outside the model's folder", what, location);
  }
  int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return KILN_ERROR(kIo, "{}: cannot open external data file '{}': {}", what, full.string(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return KILN_ERROR(kInvalidModel, "{}: external data '{}' is not a regular file", what, full.string());
  }
  int64_t need = int64_t(t.nbytes());
  if (length >= 0 && length != need) {
    ::close(fd);
    return KILN_ERROR(kInvalidModel, "{}: external data length {} but dims {} of {} need {} bytes", what, length,
                      dims_to_string(t.dims()), dtype_name(t.dtype()), need);
  }
  if (offset > st.st_size || need > st.st_size - offset) {
    ::close(fd);
    return KILN_ERROR(kInvalidModel, "{}: external data [{}, {}) runs past the end of '{}' ({} bytes)", what, offset,
                      offset + need, location, int64_t(st.st_size));
  }
  if (need == 0) { ::close(fd); return t; }
  int64_t page = sysconf(_SC_PAGESIZE);
  int64_t start = offset / page * page;
  auto m = std::make_shared<Mapping>();
  m->len = size_t(offset - start + need);
  m->base = mmap(nullptr, m->len, PROT_READ, MAP_PRIVATE, fd, start);
  ::close(fd);
  if (m->base == MAP_FAILED) {
    m->base = nullptr;
    return KILN_ERROR(kIo, "{}: cannot map external data '{}': {}", what, location, std::strerror(errno));
  }
  void* data = static_cast<char*>(m->base) + (offset - start);
  return Tensor::view(t.dtype(), t.dims(), std::shared_ptr<void>(m, data), data);
}

Expected<int64_t> numel_of(const std::vector<int64_t>& dims, const std::string& what) {
  auto n = checked_numel(dims);
  if (!n) return KILN_ERROR(kInvalidModel, "{}: {}", what, n.status().message());
  return *n;
}

}  // namespace

Expected<Tensor> tensor_from_proto(const onnx::TensorProto& p, const TensorReadOptions& opt, const std::string& what) {
  auto dt = dtype_from_onnx(p.data_type());
  if (!dt) {
    return KILN_ERROR(kUnsupported, "{} has element type {} ({}), which kiln does not support", what, p.data_type(),
                      onnx::TensorProto_DataType_IsValid(p.data_type())
                          ? onnx::TensorProto_DataType_Name(onnx::TensorProto_DataType(p.data_type()))
                          : std::string("invalid"));
  }
  if (p.has_segment()) return KILN_ERROR(kUnsupported, "{} is a segmented tensor", what);
  std::vector<int64_t> dims(p.dims().begin(), p.dims().end());
  for (int64_t d : dims) {
    if (d < 0) return KILN_ERROR(kInvalidModel, "{} has a negative dimension in {}", what, dims_to_string(dims));
  }
  if (p.data_location() == onnx::TensorProto::EXTERNAL) {
    // Check sizes before anything is allocated: the view maps the file instead.
    KILN_ASSIGN_OR_RETURN(int64_t n, numel_of(dims, what));
    if (*dt == DType::kString) return KILN_ERROR(kUnsupported, "{}: external string data", what);
    if (dtype_is_packed(*dt)) return KILN_ERROR(kUnsupported, "{}: external {} data", what, dtype_name(*dt));
    int64_t bytes;
    if (__builtin_mul_overflow(n, int64_t(dtype_size(*dt)), &bytes)) {
      return KILN_ERROR(kInvalidModel, "{}: dims {} are too large", what, dims_to_string(dims));
    }
    return read_external(p, Tensor::view(*dt, dims, nullptr, nullptr), opt, what);
  }
  // Refuse declared sizes the data cannot back before allocating them.
  KILN_ASSIGN_OR_RETURN(int64_t n, numel_of(dims, what));
  const bool packed = dtype_is_packed(*dt);
  if (p.has_raw_data() && packed) {
    if (n > (int64_t(1) << 60) || packed_bytes(n, *dt) != int64_t(p.raw_data().size())) {
      return KILN_ERROR(kInvalidModel, "{} has {} bytes of raw data but dims {} of {} need {}", what,
                        p.raw_data().size(), dims_to_string(dims), dtype_name(*dt), packed_need(n, *dt));
    }
  } else if (packed) {
    if (n > (int64_t(1) << 60) || p.int32_data_size() != packed_bytes(n, *dt)) {
      return KILN_ERROR(kInvalidModel, "{} has {} packed values in int32_data but dims {} of {} need {}", what,
                        p.int32_data_size(), dims_to_string(dims), dtype_name(*dt), packed_need(n, *dt));
    }
  } else if (p.has_raw_data() && *dt != DType::kString) {
    int64_t bytes;
    const bool overflow = __builtin_mul_overflow(n, int64_t(dtype_size(*dt)), &bytes);
    if (overflow || bytes != int64_t(p.raw_data().size())) {
      // The product is only printed when it exists (a hostile model's dims can overflow it).
      return KILN_ERROR(kInvalidModel, "{} has {} bytes of raw data but dims {} of {} need {}", what,
                        p.raw_data().size(), dims_to_string(dims), dtype_name(*dt),
                        overflow ? std::string("more than 2^63") : std::to_string(bytes));
    }
  } else {
    int64_t have = 0;
    switch (*dt) {
      case DType::kFloat32: have = p.float_data_size(); break;
      case DType::kFloat64: have = p.double_data_size(); break;
      case DType::kInt64: have = p.int64_data_size(); break;
      case DType::kUInt32: case DType::kUInt64: have = p.uint64_data_size(); break;
      case DType::kString: have = p.string_data_size(); break;
      default: have = p.int32_data_size(); break;
    }
    if (have != n) {
      return KILN_ERROR(kInvalidModel, "{} has {} values but its dims {} need {}", what, have, dims_to_string(dims), n);
    }
  }
  // Large raw data is viewed where the protobuf holds it (aligned for any element type).
  constexpr size_t kViewBytes = 4096;
  if (opt.owner && !packed && p.has_raw_data() && *dt != DType::kString && p.raw_data().size() >= kViewBytes &&
      reinterpret_cast<uintptr_t>(p.raw_data().data()) % 16 == 0) {
    return Tensor::view(*dt, dims, std::const_pointer_cast<void>(opt.owner), const_cast<char*>(p.raw_data().data()));
  }
  auto created = Tensor::create(*dt, dims);
  if (!created) return Status(created.status().code(), what + ": " + created.status().message());
  Tensor t = std::move(*created);
  if (packed) {
    std::vector<uint8_t> bytes(p.raw_data().begin(), p.raw_data().end());
    if (!p.has_raw_data()) {
      for (int32_t v : p.int32_data()) bytes.push_back(uint8_t(v));
    }
    unpack_into(t, bytes.data());
    return t;
  }
  if (p.has_raw_data() && *dt != DType::kString) {
    if (n > 0) std::memcpy(t.raw(), p.raw_data().data(), t.nbytes());  // little-endian host
    return t;
  }
  switch (*dt) {
    case DType::kFloat32: KILN_RETURN_IF_ERROR(copy_field(p.float_data(), t, what)); break;
    case DType::kFloat64: KILN_RETURN_IF_ERROR(copy_field(p.double_data(), t, what)); break;
    case DType::kInt64: KILN_RETURN_IF_ERROR(copy_field(p.int64_data(), t, what)); break;
    case DType::kUInt32: case DType::kUInt64: KILN_RETURN_IF_ERROR(copy_field(p.uint64_data(), t, what)); break;
    case DType::kString:
      for (int64_t i = 0; i < n; ++i) t.data<std::string>()[i] = p.string_data(int(i));
      break;
    default: KILN_RETURN_IF_ERROR(copy_field(p.int32_data(), t, what)); break;
  }
  return t;
}

Expected<Data> data_from_sequence(const onnx::SequenceProto& p, const std::string& what) {
  std::vector<Tensor> items;
  DType dt = DType::kFloat32;
  if (p.elem_type() != onnx::SequenceProto::TENSOR && p.elem_type() != onnx::SequenceProto::UNDEFINED) {
    return KILN_ERROR(kUnsupported, "{}: sequences of non-tensors are not supported", what);
  }
  for (int i = 0; i < p.tensor_values_size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(p.tensor_values(i), {}, what));
    dt = t.dtype();
    items.push_back(std::move(t));
  }
  return Data::make_sequence(std::move(items), dt);
}

Expected<Data> data_from_optional(const onnx::OptionalProto& p, const std::string& what) {
  if (p.has_tensor_value()) {
    KILN_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(p.tensor_value(), {}, what));
    return Data(std::move(t));
  }
  if (p.has_sequence_value()) return data_from_sequence(p.sequence_value(), what);
  return Data();
}

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* p) {
  p->Clear();
  p->set_name(name);
  p->set_data_type(dtype_to_onnx(t.dtype()));
  for (int64_t d : t.dims()) p->add_dims(d);
  if (t.dtype() == DType::kString) {
    for (int64_t i = 0; i < t.numel(); ++i) p->add_string_data(t.data<std::string>()[i]);
  } else if (dtype_is_packed(t.dtype())) {
    const int bits = dtype_bits(t.dtype());
    std::string bytes(size_t(packed_bytes(t.numel(), t.dtype())), '\0');
    const uint8_t* in = static_cast<const uint8_t*>(t.raw());
    const uint8_t mask = uint8_t((1u << bits) - 1);
    for (int64_t i = 0; i < t.numel(); ++i) {
      bytes[size_t(i * bits / 8)] = char(uint8_t(bytes[size_t(i * bits / 8)]) | ((in[i] & mask) << (i * bits % 8)));
    }
    p->set_raw_data(bytes);
  } else {
    p->set_raw_data(t.raw(), t.nbytes());
  }
}

}  // namespace kiln::onnx_io
