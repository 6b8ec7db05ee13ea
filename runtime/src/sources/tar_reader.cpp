// TarReader: ustar / GNU / pax archives read header by header with pread.
//
// Design decisions:
// - Every length comes from the archive and is untrusted: a member's data must
//   end inside the file size fstat gave at open (checked before any read or
//   allocation), names and extended headers are bounded, and numeric fields
//   are parsed with explicit overflow checks. So a corrupt shard costs at most
//   its own size in memory and never reads past its end.
// - Which members carry data follows Python's tarfile (the reference the tests
//   compare with): regular files and unknown types do; links, directories,
//   devices and fifos do not, whatever their size field says.
// - The end of the archive is the first zero block. A file that ends without
//   one is reported: a shard cut exactly between two members would otherwise
//   lose its tail silently (tarfile and webdataset accept it).
#include <spindle/sources.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "io_util.hpp"
#include "shard_stream_internal.hpp"

namespace spindle {
namespace {

constexpr uint64_t kInt64Max = static_cast<uint64_t>(INT64_MAX);

// A NUL-terminated string field of at most n bytes (tarfile's nts).
std::string field_string(const unsigned char* f, std::size_t n) {
  const auto* end = static_cast<const unsigned char*>(std::memchr(f, 0, n));
  return std::string(reinterpret_cast<const char*>(f), end ? static_cast<std::size_t>(end - f) : n);
}

// A numeric header field (tarfile's nti): octal digits, cut at the first NUL,
// surrounding spaces allowed, empty = 0; or GNU base-256 (first byte 0x80
// positive, 0xff negative). Returns false if malformed or over INT64_MAX;
// `negative` tells whether a base-256 value was negative.
bool parse_number(const unsigned char* f, std::size_t n, uint64_t& out, bool& negative) {
  out = 0;
  negative = false;
  if (f[0] == 0x80 || f[0] == 0xff) {
    negative = f[0] == 0xff;
    uint64_t v = 0;
    for (std::size_t k = 1; k < n; ++k) {
      const unsigned char b = negative ? static_cast<unsigned char>(~f[k]) : f[k];
      if (v > (kInt64Max >> 8)) return false;
      v = (v << 8) | b;
    }
    out = negative ? v + 1 : v;  // two's complement magnitude
    return out <= kInt64Max;
  }
  std::size_t end = 0;
  while (end < n && f[end] != 0) ++end;
  std::size_t i = 0;
  while (i < end && (f[i] == ' ' || f[i] == '\t')) ++i;
  std::size_t j = end;
  while (j > i && (f[j - 1] == ' ' || f[j - 1] == '\t')) --j;
  for (; i < j; ++i) {
    if (f[i] < '0' || f[i] > '7') return false;
    if (out > (kInt64Max >> 3)) return false;
    out = (out << 3) | static_cast<uint64_t>(f[i] - '0');
  }
  return true;
}

bool parse_decimal(const std::string& s, uint64_t& out) {
  out = 0;
  if (s.empty() || s.size() > 19) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + static_cast<uint64_t>(c - '0');
  }
  return out <= kInt64Max;
}

struct NumericField {
  const char* name;
  std::size_t at, len;
};
constexpr NumericField kNumericFields[] = {{"mode", 100, 8},   {"uid", 108, 8},       {"gid", 116, 8},
                                           {"mtime", 136, 12}, {"devmajor", 329, 8}, {"devminor", 337, 8}};

bool is_regular_type(char t) { return t == '0' || t == '\0' || t == '7'; }
// Types tarfile knows; for those that are not regular files it skips no data.
bool is_known_type(char t) {
  return is_regular_type(t) || (t >= '1' && t <= '6') || t == 'L' || t == 'K' || t == 'S' || t == 'x' || t == 'g';
}

}  // namespace

TarReader::TarReader(const std::string& path) : TarReader(detail::open_file_stream(path, path)) {}

TarReader::TarReader(int fd, std::string name) : TarReader(detail::open_file_stream(fd, false, std::move(name))) {}

TarReader::TarReader(std::unique_ptr<ShardStream> stream) : stream_(std::move(stream)), name_(stream_->url()) {
  const std::optional<uint64_t> size = stream_->size();
  size_known_ = size.has_value();
  file_size_ = size.value_or(UINT64_MAX);
}

TarReader::TarReader(TarReader&& o) noexcept
    : stream_(std::move(o.stream_)),
      name_(std::move(o.name_)),
      size_known_(o.size_known_),
      file_size_(o.file_size_),
      pos_(o.pos_),
      offset_(o.offset_),
      done_(o.done_),
      global_pax_(std::move(o.global_pax_)) {}

TarReader::~TarReader() = default;

uint64_t TarReader::bytes_fetched() const noexcept { return stream_ ? stream_->bytes_fetched() : 0; }

void TarReader::fail(uint64_t at, const std::string& what) const {
  throw DataError("corrupt tar shard '" + name_ + "' at byte offset " + std::to_string(at) + ": " + what +
                  " (re-create or re-download the shard)",
                  name_);
}

void TarReader::skip_to(uint64_t at) {
  if (at <= pos_) return;
  const uint64_t got = stream_->skip(at - pos_);
  pos_ += got;
  if (pos_ < at) {  // the stream ended first: now its size is known
    size_known_ = true;
    file_size_ = pos_;
  }
}

std::size_t TarReader::read_some(uint64_t at, void* dst, std::size_t n) {
  skip_to(at);
  if (pos_ != at) return 0;
  auto* p = static_cast<char*>(dst);
  std::size_t got = 0;
  while (got < n) {
    const std::size_t k = stream_->read(p + got, n - got);
    if (k == 0) break;
    got += k;
  }
  pos_ += got;
  if (got < n) {
    if (size_known_) fail(at, "the file shrank while being read");
    size_known_ = true;
    file_size_ = pos_;
  }
  return got;
}

void TarReader::read_exact(uint64_t at, void* dst, std::size_t n) {
  if (read_some(at, dst, n) != n) fail(at, "the file shrank while being read");
}

std::optional<TarMember> TarReader::next() {
  if (done_) return std::nullopt;
  std::optional<std::string> long_name;     // from a GNU 'L' header
  std::map<std::string, std::string> pax;   // from a pax 'x' header
  uint64_t first_at = offset_;              // the member's first (maybe metadata) header
  bool pending_meta = false;
  while (true) {
    const uint64_t at = offset_;
    if (!size_known_) skip_to(at);  // a stream: its end may lie in the padding
    if (at > file_size_) fail(file_size_, "truncated inside the padding of the last member");
    if (at == file_size_) {
      if (pending_meta) fail(first_at, "extended header(s) not followed by a member: truncated");
      fail(at, "the file ends without an end-of-archive block (truncated between two members?)");
    }
    if (file_size_ - at < kBlock)
      fail(at, "truncated mid-header: " + std::to_string(file_size_ - at) + " of 512 bytes");
    unsigned char h[kBlock];
    if (read_some(at, h, kBlock) != kBlock) continue;  // a stream ended here: the checks above say how
    if (std::all_of(h, h + kBlock, [](unsigned char b) { return b == 0; })) {
      if (pending_meta) fail(first_at, "extended header(s) followed by the end of the archive");
      done_ = true;
      stream_->finish();
      return std::nullopt;
    }
    // Checksum: the sum of the header's bytes with the checksum field as
    // spaces; old tars summed signed chars, so either sum is accepted.
    uint64_t stored;
    bool neg;
    if (!parse_number(h + 148, 8, stored, neg) || neg) fail(at, "the header checksum field is not a number");
    int64_t unsigned_sum = 0, signed_sum = 0;
    for (std::size_t k = 0; k < kBlock; ++k) {
      const bool in_field = k >= 148 && k < 156;
      unsigned_sum += in_field ? ' ' : h[k];
      signed_sum += in_field ? ' ' : static_cast<signed char>(h[k]);
    }
    if (static_cast<int64_t>(stored) != unsigned_sum && static_cast<int64_t>(stored) != signed_sum)
      fail(at, "bad header checksum (stored " + std::to_string(stored) + ", computed " +
                   std::to_string(unsigned_sum) + "): not a tar header");
    for (const NumericField& f : kNumericFields) {
      uint64_t v;
      if (!parse_number(h + f.at, f.len, v, neg)) fail(at, std::string("the header's ") + f.name + " field is malformed");
    }
    uint64_t size;
    if (!parse_number(h + 124, 12, size, neg) || neg) fail(at, "the header's size field is malformed or negative");
    const char type = static_cast<char>(h[156]);
    const bool meta = type == 'L' || type == 'K' || type == 'x' || type == 'g';
    const uint64_t data_at = at + kBlock;
    // Data must end inside the file: checked before any read or allocation
    // where the size is known, else where the stream ends.
    auto past_end = [&](uint64_t bytes) {
      fail(at, "a member of " + std::to_string(bytes) + " bytes at byte " + std::to_string(data_at) +
                   " runs past the end of the file (" + std::to_string(file_size_) +
                   " bytes): truncated mid-data or a bad size field");
    };
    auto check_data = [&](uint64_t bytes) {
      if (size_known_ && bytes > file_size_ - data_at) past_end(bytes);
      return data_at + (bytes + kBlock - 1) / kBlock * kBlock;
    };
    // Reads `bytes` of data at data_at into `dst` (resized as it arrives when the size is unknown).
    auto read_data = [&](auto& dst, uint64_t bytes) {
      if (size_known_) {
        dst.resize(static_cast<std::size_t>(bytes));
        read_exact(data_at, dst.data(), dst.size());
        return;
      }
      constexpr uint64_t kStep = uint64_t{4} << 20;  // an absurd size field costs what arrived, not what it says
      dst.clear();
      for (uint64_t done = 0; done < bytes;) {
        const std::size_t step = static_cast<std::size_t>(std::min(kStep, bytes - done));
        dst.resize(static_cast<std::size_t>(done) + step);
        if (read_some(data_at + done, dst.data() + done, step) != step) past_end(bytes);
        done += step;
      }
    };

    if (meta) {
      const std::size_t bound = (type == 'x' || type == 'g') ? kMaxPaxBytes : kMaxNameBytes;
      if (size > bound)
        fail(at, std::string("extended header '") + type + "' of " + std::to_string(size) + " bytes (limit " +
                     std::to_string(bound) + ")");
      const uint64_t next_at = check_data(size);
      std::string buf;
      read_data(buf, size);
      if (!pending_meta) first_at = at;
      pending_meta = true;
      offset_ = next_at;
      if (type == 'L') {
        long_name = field_string(reinterpret_cast<const unsigned char*>(buf.data()), buf.size());
      } else if (type == 'x' || type == 'g') {
        // Records "<len> <key>=<value>\n", len counting the whole record.
        std::map<std::string, std::string>& dst = type == 'x' ? pax : global_pax_;
        std::size_t pos = 0;
        while (pos < buf.size() && buf[pos] != '\0') {
          std::size_t sp = pos;
          uint64_t len = 0;
          while (sp < buf.size() && sp - pos < 19 && buf[sp] >= '0' && buf[sp] <= '9')
            len = len * 10 + static_cast<uint64_t>(buf[sp++] - '0');
          const std::size_t eq = buf.find('=', sp);
          if (sp == pos || sp >= buf.size() || buf[sp] != ' ' || len > buf.size() - pos || eq == std::string::npos ||
              eq >= pos + len || buf[pos + len - 1] != '\n' || eq == sp + 1)
            fail(data_at + pos, "malformed pax record");
          std::string key = buf.substr(sp + 1, eq - sp - 1);
          std::string value = buf.substr(eq + 1, pos + len - 1 - (eq + 1));
          if (key == "path" && value.size() > kMaxNameBytes)
            fail(data_at + pos, "pax path of " + std::to_string(value.size()) + " bytes (limit " +
                                    std::to_string(kMaxNameBytes) + ")");
          if (key == "path" || key == "size") dst[key] = std::move(value);  // others do not matter here
          pos += len;
        }
      }
      continue;  // 'K' (long link target) is read and dropped
    }

    if (type == 'S') fail(at, "GNU sparse members are not supported (re-create the shard without --sparse)");
    // A pax record (local over global; an empty local value unsets) overrides the header.
    auto pax_value = [&](const char* key) -> const std::string* {
      if (auto it = pax.find(key); it != pax.end()) return it->second.empty() ? nullptr : &it->second;
      if (auto it = global_pax_.find(key); it != global_pax_.end() && !it->second.empty()) return &it->second;
      return nullptr;
    };
    if (const std::string* v = pax_value("size"); v && !parse_decimal(*v, size))
      fail(first_at, "the pax size record '" + v->substr(0, 32) + "' is not a size");
    std::string name;
    if (const std::string* v = pax_value("path")) {
      name = *v;
    } else if (long_name) {
      name = *long_name;
    } else {
      name = field_string(h, 100);
      const bool posix = std::memcmp(h + 257, "ustar\0", 6) == 0;
      const std::string prefix = field_string(h + 345, 155);
      if (posix && !prefix.empty()) name = prefix + "/" + name;
    }
    // A V7 directory is a regular-file header whose name ends in '/'.
    const bool regular = is_regular_type(type) && !(type == '\0' && !name.empty() && name.back() == '/');
    // tarfile skips the data of regular files and unknown types only; links,
    // directories, devices and fifos have none whatever their size field says.
    const bool has_data = regular || !is_known_type(type);
    offset_ = has_data ? check_data(size) : data_at;
    if (!regular && has_data && !size_known_) {
      skip_to(data_at + size);
      if (size_known_ && file_size_ < data_at + size) past_end(size);
    }
    if (!regular) {
      long_name.reset();
      pax.clear();
      pending_meta = false;
      first_at = offset_;
      continue;
    }
    TarMember m;
    m.name = std::move(name);
    m.size = size;
    m.offset = first_at;
    read_data(m.data, size);
    return m;
  }
}

}  // namespace spindle
