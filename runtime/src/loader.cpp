#include <spindle/loader.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include <spindle/detail/arena.hpp>
#include <spindle/error.hpp>
#include <spindle/detail/shm_segment.hpp>

namespace spindle {

struct RingStorage {
  RingStorage(std::size_t bytes, std::size_t reserve, const std::string& what) : segment(bytes, what, reserve) {}
  ShmSegment segment;
  BatchRing ring;
};

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
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return "gone";
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* paren = static_cast<const char*>(memrchr(buf, ')', n));
  const char state = paren && paren + 2 < buf + n ? paren[2] : '?';
  switch (state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible sleep (I/O)";
    case 'T': return "stopped (SIGSTOP/SIGTSTP)";
    case 't': return "stopped by a debugger";
    case 'Z': return "a zombie";
    default: return std::string("in state '") + state + "'";
  }
}

// 2000 ms -> "2", 1500 ms -> "1.5" (as torch prints its timeout).
std::string seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(ms.count()) / 1000.0);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------- batches

Batch::Batch(std::shared_ptr<RingStorage> ring, uint32_t slot) : ring_(std::move(ring)), slot_(slot) {
  const BatchRing& r = ring_->ring;
  const SlotHeader& h = r.slot(slot);
  batch_id_ = h.batch_id;
  skipped_ = h.skipped;
  indices_ = {r.indices(slot), h.count};
  contents_ = read_descriptor(r.descriptor(slot), h.reserved);
  const uint64_t used = contents_.kind == PayloadKind::kRaw
                            ? std::min<uint64_t>(r.geometry().slot_bytes, h.reserved)
                            : contents_.data_bytes;
  data_ = {r.payload(slot), static_cast<std::size_t>(used)};
}

void Batch::check_field(std::size_t i, std::size_t item) const {
  if (kind() != PayloadKind::kArrays || i >= layout().num_fields())
    SPINDLE_THROW(std::invalid_argument, "spindle: batch " + std::to_string(batch_id_) + " has no array field " +
                                             std::to_string(i));
  if (layout().itemsize(i) != item)
    SPINDLE_THROW(std::invalid_argument, "spindle: field " + std::to_string(i) + " holds '" +
                                             layout().field(i).dtype + "' items of " +
                                             std::to_string(layout().itemsize(i)) + " bytes, not " +
                                             std::to_string(item));
}

Batch::Batch(Batch&& o) noexcept { *this = std::move(o); }

Batch& Batch::operator=(Batch&& o) noexcept {
  if (this != &o) {
    release();
    ring_ = std::move(o.ring_);
    slot_ = o.slot_;
    batch_id_ = o.batch_id_;
    skipped_ = o.skipped_;
    indices_ = o.indices_;
    data_ = o.data_;
    contents_ = std::move(o.contents_);
    owned_ = std::move(o.owned_);  // moving keeps the buffers, so the spans stay valid
    owned_indices_ = std::move(o.owned_indices_);
    owned_descriptor_ = std::move(o.owned_descriptor_);
  }
  return *this;
}

Batch::~Batch() { release(); }

void Batch::release() noexcept {
  if (ring_) ring_->ring.set_state(slot_, SlotState::kFree);
  ring_.reset();
}

void Batch::copy_out() {
  owned_.resize(data_.size());
  Arena::global().parallel_copy(owned_.data(), data_.data(), data_.size());
  owned_indices_.assign(indices_.begin(), indices_.end());
  const std::byte* desc = ring_->ring.descriptor(slot_);
  owned_descriptor_.assign(desc, desc + kDescriptorBytes);
  data_ = owned_;
  indices_ = owned_indices_;
  if (contents_.kind == PayloadKind::kArrays)  // the structure bytes now live in our copy
    contents_.structure = std::string_view(
        reinterpret_cast<const char*>(owned_descriptor_.data()) +
            (contents_.structure.data() - reinterpret_cast<const char*>(desc)),
        contents_.structure.size());
  release();
}

// ---------------------------------------------------------------- consumer side

Loader::Loader(const LoaderOptions& options, BatchPlan batches, WorkerMain worker_main,
               const ForkHooks& hooks)
    : options_(options), batches_(std::move(batches)) {
  prepare();
  const BatchRing ring = ring_->ring;
  const pid_t consumer = getpid();
  const int segment_fd = ring_->segment.fd();  // inherited by the forks: slots grow through it
  // Each worker is marked started as soon as it is forked: from then on /proc
  // counts it, and the ledger must not count it as pending too.
  ForkHooks counted = hooks;
  counted.after_fork_parent = [this, parent = hooks.after_fork_parent] {
    if (parent) parent();
    ledger_lease_.started(1);
  };
  pool_ = std::make_unique<WorkerPool>(
      options_.num_workers,
      [&](int w) {
        ring.worker(static_cast<uint32_t>(w)).pid.store(getpid(), std::memory_order_relaxed);
        WorkerContext ctx(ring, w, consumer, segment_fd);
        return worker_main(ctx);
      },
      counted);
  start();
}

Loader::Loader(const LoaderOptions& options, BatchPlan batches, Zygote& zygote,
               const std::string& main)
    : options_(options), batches_(std::move(batches)) {
  prepare();
  pool_ = std::make_unique<WorkerPool>(options_.num_workers, zygote, main, ring_->segment.fd());
  ledger_lease_.started(plan_.num_workers);
  start();
}

Loader::Loader(const LoaderOptions& options, BatchPlan batches, const SpawnSpec& spawn)
    : options_(options), batches_(std::move(batches)) {
  prepare();
  pool_ = std::make_unique<WorkerPool>(options_.num_workers, spawn, ring_->segment.fd());
  ledger_lease_.started(plan_.num_workers);
  start();
}

Loader::Loader(const LoaderOptions& options, BatchPlan batches, WorkerMain worker_main, ArenaThreads)
    : options_(options), batches_(std::move(batches)) {
  prepare(/*threads=*/true);
  const BatchRing ring = ring_->ring;
  const pid_t parent = getppid();  // a worker thread stops if this process is orphaned, as a forked one does
  const int segment_fd = ring_->segment.fd();
  auto main = std::make_shared<WorkerMain>(std::move(worker_main));
  threads_ = Arena::global().start(options.num_workers, [ring, parent, segment_fd, main](int w) {
    // The record names the thread (its tid) where a process would be named.
    ring.worker(static_cast<uint32_t>(w)).pid.store(static_cast<int32_t>(gettid()), std::memory_order_relaxed);
    WorkerContext ctx(ring, w, parent, segment_fd);
    (*main)(ctx);
  });
  start();
}

void Loader::prepare(bool threads) {
  const LoaderOptions& options = options_;
  if (options.num_workers < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: a Loader needs num_workers >= 1 (got " +
                                             std::to_string(options.num_workers) + ")");
  if (options.batch_capacity < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: batch_capacity must be >= 1");
  if (options.prefetch_factor < 1)
    SPINDLE_THROW(std::invalid_argument, "spindle: prefetch_factor must be >= 1 (got " +
                                             std::to_string(options.prefetch_factor) + ")");
  check_batches(batches_);
  // Address space, not memory, but it must fit the 47-bit user address space.
  constexpr uint64_t kMaxWindow = uint64_t{1} << 40;
  if (options.max_batch_bytes < 1 || options.max_batch_bytes > kMaxWindow || options.slot_bytes > kMaxWindow)
    SPINDLE_THROW(std::invalid_argument, "spindle: max_batch_bytes must be in [1, 1 TiB] and slot_bytes at most "
                                         "1 TiB (got max_batch_bytes=" + std::to_string(options.max_batch_bytes) +
                                             ", slot_bytes=" + std::to_string(options.slot_bytes) + ")");

  BudgetSources sources = options.budget_sources;
  if (options.max_threads) sources.user_cap = options.max_threads;
  if (options.first_worker < 0 || options.first_worker >= options.num_workers)
    SPINDLE_THROW(std::invalid_argument, "spindle: first_worker must be in [0, num_workers)");
  // The ledger grants the plan (possibly fewer workers, per budget_policy)
  // and records it before anything is forked; see budget_ledger.hpp.
  requested_workers_ = options.num_workers;
  LedgerGrant grant = BudgetLedger::global().acquire(
      options.num_workers, options.budget_policy, options.timeout, [&] { return ThreadBudget(sources); },
      options.budget_poll);
  plan_ = grant.plan;
  ledger_lease_ = std::move(grant.lease);
  budget_note_ = std::move(grant.note);
  options_.num_workers = plan_.num_workers;
  // The arena runs the sum of its live leases; this loader's is what its
  // ledger lease was granted: the plan's arena threads (within cpus - 1 for
  // the whole process) and, in threads mode, the workers, which are arena
  // threads.
  arena_lease_ = Arena::global().lease(plan_.arena_threads + (threads ? plan_.num_workers : 0));

  const auto nw = static_cast<uint32_t>(options.num_workers);
  const auto want = static_cast<std::size_t>(nw) * static_cast<uint32_t>(options.prefetch_factor);
  const std::size_t known = options.round_robin ? want : batches_.size();  // streams: unknown length
  inflight_target_ = static_cast<uint32_t>(std::max<std::size_t>(1, std::min(want, known)));
  active_.assign(nw, true);
  // Checked against the workers asked for; with fewer (kShrink) the turn wraps.
  next_worker_ = static_cast<uint32_t>(options.first_worker % options.num_workers);
  // Two slots beyond what is in flight: the batch the user is working on and
  // one more they may keep, before copy-out kicks in.
  RingGeometry g;
  g.num_slots = inflight_target_ + 2;
  g.num_workers = nw;
  g.batch_capacity = options.batch_capacity;
  g.slot_bytes = options.slot_bytes;
  g.slot_window = std::max(options.max_batch_bytes, options.slot_bytes);
  g.round_robin = options.round_robin || options.assign_in_turn;
  const std::size_t bytes = BatchRing::bytes_for(g);
  const std::string what = "the batch ring (" + std::to_string(g.num_slots) + " slots)";
  // Sparse: the fixed part now, each slot's first bytes below, the rest as
  // workers need it (slots grow in place).
  ring_ = std::make_shared<RingStorage>(bytes, BatchRing::fixed_bytes_for(g), what);
  ring_->ring = BatchRing::create(ring_->segment.data(), g);
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

std::string Loader::describe_batch(std::size_t b) const {
  if (b < batches_.size()) return preview(batches_.batch(b));
  return "(from worker streams)";
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
  samples_seen_ = samples_skipped_ = 0;
  const std::size_t room = ring_->ring.geometry().num_slots - 2;
  const auto want = static_cast<std::size_t>(options_.num_workers) * static_cast<std::size_t>(options_.prefetch_factor);
  inflight_target_ = static_cast<uint32_t>(std::max<std::size_t>(1, std::min({want, batches_.size(), room})));
  post_more();
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
}

void Loader::reset_streams(int first_worker, std::vector<std::string> messages) {
  std::lock_guard op(op_mu_);
  if (closed() && broken_.empty()) SPINDLE_THROW(std::logic_error, "spindle: reset_streams() on a closed Loader");
  rethrow_if_broken();
  if (!options_.round_robin)
    SPINDLE_THROW(std::logic_error, "spindle: reset_streams() needs a round-robin (stream) loader; a loader of "
                                    "planned batches starts a new epoch with reset(batches)");
  if (!pool_ && !threads_) SPINDLE_THROW(std::logic_error, "spindle: reset_streams() on a closed Loader");
  const auto nw = static_cast<std::size_t>(options_.num_workers);
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

void Loader::rethrow_if_broken() const {
  if (broken_.empty()) return;
  if (broken_timeout_) throw LoaderTimeoutError(broken_);
  if (broken_died_) throw *broken_died_;
  throw WorkerDiedError(broken_);
}

void Loader::start() {
  {
    std::lock_guard lock(pids_mu_);
    if (pool_) {
      pids_ = pool_->pids();
      exits_ = pool_->exits();
    }
  }
  last_check_ = std::chrono::steady_clock::now();
  post_more();
}

Loader::~Loader() { close(); }

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
  closing_.store(true, std::memory_order_release);
  // Wake a next() waiting in another thread; it sees closing_ and returns.
  if (ring_) detail::futex_wake(&ring_->ring.header().completed, INT32_MAX);
  std::lock_guard op(op_mu_);
  stop_workers(grace);
}

void Loader::stop_workers(std::chrono::milliseconds grace) noexcept {
  closing_.store(true, std::memory_order_release);
  if (!pool_ && !threads_) {
    arena_lease_.reset();
    ledger_lease_.reset();
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
  arena_lease_.reset();
  ledger_lease_.reset();
  std::lock_guard lock(pids_mu_);
  pids_.clear();
}

void Loader::post_more() {
  const BatchRing& r = ring_->ring;
  const uint32_t n = r.geometry().num_slots;
  uint32_t s = 0;
  if (options_.round_robin) {
    // Task k goes to the next worker whose stream has not ended, in turn.
    const auto nw = static_cast<uint32_t>(options_.num_workers);
    while (inflight_.size() < inflight_target_ && std::find(active_.begin(), active_.end(), true) != active_.end()) {
      while (s < n && r.state(s) != SlotState::kFree) ++s;
      if (s == n) return;
      while (!active_[next_worker_]) next_worker_ = (next_worker_ + 1) % nw;
      SlotHeader& h = r.slot(s);
      h.flags = 0;
      h.message_bytes = 0;
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
      h.batch_id = static_cast<int64_t>(next_post_++);
      h.count = options_.batch_capacity;
      h.worker = -1;
      h.error_bytes = 0;
      h.failure = h.failure_path_bytes = h.failure_key_bytes = h.skipped = 0;
      write_raw_descriptor(r.descriptor(s));
      r.set_state(s, SlotState::kPosted);
      r.queue(1 + next_worker_).post(s);
      inflight_.push_back(s);
      next_worker_ = (next_worker_ + 1) % nw;
    }
    return;
  }
  while (next_post_ < batches_.size() && inflight_.size() < inflight_target_) {
    while (s < n && r.state(s) != SlotState::kFree) ++s;
    if (s == n) return;  // every other slot is leased by the user
    const auto idx = batches_.batch(next_post_);
    SlotHeader& h = r.slot(s);
    h.batch_id = static_cast<int64_t>(next_post_);
    h.count = static_cast<uint32_t>(idx.size());
    h.worker = -1;
    h.error_bytes = 0;
    h.failure = h.failure_path_bytes = h.failure_key_bytes = h.skipped = 0;
    h.flags = 0;
    h.message_bytes = 0;
    write_raw_descriptor(r.descriptor(s));
    std::copy(idx.begin(), idx.end(), r.indices(s));
    r.set_state(s, SlotState::kPosted);
    // Batch k to worker k mod N when assignment is fixed, else to whoever is free.
    r.queue(options_.assign_in_turn ? 1 + static_cast<uint32_t>(next_post_ % options_.num_workers) : 0).post(s);
    inflight_.push_back(s);
    ++next_post_;
  }
}

std::string Loader::describe_holder(uint32_t slot) const {
  const BatchRing& r = ring_->ring;
  if (r.state(slot) == SlotState::kPosted) {
    std::string who;
    for (uint32_t w = 0; w < static_cast<uint32_t>(options_.num_workers); ++w) {
      const pid_t pid = r.worker(w).pid.load();
      who += (w ? ", " : "") + std::to_string(w) + " (pid " + std::to_string(pid) + ") " + process_state(pid);
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
  auto e = pool_->poll_exit();
  if (!e) return;
  {
    std::lock_guard lock(pids_mu_);
    exits_ = pool_->exits();
  }
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
  // The fields are the exception's (the bindings copy them to Python); the
  // text says the same for a person.
  fail_closed(WorkerDiedError(
      "spindle: worker " + std::to_string(e->worker_id) + " (pid " + std::to_string(e->pid) + ") " + e->describe() +
          " " + doing +
          ". The loader is closed; start a new iteration to continue. A signal usually means the "
          "sample code crashed or ran out of memory (check dmesg for the OOM killer).",
      e->worker_id, static_cast<int>(e->pid), e->signaled ? std::nullopt : std::optional<int>(e->code),
      e->signaled ? std::optional<int>(e->code) : std::nullopt, sample_field, batch_field));
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
    if (options_.timeout.count() > 0 && now - start >= options_.timeout) {
      const uint32_t s = inflight_.front();
      const auto b = static_cast<std::size_t>(r.slot(s).batch_id);
      fail_closed("spindle: DataLoader timed out after " + seconds(options_.timeout) +
                      " seconds: no batch arrived; waiting for batch " + std::to_string(b) + " " +
                      describe_batch(b) + ", " + describe_holder(s) +
                      ". Raise timeout, or find out why this sample is slow. The loader is closed.",
                  true);
    }
    detail::futex_wait(&completed, seq, kSupervisePeriod);
  }
}

std::optional<Batch> Loader::next(const std::function<void()>& poll) {
  std::lock_guard op(op_mu_);
  rethrow_if_broken();
  if (closed()) return std::nullopt;
  const BatchRing& r = ring_->ring;
  uint32_t s = 0;
  for (;;) {
    if (!options_.round_robin && delivered_ == batches_.size()) {
      check_skips(/*final=*/true);
      return std::nullopt;
    }
    post_more();
    if (options_.round_robin && inflight_.empty()) {  // every stream ended
      check_skips(/*final=*/true);
      return std::nullopt;
    }
    const auto got = wait_for_delivery(poll);
    if (!got) return std::nullopt;  // closed meanwhile
    s = *got;
    ++delivered_;
    SlotHeader& done = r.slot(s);
    if (r.state(s) == SlotState::kReady && (done.flags & kSlotExhausted)) {
      if (done.worker >= 0) active_[static_cast<std::size_t>(done.worker)] = false;
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
  bool pipeline_has_room = false;
  for (uint32_t i = 0; i < r.geometry().num_slots && !pipeline_has_room; ++i)
    pipeline_has_room = r.state(i) != SlotState::kLeased;
  if (!pipeline_has_room) {
    batch.copy_out();
    ++copied_out_;
  }
  post_more();
  return batch;
}

}  // namespace spindle
