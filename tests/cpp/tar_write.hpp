#pragma once
// Tar archives built byte by byte for the tests (ustar headers with correct
// checksums), so corruption lands at known offsets and shards hold exactly
// the members a test names.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace spindle::testing {

// One 512-byte ustar header with a correct checksum.
inline std::string tar_header(const std::string& name, uint64_t size, char type = '0',
                              const std::string& prefix = "", const char* size_field = nullptr) {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<std::size_t>(name.size(), 100));
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 108, 8, "%07o", 0);
  std::snprintf(h.data() + 116, 8, "%07o", 0);
  if (size_field) std::memcpy(h.data() + 124, size_field, std::min<std::size_t>(std::strlen(size_field), 12));
  else std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(h.data() + 136, 12, "%011o", 0);
  h[156] = type;
  std::memcpy(h.data() + 257, "ustar\0" "00", 8);
  std::memcpy(h.data() + 345, prefix.data(), std::min<std::size_t>(prefix.size(), 155));
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return h;
}

inline std::string pad(std::string data) {
  data.resize((data.size() + 511) / 512 * 512, '\0');
  return data;
}

inline std::string tar_member(const std::string& name, const std::string& data, char type = '0',
                              const std::string& prefix = "") {
  return tar_header(name, data.size(), type, prefix) + pad(data);
}

// The two zero blocks that end an archive.
inline const std::string kTarEnd(1024, '\0');

}  // namespace spindle::testing
