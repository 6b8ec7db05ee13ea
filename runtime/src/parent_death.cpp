#include <spindle/detail/parent_death.hpp>

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

namespace spindle::detail {
namespace {

volatile pid_t g_parent = 0;

void on_parent_death(int) {
  if (getppid() != g_parent) _exit(128 + SIGKILL);  // reparented away: the consumer process is gone
}

}  // namespace

int parent_death_signal() noexcept { return SIGRTMAX - 2; }

void die_with_process(pid_t parent) noexcept {
  g_parent = parent;
  const int sig = parent_death_signal();
  struct sigaction sa {};
  sa.sa_handler = on_parent_death;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  prctl(PR_SET_PDEATHSIG, sig);
  if (getppid() != parent) _exit(1);  // the consumer died before prctl took effect
}

}  // namespace spindle::detail
