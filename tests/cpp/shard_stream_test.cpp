// Shard streams (shard_stream.hpp): an HTTP fetch starts no thread (libcurl's
// threaded resolver never runs, numeric host or name), a pipe: command is
// killed and reaped when its stream closes early, and brace expansion.
//
// pthread_create is interposed below: libcurl (a shared library) calls it
// through the PLT, so every thread it could start is counted here.
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netdb.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <spindle/error.hpp>
#include <spindle/shard_stream.hpp>

namespace {
std::atomic<int> g_threads_started{0};
}

extern "C" int pthread_create(pthread_t* t, const pthread_attr_t* attr, void* (*fn)(void*), void* arg) {
  using Real = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_create"));
  g_threads_started.fetch_add(1);
  return real(t, attr, fn, arg);
}

namespace spindle {
namespace {

// A one-shot HTTP server in a forked child (its threads are not ours): answers
// `connections` requests with `body`, then exits.
struct ForkedServer {
  ForkedServer(const std::string& body, int connections) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd, 8), 0);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    pid = fork();
    if (pid == 0) {
      for (int k = 0; k < connections; ++k) {
        const int c = accept(fd, nullptr, nullptr);
        if (c < 0) _exit(1);
        std::string req;
        char buf[4096];
        while (req.find("\r\n\r\n") == std::string::npos) {
          const ssize_t r = read(c, buf, sizeof buf);
          if (r <= 0) break;
          req.append(buf, static_cast<std::size_t>(r));
        }
        const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                                 "\r\nConnection: close\r\n\r\n";
        (void)!write(c, head.data(), head.size());
        (void)!write(c, body.data(), body.size());
        close(c);
      }
      _exit(0);
    }
    close(fd);
  }
  ~ForkedServer() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  int fd = -1;
  int port = 0;
  pid_t pid = -1;
};

std::string read_all(ShardStream& s) {
  std::string out;
  char buf[1000];
  while (const std::size_t got = s.read(buf, sizeof buf)) out.append(buf, got);
  return out;
}

// This machine's host name if it resolves to a loopback address (as Debian's /etc/hosts
// has it), else "": a name libcurl would resolve on its threaded resolver ("localhost"
// it resolves itself).
std::string loopback_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return {};
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &res) != 0) return {};
  const bool loopback =
      (ntohl(reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr) >> 24) == 127;
  freeaddrinfo(res);
  return loopback ? name : "";
}

// Proves: fetching over HTTP by a numeric host and by host names starts no thread in the
// reading process (the interposed pthread_create counts none), and the bytes arrive whole.
TEST(ShardStreamTest, HttpFetchStartsNoThreadForNumericHostsOrNames) {
  std::string body(300000, '\0');
  for (std::size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 7 + i / 251);
  std::vector<std::string> hosts = {"127.0.0.1", "localhost"};
  if (const std::string name = loopback_hostname(); !name.empty()) hosts.push_back(name);
  ForkedServer server(body, static_cast<int>(hosts.size()));
  const int before = g_threads_started.load();
  for (const std::string& host : hosts) {
    ShardOptions o;
    o.timeout = std::chrono::milliseconds(10000);
    o.read_ahead_bytes = 64 * 1024;  // pauses and resumes the transfer many times
    auto s = open_shard("http://" + host + ":" + std::to_string(server.port) + "/x.tar", o);
    EXPECT_EQ(read_all(*s), body) << host;
    EXPECT_EQ(s->size(), body.size()) << host;
  }
  EXPECT_EQ(g_threads_started.load(), before) << "a library started a thread during the fetch";
}

// Proves: the interposer sees the threads libcurl starts: a plain curl_easy_perform on a host
// name (no CURLOPT_RESOLVE) starts its resolver thread, so the test above can fail.
TEST(ShardStreamTest, ThreadCounterSeesLibcurlsResolverThread) {
  const std::string name = loopback_hostname();
  if (name.empty()) GTEST_SKIP() << "this machine's host name does not resolve to a loopback address";
  ASSERT_EQ(curl_global_init(CURL_GLOBAL_DEFAULT), CURLE_OK);
  const int before = g_threads_started.load();
  CURL* e = curl_easy_init();
  const std::string url = "http://" + name + ":9/";  // nothing listens: only the resolve matters
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 2L);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_perform(e);
  curl_easy_cleanup(e);
  EXPECT_GE(g_threads_started.load(), before + 1);
}

// Proves: closing a pipe: stream before its command ended kills and reaps the command.
TEST(ShardStreamTest, PipeCommandIsKilledAndReapedOnEarlyClose) {
  auto s = open_shard("pipe:echo $$; exec sleep 300");
  char buf[32] = {};
  std::size_t got = 0;
  while (got < sizeof buf - 1 && std::memchr(buf, '\n', got) == nullptr) {
    const std::size_t k = s->read(buf + got, 1);
    ASSERT_EQ(k, 1u);
    got += k;
  }
  const pid_t pid = static_cast<pid_t>(std::stol(buf));
  ASSERT_EQ(kill(pid, 0), 0);
  s.reset();
  EXPECT_EQ(kill(pid, 0), -1);
  EXPECT_EQ(errno, ESRCH);
}

// Proves: a command that writes nothing for `timeout` is a DataError naming the URL, not a hang.
TEST(ShardStreamTest, SilentPipeCommandTimesOut) {
  ShardOptions o;
  o.timeout = std::chrono::milliseconds(300);
  auto s = open_shard("pipe:exec sleep 30", o);
  char c;
  try {
    s->read(&c, 1);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("pipe:exec sleep 30"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("stalled"), std::string::npos) << e.what();
  }
}

// Proves: braces expand left to right with zero padding, lists split on "::", bad specs are refused.
TEST(ShardStreamTest, BraceExpansion) {
  EXPECT_EQ(expand_shard_urls("a{0..2}"), (std::vector<std::string>{"a0", "a1", "a2"}));
  EXPECT_EQ(expand_shard_urls("{x,y}-{009..010}::z"),
            (std::vector<std::string>{"x-009", "x-010", "y-009", "y-010", "z"}));
  EXPECT_THROW(expand_shard_urls("a{1..0}"), std::invalid_argument);
  EXPECT_THROW(expand_shard_urls("a{1..2"), std::invalid_argument);
  EXPECT_THROW(expand_shard_urls("a}"), std::invalid_argument);
  EXPECT_THROW(open_shard("s3://bucket/a.tar"), std::invalid_argument);
}

}  // namespace
}  // namespace spindle
