#pragma once
// Shard streams: the bytes of one WebDataset shard, read front to back, from
// wherever the shard lives. The tar reader (sources.hpp) reads only through
// this interface, so where a shard comes from is decided in one place:
//
// | URL                         | stream                                                  |
// |-----------------------------|---------------------------------------------------------|
// | a plain path, file://path   | the file, pread at the stream's own offset (fork-safe)  |
// | http://..., https://...     | libcurl in the calling thread, pulled as the reader asks |
// | pipe:CMD                    | the stdout of `/bin/sh -c CMD`, as webdataset does       |
//
// Remote shards (http, https, pipe) may be kept whole in a local cache
// (ShardOptions::cache_dir): the first pass writes what it reads to a private
// part file and renames it into place once the shard's end was read, so a
// killed job leaves no half file under a shard's name; later passes read the
// file. The cache is kept under cache_limit_bytes by removing the least
// recently used shards.
//
// Threads: nothing here starts a thread. HTTP runs libcurl's easy handle on a
// multi handle driven by the reading thread; libcurl's threaded resolver is
// never used: a numeric host needs none, and a name is resolved with
// getaddrinfo in the reading thread and handed to libcurl (CURLOPT_RESOLVE).
// (A proxy named by a host name in http_proxy/https_proxy would be resolved by
// libcurl itself; give proxies by address.)
//
// Errors: a shard that cannot be fetched throws spindle::DataError whose path
// is the URL and whose text names the URL, the HTTP status or curl's reason,
// and the attempts made. Transient failures (a dropped or reset connection, a
// stall, HTTP 5xx/408/429) are retried with exponential backoff up to
// ShardOptions::retries times, resuming where the stream stopped (a Range
// request); a 4xx, a refused connection, an unknown host and exhausted
// retries are errors at once. A stall is `timeout` without a byte while the
// reader waits (connecting included), so no read hangs.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace spindle {

struct ShardOptions {
  // Keep remote shards here (created if missing); empty: no cache.
  std::string cache_dir;
  // Most bytes of cached shards kept (least recently used removed first); 0: no limit.
  uint64_t cache_limit_bytes = 0;
  // Extra attempts after a transient failure (so retries + 1 in all).
  int retries = 3;
  // Connecting, or waiting for the next byte, longer than this fails the attempt.
  std::chrono::milliseconds timeout{30000};
  // Wait before the first retry; doubles for each further one (capped at 10 s).
  std::chrono::milliseconds backoff{250};
  // HTTP: most received bytes held ahead of the reader (the transfer pauses beyond it).
  std::size_t read_ahead_bytes = std::size_t{4} << 20;
};

class ShardStream {
 public:
  virtual ~ShardStream() = default;
  // Up to `n` bytes; fewer only at the end of the shard. Throws DataError (a
  // failed fetch, naming the URL) or std::system_error (a local file).
  virtual std::size_t read(void* dst, std::size_t n) = 0;
  // Drops the next `n` bytes; returns how many there were (fewer only at the end).
  virtual uint64_t skip(uint64_t n);
  // The shard's size when known up front (a file, an HTTP Content-Length).
  virtual std::optional<uint64_t> size() const noexcept = 0;
  // The reader has reached the end of the archive: reads whatever follows it
  // (a tar's trailing zero blocks), checks a command's exit status, and
  // commits a cache entry. Not calling it (a pass stopped early) caches nothing.
  virtual void finish() {}
  // The URL (or path) as given, for messages.
  virtual const std::string& url() const noexcept = 0;
  // Bytes this stream fetched from where the shard lives (0 for a local file
  // or a cache hit: nothing was streamed).
  virtual uint64_t bytes_fetched() const noexcept { return 0; }
};

// Opens the shard at `url` (see the table above).
std::unique_ptr<ShardStream> open_shard(const std::string& url, const ShardOptions& options = {});

// webdataset's shard notation (braceexpand): "a-{000..099}.tar" (zero-padded
// to the wider bound when a bound has a leading zero), "{a,b}" alternatives, several braces in one name (expanded left to
// right), and lists separated by "::". Throws std::invalid_argument naming
// the spec for a range it cannot read or an unbalanced brace.
std::vector<std::string> expand_shard_urls(const std::string& spec);

// True for http://, https:// and pipe: URLs (what the cache may keep).
bool is_remote_shard(const std::string& url) noexcept;

}  // namespace spindle
