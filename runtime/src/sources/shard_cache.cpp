// The local cache of whole remote shards (ShardOptions::cache_dir).
//
// Design decisions:
// - A shard is cached by teeing the pass that reads it, not by downloading it
//   first: the first epoch streams at network speed instead of waiting for
//   whole shards, and nothing is read twice.
// - Atomic by rename: bytes go to ".<name>.part.<pid>.<n>" (O_EXCL) and are
//   renamed to "<name>" only after the stream's end was read (finish()). A
//   killed job leaves at most a part file, never a short file under a shard's
//   name; part files of dead pids are removed by the next cache open.
// - LRU by mtime: a hit touches the file, eviction removes the oldest first.
//   Several workers and jobs may share one folder: each writes its own part
//   file, the last rename wins (both are whole), an eviction that loses a race
//   ignores ENOENT.
// - A shard larger than the limit is streamed but not kept.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include <spindle/error.hpp>

#include "shard_stream_internal.hpp"

namespace spindle::detail {
namespace {

namespace fs = std::filesystem;

// "<16 hex digits of FNV-1a(url)>-<the URL's last component, sanitized>".
std::string cache_name(const std::string& url) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : url) h = (h ^ c) * 1099511628211ULL;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  std::string base = url.substr(url.find_last_of("/ ") == std::string::npos ? 0 : url.find_last_of("/ ") + 1);
  if (base.size() > 80) base = base.substr(base.size() - 80);
  for (char& c : base)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  return std::string(hex) + "-" + base;
}

bool is_part(const std::string& name) { return name.starts_with(".") && name.find(".part.") != std::string::npos; }

// Removes part files whose writer is gone (a job killed mid-write).
void remove_dead_parts(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!is_part(name)) continue;
    const std::size_t at = name.rfind(".part.") + 6;
    const long pid = std::strtol(name.c_str() + at, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
  }
}

// Removes least recently used shards until the cached bytes fit `limit`.
void evict(const fs::path& dir, uint64_t limit) {
  if (limit == 0) return;
  struct Entry {
    fs::path path;
    uint64_t bytes;
    fs::file_time_type used;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (is_part(name) || !e.is_regular_file(ec)) continue;
    const uint64_t bytes = e.file_size(ec);
    if (ec) continue;
    entries.push_back({e.path(), bytes, e.last_write_time(ec)});
    total += bytes;
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  for (const Entry& e : entries) {
    if (total <= limit) break;
    fs::remove(e.path, ec);
    total -= e.bytes;
  }
}

class CachingStream final : public ShardStream {
 public:
  CachingStream(std::unique_ptr<ShardStream> inner, fs::path dir, std::string name, uint64_t limit)
      : inner_(std::move(inner)), dir_(std::move(dir)), name_(std::move(name)), limit_(limit) {
    static std::atomic<uint64_t> counter{0};
    part_ = dir_ / ("." + name_ + ".part." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    const auto size = inner_->size();
    if (limit_ != 0 && size && *size > limit_) return;  // will not be kept: do not write it
    fd_ = ::open(part_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) SPINDLE_THROW_ERRNO("cannot create a part file in the shard cache '" + dir_.string() + "'");
  }
  ~CachingStream() override { abandon(); }

  std::size_t read(void* dst, std::size_t n) override {
    const std::size_t got = inner_->read(dst, n);
    tee(dst, got);
    return got;
  }
  std::optional<uint64_t> size() const noexcept override { return inner_->size(); }
  const std::string& url() const noexcept override { return inner_->url(); }
  uint64_t bytes_fetched() const noexcept override { return inner_->bytes_fetched(); }

  void finish() override {
    // The rest of the shard (a tar's trailing blocks) belongs in the file too.
    char buf[64 * 1024];
    while (const std::size_t got = inner_->read(buf, sizeof buf)) tee(buf, got);
    inner_->finish();  // a pipe's exit status: a failed command caches nothing
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      std::error_code ec;
      fs::remove(part_, ec);
      return;
    }
    // Keep the file's modification time as the LRU clock: now.
    std::error_code ec;
    fs::rename(part_, dir_ / name_, ec);
    if (ec) {
      fs::remove(part_, ec);
      return;
    }
    evict(dir_, limit_);
  }

 private:
  void tee(const void* src, std::size_t n) {
    if (fd_ < 0 || n == 0) return;
    written_ += n;
    if (limit_ != 0 && written_ > limit_) {  // larger than the whole cache: stream it, keep nothing
      abandon();
      return;
    }
    const char* p = static_cast<const char*>(src);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        abandon();  // a full disk costs the cache entry, not the epoch
        return;
      }
      p += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  void abandon() noexcept {
    if (fd_ < 0) return;
    ::close(std::exchange(fd_, -1));
    std::error_code ec;
    fs::remove(part_, ec);
  }

  std::unique_ptr<ShardStream> inner_;
  fs::path dir_;
  std::string name_;
  uint64_t limit_;
  fs::path part_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

}  // namespace

std::unique_ptr<ShardStream> open_cached(const std::string& url, const ShardOptions& options,
                                         std::unique_ptr<ShardStream> (*open)(const std::string&,
                                                                              const ShardOptions&)) {
  const fs::path dir(options.cache_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw std::system_error(ec, "spindle: cannot create the shard cache folder '" + options.cache_dir +
                                    "' (cache_dir=)");
  const std::string name = cache_name(url);
  const fs::path path = dir / name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::futimens(fd, nullptr);  // used now: the LRU clock (a read-only fd may set it to now)
    return open_file_stream(fd, true, url + " (cached as " + path.string() + ")");
  }
  remove_dead_parts(dir);
  return std::make_unique<CachingStream>(open(url, options), dir, name, options.cache_limit_bytes);
}

}  // namespace spindle::detail
