// ArraySource: rows of a C-order array, from a caller's buffer or a .npy file
// mapped read-only (the mapping, not an fd, is what a forked worker inherits).
#include <spindle/sources.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <stdexcept>

#include "io_util.hpp"

namespace spindle {

struct ArraySource::Mapping {
  void* base = MAP_FAILED;
  std::size_t bytes = 0;
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
};

namespace {

// The header of a .npy file: a Python dict literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  bool has_descr = false, has_order = false, has_shape = false;
};

class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : s_(text), path_(path) {}

  NpyHeader parse() {
    NpyHeader h;
    expect('{');
    while (true) {
      ws();
      if (peek() == '}') break;
      const std::string key = string_literal();
      ws();
      expect(':');
      ws();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          bad("dtype " + s_.substr(i_, 40) +
              " is structured; spindle reads plain dtypes only (save each field as its own array)");
        h.descr = string_literal();
        h.has_descr = true;
      } else if (key == "fortran_order") {
        if (s_.compare(i_, 4, "True") == 0) h.fortran_order = true, i_ += 4;
        else if (s_.compare(i_, 5, "False") == 0) h.fortran_order = false, i_ += 5;
        else bad("fortran_order is neither True nor False");
        h.has_order = true;
      } else if (key == "shape") {
        expect('(');
        while (true) {
          ws();
          if (peek() == ')') break;
          h.shape.push_back(integer());
          if (h.shape.size() > 64) bad("more than 64 dimensions");
          ws();
          if (peek() == ',') ++i_;
          else if (peek() != ')') bad("malformed shape");
        }
        ++i_;
        h.has_shape = true;
      } else {
        bad("unexpected key '" + key + "'");
      }
      ws();
      if (peek() == ',') ++i_;
      else if (peek() != '}') bad("malformed header dict");
    }
    if (!h.has_descr || !h.has_order || !h.has_shape) bad("header lacks descr, fortran_order or shape");
    return h;
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    ws();
    if (peek() != c) bad(std::string("expected '") + c + "' at header byte " + std::to_string(i_));
    ++i_;
  }
  std::string string_literal() {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string at header byte " + std::to_string(i_));
    const std::size_t end = s_.find(q, i_ + 1);
    if (end == std::string::npos) bad("unterminated string");
    std::string out = s_.substr(i_ + 1, end - i_ - 1);
    i_ = end + 1;
    return out;
  }
  int64_t integer() {
    if (!std::isdigit(static_cast<unsigned char>(peek()))) bad("shape entry is not a non-negative integer");
    int64_t v = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      const int d = peek() - '0';
      if (v > (INT64_MAX - d) / 10) bad("shape entry overflows int64");
      v = v * 10 + d;
      ++i_;
    }
    if (peek() == 'L') ++i_;  // Python 2 long suffix in old files
    return v;
  }
  [[noreturn]] void bad(const std::string& what) const {
    throw DataError("ArraySource: '" + path_ + "' has an unusable .npy header: " + what);
  }

  const std::string& s_;
  const std::string& path_;
  std::size_t i_ = 0;
};

}  // namespace

std::size_t ArraySource::itemsize_of(const std::string& dtype) noexcept {
  // [byte order][kind][bytes]: "<f4", "|u1", ">i8", "|S10", "<U5".
  if (dtype.size() < 3) return 0;
  const char order = dtype[0], kind = dtype[1];
  if (order != '<' && order != '>' && order != '|' && order != '=') return 0;
  std::size_t n = 0;
  for (std::size_t k = 2; k < dtype.size(); ++k) {
    const char c = dtype[k];
    if (c < '0' || c > '9' || n > (SIZE_MAX / 10) - 9) return 0;
    n = n * 10 + static_cast<std::size_t>(c - '0');
  }
  if (n == 0) return 0;
  switch (kind) {
    case 'b': return n == 1 ? 1 : 0;
    case 'i': case 'u': return (n == 1 || n == 2 || n == 4 || n == 8) ? n : 0;
    case 'f': return (n == 2 || n == 4 || n == 8 || n == 16) ? n : 0;
    case 'c': return (n == 8 || n == 16 || n == 32) ? n : 0;
    case 'S': return n;
    case 'U': return n <= SIZE_MAX / 4 ? 4 * n : 0;
    default: return 0;  // 'O' (pointers), 'V', 'M'/'m' (datetimes), ...
  }
}

void ArraySource::init(std::string dtype, std::vector<int64_t> shape) {
  dtype_ = std::move(dtype);
  shape_ = std::move(shape);
  itemsize_ = itemsize_of(dtype_);
  if (itemsize_ == 0)
    throw DataError("ArraySource: " + origin_ + " has dtype '" + dtype_ +
                    "', which spindle cannot carry as plain bytes (use a numeric, bool or fixed-size string dtype)");
  if (shape_.empty())
    throw DataError("ArraySource: " + origin_ + " is a 0-d array; a source needs at least one dimension (its rows)");
  std::size_t row = itemsize_;
  for (std::size_t k = 0; k < shape_.size(); ++k) {
    if (shape_[k] < 0) throw std::invalid_argument("ArraySource: negative dimension in the shape of " + origin_);
    if (k == 0) continue;
    const auto d = static_cast<std::size_t>(shape_[k]);
    if (d != 0 && row > SIZE_MAX / d) throw DataError("ArraySource: the rows of " + origin_ + " overflow size_t");
    row *= d;
  }
  row_bytes_ = row;
  const auto rows = static_cast<std::size_t>(shape_[0]);
  if (rows != 0 && row_bytes_ > (SIZE_MAX / 2) / rows)
    throw DataError("ArraySource: the data of " + origin_ + " overflows size_t");
}

ArraySource::ArraySource(const void* data, std::string dtype, std::vector<int64_t> shape)
    : data_(static_cast<const std::byte*>(data)) {
  init(std::move(dtype), std::move(shape));
  if (!data_ && row_bytes_ * size() != 0) throw std::invalid_argument("ArraySource: null data for a non-empty array");
}

ArraySource ArraySource::from_npy(const std::string& path) {
  detail::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) SPINDLE_THROW_ERRNO("ArraySource: cannot open '" + path + "'");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) SPINDLE_THROW_ERRNO("ArraySource: cannot stat '" + path + "'");
  const auto file_bytes = static_cast<uint64_t>(st.st_size);
  // Preamble: "\x93NUMPY", major, minor, header length (2 bytes in v1, 4 in v2/v3).
  unsigned char pre[12] = {};
  const std::size_t got = detail::pread_full(fd.get(), pre, sizeof pre, 0, path);
  if (got < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    throw DataError("ArraySource: '" + path + "' is not a .npy file (no \\x93NUMPY magic)");
  const int major = pre[6];
  uint64_t header_len, header_at;
  if (major == 1) {
    header_len = pre[8] | (uint64_t{pre[9]} << 8);
    header_at = 10;
  } else if (major == 2 || major == 3) {
    if (got < 12) throw DataError("ArraySource: '" + path + "' is truncated in its .npy preamble");
    header_len = pre[8] | (uint64_t{pre[9]} << 8) | (uint64_t{pre[10]} << 16) | (uint64_t{pre[11]} << 24);
    header_at = 12;
  } else {
    throw DataError("ArraySource: '" + path + "' has .npy format version " + std::to_string(major) +
                    "; spindle reads versions 1 to 3");
  }
  if (header_len > (uint64_t{1} << 20) || header_at + header_len > file_bytes)
    throw DataError("ArraySource: '" + path + "' has a .npy header of " + std::to_string(header_len) +
                    " bytes, past the end of the file (" + std::to_string(file_bytes) + " bytes)");
  std::string text(header_len, '\0');
  if (detail::pread_full(fd.get(), text.data(), header_len, header_at, path) != header_len)
    throw DataError("ArraySource: '" + path + "' shrank while its header was read");
  const NpyHeader h = HeaderParser(text, path).parse();
  if (h.fortran_order)
    throw DataError("ArraySource: '" + path +
                    "' holds a Fortran-order array; rows must be contiguous: save np.ascontiguousarray(a) instead");

  ArraySource src;
  src.origin_ = "'" + path + "'";
  src.init(h.descr, h.shape);
  const uint64_t data_at = header_at + header_len;
  const uint64_t data_bytes = static_cast<uint64_t>(src.row_bytes_) * src.size();
  if (data_bytes > file_bytes - data_at)
    throw DataError("ArraySource: '" + path + "' is truncated: its header promises " + std::to_string(data_bytes) +
                    " bytes of data, the file holds " + std::to_string(file_bytes - data_at));
  auto m = std::make_shared<Mapping>();
  m->bytes = static_cast<std::size_t>(file_bytes);
  m->base = ::mmap(nullptr, m->bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (m->base == MAP_FAILED) SPINDLE_THROW_ERRNO("ArraySource: cannot map '" + path + "'");
  src.data_ = static_cast<const std::byte*>(m->base) + data_at;
  src.mapping_ = std::move(m);
  return src;
}

std::span<const std::byte> ArraySource::row(std::size_t i) const {
  if (i >= size())
    throw std::out_of_range("ArraySource: row " + std::to_string(i) + " out of range for " +
                            std::to_string(size()) + " rows of " + origin_);
  return {data_ + i * row_bytes_, row_bytes_};
}

}  // namespace spindle
