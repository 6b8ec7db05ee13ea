// Loader statistics (loader_stats.hpp): the wait histogram, stats(),
// reset_stats() and the description of what the workers are doing.
//
// Design decisions:
// - Cost per batch, never per sample: next() reads the clock twice and takes
//   an uncontended mutex once; a worker reads the clock at claim and publish.
//   Per-sample work (the sample index a worker is at) was already recorded
//   for crash reports.
// - Workers' counters only grow, and only their worker writes them, so
//   reset_stats() records a baseline in the consumer instead of writing into
//   the workers' records (which would make two writers).
// - A fixed log-scale histogram (8 buckets an octave) rather than a sample
//   buffer: constant memory for any epoch, mergeable across epochs' loaders,
//   and quantiles within about 4.5%.
#include <spindle/loader.hpp>
#include <spindle/loader_stats.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loader_internal.hpp"

namespace spindle {
using detail::SlotState;
using detail::WorkerRecord;
using detail::BatchRing;

void WaitHistogram::add(uint64_t ns) noexcept {
  ++n;
  total_ns += ns;
  max_ns = std::max(max_ns, ns);
  const double us = static_cast<double>(ns) / 1e3;
  int k = us <= 1.0 ? 0 : static_cast<int>(std::log2(us) * kPerOctave);
  counts[static_cast<std::size_t>(std::clamp(k, 0, kBuckets - 1))] += 1;
}

void WaitHistogram::merge(const WaitHistogram& o) noexcept {
  for (int k = 0; k < kBuckets; ++k) counts[static_cast<std::size_t>(k)] += o.counts[static_cast<std::size_t>(k)];
  n += o.n;
  total_ns += o.total_ns;
  max_ns = std::max(max_ns, o.max_ns);
}

double WaitHistogram::quantile_ms(double q) const noexcept {
  if (n == 0) return 0.0;
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(n);
  uint64_t seen = 0;
  for (int k = 0; k < kBuckets; ++k) {
    seen += counts[static_cast<std::size_t>(k)];
    if (static_cast<double>(seen) >= rank && counts[static_cast<std::size_t>(k)] > 0) {
      if (k == 0) return std::min(1e-3, static_cast<double>(max_ns) / 1e6);
      const double mid_us = std::exp2((k + 0.5) / kPerOctave);
      return std::min(mid_us / 1e3, static_cast<double>(max_ns) / 1e6);
    }
  }
  return static_cast<double>(max_ns) / 1e6;
}

void LoaderStats::merge(const LoaderStats& o) {
  batches += o.batches;
  samples += o.samples;
  skipped += o.skipped;
  elapsed_s += o.elapsed_s;
  wait.merge(o.wait);
  bytes_fetched += o.bytes_fetched;
  copied_out += o.copied_out;
  replaced += o.replaced;
  if (max_processes == 0) {  // an ended epoch's, folded into an empty total: its processes at the end
    processes = o.processes;
    max_processes = o.max_processes;
  }
  if (resize_reason.empty()) resize_reason = o.resize_reason;
  for (const WorkerStats& w : o.workers) {
    auto it = std::find_if(workers.begin(), workers.end(), [&](const WorkerStats& m) { return m.worker == w.worker; });
    if (it == workers.end()) {
      WorkerStats past = w;
      past.batch = past.sample = -1;
      past.busy_for_s = 0;
      workers.push_back(past);
      continue;
    }
    it->busy_s += w.busy_s;
    it->samples += w.samples;
    it->bytes_fetched += w.bytes_fetched;
  }
}

void Loader::record_wait(std::chrono::steady_clock::time_point since, uint32_t count, uint32_t skipped) {
  const auto waited = std::chrono::steady_clock::now() - since;
  std::lock_guard lock(stats_mu_);
  counts_.wait.add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count()));
  counts_.batches += 1;
  counts_.samples += count;
  counts_.skipped += skipped;
}

LoaderStats Loader::stats() const {
  LoaderStats out;
  {
    std::lock_guard lock(stats_mu_);
    out = counts_;
    out.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - stats_since_).count();
  }
  const BatchRing& r = ring_->ring;
  out.ring_slots = r.geometry().num_slots;
  for (uint32_t s = 0; s < out.ring_slots; ++s) {
    switch (r.state(s)) {
      case SlotState::kReady:
      case SlotState::kFailed: ++out.ring_ready; break;
      case SlotState::kPosted:
      case SlotState::kFilling: ++out.ring_in_flight; break;
      case SlotState::kLeased: ++out.ring_leased; break;
      default: break;
    }
  }
  out.copied_out = copied_out_;
  out.processes = running_.load();
  out.max_processes = advises() ? static_cast<int>(logical_) : options_.num_workers;
  out.replaced = replaced_total_;
  out.resize_reason = resize_reason();
  const int64_t now = monotonic_ns();
  std::lock_guard lock(stats_mu_);  // baseline_
  for (uint32_t w = 0; w < r.geometry().num_workers; ++w) {
    const WorkerRecord& rec = r.worker(w);
    const WorkerBaseline& base = baseline_[w];
    WorkerStats ws;
    ws.worker = static_cast<int>(w);
    ws.pid = rec.pid.load(std::memory_order_relaxed);
    ws.busy_s = static_cast<double>(rec.busy_ns.load(std::memory_order_relaxed) - base.busy_ns) / 1e9;
    ws.samples = rec.samples.load(std::memory_order_relaxed) - base.samples;
    ws.bytes_fetched = rec.bytes_fetched.load(std::memory_order_relaxed) - base.bytes_fetched;
    ws.batch = rec.batch_id.load(std::memory_order_relaxed);
    ws.sample = rec.sample_index.load(std::memory_order_relaxed);
    const int64_t since = rec.busy_since_ns.load(std::memory_order_relaxed);
    if (since > 0 && ws.batch >= 0) {
      ws.busy_for_s = static_cast<double>(now - since) / 1e9;
      ws.busy_s += ws.busy_for_s;  // the item in hand counts as busy already
    }
    out.bytes_fetched += ws.bytes_fetched;
    out.workers.push_back(ws);
  }
  return out;
}

void Loader::reset_stats() {
  const BatchRing& r = ring_->ring;
  std::lock_guard lock(stats_mu_);
  counts_ = LoaderStats{};
  stats_since_ = std::chrono::steady_clock::now();
  for (uint32_t w = 0; w < r.geometry().num_workers; ++w) {
    const WorkerRecord& rec = r.worker(w);
    baseline_[w] = {rec.busy_ns.load(std::memory_order_relaxed), rec.samples.load(std::memory_order_relaxed),
                    rec.bytes_fetched.load(std::memory_order_relaxed)};
  }
}

std::string Loader::describe_workers() const {
  const BatchRing& r = ring_->ring;
  const int64_t now = monotonic_ns();
  std::string out;
  for (uint32_t w = 0; w < r.geometry().num_workers; ++w) {
    const WorkerRecord& rec = r.worker(w);
    const int64_t batch = rec.batch_id.load(std::memory_order_relaxed);
    const int64_t sample = rec.sample_index.load(std::memory_order_relaxed);
    const int64_t since = rec.busy_since_ns.load(std::memory_order_relaxed);
    char line[200];
    if (rec.pid.load() == 0) {
      std::snprintf(line, sizeof line, "%sworker %u starting", w ? "; " : "", w);
    } else if (batch < 0) {
      std::snprintf(line, sizeof line, "%sworker %u (pid %d) idle, waiting for input", w ? "; " : "", w,
                    static_cast<int>(rec.pid.load()));
    } else {
      std::string where = sample >= 0 ? ", sample " + std::to_string(sample) : "";
      if (since > 0)
        std::snprintf(line, sizeof line, "%sworker %u (pid %d) busy for %.1f s in batch %lld%s", w ? "; " : "", w,
                      static_cast<int>(rec.pid.load()), static_cast<double>(now - since) / 1e9,
                      static_cast<long long>(batch), where.c_str());
      else
        std::snprintf(line, sizeof line, "%sworker %u (pid %d) busy in batch %lld%s", w ? "; " : "", w,
                      static_cast<int>(rec.pid.load()), static_cast<long long>(batch), where.c_str());
    }
    out += line;
    const uint64_t fetched = rec.bytes_fetched.load(std::memory_order_relaxed);
    if (fetched > 0) out += ", " + std::to_string(fetched) + " bytes fetched";
  }
  return out;
}

}  // namespace spindle
