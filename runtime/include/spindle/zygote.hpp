#pragma once
// Zygote: a single-threaded process, forked at program start before any other
// thread exists, that forks loader workers on request.
//
// Why: fork() copies only the calling thread. In a native program whose other
// threads may hold locks (a logger, an allocator of their own, a runtime's
// pool) at the moment a loader starts, a worker forked directly could inherit
// such a lock held forever. Workers forked by the zygote instead start from
// the clean single-threaded image taken at program start. The price: worker
// bodies must be registered, by name, before the zygote starts, because the
// zygote cannot see anything created later; the segment reaches it as a file
// descriptor (SCM_RIGHTS).
//
// Process tree: consumer -> zygote -> workers. The zygote dies with the
// consumer (PR_SET_PDEATHSIG) and the workers with the zygote. Workers are not
// the consumer's children, so the zygote reaps them and reports every exit
// (pid + wait status) to the consumer over a socket.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include <spindle/worker_context.hpp>

namespace spindle {

class Zygote {
 public:
  // Forks the zygote. Throws std::logic_error if this process already runs
  // more than one thread (then the zygote would not be clean).
  explicit Zygote(std::map<std::string, WorkerMain> mains);
  ~Zygote();
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  pid_t pid() const noexcept { return pid_; }

  // Asks the zygote to fork worker `worker_id` running `main` over the
  // segment `segment_fd`. Returns the worker's pid; throws std::system_error
  // if the zygote could not fork, std::invalid_argument for an unknown main.
  pid_t spawn(const std::string& main, int worker_id, int segment_fd);
  // A worker exit the zygote reported: (pid, wait status), waiting up to `wait`.
  std::optional<std::pair<pid_t, int>> next_exit(std::chrono::milliseconds wait);

  // Longest main name a request can carry.
  static constexpr std::size_t kMaxName = 63;

 private:
  int control_ = -1;  // requests and replies
  int events_ = -1;   // exit reports from the zygote
  pid_t pid_ = 0;
};

}  // namespace spindle
