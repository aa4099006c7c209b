// Errors are values (DESIGN.md rule 7): Status and Expected<T> (public: include/kiln/status.h) carry
// a user-facing message through the library; KILN_ERROR formats one, KILN_CHECK aborts on broken
// internal invariants only.
//
//   Expected<Tensor> t = load(path);
//   if (!t) return t.status();            // or: KILN_ASSIGN_OR_RETURN(Tensor x, load(path));
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "kiln/status.h"

namespace kiln {

template <typename... Args>
Status make_error(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}
#define KILN_ERROR(code, ...) ::kiln::make_error(::kiln::ErrorCode::code, __VA_ARGS__)

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
