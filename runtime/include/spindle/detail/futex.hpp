#pragma once
// Cross-process futex wait/wake on a 32-bit word in a MAP_SHARED mapping.
// Not API. Waiting never holds a lock, so a process that dies mid-wait or
// mid-wake leaves nothing poisoned behind.

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace spindle::detail {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be plain lock-free 32-bit atomics");

// Sleeps while *word == expected, at most `timeout`. Spurious returns are
// fine: every caller re-checks its condition in a loop.
inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected,
                       std::chrono::microseconds timeout) noexcept {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000),
              static_cast<long>((timeout.count() % 1000000) * 1000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void futex_wake(std::atomic<uint32_t>* word, int count = INT_MAX) noexcept {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

}  // namespace spindle::detail
