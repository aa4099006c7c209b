// Errors are values (DESIGN.md rule 7): Status and Expected<T> carry a user-facing message through
// the library; KILN_CHECK aborts on broken internal invariants only.
//
//   Expected<Tensor> t = load(path);
//   if (!t) return t.status();            // or: KILN_ASSIGN_OR_RETURN(Tensor x, load(path));
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace kiln {

enum class ErrorCode {
  kOk,
  kInvalidModel,     // the model file is malformed or inconsistent
  kUnsupported,      // valid ONNX that kiln does not implement
  kInvalidArgument,  // bad user input at run time (inputs, flags)
  kIo,               // file system
  kOutOfMemory,      // allocation refused (too large or the device is full)
  kInternal,         // a backend library failed
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Prefixes context ("while importing foo.onnx: ...") onto an error; no-op on success.
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
#define KILN_ERROR(code, ...) ::kiln::make_error(::kiln::ErrorCode::code, __VA_ARGS__)

template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.is_ok()) status_ = Status(ErrorCode::kInternal, "Expected built from an ok Status");
  }
  bool has_value() const { return value_.has_value(); }
  explicit operator bool() const { return has_value(); }
  const Status& status() const { return status_; }
  T& value() & { check(); return *value_; }
  const T& value() const& { check(); return *value_; }
  T&& value() && { check(); return std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void check() const {
    if (!value_) {
      std::fprintf(stderr, "kiln: internal error: value() on an error: %s\n", status_.message().c_str());
      std::abort();
    }
  }
  std::optional<T> value_;
  Status status_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

#define KILN_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::kiln::Status kiln_status_ = (expr);       \
    if (!kiln_status_.is_ok()) return kiln_status_; \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp) return tmp.status();                   \
  lhs = std::move(*tmp)
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_expected_, __LINE__), lhs, expr)

// Broken internal invariant: abort with the condition. Never for user or model errors.
#define KILN_CHECK(cond, ...)                                                       \
  do {                                                                              \
    if (!(cond)) ::kiln::check_failed(__FILE__, __LINE__, #cond, fmt::format("" __VA_ARGS__)); \
  } while (0)
