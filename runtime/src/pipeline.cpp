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
  explicit ArraysSource(const PipelineOptions& o) : arrays_(ArraySource::from_npy(o.npy)), npy_(o.npy) {
    if (arrays_.dtype() != "|u1")
      SPINDLE_THROW(std::invalid_argument, "spindle: " + o.npy + " holds " + arrays_.dtype() +
                                               "; the image pipeline reads uint8 images [N, H, W, 3]");
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
    out.id = SampleId{"sample " + std::to_string(index) + " (" + npy_ + ")", npy_, ""};
  }

 private:
  ArraySource arrays_;
  std::string npy_;
};

class WebDatasetSource final : public PipelineSource {
 public:
  explicit WebDatasetSource(const PipelineOptions& o) : wds_(o.webdataset, o.webdataset_options) {
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

// One step of a pipeline's plan: a stage, or a built-in fused with the
// decode before it (the same bytes as running them one by one).
struct Step {
  enum class Op { kRun, kDecode, kDecodeCenterCrop, kDecodeResizedCrop, kNormalize } op = Op::kRun;
  std::size_t stage = 0;                 // the (first) stage it runs
  const Stage* crop = nullptr;           // kDecodeCenterCrop, kDecodeResizedCrop
  const Stage* flip = nullptr;           // kDecodeResizedCrop: the random_flip fused into it
  bool direct = false;                   // kDecodeResizedCrop: writes straight into the slot's row
  std::optional<ops::Size> size;         // the image's size after it, if fixed
};

// How a pipeline runs its stages (plan_stages).
struct Plan {
  std::vector<Step> plan;
  const Stage* normalize = nullptr;      // the final normalize, done as the row is written
  int out_h = 0, out_w = 0;              // the image field's height and width
  std::vector<std::string> byte_fields;  // keep, then the stages' adds_bytes
};

}  // namespace

struct Pipeline::Impl : Plan {
  std::unique_ptr<PipelineSource> source;
  std::vector<std::string> names;  // image, label, byte fields
};

namespace {

std::string stage_name(const std::vector<Stage>& stages, std::size_t i) {
  return "stage " + std::to_string(i) + " (" + stages[i].name + ")";
}

// Checks the stages in order against what the image is at each (encoded,
// pixels, normalized) and its size, and plans their run: which built-ins fuse
// with the decode before them, where normalize is. Throws
// std::invalid_argument naming the stage and what to change.
void plan_stages(const PipelineOptions& o, const PipelineSource& source, Plan& impl) {
  const std::vector<Stage>& st = o.stages;
  const bool arrays = !o.npy.empty();
  enum class State { kEncoded, kPixels, kNormalized } state = arrays ? State::kPixels : State::kEncoded;
  std::optional<ops::Size> size;
  if (arrays)
    if (auto s = source.fixed_size()) size = ops::Size{s->first, s->second};
  for (std::size_t i = 0; i < st.size(); ++i) {
    const Stage& s = st[i];
    if (!s.run && s.kind == Stage::Kind::kPlain)
      SPINDLE_THROW(std::invalid_argument, "spindle: " + stage_name(st, i) + " has no function");
    if (s.needs == Stage::Needs::kEncoded && state != State::kEncoded)
      SPINDLE_THROW(std::invalid_argument,
                    arrays ? "spindle: arrays are already decoded: drop decode() (" + stage_name(st, i) + ")"
                           : "spindle: " + stage_name(st, i) + " needs encoded bytes, but an earlier decode() "
                                                               "decoded them: decode once");
    if (s.needs == Stage::Needs::kPixels && state == State::kEncoded)
      SPINDLE_THROW(std::invalid_argument, "spindle: " + stage_name(st, i) +
                                               " needs decoded pixels: add decode() before it");
    if (s.needs == Stage::Needs::kPixels && state == State::kNormalized)
      SPINDLE_THROW(std::invalid_argument, "spindle: " + stage_name(st, i) +
                                               " comes after normalize(), which must be the last stage that touches "
                                               "the image: move it before normalize()");
    Step step;
    step.stage = i;
    if (s.kind == Stage::Kind::kDecode) {
      step.op = Step::Op::kDecode;
      const Stage* next = i + 1 < st.size() ? &st[i + 1] : nullptr;
      if (next && next->kind == Stage::Kind::kRandomResizedCrop) {
        step.op = Step::Op::kDecodeResizedCrop;
        step.crop = next;
        ++i;
        if (i + 1 < st.size() && st[i + 1].kind == Stage::Kind::kFlip) step.flip = &st[++i];
      } else if (next && next->kind == Stage::Kind::kCenterCrop) {
        step.op = Step::Op::kDecodeCenterCrop;
        step.crop = next;
        ++i;
      }
      state = State::kPixels;
      size = step.crop ? std::optional<ops::Size>(step.crop->fused.size) : std::nullopt;
    } else if (s.kind == Stage::Kind::kNormalize) {
      step.op = Step::Op::kNormalize;
      state = State::kNormalized;
      impl.normalize = &s;
    } else if (s.size_after) {
      size = s.size_after(size);
    }
    step.size = size;
    impl.plan.push_back(step);
    for (const std::string& name : s.adds_bytes) impl.byte_fields.push_back(name);
  }
  if (state == State::kEncoded)
    SPINDLE_THROW(std::invalid_argument, std::string("spindle: ") +
                                             (o.webdataset.empty() ? "an image folder" : "WebDataset shards") +
                                             " hold encoded images: add decode() after the source");
  if (!size)
    SPINDLE_THROW(std::invalid_argument,
                  "spindle: a pipeline's images must all come out the same size to be batched: end with "
                  "random_resized_crop(size), center_crop(size) or resize((h, w)) (after decode)");
  impl.out_h = size->height;
  impl.out_w = size->width;
  // A fused crop writes straight into the slot when nothing after it touches the pixels.
  if (!impl.plan.empty() && impl.plan.back().op == Step::Op::kDecodeResizedCrop) impl.plan.back().direct = true;
}

std::string size_text(int h, int w) { return std::to_string(h) + "x" + std::to_string(w); }

// A pixel buffer per thread, handed from sample to sample: decoding (and a
// fused crop followed by more stages or normalize) allocates nothing once warm.
std::vector<uint8_t>& spare_pixels() {
  thread_local std::vector<uint8_t> spare;
  return spare;
}

DecodeError decode_error(const SampleId& id, const std::exception& e) {
  return DecodeError("spindle: cannot decode " + id.origin + ": " + e.what(), id.path, id.key);
}

}  // namespace

Pipeline::Pipeline(PipelineOptions options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  const PipelineOptions& o = options_;
  if (int(!o.image_folder.empty()) + int(!o.npy.empty()) + int(!o.webdataset.empty()) != 1)
    SPINDLE_THROW(std::invalid_argument,
                  "spindle: a pipeline needs exactly one source (image_folder, npy or webdataset shards)");
  if (!o.keep.empty() && o.webdataset.empty())
    SPINDLE_THROW(std::invalid_argument, "spindle: keep names WebDataset members; this pipeline reads no shards");
  impl_->source = make_source(o);
  for (const std::string& k : o.keep) {
    if (k.empty() || k == "jpg" || k == "jpeg" || k == "png")
      SPINDLE_THROW(std::invalid_argument, "spindle: keep='" + k + "': name members other than the image (e.g. "
                                               "'txt', 'json')");
    impl_->byte_fields.push_back(k);
  }
  plan_stages(o, *impl_->source, *impl_);
  impl_->names = {"image", "label"};
  for (const std::string& name : impl_->byte_fields) {
    for (const std::string& seen : impl_->names)
      if (seen == name) SPINDLE_THROW(std::invalid_argument, "spindle: the batch field '" + name + "' is named twice");
    impl_->names.push_back(name);
  }
}

Pipeline::~Pipeline() = default;
Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&&) noexcept = default;

std::size_t Pipeline::size() const noexcept { return impl_->source->size(); }

bool Pipeline::streaming() const noexcept { return impl_->source->stream() != nullptr; }

const std::vector<std::string>& Pipeline::field_names() const noexcept { return impl_->names; }

const WebDataset& Pipeline::webdataset() const {
  const WebDataset* wds = impl_->source->stream();
  if (!wds) SPINDLE_FAIL_INTERNAL("spindle: this pipeline does not read WebDataset shards");
  return *wds;
}

SlotLayout Pipeline::layout(uint32_t capacity) const {
  const int64_t h = impl_->out_h, w = impl_->out_w;
  std::vector<FieldSpec> fields(2);
  if (const Stage* n = impl_->normalize) {
    fields[0].dtype = "<f4";
    fields[0].shape = n->fused.chw ? std::vector<int64_t>{3, h, w} : std::vector<int64_t>{h, w, 3};
  } else {
    fields[0].dtype = "|u1";
    fields[0].shape = {h, w, 3};
  }
  fields[1] = FieldSpec{"<i8", {}};
  uint64_t room = 0;
  if (__builtin_mul_overflow(options_.bytes_per_sample, uint64_t{capacity}, &room))
    SPINDLE_THROW(std::invalid_argument, "spindle: bytes_per_sample x batch size overflows");
  for (std::size_t i = 0; i < impl_->byte_fields.size(); ++i) fields.push_back(FieldSpec::bytes(room));
  return SlotLayout(std::move(fields), capacity);
}

void Pipeline::produce(int64_t index, uint64_t seed, uint64_t epoch, const SlotLayout& layout,
                       std::span<std::byte> payload, std::size_t row, BatchBytes& bytes) const {
  SourceSample read;
  impl_->source->read(index, read);
  Sample sample;
  sample.id = &read.id;
  sample.label = read.label;
  if (read.is_decoded) {
    sample.image = std::move(read.decoded);
    sample.decoded = true;
  } else {
    sample.encoded = read.encoded;
  }
  produce_read(sample, static_cast<uint64_t>(index), seed, epoch, layout, payload, row, bytes);
}

void Pipeline::produce_read(Sample& sample, uint64_t draw, uint64_t seed, uint64_t epoch, const SlotLayout& layout,
                            std::span<std::byte> payload, std::size_t row, BatchBytes& bytes) const {
  ops::Rng rng(seed, epoch, draw);
  run_stages(sample, rng, layout, payload, row, bytes);
}

void Pipeline::run_stages(Sample& x, ops::Rng& rng, const SlotLayout& layout, std::span<std::byte> payload,
                          std::size_t row, BatchBytes& bytes) const {
  static const SampleId kNoId{"a sample", "", ""};
  const SampleId& id = x.id ? *x.id : kNoId;
  const std::vector<Stage>& st = options_.stages;
  const std::size_t n = static_cast<std::size_t>(impl_->out_h) * impl_->out_w * 3;
  bool written = false;  // the image is in the slot already (a direct fused crop)
  if (!x.decoded) x.image.pixels.swap(spare_pixels());  // decode into the thread's last buffer
  for (const Step& step : impl_->plan) {
    switch (step.op) {
      case Step::Op::kDecode:
        try {
          ops::decode(x.encoded, std::nullopt, std::nullopt, x.image);
        } catch (const std::exception& e) {
          throw decode_error(id, e);
        }
        x.decoded = true;
        continue;
      case Step::Op::kDecodeCenterCrop:
        try {
          const ops::ImageInfo info = ops::probe(x.encoded);
          ops::decode(x.encoded, ops::center_crop_box(info.height, info.width, step.crop->fused.size), std::nullopt,
                      x.image);
        } catch (const std::exception& e) {
          throw decode_error(id, e);
        }
        x.decoded = true;
        continue;
      case Step::Op::kDecodeResizedCrop: {
        // decode + crop + resize (+ flip) in one call, straight into the slot's
        // row when it is the last step, else into the sample's image. Draws in
        // stage order: the crop's, then the flip's.
        const Stage::Fused& c = step.crop->fused;
        std::span<uint8_t> dst;
        if (step.direct && !impl_->normalize) {
          dst = layout.view<uint8_t>(payload, 0).subspan(row * n, n);
          written = true;
        } else {
          const std::size_t need = static_cast<std::size_t>(c.size.height) * c.size.width * 3;
          x.image.height = c.size.height;
          x.image.width = c.size.width;
          x.image.channels = 3;
          x.image.pixels.resize(need);
          dst = x.image.pixels;
        }
        const double flip = step.flip ? step.flip->fused.p : 0.0;
        auto plan = [&](int height, int width) {
          ops::CropPlan p;
          p.box = ops::random_resized_crop_box(height, width, rng, c.scale, c.ratio);
          p.mirror = flip > 0 && rng.uniform() < flip;
          return p;
        };
        try {
          ops::decode_resized(x.encoded, plan, c.size, dst);
        } catch (const std::exception& e) {
          throw decode_error(id, e);
        }
        x.decoded = true;
        continue;
      }
      case Step::Op::kNormalize:
        continue;  // as the row is written, below
      case Step::Op::kRun: {
        const Stage& s = st[step.stage];
        const int h = x.image.height, w = x.image.width;
        s.run(x, rng);
        // A stage keeps the image's size or makes the one it declares.
        if (x.decoded && s.needs != Stage::Needs::kEncoded) {
          std::optional<ops::Size> want;
          if (!s.size_after) want = ops::Size{h, w};
          else want = step.size;  // nullopt: known per sample only (resize of an unknown size)
          if (want && (x.image.height != want->height || x.image.width != want->width))
            throw std::runtime_error("spindle: " + stage_name(st, step.stage) + " made " + id.origin + "'s image " +
                                     size_text(x.image.height, x.image.width) + ", not " +
                                     size_text(want->height, want->width) +
                                     (s.size_after ? "" : " (a stage that changes the size declares it: "
                                                          "UserStage::output_size)"));
        }
        continue;
      }
    }
  }
  if (!written) {
    if (x.image.height != impl_->out_h || x.image.width != impl_->out_w || x.image.channels != 3 ||
        x.image.pixels.size() != n)
      throw std::runtime_error("spindle: " + id.origin + " came out " + size_text(x.image.height, x.image.width) +
                               ", not the pipeline's " + size_text(impl_->out_h, impl_->out_w));
    if (const Stage* norm = impl_->normalize) {
      std::span<float> out = layout.view<float>(payload, 0).subspan(row * n, n);
      ops::normalize(x.image, norm->fused.mean, norm->fused.std, norm->fused.chw, out);
    } else {
      std::memcpy(layout.view<uint8_t>(payload, 0).subspan(row * n, n).data(), x.image.pixels.data(), n);
    }
  }
  layout.view<int64_t>(payload, 1)[row] = x.label;
  if (x.image.pixels.capacity() > spare_pixels().capacity()) spare_pixels().swap(x.image.pixels);  // for the next
  const std::size_t fields = impl_->byte_fields.size();
  if (!fields) return;
  if (bytes.rows.size() != fields) bytes.rows.resize(fields);
  if (bytes.origins.size() <= row) bytes.origins.resize(row + 1);
  bytes.origins[row] = id.origin;
  for (std::size_t f = 0; f < fields; ++f) {
    auto& column = bytes.rows[f];
    if (column.size() <= row) column.resize(row + 1);
    column[row] = std::move(x.bytes_field(impl_->byte_fields[f]));
  }
}

void Pipeline::put_bytes(const SlotLayout& layout, std::span<std::byte> payload, const BatchBytes& bytes,
                         std::size_t count) const {
  const std::size_t fields = impl_->byte_fields.size();
  for (std::size_t f = 0; f < fields; ++f) {
    std::vector<std::span<const std::byte>> rows(count);
    uint64_t total = 0;
    const uint64_t room = layout.field(2 + f).value_bytes;
    std::size_t first_over = count;
    for (std::size_t r = 0; r < count; ++r) {
      rows[r] = bytes.rows.at(f).at(r);
      total += rows[r].size();
      if (total > room && first_over == count) first_over = r;
    }
    if (first_over != count)
      throw std::length_error(
          "spindle: the '" + impl_->byte_fields[f] + "' fields of a batch of " + std::to_string(count) +
          " samples take " + std::to_string(total) + " bytes, more than the slot's " + std::to_string(room) +
          " (bytes_per_sample=" + std::to_string(options_.bytes_per_sample) + " x " +
          std::to_string(layout.capacity()) + "); " + bytes.origins.at(first_over) +
          " is the first that does not fit. Set bytes_per_sample to at least " +
          std::to_string((total + layout.capacity() - 1) / layout.capacity()));
    layout.put_bytes(payload, 2 + f, rows);
  }
}

Skips fill_batch(const Pipeline& pipe, std::span<const int64_t> indices, uint64_t seed, uint64_t epoch,
                 const SlotLayout& layout, std::span<std::byte> payload) {
  const bool skip = pipe.options().on_error == PipelineOptions::OnError::kSkip;
  thread_local BatchBytes bytes;  // reused: no allocation per batch once warm
  bytes.rows.resize(pipe.field_names().size() - 2);
  bytes.origins.resize(indices.size());
  std::vector<std::size_t> bad;
  Skips skips;
  std::string first_error, first_path, first_key;
  for (std::size_t row = 0; row < indices.size(); ++row) {
    try {
      pipe.produce(indices[row], seed, epoch, layout, payload, row, bytes);
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
  if (bad.empty()) {
    pipe.put_bytes(layout, payload, bytes, indices.size());
    return {};
  }
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
      if (layout.is_bytes(f)) continue;
      std::byte* block = payload.data() + layout.offset(f);
      std::memcpy(block + r * layout.row_bytes(f), block + src * layout.row_bytes(f), layout.row_bytes(f));
    }
    for (auto& column : bytes.rows) {
      if (column.size() <= r) column.resize(r + 1);
      column[r] = column.at(src);
    }
    bytes.origins[r] = bytes.origins[src];
  }
  pipe.put_bytes(layout, payload, bytes, indices.size());
  return skips;
}

}  // namespace spindle
