#include <spindle/worker_context.hpp>

#include <time.h>

#include <spindle/procfs.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include <spindle/detail/batch_ring.hpp>
#include <spindle/error.hpp>
#include <spindle/ring_copy.hpp>
#include <spindle/shm_segment.hpp>

namespace spindle {
using detail::SlotState;
using detail::SlotHeader;
using detail::WorkerRecord;
using detail::RingHeader;
using detail::BatchRing;
using detail::IndexQueue;
using detail::kSlotExhausted;
using detail::kSlotNewStream;
namespace {
#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;  // Linux 5.14+
#endif

static_assert(2 * WorkerContext::kMaxFailurePathBytes < BatchRing::kMinSlotStride,
              "a failed slot holds the failure's path and key and still has room for its report");

constexpr uint64_t kGrowStep = 1 << 20;  // slots grow in MiB steps: few fallocate calls

std::string mib(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

}  // namespace

BatchRing WorkerContext::ring() const noexcept { return BatchRing(segment_); }

WorkerContext::WorkerContext(const BatchRing& view, int worker_id, pid_t parent, int segment_fd)
    : segment_(reinterpret_cast<std::byte*>(&view.header())), worker_id_(worker_id), parent_(parent),
      segment_fd_(segment_fd) {
  // A forked child inherits the mapping but not its page-table entries: map
  // what is reserved up front (one call per region) instead of faulting on
  // every page of every slot it writes. Best effort: older kernels lack the
  // flag. Never the whole window: that would back it all with memory.
  auto* base = reinterpret_cast<std::byte*>(&ring().header());
  madvise(base, ring().fixed_bytes(), kMadvPopulateWrite);
  for (uint32_t s = 0; s < ring().geometry().num_slots; ++s)
    madvise(ring().payload(s), ring().slot(s).reserved, kMadvPopulateWrite);
}

int WorkerContext::num_workers() const noexcept { return static_cast<int>(ring().geometry().num_workers); }

int WorkerContext::logical_workers() const noexcept {
  const detail::RingGeometry& g = ring().geometry();
  return static_cast<int>(g.logical_workers > g.num_workers ? g.logical_workers : g.num_workers);
}

uint32_t WorkerContext::batch_capacity() const noexcept { return ring().geometry().batch_capacity; }

void WorkerContext::set_sample(int64_t index) noexcept {
  ring().worker(worker_id_).sample_index.store(index, std::memory_order_relaxed);
}

std::atomic<int64_t>& WorkerContext::sample_record() noexcept { return ring().worker(worker_id_).sample_index; }

int64_t WorkerContext::current_sample() const noexcept {
  return ring().worker(worker_id_).sample_index.load(std::memory_order_relaxed);
}

std::span<std::byte> WorkerContext::reserve(WorkItem& item, uint64_t bytes) {
  SlotHeader& h = ring().slot(item.slot);
  if (bytes > h.reserved) {
    const uint64_t window = ring().header().slot_stride;
    if (bytes > window)
      SPINDLE_THROW(std::length_error,
                    "spindle: batch " + std::to_string(item.batch_id) + " needs " + mib(bytes) +
                        " but a ring slot holds at most " + mib(window) +
                        "; raise max_batch_bytes (LoaderOptions::max_batch_bytes) or lower batch_size");
    if (segment_fd_ < 0)
      SPINDLE_THROW(std::length_error, "spindle: batch " + std::to_string(item.batch_id) + " needs " +
                                           mib(bytes) + " but this worker's slots cannot grow past " +
                                           mib(h.reserved) + "; raise LoaderOptions::slot_bytes");
    const uint64_t want = std::min(window, (bytes + kGrowStep - 1) / kGrowStep * kGrowStep);
    auto* base = reinterpret_cast<std::byte*>(&ring().header());
    ShmSegment::reserve(segment_fd_, base, static_cast<std::size_t>(ring().payload(item.slot) - base),
                        static_cast<std::size_t>(want),
                        "batch " + std::to_string(item.batch_id) + " (" + mib(bytes) + ")");
    h.reserved = want;
  }
  item.out = ring().payload_span(item.slot);
  return item.out;
}

std::span<std::byte> WorkerContext::begin_arrays(WorkItem& item, const SlotLayout& layout,
                                                 std::string_view structure) {
  if (layout.capacity() < item.indices.size())
    SPINDLE_THROW(std::invalid_argument, "spindle: the layout holds " + std::to_string(layout.capacity()) +
                                             " samples but batch " + std::to_string(item.batch_id) + " has " +
                                             std::to_string(item.indices.size()));
  std::span<std::byte> out = reserve(item, layout.bytes());
  write_arrays_descriptor(ring().descriptor(item.slot), layout, structure);
  return out;
}

void WorkerContext::put_rows(WorkItem& item, const SlotLayout& layout, std::string_view structure,
                             std::span<const std::byte* const> rows) {
  const std::size_t fields = layout.num_fields();
  const std::size_t count = fields == 0 ? 0 : rows.size() / fields;
  if (count * fields != rows.size() || count > item.indices.size())
    SPINDLE_THROW(std::invalid_argument, "spindle: batch " + std::to_string(item.batch_id) + " holds " +
                                             std::to_string(item.indices.size()) + " samples of " +
                                             std::to_string(fields) + " fields, but " +
                                             std::to_string(rows.size()) + " rows were given");
  std::span<std::byte> out = begin_arrays(item, layout, structure);
  for (std::size_t f = 0; f < fields; ++f) {
    const std::size_t row = layout.row_bytes(f);
    std::byte* dst = out.data() + layout.offset(f);
    for (std::size_t r = 0; r < count; ++r, dst += row) copy_into_ring(dst, rows[r * fields + f], row);
  }
}

void WorkerContext::put_row(const SlotLayout& layout, std::span<std::byte> out, std::size_t row,
                            std::span<const std::byte* const> field_rows) const {
  const std::size_t fields = layout.num_fields();
  if (field_rows.size() != fields || row >= layout.capacity() || out.size() < layout.bytes())
    SPINDLE_THROW(std::invalid_argument, "spindle: put_row got " + std::to_string(field_rows.size()) +
                                             " rows for " + std::to_string(fields) + " fields, row " +
                                             std::to_string(row) + " of " + std::to_string(layout.capacity()));
  for (std::size_t f = 0; f < fields; ++f) {
    const std::size_t bytes = layout.row_bytes(f);
    copy_into_ring(out.data() + layout.offset(f) + row * bytes, field_rows[f], bytes);
  }
}

void WorkerContext::put_bytes(WorkItem& item, std::span<const std::byte> bytes) {
  std::span<std::byte> out = reserve(item, bytes.size());
  copy_into_ring(out.data(), bytes.data(), bytes.size());
  write_bytes_descriptor(ring().descriptor(item.slot), bytes.size());
}

int64_t monotonic_ns() noexcept {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

uint64_t process_cpu_ns(pid_t pid) noexcept {
  clockid_t clock;
  struct timespec ts;
  if (clock_getcpuclockid(pid, &clock) != 0 || clock_gettime(clock, &ts) != 0) return 0;
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(ts.tv_nsec);
}

void WorkerContext::add_bytes_fetched(uint64_t bytes) noexcept {
  if (bytes == 0) return;
  std::atomic<uint64_t>& c = ring().worker(worker_id_).bytes_fetched;
  c.store(c.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
}

std::optional<WorkItem> WorkerContext::claim() {
  IndexQueue& q = ring().queue_of(static_cast<uint32_t>(worker_id_));
  WorkerRecord& rec = ring().worker(worker_id_);
  if (rec.started_ns.load(std::memory_order_relaxed) == 0) {  // its first claim: its start is done
    rec.start_cpu_ns.store(process_cpu_ns(getpid()), std::memory_order_relaxed);
    rec.started_ns.store(monotonic_ns(), std::memory_order_release);
  }
  for (;;) {
    if (q.is_closed() || rec.retire.load(std::memory_order_acquire)) return std::nullopt;
    // rec.slot names the item before the queue's CAS and h.worker before the slot's: a worker that
    // dies at any instruction leaves its item findable (Loader::recover_item). The slot's CAS fails
    // only if the consumer took the item back from a lost worker first; it posts it again.
    if (auto s = q.try_claim(&rec.slot)) {
      SlotHeader& h = ring().slot(*s);
      h.worker = worker_id_;
      auto expected = static_cast<uint32_t>(SlotState::kPosted);
      if (!h.state.compare_exchange_strong(expected, static_cast<uint32_t>(SlotState::kFilling),
                                           std::memory_order_acq_rel)) {
        rec.slot.store(-1, std::memory_order_relaxed);
        continue;
      }
      rec.batch_id.store(h.batch_id, std::memory_order_relaxed);
      rec.sample_index.store(-1, std::memory_order_relaxed);
      if (ring().header().stats) rec.busy_since_ns.store(monotonic_ns(), std::memory_order_relaxed);
      WorkItem item{*s, h.batch_id, {ring().indices(*s), h.count}, ring().payload_span(*s), false, {}, h.stream};
      if (h.flags & kSlotNewStream) {
        item.new_stream = true;
        item.message = {ring().payload(*s), std::min<std::size_t>(h.message_bytes, item.out.size())};
      }
      return item;
    }
    if (getppid() != parent_) return std::nullopt;  // orphaned: the consumer is gone
    q.wait(std::chrono::milliseconds(100));
  }
}

void WorkerContext::finish(const WorkItem& item, SlotState st) noexcept {
  ring_copy_fence();  // streaming stores (copy_into_ring) land before the slot is published
  WorkerRecord& rec = ring().worker(worker_id_);
  if (ring().header().stats) {  // one writer (this worker): plain load + store
    const int64_t since = rec.busy_since_ns.load(std::memory_order_relaxed);
    if (since > 0) rec.busy_ns.store(rec.busy_ns.load(std::memory_order_relaxed) + static_cast<uint64_t>(monotonic_ns() - since),
                                     std::memory_order_relaxed);
    if (st == SlotState::kReady)
      rec.samples.store(rec.samples.load(std::memory_order_relaxed) + ring().slot(item.slot).count, std::memory_order_relaxed);
    rec.busy_since_ns.store(0, std::memory_order_relaxed);
  }
  ring().publish(item.slot, st);
  rec.slot.store(-1, std::memory_order_relaxed);
  rec.batch_id.store(-1, std::memory_order_relaxed);
  rec.sample_index.store(-1, std::memory_order_relaxed);
}

void WorkerContext::commit(const WorkItem& item) noexcept { finish(item, SlotState::kReady); }

void WorkerContext::commit(const WorkItem& item, uint32_t count) noexcept {
  SlotHeader& h = ring().slot(item.slot);
  if (count < h.count) h.count = count;
  finish(item, SlotState::kReady);
}

void WorkerContext::set_stream_position(const WorkItem& item, uint64_t position) noexcept {
  ring().slot(item.slot).stream_position = position;
}

void WorkerContext::exhausted(const WorkItem& item) noexcept {
  SlotHeader& h = ring().slot(item.slot);
  h.count = 0;
  h.flags = kSlotExhausted;
  finish(item, SlotState::kReady);
}

void WorkerContext::fail(const WorkItem& item, std::string_view report, FailureKind kind, std::string_view path,
                         std::string_view key) noexcept {
  // Every slot has report_capacity() bytes (>= kMinSlotStride, far more than
  // two capped names); the report gets what the path and key leave.
  path = path.substr(0, kMaxFailurePathBytes);
  key = key.substr(0, kMaxFailurePathBytes);
  const std::size_t n = std::min(report.size(), ring().report_capacity() - path.size() - key.size());
  std::byte* out = ring().payload(item.slot);
  // An empty view may hold a null pointer, which memcpy must not be given.
  auto put = [&out](std::string_view part, std::size_t bytes) {
    if (bytes) std::memcpy(out, part.data(), bytes);
    out += bytes;
  };
  put(report, n);
  put(path, path.size());
  put(key, key.size());
  write_raw_descriptor(ring().descriptor(item.slot));
  SlotHeader& h = ring().slot(item.slot);
  h.error_bytes = static_cast<uint32_t>(n);
  h.failure = static_cast<uint32_t>(kind);
  h.failure_path_bytes = static_cast<uint32_t>(path.size());
  h.failure_key_bytes = static_cast<uint32_t>(key.size());
  finish(item, SlotState::kFailed);
}

AttachedWorker::AttachedWorker(int segment_fd, int worker_id, pid_t parent) {
  procfs::die_with_process(parent);  // with the consumer process, not the thread that spawned us
  struct stat st {};
  if (fstat(segment_fd, &st) != 0) SPINDLE_THROW_ERRNO("spindle: worker cannot stat the loader's segment");
  size_ = static_cast<std::size_t>(st.st_size);
  mem_ = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, segment_fd, 0);
  if (mem_ == MAP_FAILED) SPINDLE_THROW_ERRNO("spindle: worker cannot map the loader's segment");
  fd_ = segment_fd;  // kept: slots grow through it
  BatchRing ring(static_cast<std::byte*>(mem_));
  if (ring.header().magic != RingHeader::kMagic || worker_id < 0 ||
      static_cast<uint32_t>(worker_id) >= ring.geometry().num_workers)
    SPINDLE_THROW(std::invalid_argument, "spindle: descriptor " + std::to_string(segment_fd) +
                                             " is not a loader segment for worker " + std::to_string(worker_id));
  ring.worker(static_cast<uint32_t>(worker_id)).pid.store(getpid(), std::memory_order_relaxed);
  context_.emplace(ring, worker_id, parent, fd_);
}

AttachedWorker::~AttachedWorker() {
  context_.reset();
  if (mem_ && mem_ != MAP_FAILED) munmap(mem_, size_);
  if (fd_ >= 0) close(fd_);
}

WorkerMain sample_worker(SampleFn fn, uint64_t sample_bytes) {
  return [fn = std::move(fn), sample_bytes](WorkerContext& ctx) {
    while (auto item = ctx.claim()) {
      int64_t current = -1;
      try {
        if (item->indices.size() * sample_bytes > item->out.size())
          SPINDLE_THROW(std::length_error, "spindle: slot of " + std::to_string(item->out.size()) +
                                               " bytes cannot hold " + std::to_string(item->indices.size()) +
                                               " samples of " + std::to_string(sample_bytes) +
                                               " bytes; raise LoaderOptions::slot_bytes");
        for (std::size_t i = 0; i < item->indices.size(); ++i) {
          current = item->indices[i];
          ctx.set_sample(current);
          fn(current, item->out.subspan(i * sample_bytes, sample_bytes));
        }
        ctx.commit(*item);
      } catch (const DecodeError& e) {
        ctx.fail(*item, "sample " + std::to_string(current) + ": " + e.what(), FailureKind::kDecode, e.path, e.key);
      } catch (const DataError& e) {
        ctx.fail(*item, "sample " + std::to_string(current) + ": " + e.what(), FailureKind::kData, e.path, e.key);
      } catch (const InternalError& e) {
        ctx.fail(*item, "sample " + std::to_string(current) + ": " + e.what(), FailureKind::kInternal);
      } catch (const std::exception& e) {
        ctx.fail(*item, "sample " + std::to_string(current) + ": " + e.what());
      }
    }
    return 0;
  };
}

}  // namespace spindle
