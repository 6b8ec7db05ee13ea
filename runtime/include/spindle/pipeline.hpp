#pragma once
// Pipeline: a native input pipeline — a source of encoded samples, decoding
// and augmentation in C++ — producing batches of typed fields:
//
//   "image"  uint8 [H, W, 3] (or float32 [H, W, 3] / [3, H, W] after normalize)
//   "label"  int64 []
//
// It runs the same way in a forked worker (processes mode: a Loader with
// Launcher::fork(pipeline_worker(...))) and on the arena's threads in the
// consumer (threads mode: Launcher::threads(pipeline_worker(...))), and gives the same bytes either way: every random draw
// comes from Rng(seed, epoch, sample index), never from a stream that depends
// on which worker or thread ran the sample, or in what order.
//
// The ops run in one fixed order: decode, then a crop (random-resized or
// center) fused into the decode when it follows it directly, then resize,
// flip, normalize. A sample that cannot be read or decoded fails its batch
// with the file (or shard and key) and the decoder's message; with
// on_error=kSkip it is replaced by the next good sample of its batch's
// neighbourhood and counted, and the loader raises once skips exceed
// max_skip_ratio of the samples seen.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spindle/ops/image_ops.hpp>
#include <spindle/slot_layout.hpp>
#include <spindle/worker_context.hpp>

namespace spindle {

struct PipelineOptions {
  // The source: exactly one of these.
  std::string image_folder;  // ImageNet layout: root/<class>/<file>
  std::string npy;           // a .npy of images [N, H, W, C] uint8 (memory-mapped); labels none (-1)
  // WebDataset tar shards, streamed (never extracted): the image is the
  // sample's jpg/jpeg/png member, the label its cls (or json "label").
  // Worker w reads shards w, w + N, ... (webdataset's split_by_worker).
  std::vector<std::string> webdataset;

  bool decode = false;  // encoded bytes -> RGB uint8 (needed for image folders)
  struct RandomResizedCrop {
    int size = 224;
    std::pair<double, double> scale{0.08, 1.0};
    std::pair<double, double> ratio{3.0 / 4.0, 4.0 / 3.0};
  };
  std::optional<RandomResizedCrop> random_resized_crop;
  std::optional<int> resize_shorter;  // torchvision Resize(int): shorter side to this, keeping the aspect
  std::optional<int> center_crop;     // torchvision CenterCrop(int)
  double flip_probability = 0.0;      // horizontal flip
  std::optional<std::pair<std::array<float, 3>, std::array<float, 3>>> normalize;  // mean, std (of x/255)
  bool chw = false;                   // with normalize: [3, H, W] instead of [H, W, 3]

  enum class OnError { kRaise, kSkip } on_error = OnError::kRaise;
  double max_skip_ratio = 0.05;
};

// A sample's identity in errors: `origin` for the message ("sample 3
// (root/cls/a.jpg)", "shard.tar:key"), `path` and `key` for DecodeError /
// DataError's fields (the file or shard; the WebDataset key, empty otherwise).
struct SampleId {
  std::string origin;
  std::string path;
  std::string key;
};

class Pipeline {
 public:
  explicit Pipeline(PipelineOptions options);
  ~Pipeline();
  Pipeline(Pipeline&&) noexcept;
  Pipeline& operator=(Pipeline&&) noexcept;

  std::size_t size() const noexcept;  // samples in the source (0 for a stream)
  bool streaming() const noexcept;    // WebDataset: read by shard, not by index
  const PipelineOptions& options() const noexcept { return options_; }
  // The batch's fields for up to `capacity` samples: image, label.
  SlotLayout layout(uint32_t capacity) const;

  // Produces sample `index` of epoch `epoch` into row `row` of a payload laid
  // out by layout(). Throws spindle::DecodeError / DataError (with the
  // sample's path and key) on bad input (the caller decides: fail or skip).
  void produce(int64_t index, uint64_t seed, uint64_t epoch, const SlotLayout& layout, std::span<std::byte> payload,
               std::size_t row) const;
  // The same for encoded bytes already read (a stream's sample); `draw` names
  // the sample for its random draws, `id` names it in errors.
  void produce_encoded(std::span<const std::byte> encoded, int64_t label, const SampleId& id, uint64_t draw,
                       uint64_t seed, uint64_t epoch, const SlotLayout& layout, std::span<std::byte> payload,
                       std::size_t row) const;
  // The WebDataset source (streaming() only).
  const class WebDataset& webdataset() const;

 private:
  void finish(ops::Image img, int64_t label, ops::Rng& rng, const SlotLayout& layout, std::span<std::byte> payload,
              std::size_t row) const;
  struct Impl;
  PipelineOptions options_;
  std::unique_ptr<Impl> impl_;
};

// What fill_batch skipped (on_error=kSkip): how many samples, and the
// reasons of the first kMaxReasons (the warning names their files). The count travels in the batch's own field (SlotHeader::skipped,
// Batch::skipped()); the consumer enforces max_skip_ratio on it
// (LoaderOptions::max_skip_ratio).
struct Skips {
  static constexpr std::size_t kMaxReasons = 8;  // reasons kept per batch; the rest are counted
  std::size_t count = 0;
  std::vector<std::string> reasons;  // of the first kMaxReasons skipped samples, each naming its file
  void add(std::string reason) {
    if (count++ < kMaxReasons) reasons.push_back(std::move(reason));
  }
};

// Fills rows of a batch: produce() for each index, applying on_error. With
// kSkip a bad row becomes a copy of the nearest good row of the same batch;
// throws the first error with kRaise, or if no row of the batch is good.
Skips fill_batch(const Pipeline& pipe, std::span<const int64_t> indices, uint64_t seed, uint64_t epoch,
                 const SlotLayout& layout, std::span<std::byte> payload);

// The worker body for processes mode: claims items and fills them. The seed
// and epoch of each batch travel in the slot (see LoaderOptions).
WorkerMain pipeline_worker(std::shared_ptr<const Pipeline> pipe, uint64_t seed, uint64_t epoch);

// The worker body for a streaming (WebDataset) pipeline, for a round-robin
// Loader: worker w fills each claimed item with up to batch_capacity samples
// of its shards, in order, and answers "exhausted" when they end. Random
// draws come from (seed, epoch, shard << 32 | position in the shard), so a
// sample gets the same augmentation whichever worker or mode reads it; the
// batch order depends on the worker count, as with any sharded stream.
WorkerMain pipeline_stream_worker(std::shared_ptr<const Pipeline> pipe, uint64_t seed, uint64_t epoch);

}  // namespace spindle
