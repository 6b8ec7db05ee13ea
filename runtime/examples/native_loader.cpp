// A native pipeline on spindle: 2 workers produce 64x64x3 uint8 "images"
// into the shared ring; the main thread iterates the batches and checks them.
//
//   ./native_loader [num_samples] [batch_size] [num_workers]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <spindle/loader.hpp>

namespace {

constexpr uint64_t kSampleBytes = 64 * 64 * 3;

// The sample producer: decode sample `index` into `out`. Here, a pattern that
// the consumer can verify.
void make_image(int64_t index, std::span<std::byte> out) {
  std::memset(out.data(), static_cast<int>(index % 251), out.size());
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 100000;
  const uint32_t batch = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 256;
  const int workers = argc > 3 ? std::atoi(argv[3]) : 2;

  std::vector<std::vector<int64_t>> batches;
  for (int64_t i = 0; i < n; i += batch) {
    batches.emplace_back();
    for (int64_t j = i; j < std::min<int64_t>(n, i + batch); ++j) batches.back().push_back(j);
  }

  spindle::LoaderOptions opt;
  opt.num_workers = workers;
  opt.batch_capacity = batch;
  opt.slot_bytes = kSampleBytes * batch;
  spindle::Loader loader(opt, batches, spindle::sample_worker(make_image, kSampleBytes));
  std::printf("workers=%d arena_threads=%d budget=%lld slots=%u\n", loader.plan().num_workers,
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
