// pipe:CMD shards: the stdout of `/bin/sh -c CMD`, as webdataset reads them.
//
// Design decisions:
// - The command never outlives its reader. It runs in a process group of its
//   own, which the stream kills (SIGKILL) and reaps when it is closed before
//   the command ended (a pass stopped early, an error, a loader closing); it
//   dies with the thread that started it (PR_SET_PDEATHSIG), so a worker
//   killed by SIGKILL takes it along (sh -c execs a simple command, so the
//   command itself gets it); Ctrl-C ends the loader, which ends the workers.
//   A command that starts a pipeline of its own leaves those to SIGPIPE.
// - fork + exec, with only async-signal-safe calls in between: the reader may
//   be an arena thread of a multithreaded consumer.
// - SIGPIPE is reset to its default in the child (Python ignores it, and the
//   ignore would survive exec), so `cat` stops when the reader does.
// - A stall is `timeout` without a byte (poll), never a hang; a command that
//   exits non-zero fails the shard at its end with the status, as webdataset
//   does.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <spindle/error.hpp>

#include "shard_stream_internal.hpp"

namespace spindle::detail {
namespace {

class PipeStream final : public ShardStream {
 public:
  PipeStream(std::string url, const ShardOptions& o) : url_(std::move(url)), timeout_(o.timeout) {
    const std::string cmd = url_.substr(5);
    if (cmd.empty()) throw std::invalid_argument("spindle: shard '" + url_ + "' names no command after pipe:");
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) SPINDLE_THROW_ERRNO("cannot create a pipe for shard '" + url_ + "'");
    const pid_t parent = ::getpid();
    const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
    pid_ = ::fork();
    if (pid_ < 0) {
      const int err = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      errno = err;
      SPINDLE_THROW_ERRNO("cannot start the command of shard '" + url_ + "'");
    }
    if (pid_ == 0) {  // the child: async-signal-safe calls only
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      struct sigaction dfl{};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGCHLD}) ::sigaction(sig, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      if (::dup2(fds[1], 1) < 0) ::_exit(127);
      ::execv("/bin/sh", const_cast<char* const*>(argv));
      ::_exit(127);
    }
    ::setpgid(pid_, pid_);  // also from here, so a kill right after fork finds the group
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~PipeStream() override {
    if (fd_ >= 0) ::close(fd_);
    if (pid_ > 0 && !reaped_) {
      ::kill(-pid_, SIGKILL);
      ::kill(pid_, SIGKILL);
      int status;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }

  std::size_t read(void* dst, std::size_t n) override {
    auto* out = static_cast<char*>(dst);
    std::size_t got = 0;
    while (got < n && !eof_) {
      struct pollfd p{fd_, POLLIN, 0};
      const int timeout_ms = timeout_.count() > 0 ? static_cast<int>(timeout_.count()) : -1;
      const int r = ::poll(&p, 1, timeout_ms);
      if (r < 0) {
        if (errno == EINTR) continue;
        SPINDLE_THROW_ERRNO("cannot wait for the command of shard '" + url_ + "'");
      }
      if (r == 0)
        throw DataError("spindle: shard '" + url_ + "': the command wrote no byte for " +
                            std::to_string(timeout_.count() / 1000.0).substr(0, 4) + " s after " +
                            std::to_string(fetched_) + " bytes (stalled; timeout=)",
                        url_);
      const ssize_t k = ::read(fd_, out + got, n - got);
      if (k < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        SPINDLE_THROW_ERRNO("cannot read the output of shard '" + url_ + "'");
      }
      if (k == 0) {
        eof_ = true;
        reap_and_check();  // a failed command is reported as such, not as a truncated tar
      }
      got += static_cast<std::size_t>(k);
      fetched_ += static_cast<uint64_t>(k);
    }
    return got;
  }

  void finish() override {
    char buf[4096];
    while (read(buf, sizeof buf) > 0) {
    }
  }

  std::optional<uint64_t> size() const noexcept override { return std::nullopt; }
  const std::string& url() const noexcept override { return url_; }
  uint64_t bytes_fetched() const noexcept override { return fetched_; }

 private:
  void reap_and_check() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) {
      if (errno != EINTR) SPINDLE_THROW_ERRNO("cannot reap the command of shard '" + url_ + "'");
    }
    reaped_ = true;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    const std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                              : "was killed by signal " + std::to_string(WTERMSIG(status));
    throw DataError("spindle: shard '" + url_ + "': the command " + how + " after writing " +
                        std::to_string(fetched_) + " bytes",
                    url_);
  }

  std::string url_;
  std::chrono::milliseconds timeout_;
  pid_t pid_ = -1;
  int fd_ = -1;
  bool eof_ = false;
  bool reaped_ = false;
  uint64_t fetched_ = 0;
};

}  // namespace

std::unique_ptr<ShardStream> open_pipe_stream(const std::string& url, const ShardOptions& options) {
  return std::make_unique<PipeStream>(url, options);
}

}  // namespace spindle::detail
