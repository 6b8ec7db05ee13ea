// The worker bodies of native pipelines (pipeline.hpp): by index
// (pipeline_worker) and by WebDataset shard (pipeline_stream_worker), for
// either launcher. A sample's work is Pipeline's; what a WebDataset sample's
// members become (image, label, kept byte fields) is take_members below.
#include <spindle/pipeline.hpp>

#include <spindle/detail/batch_ring.hpp>
#include <spindle/error.hpp>
#include <spindle/launcher.hpp>
#include <spindle/loader.hpp>
#include <spindle/sources.hpp>

#include <stdexcept>

namespace spindle {

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

// A WebDataset sample's members as a Sample's fields: the image (its jpg,
// jpeg or png member), the label (cls, or json "label") and the kept members
// as byte fields. Throws DataError naming the shard and key for a missing
// image or kept member, or a bad label. `sample` must outlive `x` (the image
// is viewed, not copied).
void take_members(WdsSample& sample, const std::vector<std::string>& keep, const SampleId& id, Sample& x) {
  const std::vector<std::byte>* image = nullptr;
  for (const char* ext : {"jpg", "jpeg", "png"})
    if (auto it = sample.fields.find(ext); it != sample.fields.end()) image = &it->second;
  if (!image) throw DataError("spindle: " + sample.origin + " has no jpg, jpeg or png member", id.path, id.key);
  x.encoded = *image;
  try {
    x.label = WebDataset::label_of(sample);
  } catch (const DataError& e) {  // a bad label: named by its shard and key too
    if (!e.path.empty()) throw;
    throw DataError(e.what(), id.path, id.key);
  }
  for (const std::string& k : keep) {
    auto it = sample.fields.find(k);
    if (it == sample.fields.end()) {
      std::string have;
      for (const auto& [name, _] : sample.fields) have += (have.empty() ? "" : ", ") + name;
      throw DataError("spindle: " + sample.origin + " has no '" + k + "' member (keep=" + k + "; it has: " + have +
                          "); in shard " + id.path + ", key " + id.key,
                      id.path, id.key);
    }
    x.bytes.insert_or_assign(k, std::move(it->second));  // after label_of, which may read json
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

namespace {

// One logical worker's WebDataset stream, as the process serving it reads it.
// Its position is the shard ordinal in its list and the samples read of that
// shard: (ordinal << 32) | sample, 0 at the start (Batch::stream_position).
class LogicalStream {
 public:
  LogicalStream(const WebDataset& wds, std::vector<std::size_t> shards, uint64_t start)
      : wds_(wds), shards_(std::move(shards)) {
    const auto ordinal = static_cast<std::size_t>(start >> 32);
    const uint64_t sample = start & 0xffffffffu;
    if (ordinal > shards_.size() || (ordinal == shards_.size() && sample != 0))
      throw std::invalid_argument("spindle: a stream start names shard " + std::to_string(ordinal) + " of a worker's " +
                                  std::to_string(shards_.size()) + ": it was saved for other shards or workers");
    next_ = ordinal;
    if (sample == 0) return;
    open();  // the samples of this shard already delivered: read again, not decoded
    for (uint64_t i = 0; i < sample; ++i)
      if (!reader_->next())
        throw DataError("spindle: shard " + reader_->shard() + " has " + std::to_string(i) + " samples, fewer than the " +
                            std::to_string(sample) + " its stream had read: did it change since?",
                        reader_->shard(), "");
    position_ = sample;
  }

  // The next sample and its draw (shard << 32 | position), or nullopt when the shards end. A
  // reader error leaves its shard (its tail is lost: the next shard goes on) and is rethrown.
  std::optional<WdsSample> next(WorkerContext& ctx, uint64_t& draw) {
    while (true) {
      if (!reader_) {
        if (next_ == shards_.size()) return std::nullopt;
        open();
      }
      std::optional<WdsSample> sample;
      try {
        sample = reader_->next();
        ctx.add_bytes_fetched(reader_->bytes_fetched() - fetched_);  // Loader::stats(): bytes from remote shards
        fetched_ = reader_->bytes_fetched();
      } catch (...) {
        reader_.reset();
        throw;
      }
      if (sample) {
        draw = (static_cast<uint64_t>(shard_) << 32) | position_++;
        return sample;
      }
      reader_.reset();
    }
  }

  const std::string& shard_name() const { return reader_->shard(); }
  uint64_t position() const noexcept {
    return reader_ ? (static_cast<uint64_t>(next_ - 1) << 32) | position_ : static_cast<uint64_t>(next_) << 32;
  }

 private:
  void open() {
    shard_ = shards_[next_++];
    position_ = 0;
    fetched_ = 0;
    reader_.emplace(wds_, shard_);
  }

  const WebDataset& wds_;
  std::vector<std::size_t> shards_;  // of the whole list (WebDataset::shards_of_worker)
  std::size_t next_ = 0;             // ordinal in shards_ of the shard opened next
  std::size_t shard_ = 0;            // the shard being read
  uint64_t position_ = 0;            // of the next sample in it
  uint64_t fetched_ = 0;             // bytes the reader had fetched at the last count
  std::optional<WdsShardReader> reader_;
};

}  // namespace

WorkerMain pipeline_stream_worker(std::shared_ptr<const Pipeline> pipe, uint64_t seed, uint64_t epoch,
                                  std::vector<uint64_t> starts) {
  return [pipe = std::move(pipe), seed, epoch, starts = std::move(starts)](WorkerContext& ctx) {
    const WebDataset& wds = pipe->webdataset();
    const auto logical = static_cast<std::size_t>(ctx.logical_workers());
    const bool skip = pipe->options().on_error == PipelineOptions::OnError::kSkip;
    const uint32_t capacity = ctx.ring().geometry().batch_capacity;
    const SlotLayout layout = pipe->layout(capacity);
    // The streams of the logical workers this process serves, made at their first item (from
    // their start) and again at a new epoch of the streams (Loader::reset_streams).
    std::vector<std::optional<LogicalStream>> streams(logical);
    std::vector<bool> ended(logical, false);
    BatchBytes batch_bytes;  // reused batch after batch
    while (auto item = ctx.claim()) {
      const auto l = static_cast<std::size_t>(item->stream >= 0 ? item->stream : ctx.worker_id());
      try {
        if (item->new_stream) {  // this worker's shards again, from the first
          streams[l].reset();
          ended[l] = false;
        }
        if (ended[l]) {
          ctx.exhausted(*item);
          continue;
        }
        if (!streams[l]) {
          const uint64_t start = starts.empty() || item->new_stream ? 0 : starts.at(l);
          streams[l].emplace(wds, wds.shards_of_worker(l, logical), start);
        }
        LogicalStream& stream = *streams[l];
        std::span<std::byte> out = ctx.begin_arrays(*item, layout, "");
        uint32_t count = 0;
        Skips skips;
        BatchBytes& bytes = batch_bytes;
        while (count < capacity) {
          uint64_t draw = 0;
          std::optional<WdsSample> sample = stream.next(ctx, draw);
          if (!sample) {
            ended[l] = true;
            break;
          }
          ctx.set_sample(static_cast<int64_t>(draw));
          try {
            SampleId id{sample->origin, stream.shard_name(), sample->key};
            Sample x;
            x.id = &id;
            take_members(*sample, pipe->options().keep, id, x);
            pipe->produce_read(x, draw, seed, epoch, layout, out, count, bytes);
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
        pipe->put_bytes(layout, out, bytes, count);
        note_skips(ctx, *item, layout, skips);
        ctx.set_stream_position(*item, stream.position());
        ctx.commit(*item, count);
      } catch (...) {
        fail_current(ctx, *item);
      }
    }
    return 0;
  };
}

std::unique_ptr<Loader> make_pipeline_loader(std::shared_ptr<const Pipeline> pipe, PipelineEpoch epoch,
                                             LoaderOptions options, PipelineMode mode, ForkHooks hooks) {
  const bool stream = pipe->streaming();
  options.round_robin = stream;
  options.logical_workers = stream;  // a stream's data is defined by the workers asked, whatever runs them
  if (!epoch.stream_starts.empty() && epoch.stream_starts.size() != static_cast<std::size_t>(options.num_workers))
    SPINDLE_THROW(std::invalid_argument, "spindle: " + std::to_string(epoch.stream_starts.size()) +
                                             " stream starts for " + std::to_string(options.num_workers) + " workers");
  options.slot_bytes = pipe->layout(options.batch_capacity).bytes();
  options.max_skip_ratio.reset();
  if (pipe->options().on_error == PipelineOptions::OnError::kSkip) options.max_skip_ratio = pipe->options().max_skip_ratio;
  BatchPlan plan = stream ? BatchPlan::chunked({}, options.batch_capacity, false)
                          : BatchPlan::chunked(std::move(epoch.order), options.batch_capacity, epoch.drop_last);
  WorkerMain body = stream ? pipeline_stream_worker(pipe, epoch.seed, epoch.epoch, std::move(epoch.stream_starts))
                           : pipeline_worker(pipe, epoch.seed, epoch.epoch);
  Launcher launcher = mode == PipelineMode::kThreads ? Launcher::threads(std::move(body))
                                                     : Launcher::fork(std::move(body), std::move(hooks));
  return std::make_unique<Loader>(options, std::move(plan), std::move(launcher));
}

}  // namespace spindle
