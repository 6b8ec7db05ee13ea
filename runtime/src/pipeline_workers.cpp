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
    uint64_t fetched = 0;   // bytes the reader had fetched at the last count
    std::optional<WdsShardReader> reader;
    bool ended = false;
    BatchBytes batch_bytes;  // reused batch after batch
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
        BatchBytes& bytes = batch_bytes;
        while (count < capacity) {
          if (!reader) {
            if (next_shard == shards.size()) {
              ended = true;
              break;
            }
            shard = shards[next_shard++];
            position = 0;
            fetched = 0;
            reader.emplace(wds, shard);
          }
          std::optional<WdsSample> sample;
          try {
            sample = reader->next();
            ctx.add_bytes_fetched(reader->bytes_fetched() - fetched);  // Loader::stats(): bytes from remote shards
            fetched = reader->bytes_fetched();
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
          try {
            SampleId id{sample->origin, reader->shard(), sample->key};
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
  options.slot_bytes = pipe->layout(options.batch_capacity).bytes();
  options.max_skip_ratio.reset();
  if (pipe->options().on_error == PipelineOptions::OnError::kSkip) options.max_skip_ratio = pipe->options().max_skip_ratio;
  BatchPlan plan = stream ? BatchPlan::chunked({}, options.batch_capacity, false)
                          : BatchPlan::chunked(std::move(epoch.order), options.batch_capacity, epoch.drop_last);
  WorkerMain body = stream ? pipeline_stream_worker(pipe, epoch.seed, epoch.epoch)
                           : pipeline_worker(pipe, epoch.seed, epoch.epoch);
  Launcher launcher = mode == PipelineMode::kThreads ? Launcher::threads(std::move(body))
                                                     : Launcher::fork(std::move(body), std::move(hooks));
  return std::make_unique<Loader>(options, std::move(plan), std::move(launcher));
}

}  // namespace spindle
