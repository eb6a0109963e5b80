#include "core/errors.h"

namespace mm3 {

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::invalid_input: return "invalid input";
    case ErrorKind::bad_model: return "bad model";
    case ErrorKind::out_of_memory: return "out of memory";
    case ErrorKind::cancelled: return "cancelled";
    case ErrorKind::internal: return "internal error";
    case ErrorKind::not_implemented: return "not implemented";
  }
  return "unknown";
}

}  // namespace mm3
