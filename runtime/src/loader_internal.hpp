#pragma once
// What the Loader's source files share and its header only names: the ring's
// storage (kept alive by every Batch lease) and the loader's leases.

#include <spindle/detail/arena.hpp>
#include <spindle/detail/batch_ring.hpp>
#include <spindle/budget_ledger.hpp>
#include <spindle/shm_segment.hpp>

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spindle {

struct RingStorage {
  RingStorage(std::size_t bytes, std::size_t reserve, const std::string& what)
      : segment(bytes, what, reserve), owner(getpid()) {}
  ShmSegment segment;
  detail::BatchRing ring;
  // The consumer process. A forked copy of the loader's objects (in a worker
  // of another loader, or a user's fork) must not act on the ring: freeing a
  // slot there would hand the consumer's slot back under its reader.
  const pid_t owner;
  bool in_owner() const noexcept { return getpid() == owner; }
};

struct LoaderLeases {
  // Its share of the arena: plan_.arena_threads (+ the workers in threads
  // mode); given back by close().
  detail::ArenaLease arena;
  // This loader's share of the node's budget: pending until the workers are
  // started, then only the arena threads; given back by close(), once the
  // workers are reaped.
  LedgerLease ledger;
};

// Adaptive processes (LoaderOptions::adaptive, loader_autoscale.cpp): what one
// window measured from, and the controller's state.
struct AutoScale {
  std::chrono::steady_clock::time_point since{};  // the window's start
  bool judged_early = false;        // the window was looked at once before its end (kEarlyWindow)
  uint64_t waited_ns = 0;           // next() blocked during the window
  uint64_t consumer_cpu_ns = 0;     // this process's CPU (process_cpu_ns) at `since`
  std::vector<uint64_t> worker_cpu_ns;  // each worker's at `since` (0: not running)
  uint64_t busy_ns = 0;             // the workers' busy time (claim to publish) at `since`
  uint64_t idle_ticks = 0;          // the machine's idle CPU ticks at `since` (0: unknown)
  int cpus = 1;                     // usable cpus (affinity, cgroup cpu.max)
  int idle_windows = 0;             // windows in a row with the workers idle and next() not waiting
  // Adaptive streams the budget granted fewer processes than the advice asked: no growth advised
  // until they start again (it would restart them on what the budget has just refused, over and over).
  bool granted_less = false;
  std::chrono::steady_clock::time_point budget_checked{};
  std::string reason;               // the last change's line
  // Per worker: its record's samples when its process started (a process that has published more
  // has run its dataset, and the runtimes' threads it starts at first use with it).
  std::vector<uint64_t> samples_at_start;
};

}  // namespace spindle
