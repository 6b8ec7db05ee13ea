// A program that prints a line (left in stdout's buffer, not flushed), starts a
// zygote in zygote mode, prints another line and then runs a 2-worker loader:
// processes (forked from the caller or from the zygote) or threads. Run by
// check_stdio.cmake with stdout redirected to a file, which makes stdout fully
// buffered as in a real job's log: each line must appear in the file exactly
// once, whatever the workers (and the zygote) do.
//
//   ./stdio_probe fork|zygote|threads
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include <spindle/loader.hpp>
#include <spindle/zygote.hpp>

#include "test_support.hpp"

namespace {

constexpr uint64_t kSampleBytes = 64;

void fill(int64_t index, std::span<std::byte> out) {
  std::memset(out.data(), static_cast<int>(index % 251), out.size());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "fork";
  std::printf("a line printed before the zygote starts\n");  // stays in stdout's buffer (a zygote inherits it)
  std::unique_ptr<spindle::Zygote> zygote;
  if (mode == "zygote")
    zygote = std::make_unique<spindle::Zygote>(
        std::map<std::string, spindle::WorkerMain>{{"fill", spindle::sample_worker(fill, kSampleBytes)}});

  std::printf("a line printed before the loader starts\n");  // stays in stdout's buffer

  spindle::LoaderOptions o;
  o.num_workers = 2;
  o.batch_capacity = 16;
  o.slot_bytes = kSampleBytes * 16;
  spindle::Launcher launcher = mode == "zygote"  ? spindle::Launcher::zygote(*zygote, "fill")
                               : mode == "threads" ? spindle::Launcher::threads(spindle::sample_worker(fill, kSampleBytes))
                                                   : spindle::Launcher::fork(spindle::sample_worker(fill, kSampleBytes));
  spindle::Loader loader(o, spindle::testing::consecutive_batches(256, 16), std::move(launcher));
  int64_t samples = 0;
  while (auto b = loader.next()) samples += static_cast<int64_t>(b->indices().size());
  std::printf("%lld samples\n", static_cast<long long>(samples));
  return samples == 256 ? 0 : 1;
}
