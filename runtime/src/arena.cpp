#include <spindle/arena.hpp>

#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <spindle/error.hpp>

namespace spindle {
namespace {

struct State {
  std::mutex mu;
  int extra = 0;
  pid_t owner = 0;
  std::unique_ptr<tbb::global_control> control;
  std::shared_ptr<tbb::task_arena> arena;  // shared: a running call keeps its arena
};

State& state() {
  static State s;
  return s;
}

std::shared_ptr<tbb::task_arena> arena_for_this_process() {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.owner != 0 && s.owner != getpid())
    SPINDLE_THROW(std::logic_error,
                  "spindle: the thread arena was used in a forked worker; workers must stay "
                  "single-threaded (this is a bug in spindle or in code calling it from a worker)");
  if (!s.arena) {
    s.owner = getpid();
    s.control = std::make_unique<tbb::global_control>(
        tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(s.extra + 1));
    s.arena = std::make_shared<tbb::task_arena>(s.extra + 1, 1);
  }
  return s.arena;
}

}  // namespace

Arena& Arena::global() {
  static Arena a;
  return a;
}

void Arena::configure(int extra_threads) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (extra_threads < 0) extra_threads = 0;
  if (s.arena && extra_threads == s.extra) return;
  s.extra = extra_threads;
  // Rebuilt lazily on the next parallel call with the new size.
  s.arena.reset();
  s.control.reset();
}

int Arena::extra_threads() const noexcept { return state().extra; }

void Arena::parallel_for(std::size_t n, std::size_t grain,
                         const std::function<void(std::size_t, std::size_t)>& body) {
  if (n == 0) return;
  if (state().extra == 0 || n <= grain) {  // no extra threads to share with
    body(0, n);
    return;
  }
  arena_for_this_process()->execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                      [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
  });
}

void Arena::parallel_copy(void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t kChunk = 1 << 20;
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  parallel_for(bytes, kChunk, [&](std::size_t b, std::size_t e) { std::memcpy(d + b, s + b, e - b); });
}

}  // namespace spindle
