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
//
// Several loaders may share one zygote, from any threads. Each WorkerPool
// opens a pool id; the zygote tags every worker with its pool and every exit
// report with that id, and reports wait here, per pool, until their own pool
// asks. Otherwise whichever pool polled first would take another's reports,
// and the other would wait on a pid that may already belong to someone else.
//
// Only the zygote kills its workers (kill_pool): it is the process that reaps
// them, so a pid it has not reaped yet cannot have been reused; a kill sent by
// the consumer to a worker's pid could reach an unrelated process.

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

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

  // A new pool id: the exits of workers spawned under it are kept for it
  // alone until close_pool().
  uint32_t open_pool();
  // Drops the pool's undelivered reports; reports arriving later for it are
  // discarded.
  void close_pool(uint32_t pool) noexcept;

  // Asks the zygote to fork worker `worker_id` of `pool` running `main` over
  // the segment `segment_fd`. Returns the worker's pid; throws
  // std::system_error if the zygote could not fork, std::invalid_argument for
  // an unknown main.
  pid_t spawn(uint32_t pool, const std::string& main, int worker_id, int segment_fd);
  // An exit of one of `pool`'s workers that the zygote reported: (pid, wait
  // status). Does not block.
  std::optional<std::pair<pid_t, int>> next_exit(uint32_t pool);
  // Has the zygote SIGKILL those of `pool`'s workers it has not reaped yet;
  // returns how many it signaled. Their exits are reported as usual. Throws
  // std::runtime_error if the zygote is gone.
  int kill_pool(uint32_t pool);
  // False once the zygote has exited: no more reports will come, and its
  // workers are gone with it (PR_SET_PDEATHSIG), their statuses unknown.
  bool alive();

  // Longest main name a request can carry.
  static constexpr std::size_t kMaxName = 63;

 private:
  // One request and its reply; serialized so that concurrent callers never
  // read each other's replies.
  int32_t call(const void* request, std::size_t bytes, int fd, const char* what);
  // Moves every report waiting on `events_` to its pool's queue. Needs reports_mu_.
  void drain_reports();

  int control_ = -1;  // requests and replies
  int events_ = -1;   // exit reports from the zygote
  pid_t pid_ = 0;
  std::mutex control_mu_;
  std::mutex reports_mu_;  // guards everything below
  uint32_t next_pool_ = 1;
  std::map<uint32_t, std::deque<std::pair<pid_t, int>>> reports_;  // open pools' undelivered exits
  bool gone_ = false;  // the report channel reached EOF: the zygote exited
};

}  // namespace spindle
