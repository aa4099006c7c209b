// kiln's errors are values: every call that can fail returns a Status or an Expected<T>, whose
// message is one line naming what was wrong (the ONNX node, the file, the input).
//
//   kiln::Expected<kiln::Engine> e = kiln::Engine::load("model.kiln");
//   if (!e) { std::fprintf(stderr, "%s\n", e.status().message().c_str()); return 1; }
//   kiln::Engine engine = std::move(*e);
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace kiln {

enum class ErrorCode {
  kOk,
  kInvalidModel,     // the model or engine file is malformed or inconsistent
  kUnsupported,      // valid input that kiln does not implement, or that cannot run here
  kInvalidArgument,  // bad user input at run time (inputs, flags, configuration)
  kIo,               // file system
  kOutOfMemory,      // allocation refused (too large, over the memory budget, or the device is full)
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
  // value() on an error is a programming error in the caller, not a run-time condition.
  void check() const {
    if (!value_) {
      std::fprintf(stderr, "kiln: internal error: value() on an error: %s\n", status_.message().c_str());
      std::abort();
    }
  }
  std::optional<T> value_;
  Status status_;
};

}  // namespace kiln
