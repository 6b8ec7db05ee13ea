#include <spindle/error.hpp>

#include <cstring>

namespace spindle {

const char* failure_kind_name(FailureKind kind) noexcept {
  switch (kind) {
    case FailureKind::kPython: return "python";
    case FailureKind::kDecode: return "decode";
    case FailureKind::kData: return "data";
    case FailureKind::kInternal: return "internal";
    case FailureKind::kOther: break;
  }
  return "other";
}

namespace detail {

std::string location_suffix(const char* file, int line) {
  // Keep only the path below runtime/ so messages do not leak build paths.
  const char* rel = std::strstr(file, "runtime/");
  return std::string(" [") + (rel ? rel : file) + ":" + std::to_string(line) + "]";
}

}  // namespace detail
}  // namespace spindle
