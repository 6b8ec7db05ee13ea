// A native pipeline from C++: images read from a source, random-resized-cropped,
// flipped and normalized in C++, batched into the shared ring as typed fields —
// once by forked worker processes and once by the arena's threads, which must
// give the same batches bit for bit.
//
//   ./native_pipeline [image_folder_root]
//
// With no argument it writes a small .npy of 64 images (96x128 RGB) to a
// temporary file and reads that; with a folder in ImageNet layout it decodes
// the JPEG/PNG files there instead.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <spindle/loader.hpp>
#include <spindle/pipeline.hpp>

#include "npy_images.hpp"

namespace {

// Every batch of one epoch as (images, labels), read through the typed fields.
std::vector<std::pair<std::vector<float>, std::vector<int64_t>>> run(spindle::Loader& loader) {
  std::vector<std::pair<std::vector<float>, std::vector<int64_t>>> out;
  while (auto b = loader.next()) {
    const auto images = b->field<float>(0);  // [count, 3, 64, 64], normalized
    const auto labels = b->field<int64_t>(1);
    out.emplace_back(std::vector<float>(images.begin(), images.end()),
                     std::vector<int64_t>(labels.begin(), labels.end()));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  spindle::PipelineOptions o;
  std::string npy;
  namespace stages = spindle::stages;
  if (argc > 1) {
    o.image_folder = argv[1];
    o.stages.push_back(stages::decode());
  } else {
    npy = spindle_examples::write_temp_npy_images("spindle-example", 64, 96, 128, {3, 2, 1});
    if (npy.empty()) return 2;
    o.npy = npy;
  }
  o.stages.push_back(stages::random_resized_crop({64, 64}));
  o.stages.push_back(stages::random_flip(0.5));
  o.stages.push_back(stages::normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}, /*chw=*/true));
  auto pipe = std::make_shared<const spindle::Pipeline>(o);

  std::vector<int64_t> order(pipe->size());
  std::iota(order.begin(), order.end(), 0);
  spindle::LoaderOptions lo;
  lo.num_workers = 2;
  lo.batch_capacity = 16;  // the batch size
  // make_pipeline_loader adds what the pipeline decides: slot sizes, streams'
  // round robin, and the skip-ratio check when on_error is kSkip.
  const spindle::PipelineEpoch epoch{.order = order, .seed = 7, .epoch = 0};

  auto processes = spindle::make_pipeline_loader(pipe, epoch, lo, spindle::PipelineMode::kProcesses);
  const auto a = run(*processes);
  auto threads = spindle::make_pipeline_loader(pipe, epoch, lo, spindle::PipelineMode::kThreads);
  const auto b = run(*threads);
  if (!npy.empty()) std::remove(npy.c_str());

  double sum = 0;
  for (const auto& [images, labels] : a) sum = std::accumulate(images.begin(), images.end(), sum);
  std::printf("%zu samples in %zu batches of [3, 64, 64] float32; checksum %.3f; threads mode %s\n",
              pipe->size(), a.size(), sum, a == b ? "identical" : "DIFFERENT");
  return a == b && !a.empty() ? 0 : 1;
}
