#include <spindle/pipeline.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <spindle/error.hpp>
#include <spindle/ops/image_ops.hpp>
#include <spindle/sources.hpp>

namespace spindle {

namespace {

// One sample as a source gives it: encoded bytes to decode (an image file, a
// shard member) or pixels already decoded (an array row), its label and its
// name for errors.
struct SourceSample {
  std::vector<std::byte> encoded;
  ops::Image decoded;
  bool is_decoded = false;
  int64_t label = -1;
  SampleId id;
};

// Where a pipeline's samples come from. The three kinds (image folder,
// arrays, WebDataset shards) sit behind this one interface, so the pipeline
// holds one source and never asks which it is.
class PipelineSource {
 public:
  virtual ~PipelineSource() = default;
  // Samples readable by index (0 for a stream).
  virtual std::size_t size() const noexcept = 0;
  // The stream of a WebDataset source, read by shard (nullptr: read by index).
  virtual const WebDataset* stream() const noexcept { return nullptr; }
  // The image size a sample has before any op, if every sample has the same
  // one (an array's row shape); nullopt: known only per sample.
  virtual std::optional<std::pair<int, int>> fixed_size() const { return std::nullopt; }
  // Sample `index` (map-style sources only).
  virtual void read(int64_t index, SourceSample& out) const = 0;
};

class FolderSource final : public PipelineSource {
 public:
  explicit FolderSource(const PipelineOptions& o) : folder_(o.image_folder) {
    if (!o.decode)
      SPINDLE_THROW(std::invalid_argument, "spindle: an image folder holds encoded files: add decode() after it");
  }
  std::size_t size() const noexcept override { return folder_.size(); }
  void read(int64_t index, SourceSample& out) const override {
    Record rec = folder_.read(static_cast<std::size_t>(index));
    out.encoded = std::move(rec.data);
    out.label = rec.label;
    out.id = SampleId{"sample " + std::to_string(index) + " (" + rec.origin + ")", rec.origin, ""};
  }

 private:
  ImageFolder folder_;
};

class ArraysSource final : public PipelineSource {
 public:
  explicit ArraysSource(const PipelineOptions& o) : arrays_(ArraySource::from_npy(o.npy)) {
    if (arrays_.dtype() != "|u1")
      SPINDLE_THROW(std::invalid_argument, "spindle: " + o.npy + " holds " + arrays_.dtype() +
                                               "; the image pipeline reads uint8 images [N, H, W, 3]");
    if (o.decode) SPINDLE_THROW(std::invalid_argument, "spindle: arrays are already decoded: drop decode()");
  }
  std::size_t size() const noexcept override { return arrays_.size(); }
  std::optional<std::pair<int, int>> fixed_size() const override {
    const auto shape = arrays_.row_shape();
    if (shape.size() == 3 && shape[2] == 3) return std::pair{static_cast<int>(shape[0]), static_cast<int>(shape[1])};
    return std::nullopt;
  }
  void read(int64_t index, SourceSample& out) const override {
    const auto shape = arrays_.row_shape();
    const auto bytes = arrays_.row(static_cast<std::size_t>(index));
    out.decoded.height = static_cast<int>(shape[0]);
    out.decoded.width = static_cast<int>(shape[1]);
    out.decoded.channels = 3;
    out.decoded.pixels.assign(reinterpret_cast<const uint8_t*>(bytes.data()),
                              reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size());
    out.is_decoded = true;
    out.label = -1;
  }

 private:
  ArraySource arrays_;
};

class WebDatasetSource final : public PipelineSource {
 public:
  explicit WebDatasetSource(const PipelineOptions& o) : wds_(o.webdataset) {
    if (!o.decode)
      SPINDLE_THROW(std::invalid_argument, "spindle: WebDataset shards hold encoded images: add decode() after them");
  }
  std::size_t size() const noexcept override { return 0; }
  const WebDataset* stream() const noexcept override { return &wds_; }
  void read(int64_t, SourceSample&) const override {
    SPINDLE_FAIL_INTERNAL("spindle: a WebDataset pipeline is read by shard, not by index");
  }

 private:
  WebDataset wds_;
};

std::unique_ptr<PipelineSource> make_source(const PipelineOptions& o) {
  if (!o.webdataset.empty()) return std::make_unique<WebDatasetSource>(o);
  if (!o.image_folder.empty()) return std::make_unique<FolderSource>(o);
  return std::make_unique<ArraysSource>(o);
}

}  // namespace

struct Pipeline::Impl {
  std::unique_ptr<PipelineSource> source;
  int out_h = 0, out_w = 0;  // the image field's height and width
};

namespace {

// The output size the ops produce, known without reading a sample: the crop's
// size, else (for arrays without ops) the source's fixed size.
std::pair<int, int> output_size(const PipelineOptions& o, const PipelineSource& source) {
  if (o.random_resized_crop) return {o.random_resized_crop->size, o.random_resized_crop->size};
  if (o.center_crop) return {*o.center_crop, *o.center_crop};
  if (!o.resize_shorter)
    if (auto size = source.fixed_size()) return *size;
  SPINDLE_THROW(std::invalid_argument,
                "spindle: a pipeline's images must all come out the same size to be batched: add "
                "random_resized_crop(size) or center_crop(size) after decode (or resize_shorter + center_crop)");
}

// Decoded image (possibly cropped in the decoder) for one sample without a
// random-resized crop (that one is fused further: Pipeline::produce_encoded).
void decode_sample(const PipelineOptions& o, std::span<const std::byte> bytes, ops::Image& img) {
  if (o.center_crop && !o.resize_shorter) {
    const ops::ImageInfo info = ops::probe(bytes);
    const int s = *o.center_crop;
    ops::decode(bytes, ops::center_crop_box(info.height, info.width, ops::Size{s, s}), std::nullopt, img);
    return;
  }
  ops::decode(bytes, std::nullopt, std::nullopt, img);
}

// Resize so the shorter side is `shorter` (torchvision Resize(int)).
void resize_shorter(ops::Image& img, int shorter) {
  const int h = img.height, w = img.width;
  const ops::Size size = h <= w ? ops::Size{shorter, std::max(1, static_cast<int>(int64_t{w} * shorter / h))}
                                : ops::Size{std::max(1, static_cast<int>(int64_t{h} * shorter / w)), shorter};
  ops::Image out;
  ops::resize(img, size, out);
  img = std::move(out);
}

void center_crop(ops::Image& img, int size) {
  ops::Image out;
  ops::crop(img, ops::center_crop_box(img.height, img.width, ops::Size{size, size}), out);
  img = std::move(out);
}

}  // namespace

Pipeline::Pipeline(PipelineOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  const PipelineOptions& o = options_;
  if (int(!o.image_folder.empty()) + int(!o.npy.empty()) + int(!o.webdataset.empty()) != 1)
    SPINDLE_THROW(std::invalid_argument,
                  "spindle: a pipeline needs exactly one source (image_folder, npy or webdataset shards)");
  impl_->source = make_source(o);
  if (o.random_resized_crop && o.center_crop)
    SPINDLE_THROW(std::invalid_argument, "spindle: choose random_resized_crop or center_crop, not both");
  if (o.normalize) {
    for (float s : o.normalize->second)
      if (!(s > 0)) SPINDLE_THROW(std::invalid_argument, "spindle: normalize needs std > 0");
  }
  std::tie(impl_->out_h, impl_->out_w) = output_size(o, *impl_->source);
}

Pipeline::~Pipeline() = default;
Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&&) noexcept = default;

std::size_t Pipeline::size() const noexcept { return impl_->source->size(); }

bool Pipeline::streaming() const noexcept { return impl_->source->stream() != nullptr; }

const WebDataset& Pipeline::webdataset() const {
  const WebDataset* wds = impl_->source->stream();
  if (!wds) SPINDLE_FAIL_INTERNAL("spindle: this pipeline does not read WebDataset shards");
  return *wds;
}

SlotLayout Pipeline::layout(uint32_t capacity) const {
  const int64_t h = impl_->out_h, w = impl_->out_w;
  FieldSpec image;
  if (options_.normalize) {
    image.dtype = "<f4";
    image.shape = options_.chw ? std::vector<int64_t>{3, h, w} : std::vector<int64_t>{h, w, 3};
  } else {
    image.dtype = "|u1";
    image.shape = {h, w, 3};
  }
  return SlotLayout({image, FieldSpec{"<i8", {}}}, capacity);
}

void Pipeline::produce(int64_t index, uint64_t seed, uint64_t epoch, const SlotLayout& layout,
                       std::span<std::byte> payload, std::size_t row) const {
  const PipelineOptions& o = options_;
  SourceSample sample;
  impl_->source->read(index, sample);
  if (!sample.is_decoded) {
    produce_encoded(sample.encoded, sample.label, sample.id, static_cast<uint64_t>(index), seed, epoch, layout,
                    payload, row);
    return;
  }
  ops::Rng rng(seed, epoch, static_cast<uint64_t>(index));
  ops::Image img = std::move(sample.decoded);
  const int64_t label = sample.label;
  {
    if (o.random_resized_crop) {
      const ops::CropBox b = ops::random_resized_crop_box(img.height, img.width, rng, o.random_resized_crop->scale,
                                                          o.random_resized_crop->ratio);
      ops::Image crop;
      ops::crop(img, b, crop);
      ops::Image out;
      ops::resize(crop, ops::Size{o.random_resized_crop->size, o.random_resized_crop->size}, out);
      img = std::move(out);
    }
  }
  finish(std::move(img), label, rng, layout, payload, row);
}

void Pipeline::produce_encoded(std::span<const std::byte> encoded, int64_t label, const SampleId& id,
                               uint64_t draw, uint64_t seed, uint64_t epoch, const SlotLayout& layout,
                               std::span<std::byte> payload, std::size_t row) const {
  const PipelineOptions& o = options_;
  ops::Rng rng(seed, epoch, draw);
  if (o.random_resized_crop) {
    // Fused: decode + crop + resize + flip in one call, straight into the
    // slot's row (or, with normalize, into a reused per-thread image). The
    // draws come in the same order as in finish(): the crop's, then the flip's.
    const int s = o.random_resized_crop->size;
    const size_t n = static_cast<size_t>(s) * s * 3;
    thread_local ops::Image staging;
    std::span<uint8_t> dst;
    if (o.normalize) {
      staging.height = staging.width = s;
      staging.channels = 3;
      staging.pixels.resize(n);
      dst = staging.pixels;
    } else {
      dst = layout.view<uint8_t>(payload, 0).subspan(row * n, n);
    }
    auto plan = [&](int height, int width) {
      ops::CropPlan p;
      p.box = ops::random_resized_crop_box(height, width, rng, o.random_resized_crop->scale,
                                           o.random_resized_crop->ratio);
      p.mirror = o.flip_probability > 0 && rng.uniform() < o.flip_probability;
      return p;
    };
    try {
      ops::decode_resized(encoded, plan, ops::Size{s, s}, dst);
    } catch (const std::exception& e) {
      throw DecodeError("spindle: cannot decode " + id.origin + ": " + e.what(), id.path, id.key);
    }
    if (o.normalize) {
      std::span<float> out = layout.view<float>(payload, 0).subspan(row * n, n);
      ops::normalize(staging, o.normalize->first, o.normalize->second, o.chw, out);
    }
    layout.view<int64_t>(payload, 1)[row] = label;
    return;
  }
  ops::Image img;
  try {
    decode_sample(o, encoded, img);
  } catch (const std::exception& e) {
    throw DecodeError("spindle: cannot decode " + id.origin + ": " + e.what(), id.path, id.key);
  }
  finish(std::move(img), label, rng, layout, payload, row);
}

void Pipeline::finish(ops::Image img, int64_t label, ops::Rng& rng, const SlotLayout& layout,
                      std::span<std::byte> payload, std::size_t row) const {
  const PipelineOptions& o = options_;
  if (o.resize_shorter) resize_shorter(img, *o.resize_shorter);
  if (o.center_crop && (img.height != *o.center_crop || img.width != *o.center_crop)) center_crop(img, *o.center_crop);
  // The flip draw comes after the crop's draws: same sequence in every mode.
  if (o.flip_probability > 0 && rng.uniform() < o.flip_probability) ops::hflip(img);
  if (img.height != impl_->out_h || img.width != impl_->out_w)
    SPINDLE_FAIL_INTERNAL("spindle: a sample came out " + std::to_string(img.height) + "x" +
                          std::to_string(img.width) + ", not " + std::to_string(impl_->out_h) + "x" +
                          std::to_string(impl_->out_w) + " in the pipeline");
  if (o.normalize) {
    std::span<float> out = layout.view<float>(payload, 0).subspan(row * img.pixels.size(), img.pixels.size());
    ops::normalize(img, o.normalize->first, o.normalize->second, o.chw, out);
  } else {
    std::span<uint8_t> out = layout.view<uint8_t>(payload, 0).subspan(row * img.pixels.size(), img.pixels.size());
    std::memcpy(out.data(), img.pixels.data(), img.pixels.size());
  }
  layout.view<int64_t>(payload, 1)[row] = label;
}

Skips fill_batch(const Pipeline& pipe, std::span<const int64_t> indices, uint64_t seed, uint64_t epoch,
                 const SlotLayout& layout, std::span<std::byte> payload) {
  const bool skip = pipe.options().on_error == PipelineOptions::OnError::kSkip;
  std::vector<std::size_t> bad;
  Skips skips;
  std::string first_error, first_path, first_key;
  for (std::size_t row = 0; row < indices.size(); ++row) {
    try {
      pipe.produce(indices[row], seed, epoch, layout, payload, row);
    } catch (const DecodeError& e) {
      if (!skip) throw;
      if (first_error.empty()) first_error = e.what(), first_path = e.path, first_key = e.key;
      skips.add(e.what());
      bad.push_back(row);
    } catch (const DataError& e) {
      if (!skip) throw;
      if (first_error.empty()) first_error = e.what(), first_path = e.path, first_key = e.key;
      skips.add(e.what());
      bad.push_back(row);
    } catch (const std::exception& e) {
      if (!skip) throw;
      if (first_error.empty()) first_error = e.what();
      skips.add(e.what());
      bad.push_back(row);
    }
  }
  if (bad.empty()) return {};
  // Replace each bad row by a copy of a good row of the same batch (the
  // nearest before it, else after): deterministic, whatever the mode.
  std::vector<bool> is_bad(indices.size(), false);
  for (std::size_t r : bad) is_bad[r] = true;
  std::size_t good = indices.size();
  for (std::size_t r = 0; r < indices.size(); ++r)
    if (!is_bad[r]) {
      good = r;
      break;
    }
  if (good == indices.size())
    throw DecodeError("spindle: every sample of a batch failed (on_error='skip' needs one good sample "
                      "to stand in); the first: " + first_error, first_path, first_key);
  for (std::size_t r : bad) {
    std::size_t src = good;
    for (std::size_t k = r; k-- > 0;)
      if (!is_bad[k]) {
        src = k;
        break;
      }
    for (std::size_t f = 0; f < layout.num_fields(); ++f) {
      std::byte* block = payload.data() + layout.offset(f);
      std::memcpy(block + r * layout.row_bytes(f), block + src * layout.row_bytes(f), layout.row_bytes(f));
    }
  }
  return skips;
}

namespace {

// Skipped samples: the count in the slot's own field (SlotHeader::skipped),
// which the consumer's ratio check reads; the reasons of the first
// Skips::kMaxReasons, one a line (each naming its file), for the warning a
// front end gives, in the batch's structure bytes. Each is cut to fit, so the
// lines always fit the descriptor's structure bytes.
void note_skips(WorkerContext& ctx, const WorkItem& item, const SlotLayout& layout, const Skips& skips) {
  ctx.ring().slot(item.slot).skipped = static_cast<uint32_t>(skips.count);
  if (!skips.count) return;
  constexpr std::size_t kLine = SlotLayout::kMaxStructureBytes / Skips::kMaxReasons - 1;
  std::string lines;
  for (const std::string& r : skips.reasons) {
    std::string line = r.substr(0, kLine);
    for (char& c : line)
      if (c == '\n') c = ' ';
    lines += (lines.empty() ? "" : "\n") + line;
  }
  write_arrays_descriptor(ctx.ring().descriptor(item.slot), layout, lines);
}

// Inside a catch block: fails the item with its failure kind, path and key
// in the slot's failure record (the consumer raises by kind). The report
// still starts with the kind's name and a newline for the Python front that
// splits it (pipeline.py _native_error) until it reads BatchFailedError.kind.
void fail_current(WorkerContext& ctx, const WorkItem& item) noexcept {
  try {
    throw;
  } catch (const DecodeError& e) {
    ctx.fail(item, e.what(), FailureKind::kDecode, e.path, e.key);
  } catch (const DataError& e) {
    ctx.fail(item, e.what(), FailureKind::kData, e.path, e.key);
  } catch (const InternalError& e) {
    ctx.fail(item, e.what(), FailureKind::kInternal);
  } catch (const std::exception& e) {
    ctx.fail(item, e.what());
  } catch (...) {
    ctx.fail(item, "an unknown exception in the pipeline");
  }
}

}  // namespace

WorkerMain pipeline_worker(std::shared_ptr<const Pipeline> pipe, uint64_t seed, uint64_t epoch) {
  return [pipe = std::move(pipe), seed, epoch](WorkerContext& ctx) {
    std::optional<SlotLayout> layout;
    while (auto item = ctx.claim()) {
      try {
        if (!layout) layout.emplace(pipe->layout(ctx.ring().geometry().batch_capacity));
        std::span<std::byte> out = ctx.begin_arrays(*item, *layout, "");
        note_skips(ctx, *item, *layout, fill_batch(*pipe, item->indices, seed, epoch, *layout, out));
        ctx.commit(*item);
      } catch (...) {
        fail_current(ctx, *item);
      }
    }
    return 0;
  };
}

WorkerMain pipeline_stream_worker(std::shared_ptr<const Pipeline> pipe, uint64_t seed, uint64_t epoch) {
  return [pipe = std::move(pipe), seed, epoch](WorkerContext& ctx) {
    const WebDataset& wds = pipe->webdataset();
    const std::vector<std::size_t> shards =
        wds.shards_of_worker(static_cast<std::size_t>(ctx.worker_id()), static_cast<std::size_t>(ctx.num_workers()));
    const bool skip = pipe->options().on_error == PipelineOptions::OnError::kSkip;
    const uint32_t capacity = ctx.ring().geometry().batch_capacity;
    const SlotLayout layout = pipe->layout(capacity);
    std::size_t next_shard = 0, shard = 0;
    uint64_t position = 0;  // of the next sample in `shard`
    std::optional<WdsShardReader> reader;
    bool ended = false;
    while (auto item = ctx.claim()) {
      if (item->new_stream) {  // Loader::reset_streams: this worker's shards again, from the first
        next_shard = 0;
        reader.reset();
        ended = false;
      }
      if (ended) {
        ctx.exhausted(*item);
        continue;
      }
      try {
        std::span<std::byte> out = ctx.begin_arrays(*item, layout, "");
        uint32_t count = 0;
        Skips skips;
        while (count < capacity) {
          if (!reader) {
            if (next_shard == shards.size()) {
              ended = true;
              break;
            }
            shard = shards[next_shard++];
            position = 0;
            reader.emplace(wds, shard);
          }
          std::optional<WdsSample> sample;
          try {
            sample = reader->next();
          } catch (...) {
            reader.reset();  // a corrupt shard: its tail is lost, the next shard goes on
            throw;
          }
          if (!sample) {
            reader.reset();
            continue;
          }
          const uint64_t draw = (static_cast<uint64_t>(shard) << 32) | position++;
          ctx.set_sample(static_cast<int64_t>(draw));
          const std::vector<std::byte>* image = nullptr;
          for (const char* ext : {"jpg", "jpeg", "png"})
            if (auto it = sample->fields.find(ext); it != sample->fields.end()) image = &it->second;
          try {
            if (!image)
              throw DataError("spindle: " + sample->origin + " has no jpg, jpeg or png member", reader->shard(),
                              sample->key);
            int64_t label = -1;
            try {
              label = WebDataset::label_of(*sample);
            } catch (const DataError& e) {  // a bad label: named by its shard and key too
              if (!e.path.empty()) throw;
              throw DataError(e.what(), reader->shard(), sample->key);
            }
            pipe->produce_encoded(*image, label, SampleId{sample->origin, reader->shard(), sample->key}, draw, seed,
                                  epoch, layout, out, count);
            ++count;
          } catch (const std::exception& e) {
            if (!skip) throw;
            skips.add(e.what());  // dropped from the stream, counted
          }
        }
        if (count == 0) {
          ctx.exhausted(*item);
          continue;
        }
        note_skips(ctx, *item, layout, skips);
        ctx.commit(*item, count);
      } catch (...) {
        fail_current(ctx, *item);
      }
    }
    return 0;
  };
}

}  // namespace spindle
