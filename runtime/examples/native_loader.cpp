// A native pipeline on spindle: workers produce batches of typed fields — a
// 64x64x3 uint8 "image" and an int64 "label" per sample — into the shared
// ring; the main thread iterates the batches and checks every value.
//
//   ./native_loader [num_samples] [batch_size] [num_workers] [fork|zygote]
//
// No byte arithmetic in this file: a SlotLayout (spindle/slot_layout.hpp) says
// where each field's block lies, the worker asks for typed views of its slot
// (begin_arrays + SlotLayout::view), and the consumer reads typed fields back
// (Batch::field<T>). Every batch carries its layout, so the consumer needs
// nothing but the batch.
//
// "zygote" (the default) is the pattern for real programs, which usually have
// threads by the time they load data: the worker body is registered with a
// Zygote at the top of main(), while the process is single-threaded, and
// workers are forked from that clean image. "fork" forks workers straight
// from the caller, which is fine for a single-threaded caller.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <spindle/loader.hpp>
#include <spindle/slot_layout.hpp>
#include <spindle/zygote.hpp>

namespace {

constexpr int64_t kSide = 64;
constexpr int64_t kImageBytes = kSide * kSide * 3;

// The worker body: for each claimed batch, lay out its slot as (image, label)
// fields and fill one row per sample. Here the "decode" is a pattern that the
// consumer can verify.
int produce_images(spindle::WorkerContext& ctx) {
  std::optional<spindle::SlotLayout> layout;
  while (auto item = ctx.claim()) {
    if (!layout) layout.emplace(std::vector<spindle::FieldSpec>{{"|u1", {kSide, kSide, 3}}, {"<i8", {}}},
                                ctx.batch_capacity());
    try {
      std::span<std::byte> out = ctx.begin_arrays(*item, *layout, "image,label");
      std::span<uint8_t> images = layout->view<uint8_t>(out, 0);
      std::span<int64_t> labels = layout->view<int64_t>(out, 1);
      for (std::size_t i = 0; i < item->indices.size(); ++i) {
        const int64_t index = item->indices[i];
        ctx.set_sample(index);
        std::fill_n(images.begin() + static_cast<std::ptrdiff_t>(i * kImageBytes), kImageBytes,
                    static_cast<uint8_t>(index % 251));
        labels[i] = index % 1000;
      }
      ctx.commit(*item);
    } catch (const std::exception& e) {
      ctx.fail(*item, e.what());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First thing in main: before any library has a chance to start a thread.
  spindle::Zygote zygote({{"images", produce_images}});

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
  auto loader_ptr = use_zygote ? std::make_unique<spindle::Loader>(opt, batches, spindle::Launcher::zygote(zygote, "images"))
                               : std::make_unique<spindle::Loader>(opt, batches, spindle::Launcher::fork(produce_images));
  spindle::Loader& loader = *loader_ptr;
  std::printf("%s: workers=%d arena_threads=%d budget=%lld slots=%u\n", use_zygote ? "zygote" : "fork",
              loader.plan().num_workers, loader.plan().arena_threads,
              static_cast<long long>(loader.plan().budget == spindle::kUnlimited ? -1 : loader.plan().budget),
              loader.num_slots());

  const auto t0 = std::chrono::steady_clock::now();
  int64_t samples = 0;
  while (auto b = loader.next()) {
    std::span<const uint8_t> images = b->field<uint8_t>(0);
    std::span<const int64_t> labels = b->field<int64_t>(1);
    for (std::size_t i = 0; i < b->count(); ++i) {
      const int64_t index = b->indices()[i];
      const auto expect = static_cast<uint8_t>(index % 251);
      const auto image = images.subspan(i * kImageBytes, kImageBytes);
      if (image.front() != expect || image.back() != expect || labels[i] != index % 1000) {
        std::fprintf(stderr, "batch %lld sample %lld is corrupt\n", static_cast<long long>(b->batch_id()),
                     static_cast<long long>(index));
        return 1;
      }
    }
    samples += static_cast<int64_t>(b->count());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%lld samples in %.3f s: %.0f samples/s, all verified\n", static_cast<long long>(samples), s,
              static_cast<double>(samples) / s);
  return samples == n ? 0 : 1;
}
