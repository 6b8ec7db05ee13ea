#include <spindle/error.hpp>

#include <cstring>

namespace spindle::detail {

std::string location_suffix(const char* file, int line) {
  // Keep only the path below runtime/ so messages do not leak build paths.
  const char* rel = std::strstr(file, "runtime/");
  return std::string(" [") + (rel ? rel : file) + ":" + std::to_string(line) + "]";
}

}  // namespace spindle::detail
