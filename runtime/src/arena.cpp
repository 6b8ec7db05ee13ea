#include <spindle/detail/arena.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <spindle/error.hpp>

namespace spindle::detail {
namespace {

// Everything below is guarded by `mu`: leases are taken and dropped from any
// thread (a Loader may be destroyed on another thread than the one iterating
// a second one), and parallel calls read the size while that happens.
struct State {
  std::mutex mu;
  pid_t owner = 0;  // the process whose leases `grants` records
  uint64_t next_id = 1;
  std::map<uint64_t, int> grants;  // live leases by id: their extra threads
  int extra = 0;                   // sum of `grants`
  std::unique_ptr<tbb::global_control> control;  // present while a lease lives
  std::shared_ptr<tbb::task_arena> arena;         // shared: a running call keeps its arena
};

State& state() {
  static State s;
  return s;
}

// A fork of the owner inherited its bookkeeping and TBB objects but not the
// threads behind them. They are the parent's: forgotten here, and leaked on
// purpose, since destroying them would act on TBB state that describes threads
// this process does not have.
void adopt(State& s, pid_t me) {
  if (s.owner == me) return;
  if (s.owner != 0) {
    (void)s.control.release();
    if (s.arena) new std::shared_ptr<tbb::task_arena>(std::move(s.arena));  // never freed
    s.grants.clear();
    s.extra = 0;
  }
  s.owner = me;
}

// Recomputes the size from the live grants; called with `mu` held.
void resize(State& s) {
  if (s.grants.empty()) {
    s.extra = 0;
    s.control.reset();  // nothing of ours runs: TBB is back to its default
    s.arena.reset();
    return;
  }
  long long sum = 0;
  for (const auto& [id, extra] : s.grants) sum += extra;
  const int extra = static_cast<int>(std::min<long long>(sum, INT_MAX - 1));
  if (s.control && extra == s.extra) return;
  // The new cap exists before the old one goes: TBB applies the smallest
  // live global_control, so the cap is never lifted in between.
  auto control = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                       static_cast<std::size_t>(extra) + 1);
  s.control = std::move(control);
  s.extra = extra;
  s.arena.reset();  // rebuilt on the next parallel call with the new size
}

// The arena to run in now, or nullptr when there are no extra threads (the
// caller works alone).
std::shared_ptr<tbb::task_arena> arena_for_this_process() {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.extra == 0) return nullptr;
  if (s.owner != getpid())
    SPINDLE_THROW(std::logic_error,
                  "spindle: the thread arena was used in a forked worker; workers must stay "
                  "single-threaded (this is a bug in spindle or in code calling it from a worker)");
  if (!s.arena) s.arena = std::make_shared<tbb::task_arena>(s.extra + 1, 1);
  return s.arena;
}

}  // namespace

// ---------------------------------------------------------------- leases

ArenaLease::ArenaLease(ArenaLease&& o) noexcept
    : id_(std::exchange(o.id_, 0)), pid_(o.pid_), extra_(std::exchange(o.extra_, 0)) {}

ArenaLease& ArenaLease::operator=(ArenaLease&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = std::exchange(o.id_, 0);
    pid_ = o.pid_;
    extra_ = std::exchange(o.extra_, 0);
  }
  return *this;
}

ArenaLease::~ArenaLease() { reset(); }

void ArenaLease::reset() noexcept {
  if (id_ != 0) Arena::global().release(*this);
  id_ = 0;
  extra_ = 0;
}

// ---------------------------------------------------------------- arena

Arena& Arena::global() {
  static Arena a;
  return a;
}

ArenaLease Arena::lease(int extra_threads) {
  State& s = state();
  std::lock_guard lock(s.mu);
  const pid_t me = getpid();
  adopt(s, me);
  const int extra = std::max(0, extra_threads);
  const uint64_t id = s.next_id++;
  s.grants[id] = extra;
  try {
    resize(s);
  } catch (...) {
    s.grants.erase(id);
    throw;
  }
  return ArenaLease(id, me, extra);
}

void Arena::release(const ArenaLease& lease) noexcept {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (lease.pid_ != getpid() || s.owner != lease.pid_) return;  // a forked copy: not ours to give back
  if (s.grants.erase(lease.id_) == 0) return;
  try {
    resize(s);
  } catch (...) {
    // Could not build the smaller cap: the larger one stays, still within
    // what the remaining leases were granted before.
  }
}

int Arena::extra_threads() const noexcept {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.extra;
}

void Arena::parallel_for(std::size_t n, std::size_t grain,
                         const std::function<void(std::size_t, std::size_t)>& body) {
  if (n == 0) return;
  std::shared_ptr<tbb::task_arena> arena;
  if (n > grain) arena = arena_for_this_process();
  if (!arena) {  // no extra threads to share with
    body(0, n);
    return;
  }
  arena->execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, grain),
                      [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
  });
}

struct ArenaJobs::Shared {
  std::mutex mu;
  std::condition_variable done;
  int running = 0;
};

// The arena is held by the handle, not by the jobs: it must never be
// destroyed from one of its own threads.
ArenaJobs::~ArenaJobs() {
  wait();
  arena_.reset();
}

void ArenaJobs::wait() noexcept {
  {
    std::unique_lock lock(shared_->mu);
    shared_->done.wait(lock, [&] { return shared_->running == 0; });
  }
  // Every body has returned; each job's task still holds `shared_` (and the body) until the arena
  // destroys it, right after it ran. Returned before that, an owner that then ends the process (a
  // program's main) leaves them referenced only from an arena thread's task: LeakSanitizer reported
  // them, at times. Waited for, within a bound (a task kept longer is not worth a hang).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (shared_.use_count() > 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
}

std::unique_ptr<ArenaJobs> Arena::start(int n, std::function<void(int)> body) {
  auto shared = std::make_shared<ArenaJobs::Shared>();
  std::unique_ptr<ArenaJobs> jobs(new ArenaJobs(shared));
  if (n <= 0) return jobs;
  std::shared_ptr<tbb::task_arena> arena = arena_for_this_process();
  jobs->arena_ = arena;
  {
    State& s = state();
    std::lock_guard lock(s.mu);
    if (!arena || s.extra < n)
      SPINDLE_FAIL_INTERNAL("spindle: " + std::to_string(n) + " arena jobs need " + std::to_string(n) +
                            " extra arena threads; the arena has " + std::to_string(s.extra) +
                            " (take a lease for them first)");
  }
  auto fn = std::make_shared<std::function<void(int)>>(std::move(body));
  shared->running = n;
  for (int i = 0; i < n; ++i) {
    // enqueue: run by the arena's worker threads (its one master slot is for
    // callers of execute), so n jobs occupy n of its extra threads.
    arena->enqueue([shared, fn, i] {
      try {
        (*fn)(i);
      } catch (...) {
      }
      std::lock_guard lock(shared->mu);
      if (--shared->running == 0) shared->done.notify_all();
    });
  }
  return jobs;
}

void Arena::parallel_copy(void* dst, const void* src, std::size_t bytes) {
  constexpr std::size_t kChunk = 1 << 20;
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  parallel_for(bytes, kChunk, [&](std::size_t b, std::size_t e) { std::memcpy(d + b, s + b, e - b); });
}

}  // namespace spindle::detail

namespace spindle {

int arena_extra_threads() noexcept { return detail::Arena::global().extra_threads(); }

}  // namespace spindle
