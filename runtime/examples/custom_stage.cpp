// A native pipeline with a user-defined stage and a variable-length caption
// field: spindle's source and built-in stages, then a custom colour transform
// (sepia, with a per-sample strength drawn from the sample's Rng) that also
// writes a caption describing the image, then a crop and a flip. Run once by
// forked worker processes and once by the arena's threads: the batches must
// be the same bytes, captions included.
//
//   ./custom_stage [image_folder_root]
//
// With no argument it writes a small .npy of 40 images (72x96 RGB) to a
// temporary file and reads that; with a folder in ImageNet layout it decodes
// the JPEG/PNG files there instead.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <spindle/loader.hpp>
#include <spindle/pipeline.hpp>
#include <spindle/stage.hpp>

#include "npy_images.hpp"

namespace {

// The user stage: sepia toning blended in by a strength in [0.5, 1) drawn
// from the sample's own Rng (so every mode and worker count draws the same),
// and a caption of varying length naming the strength and the mean colour.
// Safe to call from many threads at once: it touches only its sample.
spindle::Stage sepia_with_caption() {
  spindle::UserStage u;
  u.name = "sepia";
  u.adds_bytes = {"caption"};
  u.fn = [](spindle::Sample& s, spindle::ops::Rng& rng) {
    const double strength = rng.uniform(0.5, 1.0);
    double sum[3] = {0, 0, 0};
    std::vector<uint8_t>& px = s.image.pixels;
    for (std::size_t k = 0; k + 2 < px.size(); k += 3) {
      const double r = px[k], g = px[k + 1], b = px[k + 2];
      const double tone[3] = {0.393 * r + 0.769 * g + 0.189 * b, 0.349 * r + 0.686 * g + 0.168 * b,
                              0.272 * r + 0.534 * g + 0.131 * b};
      for (int c = 0; c < 3; ++c) {
        const double v = (1 - strength) * px[k + c] + strength * std::min(255.0, tone[c]);
        px[k + c] = static_cast<uint8_t>(v + 0.5);
        sum[c] += px[k + c];
      }
    }
    const double n = static_cast<double>(px.size() / 3);
    char text[160];
    const int len = std::snprintf(text, sizeof text, "sepia %.2f, label %lld, mean colour (%.0f, %.0f, %.0f)%s",
                                  strength, static_cast<long long>(s.label), sum[0] / n, sum[1] / n, sum[2] / n,
                                  strength > 0.75 ? ", strongly toned" : "");
    auto& caption = s.bytes["caption"];
    caption.resize(static_cast<std::size_t>(len));
    std::memcpy(caption.data(), text, caption.size());
  };
  return spindle::user_stage(std::move(u));
}

struct Batches {
  std::vector<std::vector<uint8_t>> images;
  std::vector<std::string> captions;
  bool operator==(const Batches&) const = default;
};

Batches run(spindle::Loader& loader) {
  Batches out;
  while (auto b = loader.next()) {
    const auto images = b->field<uint8_t>(0);  // [count, 48, 64, 3]
    out.images.emplace_back(images.begin(), images.end());
    const spindle::BytesColumn captions = b->bytes(2);  // one byte string per sample
    for (std::size_t i = 0; i < captions.size(); ++i)
      out.captions.emplace_back(reinterpret_cast<const char*>(captions[i].data()), captions[i].size());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  namespace stages = spindle::stages;
  spindle::PipelineOptions o;
  std::string npy;
  if (argc > 1) {
    o.image_folder = argv[1];
    o.stages.push_back(stages::decode());
    o.stages.push_back(stages::resize({72, 96}));
  } else {
    npy = spindle_examples::write_temp_npy_images("spindle-custom-stage", 40, 72, 96, {6, 3, 2});
    if (npy.empty()) return 2;
    o.npy = npy;
  }
  o.stages.push_back(sepia_with_caption());
  o.stages.push_back(stages::random_resized_crop({48, 64}, {0.3, 1.0}));
  o.stages.push_back(stages::random_flip(0.5));
  o.bytes_per_sample = 128;  // room for the captions: 128 bytes x 8 per batch
  auto pipe = std::make_shared<const spindle::Pipeline>(o);

  std::vector<int64_t> order(pipe->size());
  std::iota(order.begin(), order.end(), 0);
  spindle::LoaderOptions lo;
  lo.num_workers = 2;
  lo.batch_capacity = 8;
  lo.slot_bytes = pipe->layout(lo.batch_capacity).bytes();
  const auto plan = spindle::BatchPlan::chunked(order, lo.batch_capacity, false);
  const uint64_t seed = 11, epoch = 0;

  spindle::Loader processes(lo, plan, spindle::Launcher::fork(spindle::pipeline_worker(pipe, seed, epoch)));
  const Batches a = run(processes);
  spindle::Loader threads(lo, plan, spindle::Launcher::threads(spindle::pipeline_worker(pipe, seed, epoch)));
  const Batches b = run(threads);
  if (!npy.empty()) std::remove(npy.c_str());

  std::size_t longest = 0, shortest = 1 << 20;
  for (const std::string& c : a.captions) {
    longest = std::max(longest, c.size());
    shortest = std::min(shortest, c.size());
  }
  std::printf("%zu samples in %zu batches of [48, 64, 3] uint8 + captions of %zu-%zu bytes; first: \"%s\"; "
              "threads mode %s\n",
              a.captions.size(), a.images.size(), shortest, longest, a.captions.empty() ? "" : a.captions[0].c_str(),
              a == b ? "identical" : "DIFFERENT");
  return a == b && a.captions.size() == pipe->size() ? 0 : 1;
}
