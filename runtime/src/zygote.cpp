#include <spindle/zygote.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

#include <spindle/error.hpp>
#include <spindle/thread_budget.hpp>

#include "child_stdio.hpp"

namespace spindle {
namespace {

// Messages on the control socket (consumer -> zygote), each answered with one
// int32_t: a spawn with the worker's pid or -errno, a kill with the number of
// workers signaled.
enum class Op : int32_t { kSpawn = 1, kKill = 2 };

struct Request {
  Op op;
  uint32_t pool;  // the WorkerPool the worker belongs to (Zygote::open_pool)
  int32_t worker_id;
  char main[Zygote::kMaxName + 1];
};

// A report on the events socket (zygote -> consumer): one reaped worker.
struct Exit {
  int32_t pid;
  int32_t status;  // as waitpid gives it
  uint32_t pool;   // 0: a child the zygote did not know (never a pool id)
};

// Sends `bytes` of `data` and, if fd >= 0, the descriptor with it.
void send_fd(int sock, const void* data, std::size_t bytes, int fd) {
  iovec iov{const_cast<void*>(data), bytes};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(bytes))
    SPINDLE_THROW_ERRNO("spindle: cannot send a request to the zygote");
}

// Returns bytes read (0 at EOF) and the passed descriptor in `fd` (or -1).
ssize_t recv_fd(int sock, Request& req, int& fd) {
  iovec iov{&req, sizeof(req)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  fd = -1;
  if (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c && c->cmsg_type == SCM_RIGHTS)
    std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return n;
}

// Runs in a worker forked by the zygote: attach to the segment (as a spawned
// worker does) and run the body.
[[noreturn]] void run_worker(const WorkerMain& main, int worker_id, int fd) {
  int rc = 1;
  try {
    AttachedWorker attached(fd, worker_id, getppid());
    rc = main(attached.context());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spindle: worker %d (pid %d) stopped: %s\n", worker_id, getpid(), e.what());
  }
  detail::flush_own_stdio();
  _exit(rc);
}

[[noreturn]] void zygote_loop(const std::map<std::string, WorkerMain>& mains, int control, int events,
                              pid_t consumer) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != consumer) _exit(0);
  // Workers not reaped yet, and their pools. Only this (single-threaded)
  // process reaps them, so every pid in here still names our own child,
  // alive or a zombie, and kill() on it cannot reach anyone else.
  std::map<pid_t, uint32_t> children;
  for (;;) {
    pollfd p{control, POLLIN, 0};
    poll(&p, 1, 20);
    for (;;) {  // report every worker that exited
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      uint32_t pool = 0;
      if (auto it = children.find(pid); it != children.end()) {
        pool = it->second;
        children.erase(it);
      }
      Exit e{pid, status, pool};
      send(events, &e, sizeof(e), MSG_NOSIGNAL);
    }
    if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
    Request req{};
    int fd = -1;
    if (recv_fd(control, req, fd) <= 0) _exit(0);  // the consumer closed us
    req.main[Zygote::kMaxName] = '\0';
    int32_t reply = 0;
    if (req.op == Op::kKill) {
      for (const auto& [pid, pool] : children)
        if (pool == req.pool && kill(pid, SIGKILL) == 0) ++reply;
    } else if (auto it = mains.find(req.main); req.op != Op::kSpawn || it == mains.end() || fd < 0) {
      reply = -EINVAL;
    } else if (pid_t pid = fork(); pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(control);
      close(events);
      run_worker(it->second, req.worker_id, fd);
    } else {
      reply = pid > 0 ? pid : -errno;
      if (pid > 0) children[pid] = req.pool;
    }
    if (fd >= 0) close(fd);
    send(control, &reply, sizeof(reply), MSG_NOSIGNAL);
  }
}

}  // namespace

Zygote::Zygote(std::map<std::string, WorkerMain> mains) {
  for (const auto& [name, _] : mains)
    if (name.size() > kMaxName) SPINDLE_THROW(std::invalid_argument, "spindle: worker main name too long: " + name);
  if (int n = count_process_threads(getpid()); n > 1)
    SPINDLE_THROW(std::logic_error, "spindle: a Zygote must be started while the process has one thread (it has " +
                                        std::to_string(n) +
                                        "); create it at the top of main(), before any library starts threads");
  int control[2], events[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, control) != 0)
    SPINDLE_THROW_ERRNO("spindle: socketpair for the zygote failed");
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, events) != 0) {
    close(control[0]);
    close(control[1]);
    SPINDLE_THROW_ERRNO("spindle: socketpair for the zygote failed");
  }
  const pid_t consumer = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // The zygote's workers are forked from it: nothing pending of the
    // consumer's may reach them (child_stdio.hpp).
    detail::drop_inherited_stdio();
    close(control[0]);
    close(events[0]);
    zygote_loop(mains, control[1], events[1], consumer);
  }
  const int err = errno;
  close(control[1]);
  close(events[1]);
  if (pid < 0) {
    close(control[0]);
    close(events[0]);
    errno = err;
    SPINDLE_THROW_ERRNO("spindle: could not fork the zygote");
  }
  pid_ = pid;
  control_ = control[0];
  events_ = events[0];
}

Zygote::~Zygote() {
  close(control_);  // the zygote reads EOF and exits
  close(events_);
  int status = 0;
  for (int i = 0; i < 200; ++i) {  // up to 1 s, then insist
    if (waitpid(pid_, &status, WNOHANG) != 0) return;
    usleep(5000);
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
}

uint32_t Zygote::open_pool() {
  std::lock_guard lock(reports_mu_);
  const uint32_t pool = next_pool_++;
  reports_[pool];
  return pool;
}

void Zygote::close_pool(uint32_t pool) noexcept {
  std::lock_guard lock(reports_mu_);
  reports_.erase(pool);
}

int32_t Zygote::call(const void* request, std::size_t bytes, int fd, const char* what) {
  std::lock_guard lock(control_mu_);
  send_fd(control_, request, bytes, fd);
  int32_t reply = 0;
  if (recv(control_, &reply, sizeof(reply), 0) != sizeof(reply))
    SPINDLE_THROW(std::runtime_error, "spindle: the zygote (pid " + std::to_string(pid_) + ") did not answer " +
                                          what + "; it died");
  return reply;
}

pid_t Zygote::spawn(uint32_t pool, const std::string& main, int worker_id, int segment_fd) {
  if (main.size() > kMaxName) SPINDLE_THROW(std::invalid_argument, "spindle: worker main name too long: " + main);
  if (segment_fd < 0) SPINDLE_THROW(std::invalid_argument, "spindle: the zygote needs the segment's descriptor");
  Request req{};
  req.op = Op::kSpawn;
  req.pool = pool;
  req.worker_id = worker_id;
  std::memcpy(req.main, main.data(), main.size());
  const int32_t reply = call(&req, sizeof(req), segment_fd, "a request to fork a worker");
  if (reply == -EINVAL)
    SPINDLE_THROW(std::invalid_argument, "spindle: the zygote has no worker main named '" + main +
                                             "'; register it in the Zygote constructor");
  if (reply < 0) {
    errno = -reply;
    SPINDLE_THROW_ERRNO("spindle: the zygote could not fork worker " + std::to_string(worker_id));
  }
  return reply;
}

int Zygote::kill_pool(uint32_t pool) {
  Request req{};
  req.op = Op::kKill;
  req.pool = pool;
  return call(&req, sizeof(req), -1, "a request to stop workers");
}

void Zygote::drain_reports() {
  for (;;) {
    Exit e{};
    const ssize_t n = recv(events_, &e, sizeof(e), MSG_DONTWAIT);
    if (n == 0) gone_ = true;  // EOF: the zygote exited
    if (n != static_cast<ssize_t>(sizeof(e))) return;
    // Reports for a closed pool (or none) have no one left to read them.
    if (auto it = reports_.find(e.pool); it != reports_.end())
      it->second.emplace_back(static_cast<pid_t>(e.pid), static_cast<int>(e.status));
  }
}

std::optional<std::pair<pid_t, int>> Zygote::next_exit(uint32_t pool) {
  std::lock_guard lock(reports_mu_);
  drain_reports();
  auto it = reports_.find(pool);
  if (it == reports_.end() || it->second.empty()) return std::nullopt;
  auto e = it->second.front();
  it->second.pop_front();
  return e;
}

bool Zygote::alive() {
  std::lock_guard lock(reports_mu_);
  drain_reports();
  return !gone_;
}

}  // namespace spindle
