#include "support/npy.h"

#include "support/mapped_file.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kiln {

namespace {

// numpy's dtype descriptor for a kiln dtype; reduced floats are widened to f32 on write, sub-byte
// integers written as (u)int8.
const char* npy_descr(DType dt) {
  switch (dt) {
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kFloat16: return "<f2";
    case DType::kInt8: return "|i1";
    case DType::kInt16: return "<i2";
    case DType::kInt32: return "<i4";
    case DType::kInt64: return "<i8";
    case DType::kUInt8: return "|u1";
    case DType::kUInt16: return "<u2";
    case DType::kUInt32: return "<u4";
    case DType::kUInt64: return "<u8";
    case DType::kBool: return "|b1";
    case DType::kInt4:  // sub-byte integers are held one per byte: numpy reads them as int8 / uint8
    case DType::kInt2: return "|i1";
    case DType::kUInt4:
    case DType::kUInt2: return "|u1";
    case DType::kFloat4E2M1:
    case DType::kString:
    case DType::kBFloat16:
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ: return nullptr;
  }
  return nullptr;
}

std::optional<DType> dtype_from_descr(const std::string& d) {
  static const DType all[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt8,
                              DType::kInt16,   DType::kInt32,   DType::kInt64,   DType::kUInt8,
                              DType::kUInt16,  DType::kUInt32,  DType::kUInt64,  DType::kBool};
  for (DType dt : all) {
    std::string want = npy_descr(dt);
    // Single-byte types may be written with '|', '<' or '='; multi-byte ones with '<' or '='.
    if (d == want || (d.size() == want.size() && (d[0] == '=' || d[0] == '<' || d[0] == '|') &&
                      d.substr(1) == want.substr(1) && (want[0] == '<' || d[0] != '>'))) {
      return dt;
    }
  }
  return std::nullopt;
}

// Finds `'key':` in the header dict and returns the text after it.
std::optional<std::string> header_field(const std::string& h, const std::string& key) {
  for (const char* q : {"'", "\""}) {
    std::string k = std::string(q) + key + q;
    size_t p = h.find(k);
    if (p == std::string::npos) continue;
    p = h.find(':', p + k.size());
    if (p == std::string::npos) return std::nullopt;
    return h.substr(p + 1);
  }
  return std::nullopt;
}

std::string trim(std::string s) {
  size_t a = s.find_first_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a);
}

}  // namespace

Expected<Tensor> parse_npy(const std::string& bytes, const std::string& what) {
  auto bad = [&](const std::string& why) { return KILN_ERROR(kInvalidArgument, "{}: not a valid .npy file: {}", what, why); };
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) return bad("missing the \\x93NUMPY magic");
  int major = uint8_t(bytes[6]);
  size_t header_len = 0, pos = 0;
  if (major == 1) {
    header_len = uint8_t(bytes[8]) | (size_t(uint8_t(bytes[9])) << 8);
    pos = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    for (int i = 0; i < 4; ++i) header_len |= size_t(uint8_t(bytes[8 + i])) << (8 * i);
    pos = 12;
  } else {
    return bad(fmt::format("unsupported format version {}", major));
  }
  if (header_len > bytes.size() - pos) return bad("header longer than the file");
  std::string h = bytes.substr(pos, header_len);
  pos += header_len;

  auto descr_f = header_field(h, "descr");
  auto order_f = header_field(h, "fortran_order");
  auto shape_f = header_field(h, "shape");
  if (!descr_f || !order_f || !shape_f) return bad("header lacks descr, fortran_order or shape");
  std::string d = trim(*descr_f);
  if (d.empty() || (d[0] != '\'' && d[0] != '"')) return bad("descr is not a simple type string (structured arrays are not supported)");
  size_t end = d.find(d[0], 1);
  if (end == std::string::npos) return bad("unterminated descr");
  std::string descr = d.substr(1, end - 1);
  if (trim(*order_f).rfind("True", 0) == 0) return bad("Fortran-order arrays are not supported; save with np.ascontiguousarray");
  std::string s = trim(*shape_f);
  if (s.empty() || s[0] != '(') return bad("shape is not a tuple");
  size_t close = s.find(')');
  if (close == std::string::npos) return bad("unterminated shape");
  std::vector<int64_t> dims;
  std::stringstream ss(s.substr(1, close - 1));
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    if (item.size() > 18 || item.find_first_not_of("0123456789") != std::string::npos) {
      return bad(fmt::format("bad dimension '{}' in shape", item));
    }
    dims.push_back(std::stoll(item));
  }
  auto numel = checked_numel(dims);
  if (!numel) return bad(numel.status().message());
  int64_t n = *numel;

  if (descr.size() >= 3 && (descr[0] == '<' || descr[0] == '|' || descr[0] == '=') && descr[1] == 'U') {
    // Fixed-width UTF-32 strings: each element is `width` code points, NUL-padded.
    std::string w = descr.substr(2);
    if (w.empty() || w.size() > 9 || w.find_first_not_of("0123456789") != std::string::npos) return bad("bad string width");
    size_t width = std::stoull(w);
    if (width != 0 && size_t(n) > (bytes.size() - pos) / (4 * width)) return bad("data shorter than its shape");
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(DType::kString, dims));
    for (int64_t i = 0; i < n; ++i) {
      std::string out;
      for (size_t c = 0; c < width; ++c) {
        const char* p = bytes.data() + pos + (size_t(i) * width + c) * 4;
        uint32_t cp = uint8_t(p[0]) | uint32_t(uint8_t(p[1])) << 8 | uint32_t(uint8_t(p[2])) << 16 | uint32_t(uint8_t(p[3])) << 24;
        if (cp == 0) break;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) {
          return bad(fmt::format("string element {} holds 0x{:X}, which is not a Unicode code point", i, cp));
        }
        if (cp < 0x80) out += char(cp);
        else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
        else if (cp < 0x10000) { out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
        else { out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F)); }
      }
      t.data<std::string>()[i] = std::move(out);
    }
    return t;
  }
  auto dt = dtype_from_descr(descr);
  if (!dt) return bad(fmt::format("unsupported dtype '{}' (big-endian, complex, object and structured types are not supported)", descr));
  size_t need = size_t(n) * dtype_size(*dt);
  if (bytes.size() - pos < need) {
    return bad(fmt::format("data is {} bytes but shape {} of {} needs {}", bytes.size() - pos, dims_to_string(dims), descr, need));
  }
  KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(*dt, dims));
  if (need) std::memcpy(t.raw(), bytes.data() + pos, need);
  if (*dt == DType::kBool) {
    for (int64_t i = 0; i < n; ++i) {
      if (static_cast<const uint8_t*>(t.raw())[i] > 1) return bad(fmt::format("bool element {} is not 0 or 1", i));
    }
  }
  return t;
}

Expected<Tensor> read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return KILN_ERROR(kIo, "{}: cannot open: {}", path, std::strerror(errno));
  f.seekg(0, std::ios::end);
  std::streamoff size = f.tellg();
  if (size < 0) return KILN_ERROR(kIo, "{}: cannot read (is it a directory?)", path);
  if (size > max_tensor_bytes() + (1 << 20)) {
    return KILN_ERROR(kOutOfMemory, "{}: {} bytes is more than the tensor size limit", path, int64_t(size));
  }
  f.seekg(0);
  std::string bytes(size_t(size), '\0');
  if (!f.read(bytes.data(), size)) return KILN_ERROR(kIo, "{}: read failed", path);
  return parse_npy(bytes, path);
}

std::string serialize_npy(const Tensor& in) {
  Tensor t = in;
  std::string descr;
  size_t str_width = 0;
  std::vector<std::u32string> wide;
  if (in.dtype() == DType::kString) {
    // UTF-8 -> UTF-32 (invalid bytes are kept as their code unit values).
    for (int64_t i = 0; i < in.numel(); ++i) {
      const std::string& s = in.data<std::string>()[i];
      std::u32string w;
      for (size_t k = 0; k < s.size();) {
        uint8_t c = uint8_t(s[k]);
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (k + len > s.size()) len = 1;
        char32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (int j = 1; j < len; ++j) cp = (cp << 6) | (uint8_t(s[k + j]) & 0x3F);
        w += cp;
        k += len;
      }
      str_width = std::max(str_width, w.size());
      wide.push_back(std::move(w));
    }
    descr = fmt::format("<U{}", std::max<size_t>(str_width, 1));
    str_width = std::max<size_t>(str_width, 1);
  } else if (const char* d = npy_descr(in.dtype())) {
    descr = d;
  } else {
    // bf16 / float8 / float4: numpy has no such dtype; widen to f32.
    t = Tensor::create(DType::kFloat32, in.dims()).value();
    for (int64_t i = 0; i < in.numel(); ++i) t.data<float>()[i] = float(in.as_double(i));
    descr = "<f4";
  }
  std::string shape = "(";
  for (size_t i = 0; i < t.rank(); ++i) shape += std::to_string(t.dim(i)) + (t.rank() == 1 ? "," : i + 1 < t.rank() ? ", " : "");
  shape += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
  // Pad so the data starts on a 64-byte boundary, ending the header with '\n' (the format spec).
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(1);
  out += char(0);
  out += char(header.size() & 0xFF);
  out += char(header.size() >> 8);
  out += header;
  if (t.dtype() == DType::kString) {
    for (const auto& w : wide) {
      for (size_t c = 0; c < str_width; ++c) {
        uint32_t cp = c < w.size() ? uint32_t(w[c]) : 0;
        for (int b = 0; b < 4; ++b) out += char((cp >> (8 * b)) & 0xFF);
      }
    }
  } else {
    out.append(static_cast<const char*>(t.raw()), t.nbytes());
  }
  return out;
}

Status write_npy(const std::string& path, const Tensor& t) { return write_file_atomic(path, serialize_npy(t)); }

std::string npy_file_stem(const std::string& name) {
  std::string s = name;
  for (char& c : s) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  // "." and ".." would name folders, and an empty name no file at all.
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

}  // namespace kiln
