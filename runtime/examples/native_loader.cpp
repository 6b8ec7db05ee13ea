// A native pipeline on spindle: 2 workers produce 64x64x3 uint8 "images"
// into the shared ring; the main thread iterates the batches and checks them.
//
//   ./native_loader [num_samples] [batch_size] [num_workers] [fork|zygote]
//
// "zygote" (the default) is the pattern for real programs, which usually have
// threads by the time they load data: the worker body is registered with a
// Zygote at the top of main(), while the process is single-threaded, and
// workers are forked from that clean image. "fork" forks workers straight
// from the caller, which is fine for a single-threaded caller.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <spindle/loader.hpp>
#include <spindle/zygote.hpp>

namespace {

constexpr uint64_t kSampleBytes = 64 * 64 * 3;

// The sample producer: decode sample `index` into `out`. Here, a pattern that
// the consumer can verify.
void make_image(int64_t index, std::span<std::byte> out) {
  std::memset(out.data(), static_cast<int>(index % 251), out.size());
}

}  // namespace

int main(int argc, char** argv) {
  // First thing in main: before any library has a chance to start a thread.
  spindle::Zygote zygote({{"images", spindle::sample_worker(make_image, kSampleBytes)}});

  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 100000;
  const uint32_t batch = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 256;
  const int workers = argc > 3 ? std::atoi(argv[3]) : 2;
  const bool use_zygote = argc <= 4 || std::strcmp(argv[4], "fork") != 0;

  std::vector<std::vector<int64_t>> batches;
  for (int64_t i = 0; i < n; i += batch) {
    batches.emplace_back();
    for (int64_t j = i; j < std::min<int64_t>(n, i + batch); ++j) batches.back().push_back(j);
  }

  spindle::LoaderOptions opt;
  opt.num_workers = workers;
  opt.batch_capacity = batch;
  opt.slot_bytes = kSampleBytes * batch;
  auto loader_ptr = use_zygote
                        ? std::make_unique<spindle::Loader>(opt, batches, zygote, "images")
                        : std::make_unique<spindle::Loader>(opt, batches,
                                                            spindle::sample_worker(make_image, kSampleBytes));
  spindle::Loader& loader = *loader_ptr;
  std::printf("%s: workers=%d arena_threads=%d budget=%lld slots=%u\n", use_zygote ? "zygote" : "fork",
              loader.plan().num_workers,
              loader.plan().arena_threads,
              static_cast<long long>(loader.plan().budget == spindle::kUnlimited ? -1 : loader.plan().budget),
              loader.num_slots());

  const auto t0 = std::chrono::steady_clock::now();
  int64_t samples = 0;
  while (auto b = loader.next()) {
    for (std::size_t i = 0; i < b->indices().size(); ++i) {
      const auto expect = static_cast<std::byte>(b->indices()[i] % 251);
      if (b->data()[i * kSampleBytes] != expect || b->data()[(i + 1) * kSampleBytes - 1] != expect) {
        std::fprintf(stderr, "batch %lld sample %lld is corrupt\n", static_cast<long long>(b->batch_id()),
                     static_cast<long long>(b->indices()[i]));
        return 1;
      }
    }
    samples += static_cast<int64_t>(b->indices().size());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%lld samples in %.3f s: %.0f samples/s, all verified\n", static_cast<long long>(samples), s,
              static_cast<double>(samples) / s);
  return samples == n ? 0 : 1;
}
