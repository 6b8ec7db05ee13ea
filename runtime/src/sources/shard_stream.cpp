// open_shard: which stream a URL gets; the local-file stream; webdataset's
// brace notation.
#include <spindle/shard_stream.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>

#include <spindle/error.hpp>

#include "io_util.hpp"
#include "shard_stream_internal.hpp"

namespace spindle {

uint64_t ShardStream::skip(uint64_t n) {
  char scratch[16 * 1024];
  uint64_t done = 0;
  while (done < n) {
    const std::size_t got = read(scratch, static_cast<std::size_t>(std::min<uint64_t>(n - done, sizeof scratch)));
    if (got == 0) break;
    done += got;
  }
  return done;
}

namespace detail {
namespace {

class FileStream final : public ShardStream {
 public:
  FileStream(int fd, bool owns, std::string name) : fd_(fd), owns_(owns), name_(std::move(name)) {
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      if (owns_) ::close(fd_);
      errno = err;
      SPINDLE_THROW_ERRNO("cannot stat tar shard '" + name_ + "'");
    }
    if (!S_ISREG(st.st_mode)) {
      if (owns_) ::close(fd_);
      throw DataError("tar shard '" + name_ + "' is not a regular file (or memfd)", name_);
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileStream() override {
    if (owns_) ::close(fd_);
  }
  std::size_t read(void* dst, std::size_t n) override {
    const std::size_t got = pread_full(fd_, dst, n, offset_, name_);
    offset_ += got;
    return got;
  }
  uint64_t skip(uint64_t n) override {  // no read: the next pread starts further on
    const uint64_t k = std::min(n, size_ > offset_ ? size_ - offset_ : 0);
    offset_ += k;
    return k;
  }
  std::optional<uint64_t> size() const noexcept override { return size_; }
  const std::string& url() const noexcept override { return name_; }

 private:
  int fd_;
  bool owns_;
  std::string name_;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace

std::unique_ptr<ShardStream> open_file_stream(int fd, bool owns, std::string name) {
  return std::make_unique<FileStream>(fd, owns, std::move(name));
}

std::unique_ptr<ShardStream> open_file_stream(const std::string& path, std::string name) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) SPINDLE_THROW_ERRNO("cannot open tar shard '" + name + "'");
  return std::make_unique<FileStream>(fd, true, std::move(name));
}

}  // namespace detail

bool is_remote_shard(const std::string& url) noexcept {
  return url.starts_with("http://") || url.starts_with("https://") || url.starts_with("pipe:");
}

std::unique_ptr<ShardStream> open_shard(const std::string& url, const ShardOptions& options) {
  if (url.starts_with("http://") || url.starts_with("https://")) {
    if (!options.cache_dir.empty()) return detail::open_cached(url, options, &detail::open_http_stream);
    return detail::open_http_stream(url, options);
  }
  if (url.starts_with("pipe:")) {
    if (!options.cache_dir.empty()) return detail::open_cached(url, options, &detail::open_pipe_stream);
    return detail::open_pipe_stream(url, options);
  }
  if (url.starts_with("file://")) return detail::open_file_stream(url.substr(7), url);
  const std::size_t scheme = url.find("://");
  if (scheme != std::string::npos && url.find('/') > scheme)
    throw std::invalid_argument("spindle: shard '" + url + "' has a scheme spindle cannot read (" +
                                url.substr(0, scheme) + "://); use a path, file://, http://, https:// or pipe:CMD");
  return detail::open_file_stream(url, url);
}

namespace {

[[noreturn]] void bad_spec(const std::string& spec, const std::string& what) {
  throw std::invalid_argument("spindle: cannot expand the shard spec '" + spec + "': " + what);
}

// The first brace group of `s` expanded, the rest of `s` expanded recursively.
void expand_one(const std::string& spec, const std::string& s, std::vector<std::string>& out) {
  const std::size_t open = s.find('{');
  const std::size_t stray = s.find('}');
  if (open == std::string::npos) {
    if (stray != std::string::npos) bad_spec(spec, "a '}' without its '{'");
    out.push_back(s);
    return;
  }
  if (stray < open) bad_spec(spec, "a '}' without its '{'");
  const std::size_t close = s.find('}', open);
  if (close == std::string::npos) bad_spec(spec, "a '{' without its '}'");
  const std::string body = s.substr(open + 1, close - open - 1);
  if (body.find('{') != std::string::npos) bad_spec(spec, "nested braces");
  const std::string head = s.substr(0, open), tail = s.substr(close + 1);
  std::vector<std::string> choices;
  const std::size_t dots = body.find("..");
  if (dots != std::string::npos) {
    const std::string lo = body.substr(0, dots), hi = body.substr(dots + 2);
    auto number = [&](const std::string& t) {
      if (t.empty() || t.size() > 18 || t.find_first_not_of("0123456789") != std::string::npos)
        bad_spec(spec, "the range {" + body + "} is not two decimal numbers");
      return std::stoll(t);
    };
    const long long a = number(lo), b = number(hi);
    if (b < a) bad_spec(spec, "the range {" + body + "} runs backwards");
    if (b - a >= 10'000'000) bad_spec(spec, "the range {" + body + "} has over 10 million shards");
    // braceexpand's rule: zero-padded to the wider bound when either bound has a leading zero.
    const bool padded = (lo.size() > 1 && lo[0] == '0') || (hi.size() > 1 && hi[0] == '0');
    const std::size_t width = padded ? std::max(lo.size(), hi.size()) : 0;
    for (long long v = a; v <= b; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      choices.push_back(std::move(digits));
    }
  } else {
    std::size_t from = 0;
    while (true) {
      const std::size_t comma = body.find(',', from);
      choices.push_back(body.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
  }
  for (const std::string& c : choices) expand_one(spec, head + c + tail, out);
}

}  // namespace

std::vector<std::string> expand_shard_urls(const std::string& spec) {
  std::vector<std::string> out;
  std::size_t from = 0;
  while (true) {
    const std::size_t sep = spec.find("::", from);
    const std::string part = spec.substr(from, sep == std::string::npos ? std::string::npos : sep - from);
    // As webdataset (braceexpand on each "::" part): a pipe: command's braces
    // expand too, into one command per shard.
    if (!part.empty()) expand_one(spec, part, out);
    if (sep == std::string::npos) break;
    from = sep + 2;
  }
  return out;
}

}  // namespace spindle
