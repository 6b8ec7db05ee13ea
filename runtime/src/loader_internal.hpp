#pragma once
// What the Loader's source files share and its header only names: the ring's
// storage (kept alive by every Batch lease) and the loader's leases.

#include <spindle/detail/arena.hpp>
#include <spindle/detail/batch_ring.hpp>
#include <spindle/budget_ledger.hpp>
#include <spindle/shm_segment.hpp>

#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <string>

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

}  // namespace spindle
