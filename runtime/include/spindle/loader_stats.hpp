#pragma once
// What a Loader has done, for users watching a training job (docs/observability.md).
//
// The counters have one owner each: the consumer's wait histogram and batch
// counts live in the Loader (written by the thread in next()); each worker's
// busy time, samples and fetched bytes live in its WorkerRecord in the shared
// segment (batch_ring.hpp), written by that worker only. Loader::stats()
// reads both; front ends ask for it and keep nothing of their own.
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace spindle {

// Log-scale histogram of waits: bucket k holds waits in [2^(k/8), 2^((k+1)/8))
// microseconds (bucket 0 also everything below 1 us), so a quantile is off by
// at most half a bucket, about 4.5%. Fixed size: merging two is adding them.
struct WaitHistogram {
  static constexpr int kPerOctave = 8;
  static constexpr int kBuckets = 40 * kPerOctave;  // 1 us .. 2^40 us (~12 days)
  std::array<uint64_t, kBuckets> counts{};
  uint64_t n = 0;
  uint64_t total_ns = 0;
  uint64_t max_ns = 0;

  void add(uint64_t ns) noexcept;
  void merge(const WaitHistogram& other) noexcept;
  // The q-quantile (0..1) in milliseconds (the bucket's geometric middle); 0 when empty.
  double quantile_ms(double q) const noexcept;
};

struct WorkerStats {
  int worker = 0;
  pid_t pid = 0;
  double busy_s = 0;            // time spent producing batches (claim to publish)
  uint64_t samples = 0;         // samples in the batches it published
  uint64_t bytes_fetched = 0;   // bytes its streamed source fetched (URL shards, pipe:)
  // Now: the batch and sample it is producing (-1: idle, waiting for a batch
  // to be posted), and for how long it has been at that batch.
  int64_t batch = -1;
  int64_t sample = -1;
  double busy_for_s = 0;
};

struct LoaderStats {
  uint64_t batches = 0;   // delivered by next()
  uint64_t samples = 0;   // in those batches
  uint64_t skipped = 0;   // samples workers replaced (on_error="skip")
  double elapsed_s = 0;   // since the loader started or stats were reset
  WaitHistogram wait;     // consumer time blocked in next(), one entry per delivered batch
  double wait_s() const noexcept { return static_cast<double>(wait.total_ns) / 1e9; }
  double wait_p50_ms() const noexcept { return wait.quantile_ms(0.50); }
  double wait_p95_ms() const noexcept { return wait.quantile_ms(0.95); }
  double wait_max_ms() const noexcept { return static_cast<double>(wait.max_ns) / 1e6; }
  // The ring now: slots in all, batches ready and not yet delivered, batches
  // being produced (posted or filling), batches the user holds.
  uint32_t ring_slots = 0, ring_ready = 0, ring_in_flight = 0, ring_leased = 0;
  uint64_t bytes_fetched = 0;  // the workers' sum
  int64_t copied_out = 0;
  // Worker processes running now, the most (LoaderOptions::adaptive; else the same), the workers
  // started again in place of lost ones since the loader started, and the last change of the
  // processes with its reason ("" if none).
  int processes = 0, max_processes = 0;
  int64_t replaced = 0;
  std::string resize_reason;
  std::vector<WorkerStats> workers;

  // Adds `other`'s counts (an earlier epoch's loader); keeps this one's ring and workers' state.
  void merge(const LoaderStats& other);
};

}  // namespace spindle
