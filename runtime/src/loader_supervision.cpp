// Loader, supervision: waiting for a batch while watching the workers and the
// timeout, describing what a worker was doing when it died or stalled,
// closing the loader on a fatal error, and stopping and reaping the workers.
// The consumer protocol (posting, delivering, epochs) is in loader.cpp.
#include <spindle/loader.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include <spindle/detail/arena.hpp>
#include <spindle/detail/futex.hpp>
#include <spindle/detail/worker_pool.hpp>
#include <spindle/error.hpp>
#include <spindle/procfs.hpp>

#include "loader_internal.hpp"

namespace spindle {
using detail::SlotState;
using detail::WorkerRecord;
using detail::BatchRing;
using detail::SlotHeader;
namespace {

constexpr auto kSupervisePeriod = std::chrono::milliseconds(50);

std::string preview(std::span<const int64_t> idx) {
  std::string s = "[";
  for (std::size_t i = 0; i < idx.size() && i < 4; ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  if (idx.size() > 4) s += ", ... " + std::to_string(idx.size()) + " samples";
  return s + "]";
}

// What the kernel says a worker is doing ("stopped" explains a timeout at once).
std::string process_state(pid_t pid) {
  try {
    const auto stat = procfs::read_stat(pid);
    return stat ? procfs::describe_state(stat->state) : "gone";
  } catch (const std::exception&) {
    return "in state '?'";  // it goes into an error message: never throw from here
  }
}

// 2000 ms -> "2", 1500 ms -> "1.5" (as torch prints its timeout).
std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

std::string Loader::describe_batch(std::size_t b) const {
  if (b < batches_.size()) return preview(batches_.batch(b));
  return "(from worker streams)";
}

void Loader::rethrow_if_broken() const {
  if (broken_.empty()) return;
  if (broken_timeout_) throw LoaderTimeoutError(broken_);
  if (broken_died_) throw *broken_died_;
  throw WorkerDiedError(broken_);
}

Loader::~Loader() {
  if (ring_ && !ring_->in_owner()) {
    // A forked copy (see close()): the workers and threads are the consumer's;
    // their handles are let go without stopping or joining anything.
    (void)pool_.release();
    (void)threads_.release();
    return;
  }
  close();
}

uint32_t Loader::num_slots() const noexcept { return ring_->ring.geometry().num_slots; }

std::vector<pid_t> Loader::worker_pids() const {
  std::lock_guard lock(pids_mu_);
  return pids_;
}

std::vector<std::optional<WorkerExit>> Loader::worker_exits() const {
  std::lock_guard lock(pids_mu_);
  return exits_;
}

void Loader::close(std::chrono::milliseconds grace) noexcept {
  // In a forked copy of the consumer nothing is closed: the queues, the
  // workers and the threads are the consumer's (and the threads do not exist
  // here: joining them would wait forever).
  if (ring_ && !ring_->in_owner()) return;
  closing_.store(true, std::memory_order_release);
  // Wake a next() waiting in another thread; it sees closing_ and returns.
  if (ring_) detail::futex_wake(&ring_->ring.header().completed, INT32_MAX);
  std::lock_guard op(op_mu_);
  stop_workers(grace);
}

void Loader::stop_workers(std::chrono::milliseconds grace) noexcept {
  closing_.store(true, std::memory_order_release);
  if (!pool_ && !threads_) {
    leases_->arena.reset();
    leases_->ledger.reset();
    return;
  }
  for (uint32_t q = 0; q < ring_->ring.num_queues(); ++q) ring_->ring.queue(q).close();
  if (pool_) {
    pool_->shutdown(grace);
    std::lock_guard lock(pids_mu_);
    exits_ = pool_->exits();
  }
  pool_.reset();
  threads_.reset();  // waits for the batches being filled: threads cannot be killed
  // The workers are reaped and nothing of this loader runs in the arena any
  // more: both leases go back now, not when the Loader is destroyed.
  leases_->arena.reset();
  leases_->ledger.reset();
  std::lock_guard lock(pids_mu_);
  pids_.clear();
}

std::string Loader::describe_holder(uint32_t slot) const {
  const BatchRing& r = ring_->ring;
  if (r.state(slot) == SlotState::kPosted) {
    std::string who;
    for (uint32_t w = 0; w < static_cast<uint32_t>(options_.num_workers); ++w) {
      if (live_[w] == 0) continue;  // adaptive: not running
      const pid_t pid = r.worker(w).pid.load();
      who += (who.empty() ? "" : ", ") + std::to_string(w) +
             (pid == 0 ? std::string(" starting") : " (pid " + std::to_string(pid) + ") " + process_state(pid));
    }
    return "not yet claimed by a worker (workers: " + who + ")";
  }
  const int w = r.slot(slot).worker;
  if (w < 0 || w >= options_.num_workers) return "in an unknown state";
  const WorkerRecord& rec = r.worker(static_cast<uint32_t>(w));
  const pid_t pid = rec.pid.load();
  return "held by worker " + std::to_string(w) + " (pid " + std::to_string(pid) + ", " + process_state(pid) +
         ") at sample index " + std::to_string(rec.sample_index.load());
}

bool Loader::workers_started() const noexcept {
  const BatchRing& r = ring_->ring;
  for (uint32_t w = 0; w < r.geometry().num_workers; ++w)
    if (live_[w] != 0 && r.worker(w).pid.load(std::memory_order_relaxed) == 0) return false;
  return true;
}

void Loader::fail_closed(const std::string& message, bool timeout) {
  broken_ = message;
  broken_timeout_ = timeout;
  // Idle workers see the closed queue at once; one that is stuck or crashed
  // gets no long grace period.
  stop_workers(std::chrono::milliseconds(100));
  if (timeout) throw LoaderTimeoutError(message);
  throw WorkerDiedError(message);
}

void Loader::fail_closed(const WorkerDiedError& died) {
  broken_ = died.what();
  broken_timeout_ = false;
  broken_died_ = died;
  stop_workers(std::chrono::milliseconds(100));  // as above
  throw died;
}

void Loader::check_workers() {
  if (!pool_) return;  // threads do not exit on their own
  // Replacements a signal interrupted: tried again (restart() keeps one that fails again, and the rest wait).
  std::vector<int> pending;
  pending.swap(unstarted_);
  for (std::size_t i = 0; i < pending.size(); ++i) {
    try {
      restart(pending[i]);
    } catch (...) {
      unstarted_.insert(unstarted_.end(), pending.begin() + static_cast<std::ptrdiff_t>(i) + 1, pending.end());
      throw;
    }
  }
  auto e = pool_->poll_exit();
  if (!e) return;
  {
    std::lock_guard lock(pids_mu_);
    exits_ = pool_->exits();
  }
  if (retired(*e)) return;
  const WorkerRecord& rec = ring_->ring.worker(static_cast<uint32_t>(e->worker_id));
  const int64_t batch = rec.batch_id.load();
  std::optional<int64_t> batch_field, sample_field;
  std::string doing = "while idle";
  if (batch >= 0) {
    const int64_t sample = rec.sample_index.load();
    batch_field = batch;
    if (sample >= 0) sample_field = sample;
    doing = "while producing batch " + std::to_string(batch) + " " +
            describe_batch(static_cast<std::size_t>(batch)) +
            (sample >= 0 ? " at sample index " + std::to_string(sample) : " before its first sample");
  }
  const std::string died = "spindle: worker " + std::to_string(e->worker_id) + " (pid " + std::to_string(e->pid) +
                           ") " + e->describe() + " " + doing;
  std::string why;  // why it is not replaced, when replacements were asked for
  if (options_.max_replacements > 0 && !closed()) {
    const auto earlier = std::find_if(deaths_.begin(), deaths_.end(),
                                      [&](const auto& d) { return sample_field && d.first == *sample_field; });
    if (options_.round_robin) {
      why = ". A stream's worker cannot be replaced: its stream's position went with it";
    } else if (earlier != deaths_.end()) {
      why = ". Sample index " + std::to_string(*sample_field) + " was being produced at an earlier loss too (" +
            earlier->second + "): a sample that kills its worker is not retried again. Fix or skip it";
    } else if (replaced_epoch_ >= options_.max_replacements) {
      std::string all;
      for (const auto& d : deaths_) all += (all.empty() ? "" : "; ") + d.second;
      why = ". " + std::to_string(replaced_epoch_) + " lost worker" + (replaced_epoch_ == 1 ? " was" : "s were") +
            " replaced this epoch already, the most allowed (max_replacements=" +
            std::to_string(options_.max_replacements) + "): " + all;
    } else {
      replace_lost(*e, died, sample_field, batch);
      return;
    }
  }
  // The fields are the exception's (the bindings copy them to Python); the
  // text says the same for a person.
  fail_closed(WorkerDiedError(
      died + why +
          ". The loader is closed; start a new iteration to continue. A signal usually means the "
          "sample code crashed or ran out of memory (check dmesg for the OOM killer).",
      e->worker_id, static_cast<int>(e->pid), e->signaled ? std::nullopt : std::optional<int>(e->code),
      e->signaled ? std::optional<int>(e->code) : std::nullopt, sample_field, batch_field));
}

void Loader::replace_lost(const WorkerExit& e, const std::string& died, std::optional<int64_t> sample, int64_t batch) {
  deaths_.emplace_back(sample.value_or(-1), died);
  ++replaced_epoch_;
  ++replaced_total_;
  const auto w = static_cast<uint32_t>(e.worker_id);
  const BatchRing& r = ring_->ring;
  detail::WorkerRecord& rec = r.worker(w);
  // Its item, if it held one: the slot it named before claiming (batch_ring.hpp, WorkerContext::claim).
  const int32_t s = rec.slot.load(std::memory_order_acquire);
  if (s >= 0 && static_cast<uint32_t>(s) < r.geometry().num_slots &&
      std::find(inflight_.begin(), inflight_.end(), static_cast<uint32_t>(s)) != inflight_.end()) {
    const auto slot = static_cast<uint32_t>(s);
    SlotHeader& h = r.slot(slot);
    if (r.state(slot) == SlotState::kFilling && h.worker == e.worker_id) {
      post_again(slot);
    } else if (r.state(slot) == SlotState::kPosted && !r.queue(queue_of(h.stream)).holds(slot)) {
      // Claimed from the queue and not yet filling: by the lost worker, or by a live one an
      // instant from its own CAS on the state. Whoever wins this CAS has the slot; the consumer
      // posts it again, a live worker that lost goes on to its next item.
      auto expected = static_cast<uint32_t>(SlotState::kPosted);
      if (h.state.compare_exchange_strong(expected, static_cast<uint32_t>(SlotState::kFree), std::memory_order_acq_rel))
        post_again(slot);
    }
  }
  rec.slot.store(-1, std::memory_order_relaxed);
  rec.batch_id.store(-1, std::memory_order_relaxed);
  rec.sample_index.store(-1, std::memory_order_relaxed);
  rec.busy_since_ns.store(0, std::memory_order_relaxed);
  rec.pid.store(0, std::memory_order_relaxed);  // "starting" until the new process writes its own
  rec.started_ns.store(0, std::memory_order_relaxed);  // its start is not yet done
  restart(e.worker_id);
  std::lock_guard lock(pids_mu_);
  const std::string line = died + "; started again as pid " + std::to_string(pids_[w]) +
                           (batch >= 0 ? " and batch " + std::to_string(batch) + " posted again" : "") +
                           " (replacement " + std::to_string(replaced_epoch_) + " of at most " +
                           std::to_string(options_.max_replacements) + " this epoch).";
  if (options_.on_replaced) options_.on_replaced(line);
  else std::fprintf(stderr, "%s\n", line.c_str());
}

void Loader::post_again(uint32_t s) {
  SlotHeader& h = ring_->ring.slot(s);
  h.count = static_cast<uint32_t>(batches_.batch(static_cast<std::size_t>(h.batch_id)).size());
  post_slot(s);
}

void Loader::restart(int worker) {
  try {
    pool_->restart(worker);
  } catch (const std::system_error& e) {
    fail_closed("spindle: worker " + std::to_string(worker) + " was lost and could not be started again: " +
                    e.what() + ". The loader is closed.",
                false);
  } catch (...) {
    unstarted_.push_back(worker);  // a signal to raise first (the fork hooks): tried again at the next check
    throw;
  }
  refresh_pids();
}

void Loader::refresh_pids() {
  std::lock_guard lock(pids_mu_);
  pids_.clear();
  for (std::size_t w = 0; w < pool_->pids().size(); ++w)
    if (live_[w] != 0) pids_.push_back(pool_->pids()[w]);
  exits_ = pool_->exits();
}

void Loader::check_skips(bool final) {
  // Judged from the 100th sample on (one bad file in a first small batch is
  // no trend), and at the end of the epoch.
  if (!options_.max_skip_ratio || !(final || samples_seen_ >= 100)) return;
  const double ratio = *options_.max_skip_ratio;
  if (!(static_cast<double>(samples_skipped_) > ratio * static_cast<double>(std::max<uint64_t>(samples_seen_, 1))))
    return;
  const uint64_t skipped = samples_skipped_, seen = samples_seen_;
  samples_seen_ = samples_skipped_ = 0;  // raised once
  char limit[32];
  std::snprintf(limit, sizeof limit, "%g", ratio);
  stop_workers(std::chrono::milliseconds(100));
  throw SkipRatioError("spindle: " + std::to_string(skipped) + " of " + std::to_string(seen) +
                           " samples could not be read and were skipped, more than max_ratio=" + limit +
                           ". Fix or remove the files, or raise the ratio with .on_error('skip', max_ratio=...).",
                       skipped, seen, ratio);
}

std::optional<uint32_t> Loader::wait_for_delivery(const std::function<void()>& poll) {
  const BatchRing& r = ring_->ring;
  if (inflight_.empty()) SPINDLE_FAIL_INTERNAL("spindle: no batch in flight");
  auto& completed = r.header().completed;
  const auto start = std::chrono::steady_clock::now();
  auto stall_from = start;  // the stall clock runs once every worker has started
  bool warned = false;
  for (;;) {
    if (closed()) return std::nullopt;
    const uint32_t seq = completed.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < inflight_.size(); ++i) {
      const SlotState st = r.state(inflight_[i]);
      if (st == SlotState::kReady || st == SlotState::kFailed) {
        const uint32_t s = inflight_[i];
        inflight_.erase(inflight_.begin() + static_cast<std::ptrdiff_t>(i));
        return s;
      }
      if (options_.in_order) break;  // only the oldest batch may be delivered
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check_ >= kSupervisePeriod) {
      last_check_ = now;
      check_workers();
      if (poll) poll();
    }
    if (auto_ && wait_began_ != std::chrono::steady_clock::time_point{}) autoscale();  // next() waits
    if (advises() && advised_.load() != 0)  // nothing ready: the streams start again on the advised processes now
      throw ProcessesAdvised("spindle: next() stopped waiting: " + std::to_string(advised_.load()) +
                             " worker processes advised; start the streams again on them (advised_processes())");
    if (!warned && options_.stall_warning.count() > 0 && !workers_started()) stall_from = now;
    if (!warned && options_.stall_warning.count() > 0 && now - stall_from >= options_.stall_warning) {
      warned = true;  // once per wait
      const uint32_t s = inflight_.front();
      const std::string message = "spindle: next() has waited " + seconds(options_.stall_warning) +
                                  " s for batch " + std::to_string(r.slot(s).batch_id) + " (" + describe_holder(s) +
                                  "); workers: " + describe_workers() +
                                  ". A busy worker is slow in that sample (decode, I/O, a remote shard); an idle "
                                  "one had no batch posted to it. Silence with stall_warning=0.";
      if (options_.on_stall) options_.on_stall(message);
      else std::fprintf(stderr, "%s\n", message.c_str());
    }
    if (options_.timeout.count() > 0 && now - start >= options_.timeout) {
      const uint32_t s = inflight_.front();
      const auto b = static_cast<std::size_t>(r.slot(s).batch_id);
      fail_closed("spindle: DataLoader timed out after " + seconds(options_.timeout) +
                      " seconds: no batch arrived; waiting for batch " + std::to_string(b) + " " +
                      describe_batch(b) + ", " + describe_holder(s) +
                      ". Raise timeout, or find out why this sample is slow. The loader is closed.",
                  true);
    }
    // The controller's looks are not held to the supervision's period: an early look at 20 ms
    // waited for the next 50-ms tick would cost the I/O-bound loader it is for a tick of waiting.
    auto sleep = std::chrono::duration_cast<std::chrono::microseconds>(kSupervisePeriod);
    if (auto_) sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::microseconds>(next_look(now)));
    detail::futex_wait(&completed, seq, sleep);
  }
}

}  // namespace spindle
