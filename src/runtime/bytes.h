// Little-endian byte writing and bounds-checked reading for kiln's binary formats (engine files,
// device plans). A Reader never reads past its end: the first failure sticks, every later read
// returns a zero value, and failed() names what was being read, so a hostile or truncated file is
// one error message, never a crash.
//
//   ByteWriter w;  w.u32(3);  w.str("conv1");
//   ByteReader r(w.bytes().data(), w.bytes().size(), "PLAN section");
//   uint32_t n = r.get<uint32_t>("the count");  std::string s = r.str("a name");
//   if (!r.ok()) return error(r.failed());     // "PLAN section ends inside a name"
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

namespace kiln {

class ByteWriter {
 public:
  void u8(uint8_t v) { s_.push_back(char(v)); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
  // One arithmetic or enum value as its bytes (no padding: never a struct).
  template <typename T>
  void put(T v) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>, "put() takes scalars; write structs field by field");
    raw(&v, sizeof(T));
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    u32(uint32_t(v.size()));
    for (const T& x : v) put(x);
  }
  void str(std::string_view v) {
    u32(uint32_t(v.size()));
    s_.append(v.data(), v.size());
  }
  void raw(const void* p, size_t n) { s_.append(static_cast<const char*>(p), n); }
  void pad(size_t align) { s_.resize((s_.size() + align - 1) / align * align, '\0'); }
  std::string& bytes() { return s_; }

 private:
  std::string s_;
};

class ByteReader {
 public:
  ByteReader(const char* p, size_t n, std::string what) : p_(p), n_(n), what_(std::move(what)) {}
  explicit ByteReader(std::string_view s, std::string what) : ByteReader(s.data(), s.size(), std::move(what)) {}
  bool ok() const { return ok_; }
  size_t left() const { return n_ - at_; }
  const std::string& failed() const { return failed_; }
  template <typename T>
  T get(const char* field) {
    static_assert(std::is_arithmetic_v<T> || std::is_enum_v<T>, "get() reads scalars");
    T v{};
    if (!take(sizeof(T), field)) return v;
    std::memcpy(&v, p_ + at_ - sizeof(T), sizeof(T));
    return v;
  }
  // A scalar that must lie in [lo, hi] (an enum's range, a rank): outside is corruption.
  template <typename T>
  T get_in(const char* field, T lo, T hi) {
    T v = get<T>(field);
    if (ok_ && (v < lo || v > hi)) fail(field, "out of range");
    return ok_ ? v : lo;
  }
  template <typename T>
  std::vector<T> vec(const char* field) {
    std::vector<T> v(count(field, sizeof(T)));
    for (T& x : v) x = get<T>(field);
    return v;
  }
  std::string str(const char* field) { return std::string(view(field)); }
  // A length-prefixed run of bytes, viewed in place.
  std::string_view view(const char* field) {
    uint32_t n = get<uint32_t>(field);
    if (!take(n, field)) return {};
    return std::string_view(p_ + at_ - n, n);
  }
  // A count of items each at least `min_item` bytes: larger than what is left is corruption.
  uint32_t count(const char* field, size_t min_item) {
    uint32_t n = get<uint32_t>(field);
    if (ok_ && size_t(n) * min_item > left()) fail(field);
    return ok_ ? n : 0;
  }
  // Marks the read failed (a value that parsed but makes no sense), naming the field.
  void fail(const char* field, const char* why = nullptr) {
    if (ok_) failed_ = why ? fmt::format("{}: {} is {}", what_, field, why) : fmt::format("{} ends inside {}", what_, field);
    ok_ = false;
  }

 private:
  bool take(size_t n, const char* field) {
    if (!ok_) return false;
    if (n > left()) {
      fail(field);
      return false;
    }
    at_ += n;
    return true;
  }
  const char* p_;
  size_t n_, at_ = 0;
  std::string what_;
  bool ok_ = true;
  std::string failed_;
};

}  // namespace kiln
