#pragma once
// Arena: the one pool of threads a loader tree may use for parallel native
// work, a oneTBB task_arena in the consumer process sized from the thread
// budget. TBB is hidden behind this interface so that nothing else in the
// runtime can start a pool of its own.
//
// Only the process that configured the arena may use it: forked workers
// inherit the object but not its threads, so a worker calling in throws.

#include <cstddef>
#include <functional>

namespace spindle {

class Arena {
 public:
  // The process-wide arena.
  static Arena& global();

  // Sets how many extra threads (beyond the calling thread) the arena may run.
  // Also caps TBB process-wide (global_control), so no other TBB use in this
  // process exceeds the budget either. Takes effect for the next parallel call.
  void configure(int extra_threads);
  int extra_threads() const noexcept;

  // Splits [0, n) into chunks and runs body(begin, end) across the arena.
  void parallel_for(std::size_t n, std::size_t grain,
                    const std::function<void(std::size_t, std::size_t)>& body);
  // memcpy across the arena, in chunks of at least 1 MiB.
  void parallel_copy(void* dst, const void* src, std::size_t bytes);

 private:
  Arena() = default;
};

}  // namespace spindle
