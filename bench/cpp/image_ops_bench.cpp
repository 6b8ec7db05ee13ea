// Google Benchmark of spindle::ops on one thread: whole decode, region decode,
// the fused decode + random-resized-crop(224) + flip of the native pipeline,
// and resize alone, on 400x400 q90 JPEGs encoded here with libjpeg.
// Run: build/<dir>/bench/cpp/image_ops_bench
#include <spindle/ops/image_ops.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <benchmark/benchmark.h>

#include "jpeg_encode.hpp"  // tests/cpp: the same encoder as image_ops_test

namespace {

using spindle::ops::Image;

using spindle::testing::encode_jpeg;

const std::vector<std::vector<std::byte>>& files() {
  static const auto f = [] {
    std::vector<std::vector<std::byte>> out;
    for (int s = 0; s < 32; ++s) {
      Image img{400, 400, 3, std::vector<uint8_t>(400 * 400 * 3)};
      uint32_t noise = 12345 + s;
      for (int y = 0; y < 400; ++y)
        for (int x = 0; x < 400; ++x)
          for (int c = 0; c < 3; ++c) {
            noise = noise * 1664525u + 1013904223u;
            double v = 128 + 60 * std::sin(0.03 * (c + 1 + s % 5) * x + 0.02 * y) + 40 * std::cos(0.05 * y - 0.01 * c * x);
            if (((x + 7 * s) / 40 + y / 50) % 3 == c) v += 50;
            v += static_cast<double>(noise >> 29) - 4;
            img.pixels[(static_cast<size_t>(y) * 400 + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
          }
      out.push_back(encode_jpeg(img));
    }
    return out;
  }();
  return f;
}

void BM_DecodeWhole(benchmark::State& state) {
  Image out;
  size_t i = 0;
  for (auto _ : state) {
    spindle::ops::decode(files()[i++ % files().size()], std::nullopt, std::nullopt, out);
    benchmark::DoNotOptimize(out.pixels.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecodeWhole);

// Fused: headers, the box, decode only the box (DCT-scaled when >= 2x), resize, flip half the time.
void BM_FusedRandomResizedCrop224Flip(benchmark::State& state) {
  Image out;
  uint64_t i = 0;
  for (auto _ : state) {
    const auto& data = files()[i % files().size()];
    const auto info = spindle::ops::probe(data);
    spindle::ops::Rng rng(0, 0, i);
    const auto box = spindle::ops::random_resized_crop_box(info.height, info.width, rng);
    spindle::ops::decode(data, box, spindle::ops::Size{224, 224}, out);
    if (rng.uniform() < 0.5) spindle::ops::hflip(out);
    benchmark::DoNotOptimize(out.pixels.data());
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_FusedRandomResizedCrop224Flip);

// Unfused: whole decode, then crop and resize (what fusing saves).
void BM_UnfusedRandomResizedCrop224Flip(benchmark::State& state) {
  Image full, cropped, out;
  uint64_t i = 0;
  for (auto _ : state) {
    spindle::ops::decode(files()[i % files().size()], std::nullopt, std::nullopt, full);
    spindle::ops::Rng rng(0, 0, i);
    const auto box = spindle::ops::random_resized_crop_box(full.height, full.width, rng);
    spindle::ops::crop(full, box, cropped);
    spindle::ops::resize(cropped, {224, 224}, out);
    if (rng.uniform() < 0.5) spindle::ops::hflip(out);
    benchmark::DoNotOptimize(out.pixels.data());
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_UnfusedRandomResizedCrop224Flip);

// Resize alone, from state.range(0) square to 224.
void BM_Resize(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  Image in{n, n, 3, std::vector<uint8_t>(static_cast<size_t>(n) * n * 3, 100)}, out;
  for (size_t k = 0; k < in.pixels.size(); ++k) in.pixels[k] = static_cast<uint8_t>(k * 31);
  for (auto _ : state) {
    spindle::ops::resize(in, {224, 224}, out);
    benchmark::DoNotOptimize(out.pixels.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Resize)->Arg(150)->Arg(280)->Arg(400);

}  // namespace
