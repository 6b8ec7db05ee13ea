#pragma once
// Pipeline: a native input pipeline — a source of samples, then per-sample
// stages in C++ (stage.hpp: the built-ins and user-defined ones, in the
// order given), then batching — producing batches of typed fields:
//
//   "image"  uint8 [H, W, 3] (or float32 [H, W, 3] / [3, H, W] after normalize)
//   "label"  int64 []
//   byte fields, one per kept WebDataset member ("txt", "json", ...) and per
//            name a stage adds: one byte string per sample (SlotLayout's
//            FieldKind::kBytes; Batch::bytes)
//
// It runs the same way in forked workers (processes mode: a Loader with
// Launcher::fork(pipeline_worker(...))) and on the arena's threads in the
// consumer (threads mode: Launcher::threads(pipeline_worker(...))), and gives
// the same bytes either way: every random draw comes from Rng(seed, epoch,
// sample index), never from a stream that depends on which worker or thread
// ran the sample, or in what order.
//
// A sample that cannot be read or decoded fails its batch with the file (or
// shard and key) and the decoder's message; with on_error=kSkip it is replaced
// by the next good sample of its batch's neighbourhood (a stream: dropped) and
// counted, and the loader raises once skips exceed max_skip_ratio of the
// samples seen. A batch whose byte fields do not fit their room in the slot
// (bytes_per_sample x batch size) fails naming the field, the sample and the
// bytes_per_sample that would fit, whatever on_error says (nothing is cut).

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <spindle/launcher.hpp>
#include <spindle/loader.hpp>
#include <spindle/ops/image_ops.hpp>
#include <spindle/shard_stream.hpp>
#include <spindle/slot_layout.hpp>
#include <spindle/stage.hpp>
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
  // Where those shards live and how they are fetched: URLs (http, https,
  // pipe:), retries, timeouts, the local cache (shard_stream.hpp).
  ShardOptions webdataset_options;
  // WebDataset members passed through as byte fields of these names ("txt",
  // "json"): a sample without one fails naming the shard and key.
  std::vector<std::string> keep;

  // The per-sample stages, in order (stage.hpp): stages::decode(), crops,
  // user_stage(...), ...; validated when the Pipeline is built.
  std::vector<Stage> stages;

  // Room for each byte field in a batch's slot: bytes_per_sample x the batch
  // size (a long caption may use a short one's share).
  uint64_t bytes_per_sample = 4096;

  enum class OnError { kRaise, kSkip } on_error = OnError::kRaise;
  double max_skip_ratio = 0.05;
};

// The byte fields of one batch's rows while it is filled (they reach the slot
// all at once, after skipped rows are replaced: SlotLayout::put_bytes).
struct BatchBytes {
  std::vector<std::vector<std::vector<std::byte>>> rows;  // [byte field][row]
  std::vector<std::string> origins;                       // [row]: the sample, for errors
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
  // The batch's fields for up to `capacity` samples: image, label, then the
  // byte fields (FieldKind::kBytes) in the order of field_names().
  SlotLayout layout(uint32_t capacity) const;
  // "image", "label", then the byte fields' names.
  const std::vector<std::string>& field_names() const noexcept;

  // Produces sample `index` of epoch `epoch` into row `row` of a payload laid
  // out by layout() (its byte fields into `bytes`, row `row`). Throws
  // spindle::DecodeError / DataError (with the sample's path and key) on bad
  // input (the caller decides: fail or skip).
  void produce(int64_t index, uint64_t seed, uint64_t epoch, const SlotLayout& layout, std::span<std::byte> payload,
               std::size_t row, BatchBytes& bytes) const;
  // The same for a sample already read (a stream's: encoded bytes, label and
  // byte fields in `sample`); `draw` names the sample for its random draws.
  void produce_read(Sample& sample, uint64_t draw, uint64_t seed, uint64_t epoch, const SlotLayout& layout,
                    std::span<std::byte> payload, std::size_t row, BatchBytes& bytes) const;
  // Writes the byte fields of rows [0, count) into the payload; throws
  // std::length_error naming the field, the first sample that does not fit
  // and the bytes_per_sample that would.
  void put_bytes(const SlotLayout& layout, std::span<std::byte> payload, const BatchBytes& bytes,
                 std::size_t count) const;
  // The WebDataset source (streaming() only).
  const class WebDataset& webdataset() const;

 private:
  void run_stages(Sample& sample, ops::Rng& rng, const SlotLayout& layout, std::span<std::byte> payload,
                  std::size_t row, BatchBytes& bytes) const;
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
// Byte fields are written after the rows are final (Pipeline::put_bytes).
Skips fill_batch(const Pipeline& pipe, std::span<const int64_t> indices, uint64_t seed, uint64_t epoch,
                 const SlotLayout& layout, std::span<std::byte> payload);

// The worker body for processes mode: claims items and fills them. The seed
// and epoch of each batch travel in the slot (see LoaderOptions).
WorkerMain pipeline_worker(std::shared_ptr<const Pipeline> pipe, uint64_t seed, uint64_t epoch);

// The worker body for a streaming (WebDataset) pipeline, for a round-robin
// Loader with logical workers: logical worker l (WorkItem::stream) reads
// shards l, l + N, ... of N logical workers (WebDataset::shards_of_worker), in
// order, filling each claimed item with up to batch_capacity samples, and
// answers "exhausted" when they end; a process serves the logical workers the
// loader gives it, each from its own reader. Random draws come from (seed,
// epoch, shard << 32 | position in the shard), so a sample gets the same
// augmentation whichever process or mode reads it. Each batch carries where
// its stream stands after it (Batch::stream_position, opaque; 0 is the
// start); `starts` (one per logical worker, or empty) starts the streams
// there: the shard it names is read up to that sample again (nothing of it
// decoded), so a stream restarted on other processes goes on with the same
// samples. The batch order is defined by N, as with any sharded stream.
WorkerMain pipeline_stream_worker(std::shared_ptr<const Pipeline> pipe, uint64_t seed, uint64_t epoch,
                                  std::vector<uint64_t> starts = {});

// Where a pipeline's workers run: forked processes, or the arena's threads in
// this process (the same bytes either way).
enum class PipelineMode { kProcesses, kThreads };

// One epoch of a pipeline: the samples in the order they are read (ignored by
// a stream, which reads its shards), cut into batches of the loader's
// batch_capacity, and what its random draws come from.
struct PipelineEpoch {
  std::vector<int64_t> order{};
  uint64_t seed = 0;
  uint64_t epoch = 0;
  bool drop_last = false;
  // A stream: where each logical worker's stream starts (the stream_position
  // of its last batch delivered; empty: every one from its first shard).
  std::vector<uint64_t> stream_starts{};
};

// A Loader running `pipe` over one epoch, with `options` as the caller set
// them (workers, batch_capacity as the batch size, prefetch, timeout, budget,
// a stream's first_worker, processes and adaptive) and the fields the
// pipeline decides: round_robin and logical_workers (a stream: batch k from
// logical worker k mod N until every one's shards end, N = num_workers
// whatever processes run them), slot_bytes (every
// batch has the layout's size: reserved up front) and max_skip_ratio
// (PipelineOptions::max_skip_ratio when on_error is kSkip, so next() throws
// SkipRatioError past it; else no check). `hooks` run around each fork
// (kProcesses; an embedding runtime's fork protocol).
std::unique_ptr<Loader> make_pipeline_loader(std::shared_ptr<const Pipeline> pipe, PipelineEpoch epoch,
                                             LoaderOptions options, PipelineMode mode, ForkHooks hooks = {});

}  // namespace spindle
