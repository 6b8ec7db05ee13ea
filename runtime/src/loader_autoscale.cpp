// Loader, adaptive processes (LoaderOptions::adaptive, Python's num_workers="auto"):
// the controller that adds and retires worker processes while batches flow,
// and the retirement protocol. Which process produces a batch never changes
// the batch (any worker may take any item), so only the speed follows it.
//
// Each window (kWindow; the first starts at the consumer's first next()) measures
// what next() waited, the CPU the workers and this process used (each process's
// CPU clock, in ns: a window of a few ms is measured, not rounded to /proc's
// 10-ms ticks), and how busy the workers were (claim to publish). A process's CPU counts from its first
// claim (WorkerRecord::started_ns): its start (the fork, imports, the dataset's
// setup) is not what it will use, and a window where the processes are still
// starting goes on until they have run. A window is judged once early
// (kEarlyWindow) when next() waited nearly all of it on processes that wait on
// I/O: each window costs the I/O's latency at too few processes.
//   - next() waited more than kGrowWait of the window, a core is free (of
//     this loader's cpus, and idle on the machine: other programs count) and
//     the epoch has batches left to post, one a process at least (not its tail):
//     more processes, as many as the free cores hold at the workers' CPU per
//     process, at most doubling (four times while next() waits most of the
//     window; all that fit at once when it waits most of the window on workers
//     that use little CPU (kIoBound): they wait on I/O, and the first windows
//     count). Never with no core free: processes that use little CPU then may
//     be starved of it rather than waiting on I/O (more processes than cores;
//     the last epoch's processes exiting), and more would starve them more;
//   - next() hardly waited and the workers were busy less than kIdleBusy of
//     their time for kIdleWindows windows: the consumer sets the pace, so one
//     process retires;
//   - the user's task budget (ulimit -u, the cgroup's pids.max) has fewer
//     than LoaderOptions::reserve_tasks free (the consumer's own threads grew:
//     a checkpoint, an eval; a runtime started threads in the workers):
//     processes retire until it has, before a pthread_create anywhere fails
//     (checked every kBudgetPeriod); and no process is added that would leave
//     fewer. A process costs what its busiest worker runs now: the threads a
//     dataset's runtimes start inside the workers count (polars, Arrow), so
//     under a finite budget none is added before a process has published a
//     batch (the runtimes start their threads at first use).
// A retiring worker exits at its next claim (WorkerRecord::retire): never with
// a batch in hand. Each change is one line to on_resized, with its numbers.
//
// Adaptive streams (round_robin with logical workers, spindle.grain's "auto"):
// a stream's position lives in the process that runs it, so the same
// decisions are advice instead (advised_processes(), one line to on_resized),
// and the controller stops there: the front end starts its streams again on
// that many processes from the state of each one's last element delivered.
// A change costs a restart of every stream, so growth advises all the
// processes the free cores hold at once, not a doubling, and all the logical
// workers when the processes wait on I/O with a core free. Streams the budget
// granted fewer processes than advised are not advised more until they start
// again (the grant would refuse it again: a restart each window).
//
// A fixed count (not adaptive) where any worker takes any batch follows the
// budget alone, when the budget is finite: processes retire as above, and come
// back one at a time once a process's threads and kSpareAgain tasks more are free
// beyond the reserve.
#include <spindle/loader.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

#include <spindle/detail/worker_pool.hpp>
#include <spindle/procfs.hpp>
#include <spindle/worker_context.hpp>

#include "loader_internal.hpp"

namespace spindle {
using detail::BatchRing;
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kWindow = std::chrono::milliseconds(100);
constexpr auto kEarlyWindow = std::chrono::milliseconds(20);  // judged here already when sure (kSureWait)
constexpr auto kLookAgain = std::chrono::milliseconds(5);  // an early look that saw too little: again after this
constexpr double kSureWait = 0.9;    // next() waited more than this share on processes that wait on I/O
constexpr double kLeastSeen = 0.25;  // the started processes ran less than this many windows together: go on
constexpr auto kBudgetPeriod = std::chrono::seconds(1);
constexpr double kGrowWait = 0.05;   // next() waited more than this share of the window
constexpr double kFreeCore = 0.5;    // cores left idle that count as a free core
constexpr double kIoBound = 0.25;    // a process using less CPU than this mostly waits (I/O): one more costs little
constexpr double kIdleWait = 0.02;   // next() waited less than this share...
constexpr double kIdleBusy = 0.5;    // ...and the workers were busy less than this share of their time
constexpr int kSpareAgain = 1;       // a fixed count takes a retired process back with its threads and this many more free beyond the reserve
constexpr int kIdleWindows = 5;      // for this many windows in a row
constexpr double kFastWait = 0.5;    // waited more than this: up to four times the processes at once

uint64_t idle_ticks() {
  try {
    return procfs::idle_cpu_ticks().value_or(0);
  } catch (const std::exception&) {
    return 0;
  }
}

std::string fixed(double v, int digits = 1) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

int auto_workers(const BudgetSources& sources) {
  BudgetSources copy = sources;
  return std::min(kAutoMax, kAutoPerCpu * ThreadBudget(copy).cpus());
}

int idle_cores_now(int cpus) {
  int others = std::numeric_limits<int>::max();
  for (int i = 0; i < 3; ++i) {  // a snapshot: the fewest others of three readings (the reader is one)
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    try {
      if (const auto n = procfs::procs_running()) others = std::min(others, *n - 1);
    } catch (const std::exception&) {
    }
  }
  if (others == std::numeric_limits<int>::max()) return 1;  // unreadable: start small
  return std::clamp(cpus - others, 1, std::max(1, cpus));
}

std::chrono::nanoseconds Loader::next_look(Clock::time_point now) const noexcept {
  const AutoScale& a = *auto_;
  if (a.since == Clock::time_point{} || closed() || advised_.load() != 0) return std::chrono::nanoseconds::max();
  const auto window = now - a.since;
  if (options_.adaptive && !a.judged_early && window < kWindow)  // its early look: due, or again soon
    return std::max<std::chrono::nanoseconds>(kEarlyWindow - window, kLookAgain);
  return std::max<std::chrono::nanoseconds>(kWindow - window, std::chrono::milliseconds(1));
}

std::string Loader::resize_reason() const {
  std::lock_guard lock(pids_mu_);
  return auto_ ? auto_->reason : std::string();
}

void Loader::autoscale() {
  AutoScale& a = *auto_;
  const auto now = Clock::now();
  const BatchRing& r = ring_->ring;
  const uint32_t nw = r.geometry().num_workers;
  auto measure = [&] {
    a.since = now;
    a.judged_early = false;
    a.waited_ns = 0;
    a.consumer_cpu_ns = process_cpu_ns(getpid());
    a.idle_ticks = idle_ticks();
    a.busy_ns = 0;
    a.worker_cpu_ns.assign(nw, 0);
    for (uint32_t w = 0; w < nw; ++w) {
      if (live_[w] != 1) continue;
      a.worker_cpu_ns[w] = process_cpu_ns(r.worker(w).pid.load(std::memory_order_relaxed));
      a.busy_ns += r.worker(w).busy_ns.load(std::memory_order_relaxed);
    }
  };
  if (a.since == Clock::time_point{}) return measure();  // the first window starts (the first next())
  const auto window = now - a.since;
  if (closed() || advised_.load() != 0) return;  // advised: the front end restarts
  // Judged at its end, or once at kEarlyWindow if the processes wait on I/O while next() waits on them.
  const bool early = window < kWindow;
  if (early && (window < kEarlyWindow || a.judged_early || !options_.adaptive)) return;

  const int running = running_.load();
  const int64_t reserve = options_.reserve_tasks;
  // What a process of this loader costs the budget: the threads its busiest worker runs now (the
  // runtimes a dataset starts inside it count: polars, Arrow), at least one. The processes running
  // fewer will start the rest as their runtimes first run: the budget free for more is what is free
  // now less those.
  // Read from /proc only when the budget is looked at (free_tasks), once a window.
  int64_t each = 1;
  std::vector<int64_t> threads;
  bool counted = false;
  auto count_threads = [&] {
    if (counted) return;
    counted = true;
    for (uint32_t w = 0; w < r.geometry().num_workers; ++w) {
      if (live_[w] != 1) continue;
      try {
        const auto st = procfs::read_stat(r.worker(w).pid.load(std::memory_order_relaxed));
        threads.push_back(st ? st->num_threads : 0);
      } catch (const std::exception&) {
        threads.push_back(0);  // gone meanwhile
      }
      each = std::max(each, threads.back());
    }
  };
  auto free_tasks = [&] {  // sets `each` too
    count_threads();
    BudgetSources sources = options_.budget_sources;
    int64_t free = ThreadBudget(sources).budget();
    for (const int64_t n : threads) free -= std::max<int64_t>(0, each - n);
    return free;
  };
  if (!early && now - a.budget_checked >= kBudgetPeriod && plan_.budget != kUnlimited) {
    a.budget_checked = now;
    const int64_t free = free_tasks();
    if (free < reserve && running > 1) {
      const auto n = static_cast<int>(std::min<int64_t>(running - 1, (reserve - free + each - 1) / each));
      shrink(n, std::to_string(free) + " task" + (free == 1 ? "" : "s") +
                       " of the user's budget left (ulimit -u, the cgroup's pids.max; less those the processes' "
                       "runtimes will still start), " + std::to_string(reserve) +
                       " kept for the consumer, " + std::to_string(each) + " thread" + (each == 1 ? "" : "s") +
                       " a process: fewer processes before a thread cannot start");
      return measure();
    }
    if (!options_.adaptive && running < options_.num_workers && free >= reserve + each + kSpareAgain) {
      add_processes(1, "the user's budget has " + std::to_string(free) + " tasks free again");
      return measure();
    }
  }
  if (!options_.adaptive) return measure();  // a fixed count follows the budget only

  const double seconds = std::chrono::duration<double>(window).count();
  uint64_t waited = a.waited_ns;
  if (wait_began_ != Clock::time_point{})
    waited += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - std::max(wait_began_, a.since)).count());
  const double wait_share = static_cast<double>(waited) / 1e9 / seconds;
  const double tck = static_cast<double>(procfs::clock_ticks_per_second());  // the machine's idle time
  // What a started process uses: its CPU over the time it ran in the window. A process still
  // starting is left out, and one that started in the window counts from its start: the forks,
  // imports and the dataset's setup are not what it will use.
  // The window's start on the workers' clock (started_ns): steady_clock is CLOCK_MONOTONIC too.
  const int64_t now_ns = monotonic_ns();
  const int64_t since_ns = now_ns - std::chrono::duration_cast<std::chrono::nanoseconds>(window).count();
  double cpu_s = 0, run_s = 0, start_s = 0;  // start_s: the CPU the starts took in the window
  uint64_t busy_ns = 0;
  for (uint32_t w = 0; w < nw; ++w) {
    if (live_[w] != 1) continue;
    const detail::WorkerRecord& rec = r.worker(w);
    busy_ns += rec.busy_ns.load(std::memory_order_relaxed);
    const int64_t started = rec.started_ns.load(std::memory_order_acquire);
    const double cpu = static_cast<double>(process_cpu_ns(rec.pid.load(std::memory_order_relaxed)));
    const double before = w < a.worker_cpu_ns.size() ? static_cast<double>(a.worker_cpu_ns[w]) : 0.0;
    const double in_window = std::max(0.0, cpu - before) / 1e9;
    if (started == 0) {  // still starting
      start_s += in_window;
    } else if (started <= since_ns && before != 0) {
      cpu_s += in_window;
      run_s += seconds;
    } else {
      const double since_start =
          std::max(0.0, cpu - static_cast<double>(rec.start_cpu_ns.load(std::memory_order_relaxed))) / 1e9;
      cpu_s += since_start;
      run_s += std::max(0.0, static_cast<double>(now_ns - started) / 1e9);  // from its start, as its CPU
      start_s += std::max(0.0, in_window - since_start);
    }
  }
  // Too little seen (the processes are still starting): the window goes on (looked at early again
  // after kLookAgain).
  if (run_s < kLeastSeen * seconds) return;
  a.judged_early = a.judged_early || early;
  const double per_process = cpu_s / run_s;
  const double worker_cores = per_process * running;
  const uint64_t consumer_now = process_cpu_ns(getpid());
  const double consumer_cores =
      static_cast<double>(consumer_now > a.consumer_cpu_ns ? consumer_now - a.consumer_cpu_ns : 0) / 1e9 / seconds;
  // Free: what this loader's processes leave of its cpus, and no more than the machine had idle
  // (other programs use cores too) but for what the processes' starts took (they do not recur).
  double free_cores = a.cpus - worker_cores - consumer_cores;
  const uint64_t idle_now = idle_ticks();
  if (a.idle_ticks != 0 && idle_now >= a.idle_ticks)
    free_cores = std::min(free_cores, (static_cast<double>(idle_now - a.idle_ticks) / tck + start_s) / seconds);
  const double busy_share =
      static_cast<double>(busy_ns > a.busy_ns ? busy_ns - a.busy_ns : 0) / 1e9 / seconds / std::max(1, running);

  // Streams: one a logical worker, or those running when the budget granted fewer than advised.
  const int most = !advises() ? options_.num_workers : a.granted_less ? running : static_cast<int>(logical_);
  // A core free: workers that use little CPU wait (on I/O), they are not starved of it.
  const bool core_free = free_cores >= kFreeCore;
  // Work for another process: planned batches not yet posted, at least one a running process (the
  // epoch's tail is in flight on the processes there are: one added now would find nothing, and the
  // next epoch would start on it). Streams and an open feed have more to come.
  const bool work_left = options_.round_robin || (options_.fed && !feed_ended_) ||
                         batches_.size() - std::min(next_post_, batches_.size()) >= static_cast<std::size_t>(running);
  const bool grows = running < most && core_free && work_left;
  if (early && !(wait_share > kSureWait && per_process < kIoBound && grows)) return;  // to its end
  if (wait_share > kGrowWait && grows) {
    a.idle_windows = 0;
    // All that fit at once where every change restarts the streams (advice), or where next() waited
    // most of the window on processes that use little CPU (they wait on I/O: the fit is sound, and
    // each doubling would cost a window of the I/O's latency); else to 4x, or 2x. Streams waiting on
    // I/O with a core free fit all their logical workers: each step restarts them.
    const bool waits_on_io = wait_share > kFastWait && per_process < kIoBound;
    const bool all = advises() && waits_on_io;
    const int fit = all || per_process <= 0.01
                        ? most
                        : static_cast<int>(std::floor(std::max(free_cores, kFreeCore) / per_process));
    const int step = advises() || waits_on_io ? most : wait_share > kFastWait ? 3 * running : running;
    int n = std::clamp(std::min(fit, step), 1, most - running);
    if (plan_.budget != kUnlimited) {  // none that would leave the consumer less than its reserve
      // What a process costs is known once one has published a batch: its dataset's runtimes start
      // their threads at first use (polars, Arrow). Until then, no more.
      bool proven = !options_.stats;  // without statistics nothing tells: the threads seen now count
      for (uint32_t w = 0; w < r.geometry().num_workers && !proven; ++w)
        proven = live_[w] == 1 && r.worker(w).samples.load(std::memory_order_relaxed) > a.samples_at_start[w];
      if (!proven) return measure();
      const int64_t free = free_tasks();
      n = static_cast<int>(std::min<int64_t>(n, (free - reserve) / each));
    }
    if (n < 1) return measure();
    grow(n, "next() waited " + fixed(100 * wait_share, 0) + "% of the last " + fixed(seconds, 2) +
                         " s with " + fixed(std::max(0.0, free_cores)) + " of " + std::to_string(a.cpus) +
                         " cores free and " + fixed(per_process, 2) + " cores used per process");
  } else if (wait_share < kIdleWait && busy_share < kIdleBusy && running > 1) {
    if (++a.idle_windows >= kIdleWindows) {
      a.idle_windows = 0;
      shrink(1, "the workers were busy " + fixed(100 * busy_share, 0) + "% of their time and next() waited " +
                     fixed(100 * wait_share, 0) + "% for " + std::to_string(kIdleWindows) +
                     " windows: the consumer sets the pace");
    }
  } else {
    a.idle_windows = 0;
  }
  measure();
}

void Loader::grow(int n, const std::string& why) {
  if (!advises()) return add_processes(n, why);
  const int before = running_.load();
  advised_.store(before + n);
  note_resize(before, before + n, why + "; the streams start again on them from their states");
}

void Loader::shrink(int n, const std::string& why) {
  if (!advises()) {
    for (int i = 0; i < n; ++i) retire_process(why);
    return;
  }
  const int before = running_.load();
  advised_.store(std::max(1, before - n));
  note_resize(before, std::max(1, before - n), why + "; the streams start again on them from their states");
}

void Loader::note_resize(int before, int after, const std::string& why) {
  const int most = advises() ? static_cast<int>(logical_) : options_.num_workers;
  const std::string line = "spindle: " + std::to_string(before) + " -> " + std::to_string(after) +
                           " worker processes (at most " + std::to_string(most) + "): " + why + ".";
  {
    std::lock_guard lock(pids_mu_);
    auto_->reason = line;
  }
  if (options_.on_resized) options_.on_resized(line);
}

void Loader::add_processes(int n, const std::string& why) {
  const int before = running_.load();
  int added = 0;
  std::string failed;
  for (int i = 0; i < n; ++i) {
    // The lowest number not running and reaped (a retiring one may still be finishing).
    std::size_t w = 0;
    while (w < live_.size() && (live_[w] != 0 || (w < pool_->exits().size() && !pool_->exits()[w]))) ++w;
    if (w == live_.size()) break;
    const BatchRing& r = ring_->ring;
    r.worker(static_cast<uint32_t>(w)).retire.store(0, std::memory_order_release);
    r.worker(static_cast<uint32_t>(w)).pid.store(0, std::memory_order_relaxed);
    r.worker(static_cast<uint32_t>(w)).started_ns.store(0, std::memory_order_relaxed);
    try {
      if (w < static_cast<std::size_t>(pool_->size())) pool_->restart(static_cast<int>(w));
      else pool_->add(options_.num_workers);
    } catch (const std::system_error& e) {
      failed = std::string("; no more: ") + e.what();  // the limit reached meanwhile: stop growing, go on
      break;
    }  // anything else (a signal to raise, from the fork hooks) leaves next() with the processes as they are
    live_[w] = 1;
    auto_->samples_at_start[w] = r.worker(static_cast<uint32_t>(w)).samples.load(std::memory_order_relaxed);
    ++added;
    running_.fetch_add(1);
  }
  if (added == 0 && failed.empty()) return;
  refresh_pids();
  inflight_target_ = inflight_target(ring_->ring.geometry().num_slots - 2, running_.load());
  post_more();
  note_resize(before, running_.load(), why + failed);
}

void Loader::retire_process(const std::string& why) {
  const int before = running_.load();
  if (before <= 1) return;
  std::size_t w = live_.size();
  while (w > 0 && live_[w - 1] != 1) --w;  // the highest running number retires
  if (w == 0) return;
  --w;
  const BatchRing& r = ring_->ring;
  r.worker(static_cast<uint32_t>(w)).retire.store(1, std::memory_order_release);
  live_[w] = 2;
  running_.fetch_sub(1);
  r.queue(0).wake_all();  // a sleeping claimer sees its flag now
  inflight_target_ = inflight_target(r.geometry().num_slots - 2, running_.load());
  note_resize(before, running_.load(), why);
}

bool Loader::retired(const WorkerExit& e) {
  const auto w = static_cast<std::size_t>(e.worker_id);
  if (w >= live_.size() || live_[w] != 2) return false;
  // A retiring worker exits at its claim, with nothing in hand; one killed meanwhile may hold an item.
  const BatchRing& r = ring_->ring;
  const int32_t s = r.worker(static_cast<uint32_t>(w)).slot.load(std::memory_order_acquire);
  if (s >= 0 && r.state(static_cast<uint32_t>(s)) == detail::SlotState::kFilling &&
      r.slot(static_cast<uint32_t>(s)).worker == e.worker_id)
    post_again(static_cast<uint32_t>(s));
  r.worker(static_cast<uint32_t>(w)).slot.store(-1, std::memory_order_relaxed);
  r.worker(static_cast<uint32_t>(w)).batch_id.store(-1, std::memory_order_relaxed);
  live_[w] = 0;
  refresh_pids();
  return true;
}

}  // namespace spindle
