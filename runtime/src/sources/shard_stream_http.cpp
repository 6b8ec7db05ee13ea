// http:// and https:// shards through libcurl, pulled by the reading thread.
//
// Design decisions:
// - Pull, not push: one easy handle on a multi handle, driven by read(). Bytes
//   arrive in the write callback into a buffer; past read_ahead_bytes the
//   callback pauses the transfer, and read() resumes it when it needs more.
//   So a shard is never held whole: at most read_ahead_bytes + one libcurl
//   chunk, plus the kernel's socket buffer.
// - Our own stall clock: an attempt fails after `timeout` without a byte while
//   read() waits for one (connecting included). libcurl's low-speed check
//   would also count the time the reader was busy elsewhere with the transfer
//   paused.
// - Resume, not restart: a retry after a dropped connection asks for the rest
//   (Range: bytes=N-); a server that answers 200 instead of 206 has its first
//   N bytes dropped. The bytes the reader saw never change.
// - No resolver thread: Debian's libcurl resolves names on a thread of its
//   own. A numeric host needs no resolver; a name is resolved here with
//   getaddrinfo, in the reading thread, and given to libcurl as
//   CURLOPT_RESOLVE, so its resolver never runs.
#include <curl/curl.h>
#include <netdb.h>
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include <spindle/error.hpp>

#include "shard_stream_internal.hpp"

namespace spindle::detail {
namespace {

using Clock = std::chrono::steady_clock;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) SPINDLE_FAIL_INTERNAL("curl_global_init failed");
  });
}

// "host:port:addr,addr" for CURLOPT_RESOLVE, or empty for a numeric host.
std::string resolve_entry(const std::string& url) {
  CURLU* u = curl_url();
  if (!u) throw std::bad_alloc();
  std::string entry;
  char* host = nullptr;
  char* port = nullptr;
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK) {
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    throw DataError("spindle: shard URL '" + url + "' is not a valid URL", url);
  }
  std::string h(host), p(port);
  curl_free(host);
  curl_free(port);
  curl_url_cleanup(u);
  if (h.starts_with("[")) return {};  // an IPv6 literal
  unsigned char buf[sizeof(struct in6_addr)];
  if (inet_pton(AF_INET, h.c_str(), buf) == 1 || inet_pton(AF_INET6, h.c_str(), buf) == 1) return {};
  struct addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  const int rc = getaddrinfo(h.c_str(), p.c_str(), &hints, &res);
  if (rc != 0)
    throw DataError("spindle: cannot fetch shard '" + url + "': cannot resolve host '" + h + "': " +
                        gai_strerror(rc),
                    url);
  entry = h + ":" + p + ":";
  bool first = true;
  for (auto* a = res; a; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* addr = a->ai_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                                               : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (!inet_ntop(a->ai_family, addr, text, sizeof text)) continue;
    if (!first) entry += ',';
    if (a->ai_family == AF_INET6) entry += '[';
    entry += text;
    if (a->ai_family == AF_INET6) entry += ']';
    first = false;
  }
  freeaddrinfo(res);
  return entry;
}

class HttpStream final : public ShardStream {
 public:
  HttpStream(std::string url, const ShardOptions& o) : url_(std::move(url)), options_(o) {
    global_init();
    const std::string entry = resolve_entry(url_);
    if (!entry.empty()) resolve_ = curl_slist_append(nullptr, entry.c_str());
    multi_ = curl_multi_init();
    if (!multi_) throw std::bad_alloc();
    start();
  }
  ~HttpStream() override {
    stop();
    if (multi_) curl_multi_cleanup(multi_);
    curl_slist_free_all(resolve_);
  }

  std::size_t read(void* dst, std::size_t n) override {
    auto* out = static_cast<char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      const std::size_t have = buf_.size() - head_;
      if (have > 0) {
        const std::size_t k = std::min(have, n - got);
        std::memcpy(out + got, buf_.data() + head_, k);
        head_ += k;
        got += k;
        if (head_ == buf_.size()) buf_.clear(), head_ = 0;
        continue;
      }
      if (ended_) break;
      pump();
    }
    delivered_ += got;
    return got;
  }
  std::optional<uint64_t> size() const noexcept override { return size_; }
  const std::string& url() const noexcept override { return url_; }
  uint64_t bytes_fetched() const noexcept override { return fetched_; }

 private:
  static std::size_t on_data(char* p, std::size_t size, std::size_t nmemb, void* self) {
    return static_cast<HttpStream*>(self)->take(p, size * nmemb);
  }

  std::size_t take(const char* p, std::size_t n) {
    if (!checked_response_) {
      checked_response_ = true;
      long code = 0;
      curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &code);
      curl_off_t length = -1;
      curl_easy_getinfo(easy_, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
      // Asked for a range and got the whole shard: drop what the reader already has.
      drop_ = (code == 200 && received_ > 0) ? received_ : 0;
      if (length >= 0) {
        const uint64_t total = static_cast<uint64_t>(length) + (code == 206 ? received_ : 0);
        if (!size_) size_ = total;
      }
    }
    if (buf_.size() - head_ >= options_.read_ahead_bytes) {
      paused_ = true;
      return CURL_WRITEFUNC_PAUSE;  // libcurl keeps this chunk and hands it again on resume
    }
    last_byte_ = Clock::now();
    fetched_ += n;
    std::size_t skip = std::min<uint64_t>(drop_, n);
    drop_ -= skip;
    received_ += n - skip;
    buf_.insert(buf_.end(), p + skip, p + n);
    return n;
  }

  void start() {
    ++attempts_;
    easy_ = curl_easy_init();
    if (!easy_) throw std::bad_alloc();
    curl_easy_setopt(easy_, CURLOPT_URL, url_.c_str());
    curl_easy_setopt(easy_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy_, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(easy_, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(easy_, CURLOPT_MAXREDIRS, 8L);
    curl_easy_setopt(easy_, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(easy_, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(easy_, CURLOPT_BUFFERSIZE, 256L * 1024);
    curl_easy_setopt(easy_, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(easy_, CURLOPT_ERRORBUFFER, error_);
    curl_easy_setopt(easy_, CURLOPT_WRITEFUNCTION, &HttpStream::on_data);
    curl_easy_setopt(easy_, CURLOPT_WRITEDATA, this);
    if (resolve_) curl_easy_setopt(easy_, CURLOPT_RESOLVE, resolve_);
    const std::string range = std::to_string(received_) + "-";
    if (received_ > 0) curl_easy_setopt(easy_, CURLOPT_RANGE, range.c_str());
    error_[0] = '\0';
    checked_response_ = false;
    paused_ = false;
    last_byte_ = Clock::now();
    curl_multi_add_handle(multi_, easy_);
  }

  void stop() noexcept {
    if (!easy_) return;
    curl_multi_remove_handle(multi_, easy_);
    curl_easy_cleanup(easy_);
    easy_ = nullptr;
  }

  // Moves the transfer on until bytes arrived or it ended; retries transient failures.
  void pump() {
    if (paused_) {
      paused_ = false;
      last_byte_ = Clock::now();  // the reader was away: the stall clock starts now
      curl_easy_pause(easy_, CURLPAUSE_CONT);
      if (buf_.size() > head_) return;
    }
    const std::size_t before = buf_.size() - head_;
    while (buf_.size() - head_ == before && !paused_) {
      int running = 0;
      if (curl_multi_perform(multi_, &running) != CURLM_OK) SPINDLE_FAIL_INTERNAL("curl_multi_perform failed");
      int queued = 0;
      while (CURLMsg* msg = curl_multi_info_read(multi_, &queued)) {
        if (msg->msg == CURLMSG_DONE) return done(msg->data.result);
      }
      if (buf_.size() - head_ != before) return;
      if (options_.timeout.count() > 0 && Clock::now() - last_byte_ >= options_.timeout) {
        return failed(true, "no byte for " + seconds(options_.timeout) + " (stalled; timeout=)", 0);
      }
      curl_multi_poll(multi_, nullptr, 0, 100, nullptr);
    }
  }

  void done(CURLcode rc) {
    long code = 0;
    curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &code);
    const std::string reason = error_[0] ? std::string(error_) : std::string(curl_easy_strerror(rc));
    if (rc == CURLE_OK) {
      stop();
      if (size_ && received_ < *size_)  // a server that closed early without saying so
        return failed(true, "the connection ended after " + std::to_string(received_) + " of " +
                                std::to_string(*size_) + " bytes",
                      code);
      ended_ = true;
      return;
    }
    bool transient = false;
    switch (rc) {
      case CURLE_HTTP_RETURNED_ERROR:
        transient = code >= 500 || code == 408 || code == 429;
        break;
      case CURLE_PARTIAL_FILE:
      case CURLE_RECV_ERROR:
      case CURLE_SEND_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_OPERATION_TIMEDOUT:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
        transient = true;
        break;
      default:
        break;  // refused, unknown host, TLS, a bad URL: retrying will not help
    }
    failed(transient, reason, code);
  }

  // Ends this attempt: retries a transient failure while attempts remain, else throws.
  void failed(bool transient, const std::string& reason, long code) {
    stop();
    const int max_attempts = 1 + std::max(0, options_.retries);
    if (transient && attempts_ < max_attempts) {
      auto wait = options_.backoff * (1 << std::min(attempts_ - 1, 16));
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(wait, std::chrono::milliseconds(10000)));
      buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
      return start();
    }
    std::string what = "spindle: cannot fetch shard '" + url_ + "': ";
    if (code >= 400) what += "HTTP " + std::to_string(code) + " (" + reason + ")";
    else what += reason;
    what += " after " + std::to_string(attempts_) + (attempts_ == 1 ? " attempt" : " attempts");
    if (received_ > 0) what += ", " + std::to_string(received_) + " bytes in";
    if (transient) what += "; retries=" + std::to_string(options_.retries) + " exhausted";
    else if (code == 404) what += "; check the URL";
    throw DataError(what, url_);
  }

  static std::string seconds(std::chrono::milliseconds t) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(t.count()) / 1000.0);
    return buf;
  }

  std::string url_;
  ShardOptions options_;
  curl_slist* resolve_ = nullptr;
  CURLM* multi_ = nullptr;
  CURL* easy_ = nullptr;
  char error_[CURL_ERROR_SIZE] = {};
  std::vector<char> buf_;
  std::size_t head_ = 0;       // unread bytes are buf_[head_..]
  uint64_t delivered_ = 0;     // bytes handed to the reader
  uint64_t received_ = 0;      // shard bytes received (delivered + buffered): where a retry resumes
  uint64_t drop_ = 0;          // response bytes to drop (a 200 to a Range request)
  uint64_t fetched_ = 0;       // bytes off the network, every attempt
  std::optional<uint64_t> size_;
  int attempts_ = 0;
  bool checked_response_ = false;
  bool paused_ = false;
  bool ended_ = false;
  Clock::time_point last_byte_{};
};

}  // namespace

std::unique_ptr<ShardStream> open_http_stream(const std::string& url, const ShardOptions& options) {
  return std::make_unique<HttpStream>(url, options);
}

}  // namespace spindle::detail
