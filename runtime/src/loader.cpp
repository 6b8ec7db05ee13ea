// Loader: construction (budget, ring, workers from the Launcher) and the
// consumer protocol: posting batches into free slots, delivering them as
// leases, and new epochs. Supervision (waiting, worker deaths, timeouts,
// closing) is in loader_supervision.cpp; the Batch lease in batch.cpp.
#include <spindle/loader.hpp>

#include <cstdlib>

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <cstring>
#include <stdexcept>

#include <spindle/detail/arena.hpp>
#include <spindle/detail/worker_pool.hpp>
#include <spindle/error.hpp>

#include "loader_internal.hpp"

namespace spindle {
using detail::SlotState;
using detail::Arena;
using detail::SlotHeader;
using detail::RingGeometry;
using detail::BatchRing;
using detail::forked_workers;
using detail::spawned_workers;
using detail::zygote_workers;
using detail::WorkerPool;
using detail::kSlotExhausted;
using detail::kSlotNewStream;

Loader::Loader(const LoaderOptions& options, BatchPlan batches, Launcher launcher)
    : options_(options), batches_(std::move(batches)) {
  prepare(/*threads=*/launcher.kind() == Launcher::Kind::kThreads);
  launch(launcher);
  start();
}

void Loader::launch(Launcher& launcher) {
  const BatchRing ring = ring_->ring;
  const int segment_fd = ring_->segment.fd();  // inherited by the forks: slots grow through it
  // Adaptive: one process now, more as autoscale() finds them needed (up to options_.num_workers).
  const int n = running_.load();
  switch (launcher.kind()) {
    case Launcher::Kind::kFork: {
      const pid_t consumer = getpid();
      // Kept by the Loader: a lost worker's replacement is forked later (max_replacements).
      worker_main_ = std::make_shared<WorkerMain>(std::move(launcher.main_));
      // Each worker is marked started as soon as it is forked: from then on
      // /proc counts it, and the ledger must not count it as pending too.
      ForkHooks counted = launcher.hooks_;
      counted.after_fork_parent = [this, parent = launcher.hooks_.after_fork_parent] {
        if (parent) parent();
        leases_->ledger.started(1);
      };
      pool_ = std::make_unique<WorkerPool>(
          n,
          forked_workers(
              [main = worker_main_.get(), ring, consumer, segment_fd](int w) {
                ring.worker(static_cast<uint32_t>(w)).pid.store(getpid(), std::memory_order_relaxed);
                WorkerContext ctx(ring, w, consumer, segment_fd);
                return (*main)(ctx);
              },
              std::move(counted)));
      return;
    }
    case Launcher::Kind::kZygote:
      pool_ = std::make_unique<WorkerPool>(n, zygote_workers(*launcher.zygote_, launcher.zygote_main_, segment_fd));
      leases_->ledger.started(n);
      return;
    case Launcher::Kind::kSpawn:
      pool_ = std::make_unique<WorkerPool>(n, spawned_workers(launcher.spawn_, segment_fd));
      leases_->ledger.started(n);
      return;
    case Launcher::Kind::kThreads: {
      const pid_t parent = getppid();  // a worker thread stops if this process is orphaned, as a forked one does
      auto main = std::make_shared<WorkerMain>(std::move(launcher.main_));
      threads_ = Arena::global().start(n, [ring, parent, segment_fd, main](int w) {
        // The record names the thread (its tid) where a process would be named.
        ring.worker(static_cast<uint32_t>(w)).pid.store(static_cast<int32_t>(gettid()), std::memory_order_relaxed);
        WorkerContext ctx(ring, w, parent, segment_fd);
        (*main)(ctx);
      });
      return;
    }
  }
}

void Loader::prepare(bool threads) {
  const LoaderOptions& options = options_;
  if (options.adaptive) {
    const bool streams = options.round_robin && options.logical_workers;
    if ((options.round_robin && !streams) || options.assign_in_turn || threads)
      SPINDLE_THROW(std::invalid_argument, "spindle: adaptive processes need planned batches that any worker may take, "
                                           "or streams with logical workers: not assign_in_turn, round_robin without "
                                           "logical_workers, or worker threads");
    if (options.num_workers == 0) {  // the core's choice of the most processes
      if (streams)
        SPINDLE_THROW(std::invalid_argument, "spindle: adaptive streams need their logical workers (num_workers; "
                                             "auto_workers() is the core's choice)");
      options_.num_workers = auto_workers(options.budget_sources);
    }
  }
  if (options.processes < 0)
    SPINDLE_THROW(std::invalid_argument, "spindle: processes must be >= 0 (got " + std::to_string(options.processes) + ")");
  if (options.num_workers < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: a Loader needs num_workers >= 1 (got " +
                                             std::to_string(options.num_workers) + ")");
  if (options.batch_capacity < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: batch_capacity must be >= 1");
  if (options.prefetch_factor < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: prefetch_factor must be >= 1 (got " +
                                             std::to_string(options.prefetch_factor) + ")");
  check_batches(batches_);
  // The switches every front end shares, whatever its signature (docs/observability.md).
  if (const char* e = std::getenv("SPINDLE_STATS"); e && std::string(e) == "0") options_.stats = false;
  if (const char* e = std::getenv("SPINDLE_STALL_WARNING"); e && *e) {
    char* end = nullptr;
    const double sec = std::strtod(e, &end);
    if (end == e || *end != '\0' || !(sec >= 0))
      SPINDLE_THROW(std::invalid_argument, "spindle: SPINDLE_STALL_WARNING must be seconds >= 0 (0: no warning), not '" +
                                               std::string(e) + "'");
    options_.stall_warning = std::chrono::milliseconds(static_cast<int64_t>(sec * 1000));
  }
  // Address space, not memory, but it must fit the 47-bit user address space.
  constexpr uint64_t kMaxWindow = uint64_t{1} << 40;
  if (options.max_batch_bytes < 1 || options.max_batch_bytes > kMaxWindow || options.slot_bytes > kMaxWindow)
    SPINDLE_THROW(std::invalid_argument, "spindle: max_batch_bytes must be in [1, 1 TiB] and slot_bytes at most "
                                         "1 TiB (got max_batch_bytes=" + std::to_string(options.max_batch_bytes) +
                                             ", slot_bytes=" + std::to_string(options.slot_bytes) + ")");

  BudgetSources sources = options.budget_sources;
  if (options.max_threads) sources.user_cap = options.max_threads;
  if (options.fed && options.round_robin)
    SPINDLE_THROW(std::invalid_argument, "spindle: a Loader is fed planned batches or runs streams, not both");
  if (options.first_worker < 0 || options.first_worker >= options.num_workers)
    SPINDLE_THROW(std::invalid_argument, "spindle: first_worker must be in [0, num_workers)");
  // The ledger grants the plan (possibly fewer workers, per budget_policy)
  // and records it before anything is forked; see budget_ledger.hpp.
  requested_workers_ = options.num_workers;
  const bool logical = options.logical_workers && (options.round_robin || options.assign_in_turn);
  // Logical workers on the processes a front end chose (LoaderOptions::processes), or on all of them;
  // adaptive streams with none chosen on the cores idle now (their processes are all started).
  // Adaptive, any worker taking any batch: the processes the front end chose (its last epoch's), or
  // the cores idle now.
  const bool chosen = logical && options.processes > 0;
  const int first = !options.adaptive || chosen ? 0
                    : options.processes > 0     ? std::min(options_.num_workers, options.processes)
                                                : std::min(options_.num_workers, idle_cores_now(ThreadBudget(sources).cpus()));
  int processes = options_.num_workers;
  if (chosen) processes = std::min(options.processes, options_.num_workers);
  else if (advises()) processes = first;
  if (options.reserve_tasks < 0 || options.worker_tasks < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: reserve_tasks must be >= 0 and worker_tasks >= 1 (got " +
                                             std::to_string(options.reserve_tasks) + " and " +
                                             std::to_string(options.worker_tasks) + ")");
  LedgerGrant grant = BudgetLedger::global().acquire(
      processes, options.budget_policy, options.timeout, [&] { return ThreadBudget(sources); },
      options.budget_poll, StartNeeds{options.reserve_tasks, options.worker_tasks});
  plan_ = grant.plan;
  leases_ = std::make_unique<LoaderLeases>();
  leases_->ledger = std::move(grant.lease);
  budget_note_ = std::move(grant.note);
  options_.num_workers = plan_.num_workers;
  if (options_.max_replacements == kReplaceEachWorker)  // the workers asked, or the most the core chose ("auto")
    options_.max_replacements = replacement_limit(requested_workers_ > 0 ? requested_workers_ : plan_.num_workers);
  // Adaptive: the cores idle now, more as autoscale() finds them needed; adaptive streams run all
  // they were given (the controller's changes are advice: advised_processes()).
  running_.store(options.adaptive && !advises() ? std::min(first, plan_.num_workers) : plan_.num_workers);
  live_.assign(static_cast<std::size_t>(plan_.num_workers), 0);
  std::fill(live_.begin(), live_.begin() + running_.load(), 1);
  // Adaptive processes, and a fixed count where any worker takes any batch under a finite budget:
  // the processes follow the budget while batches flow (loader_autoscale.cpp).
  const bool shared_queue = !options.round_robin && !options.assign_in_turn && !threads;
  if (options.adaptive || (shared_queue && plan_.budget != kUnlimited)) {
    auto_ = std::make_unique<AutoScale>();
    auto_->cpus = ThreadBudget(sources).cpus();
    auto_->samples_at_start.assign(static_cast<std::size_t>(plan_.num_workers), 0);
    auto_->granted_less = chosen && advises() && plan_.num_workers < processes;
  }
  logical_ = static_cast<uint32_t>(logical ? requested_workers_ : plan_.num_workers);
  if (logical && !budget_note_.empty()) {
    // The ledger's "N workers asked, P started: <why>" said as what it means here:
    // the data is still N workers', only fewer processes run them.
    const std::string started = " started: ";
    const auto at = budget_note_.find(started);
    const std::string why = at == std::string::npos ? budget_note_ : budget_note_.substr(at + started.size());
    budget_note_ = "spindle: " + std::to_string(requested_workers_) + " logical workers on " +
                   std::to_string(plan_.num_workers) + " processes (" + why +
                   ") The data is that of " + std::to_string(requested_workers_) +
                   " workers; fewer processes only run it with less parallel CPU.";
  }
  // The arena runs the sum of its live leases; this loader's is what its
  // ledger lease was granted: the plan's arena threads (within cpus - 1 for
  // the whole process) and, in threads mode, the workers, which are arena
  // threads.
  leases_->arena = Arena::global().lease(plan_.arena_threads + (threads ? plan_.num_workers : 0));

  const auto nw = static_cast<uint32_t>(options.num_workers);
  // No ring yet: it is sized from the most processes' target; the target is that of those running.
  const uint32_t most = inflight_target(std::numeric_limits<std::size_t>::max(), options_.num_workers);
  inflight_target_ = inflight_target(most, running_.load());
  active_.assign(logical_, true);
  outstanding_.assign(logical_, 0);
  // Checked against the workers asked for; with fewer processes (kShrink) and
  // no logical workers the turn wraps.
  next_worker_ = static_cast<uint32_t>(options.first_worker) % logical_;
  // Two slots beyond what is in flight: the batch the user is working on and
  // one more they may keep, before copy-out kicks in.
  RingGeometry g;
  g.num_slots = most + 2;
  g.num_workers = nw;
  g.batch_capacity = options.batch_capacity;
  g.slot_bytes = options.slot_bytes;
  g.slot_window = std::max(options.max_batch_bytes, options.slot_bytes);
  g.round_robin = options.round_robin || options.assign_in_turn;
  g.logical_workers = logical_;
  const std::size_t bytes = BatchRing::bytes_for(g);
  const std::string what = "the batch ring (" + std::to_string(g.num_slots) + " slots)";
  // Sparse: the fixed part now, each slot's first bytes below, the rest as
  // workers need it (slots grow in place).
  ring_ = std::make_shared<RingStorage>(bytes, BatchRing::fixed_bytes_for(g), what);
  ring_->ring = BatchRing::create(ring_->segment.data(), g);
  ring_->ring.header().stats = options.stats ? 1 : 0;
  baseline_.assign(nw, WorkerBaseline{});
  assigned_.assign(g.num_slots, -1);
  stats_since_ = std::chrono::steady_clock::now();
  // An adaptive loader's ring has slots for its most processes, but only those its first process keeps
  // in flight start with their payload reserved (here, and mapped again in every worker forked): the
  // others start with the minimum and grow in place when a worker first fills them. (A native
  // pipeline's slot is megabytes: reserving 34 of them took iter() 0.2 s.)
  const uint32_t up_front = options.adaptive && !advises() ? std::min<uint32_t>(g.num_slots, inflight_target_ + 2)
                                                           : g.num_slots;
  for (uint32_t s = up_front; s < g.num_slots; ++s) ring_->ring.slot(s).reserved = BatchRing::kMinSlotStride;
  for (uint32_t s = 0; s < g.num_slots; ++s)
    ring_->segment.reserve(static_cast<std::size_t>(ring_->ring.payload(s) - ring_->segment.data()),
                           ring_->ring.slot(s).reserved, what);
}

void Loader::check_batches(const BatchPlan& batches) const {
  for (std::size_t b = 0; b < batches.size(); ++b)
    if (batches.batch(b).empty() || batches.batch(b).size() > options_.batch_capacity)
      SPINDLE_THROW(std::invalid_argument, "spindle: batch " + std::to_string(b) + " has " +
                                               std::to_string(batches.batch(b).size()) +
                                               " samples; every batch needs 1.." +
                                               std::to_string(options_.batch_capacity));
}

void Loader::reset(BatchPlan batches) {
  std::lock_guard op(op_mu_);
  if (closed() && broken_.empty()) SPINDLE_THROW(std::logic_error, "spindle: reset() on a closed Loader");
  rethrow_if_broken();
  if (options_.round_robin)
    SPINDLE_THROW(std::logic_error, "spindle: reset() needs planned batches; a round-robin (stream) loader "
                                    "cannot restart its workers' streams");
  if (!pool_ && !threads_) SPINDLE_THROW(std::logic_error, "spindle: reset() on a closed Loader");
  check_batches(batches);
  drain_inflight();
  batches_ = std::move(batches);
  next_post_ = 0;
  delivered_ = 0;
  feed_ended_ = false;
  replaced_epoch_ = 0;
  deaths_.clear();
  samples_seen_ = samples_skipped_ = 0;
  inflight_target_ = inflight_target(ring_->ring.geometry().num_slots - 2, running_.load());
  post_more();
}

uint32_t Loader::inflight_target(std::size_t room, int workers) const noexcept {
  // workers * prefetch_factor batches in flight (the processes: after a shrink, fewer; adaptive, those
  // running), no more than the epoch has (streams and fed plans: not known up front) or the ring has
  // room for, at least one.
  const auto want = static_cast<std::size_t>(workers) * static_cast<std::size_t>(options_.prefetch_factor);
  const std::size_t known = options_.round_robin || options_.fed ? want : batches_.size();
  return static_cast<uint32_t>(std::max<std::size_t>(1, std::min({want, known, room})));
}

void Loader::feed(BatchPlan more) {
  std::lock_guard op(op_mu_);
  rethrow_if_broken();
  if (!options_.fed) SPINDLE_THROW(std::logic_error, "spindle: feed() needs a fed Loader (LoaderOptions::fed)");
  if (feed_ended_) SPINDLE_THROW(std::logic_error, "spindle: feed() after end_feed() in the same epoch");
  if (closed()) return;  // closed from another thread: nothing more is loaded
  // Numbered after the batches already fed, so an error names the epoch's batch.
  for (std::size_t b = 0; b < more.size(); ++b)
    if (more.batch(b).empty() || more.batch(b).size() > options_.batch_capacity)
      SPINDLE_THROW(std::invalid_argument, "spindle: batch " + std::to_string(batches_.size() + b) + " has " +
                                               std::to_string(more.batch(b).size()) +
                                               " samples; every batch needs 1.." +
                                               std::to_string(options_.batch_capacity));
  batches_.append(more);
  post_more();
}

void Loader::end_feed() {
  std::lock_guard op(op_mu_);
  rethrow_if_broken();
  if (!options_.fed) SPINDLE_THROW(std::logic_error, "spindle: end_feed() needs a fed Loader (LoaderOptions::fed)");
  feed_ended_ = true;
}

void Loader::drain_inflight() {
  // Items no worker has claimed yet are taken back from the queues (the
  // consumer claims them itself: the queues allow any number of claimers);
  // those being filled finish, since their slots are written by workers. All
  // are discarded, and the ring is then empty of work.
  const BatchRing& r = ring_->ring;
  for (uint32_t q = 0; q < r.num_queues(); ++q)
    while (auto s = r.queue(q).try_claim()) {
      r.set_state(*s, SlotState::kFree);  // kPosted -> kFree: the consumer won the claim, the slot is its own
      if (auto it = std::find(inflight_.begin(), inflight_.end(), *s); it != inflight_.end()) inflight_.erase(it);
    }
  while (!inflight_.empty()) {
    const auto s = wait_for_delivery({});
    if (!s) SPINDLE_THROW(std::logic_error, "spindle: the Loader was closed during reset()");
    r.set_state(*s, SlotState::kFree);
  }
  std::fill(outstanding_.begin(), outstanding_.end(), 0);
  std::fill(assigned_.begin(), assigned_.end(), -1);
}

void Loader::reset_streams(int first_worker, std::vector<std::string> messages) {
  std::lock_guard op(op_mu_);
  if (closed() && broken_.empty()) SPINDLE_THROW(std::logic_error, "spindle: reset_streams() on a closed Loader");
  rethrow_if_broken();
  if (!options_.round_robin)
    SPINDLE_THROW(std::logic_error, "spindle: reset_streams() needs a round-robin (stream) loader; a loader of "
                                    "planned batches starts a new epoch with reset(batches)");
  if (!pool_ && !threads_) SPINDLE_THROW(std::logic_error, "spindle: reset_streams() on a closed Loader");
  const auto nw = static_cast<std::size_t>(logical_);
  if (first_worker < 0 || static_cast<std::size_t>(first_worker) >= nw)
    SPINDLE_THROW(std::invalid_argument, "spindle: reset_streams(first_worker=" + std::to_string(first_worker) +
                                             ") must name one of the " + std::to_string(nw) + " workers");
  if (!messages.empty() && messages.size() != nw)
    SPINDLE_THROW(std::invalid_argument, "spindle: reset_streams() got " + std::to_string(messages.size()) +
                                             " start messages for " + std::to_string(nw) + " workers");
  const uint64_t window = ring_->ring.header().slot_stride;
  for (std::size_t w = 0; w < messages.size(); ++w)
    if (messages[w].size() > window || messages[w].size() > UINT32_MAX)
      SPINDLE_THROW(std::invalid_argument, "spindle: the start message for worker " + std::to_string(w) + " has " +
                                               std::to_string(messages[w].size()) + " bytes, more than a slot holds (" +
                                               std::to_string(window) + "); raise max_batch_bytes");
  drain_inflight();
  messages.resize(nw);
  messages_ = std::move(messages);
  restart_.assign(nw, true);
  active_.assign(nw, true);
  next_worker_ = static_cast<uint32_t>(first_worker);
  next_post_ = 0;
  delivered_ = 0;
  samples_seen_ = samples_skipped_ = 0;
  post_more();
}

void Loader::start() {
  if (pool_) refresh_pids();
  last_check_ = std::chrono::steady_clock::now();
  post_more();
}

bool Loader::more_to_post(bool fed_pending) const {
  if (options_.round_robin) return std::find(active_.begin(), active_.end(), true) != active_.end();
  // A fed loader whose feed is open will be given more (the consumer draws after each batch).
  return next_post_ < batches_.size() || (fed_pending && options_.fed && !feed_ended_);
}

void Loader::post_slot(uint32_t s) {
  const BatchRing& r = ring_->ring;
  SlotHeader& h = r.slot(s);
  h.worker = -1;
  h.error_bytes = 0;
  h.failure = h.failure_path_bytes = h.failure_key_bytes = h.skipped = 0;
  h.stream_position = 0;
  write_raw_descriptor(r.descriptor(s));
  r.set_state(s, SlotState::kPosted);
  r.queue(queue_of(h.stream)).post(s);
}

uint32_t Loader::queue_of(int32_t stream) const noexcept {
  // Logical worker l's items go to process l mod P's queue; items for whoever is free to queue 0.
  return stream >= 0 ? 1 + static_cast<uint32_t>(stream) % static_cast<uint32_t>(options_.num_workers) : 0;
}

void Loader::post_more() {
  const BatchRing& r = ring_->ring;
  const uint32_t n = r.geometry().num_slots;
  const auto nw = logical_;  // turns go over the logical workers; l's items to process l mod P
  uint32_t s = 0;
  while (inflight_.size() < inflight_target_ && more_to_post(/*fed_pending=*/false)) {
    while (s < n && r.state(s) != SlotState::kFree) ++s;
    if (s == n) return;  // every other slot is leased by the user
    SlotHeader& h = r.slot(s);
    h.flags = 0;
    h.message_bytes = 0;
    int32_t stream = -1;
    if (options_.round_robin) {
      // Task k goes to the next worker whose stream has not ended, in turn; out of order, as torch
      // does, to the next one with fewer than its share of the tasks outstanding (the share grows
      // as streams end), so a slow worker is skipped.
      if (options_.in_order) {
        while (!active_[next_worker_]) next_worker_ = (next_worker_ + 1) % nw;
      } else {
        const auto alive = static_cast<uint32_t>(std::count(active_.begin(), active_.end(), true));
        const uint32_t share = std::max<uint32_t>(1, static_cast<uint32_t>(options_.prefetch_factor) * nw / alive);
        uint32_t tried = 0;
        while (tried < nw && (!active_[next_worker_] || outstanding_[next_worker_] >= share)) {
          next_worker_ = (next_worker_ + 1) % nw;
          ++tried;
        }
        if (tried == nw) return;  // every open stream has its share: wait for a delivery
      }
      if (!restart_.empty() && restart_[next_worker_]) {
        // The first item of this worker's new stream carries its start message.
        const std::string& m = messages_[next_worker_];
        if (m.size() > h.reserved) {
          const uint64_t want = std::min<uint64_t>(
              r.header().slot_stride, (m.size() + BatchRing::kPayloadAlign - 1) / BatchRing::kPayloadAlign *
                                          BatchRing::kPayloadAlign);
          ring_->segment.reserve(static_cast<std::size_t>(r.payload(s) - ring_->segment.data()),
                                 static_cast<std::size_t>(want),
                                 "the start message of worker " + std::to_string(next_worker_));
          h.reserved = want;
        }
        std::memcpy(r.payload(s), m.data(), m.size());
        h.message_bytes = static_cast<uint32_t>(m.size());
        h.flags = kSlotNewStream;
        restart_[next_worker_] = false;
      }
      h.count = options_.batch_capacity;
      stream = static_cast<int32_t>(next_worker_);
      next_worker_ = (next_worker_ + 1) % nw;
    } else {
      const auto idx = batches_.batch(next_post_);
      h.count = static_cast<uint32_t>(idx.size());
      std::copy(idx.begin(), idx.end(), r.indices(s));
      // Batch k to worker k mod N when assignment is fixed, else to whoever is free.
      if (options_.assign_in_turn) stream = static_cast<int32_t>(next_post_ % nw);
      if (options_.assign_in_turn && !options_.in_order) {
        // Out of order, torch gives the batch to the next worker in turn with fewer than
        // prefetch_factor batches outstanding: a slow worker is skipped and its own batches
        // wait for it, the others go on.
        uint32_t w = next_worker_ % nw, tried = 0;
        while (tried < nw && outstanding_[w] >= static_cast<uint32_t>(options_.prefetch_factor)) {
          w = (w + 1) % nw;
          ++tried;
        }
        if (tried == nw) return;  // every worker has its share: wait for a delivery
        next_worker_ = (w + 1) % nw;
        stream = static_cast<int32_t>(w);
      }
    }
    h.stream = stream;
    h.batch_id = static_cast<int64_t>(next_post_++);
    post_slot(s);
    inflight_.push_back(s);
    assigned_[s] = stream;
    if (stream >= 0) ++outstanding_[static_cast<std::size_t>(stream)];
  }
}

std::optional<Batch> Loader::next(const std::function<void()>& poll) {
  std::lock_guard op(op_mu_);
  const auto entered = options_.stats ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  rethrow_if_broken();
  if (closed()) return std::nullopt;
  const BatchRing& r = ring_->ring;
  uint32_t s = 0;
  for (;;) {
    if (!options_.round_robin && delivered_ == batches_.size()) {
      if (options_.fed && !feed_ended_)
        SPINDLE_THROW(std::logic_error, "spindle: next() on a fed Loader with every batch fed delivered and the "
                                        "feed not ended: feed() more batches or end_feed() first");
      check_skips(/*final=*/true);
      return std::nullopt;
    }
    post_more();
    if (options_.round_robin && inflight_.empty()) {  // every stream ended
      check_skips(/*final=*/true);
      return std::nullopt;
    }
    if (auto_) {
      // The first window starts as the consumer first asks: what it does before (building a model,
      // compiling) is no wait of its.
      if (auto_->since == std::chrono::steady_clock::time_point{}) autoscale();
      wait_began_ = std::chrono::steady_clock::now();
    }
    const auto got = [&] {
      struct Waited {  // next() waits no more, however wait_for_delivery ends
        Loader& l;
        ~Waited() {
          if (l.auto_) {
            l.auto_->waited_ns += static_cast<uint64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                     std::max(l.wait_began_, l.auto_->since))
                    .count());
            l.wait_began_ = {};
          }
        }
      } waited{*this};
      return wait_for_delivery(poll);
    }();
    if (!got) return std::nullopt;  // closed meanwhile
    s = *got;
    ++delivered_;
    if (assigned_[s] >= 0) --outstanding_[static_cast<std::size_t>(assigned_[s])];
    SlotHeader& done = r.slot(s);
    if (r.state(s) == SlotState::kReady && (done.flags & kSlotExhausted)) {
      // The logical worker whose stream ended (posted with the item).
      if (done.stream >= 0) active_[static_cast<std::size_t>(done.stream)] = false;
      r.set_state(s, SlotState::kFree);
      continue;
    }
    break;
  }
  SlotHeader& h = r.slot(s);
  if (r.state(s) == SlotState::kFailed) {
    // The failure record (batch_ring.hpp): report, then path, then key.
    const char* record = reinterpret_cast<const char*>(r.payload(s));
    std::string payload(record, h.error_bytes);
    std::string path(record + h.error_bytes, h.failure_path_bytes);
    std::string key(record + h.error_bytes + h.failure_path_bytes, h.failure_key_bytes);
    const auto kind = static_cast<FailureKind>(h.failure);
    const int worker = h.worker;
    const int pid = worker >= 0 ? r.worker(static_cast<uint32_t>(worker)).pid.load() : 0;
    const int64_t batch = h.batch_id;
    r.set_state(s, SlotState::kFree);
    post_more();
    // Built before the throw: the payload is moved into the exception.
    std::string what = "spindle: worker " + std::to_string(worker) + " (pid " + std::to_string(pid) +
                       ") failed to produce batch " + std::to_string(batch) + ": " + payload;
    throw BatchFailedError(what, worker, pid, batch, std::move(payload), kind, std::move(path), std::move(key));
  }
  samples_seen_ += h.count;
  samples_skipped_ += h.skipped;
  if (h.skipped) {
    try {
      check_skips(/*final=*/false);
    } catch (...) {
      r.set_state(s, SlotState::kFree);
      throw;
    }
  }
  r.set_state(s, SlotState::kLeased);
  Batch batch = [&] {
    try {
      return Batch(ring_, s);
    } catch (...) {  // a descriptor the worker garbled: the slot goes back, the error to the caller
      r.set_state(s, SlotState::kFree);
      throw;
    }
  }();
  // The batches the user keeps must not starve the workers (torch's are not limited by what the
  // user holds): when no slot is free to post the next batch into while fewer than the target are
  // in flight and more are to come, this batch is copied out and its slot goes back to work.
  post_more();
  bool slot_free = false;
  for (uint32_t i = 0; i < r.geometry().num_slots && !slot_free; ++i) slot_free = r.state(i) == SlotState::kFree;
  if (!slot_free && inflight_.size() < inflight_target_ && more_to_post(/*fed_pending=*/true)) {
    batch.copy_out();
    ++copied_out_;
    post_more();
  }
  if (options_.stats) record_wait(entered, h.count, h.skipped);
  if (auto_) autoscale();
  return batch;
}

}  // namespace spindle
