// errors.h — mm3's exception hierarchy (ARCHITECTURE.md habit 10: exceptions inside, status codes at
// the C ABI). Every message names the file / tensor / field at fault and says what was expected.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace mm3 {

enum class ErrorKind {
  invalid_input = 1,  // the caller gave something wrong (CLI exit code 2)
  bad_model = 2,      // checkpoint missing, corrupt or inconsistent (exit 3)
  out_of_memory = 3,  // allocation failed; message says how much was needed (exit 4)
  cancelled = 4,      // the user asked to stop; not an error, its own outcome
  internal = 5,       // a bug in mm3
  not_implemented = 6,
};

const char* error_kind_name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

struct InvalidInput : Error {
  explicit InvalidInput(const std::string& m) : Error(ErrorKind::invalid_input, m) {}
};
struct BadModel : Error {
  explicit BadModel(const std::string& m) : Error(ErrorKind::bad_model, m) {}
};
struct OutOfMemory : Error {
  explicit OutOfMemory(const std::string& m) : Error(ErrorKind::out_of_memory, m) {}
};
struct Cancelled : Error {
  explicit Cancelled(const std::string& m = "cancelled") : Error(ErrorKind::cancelled, m) {}
};
struct InternalError : Error {
  explicit InternalError(const std::string& m) : Error(ErrorKind::internal, m) {}
};
struct NotImplemented : Error {
  explicit NotImplemented(const std::string& m) : Error(ErrorKind::not_implemented, m) {}
};

// MM3_CHECK(cond, fmt, args...) throws InternalError: for invariants that only a bug can break.
#define MM3_CHECK(cond, ...)                                                                  \
  do {                                                                                        \
    if (!(cond))                                                                              \
      throw ::mm3::InternalError(fmt::format("{}:{}: check `{}` failed: {}", __FILE__, __LINE__, \
                                             #cond, fmt::format(__VA_ARGS__)));               \
  } while (0)

}  // namespace mm3
