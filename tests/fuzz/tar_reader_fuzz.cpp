// Fuzzes TarReader and WebDataset's grouping on untrusted shard bytes. The
// input is the whole archive, written into a memfd so the real fd path runs
// (fstat for the size, pread at the reader's own offsets); WebDataset then
// reads the same bytes through /proc/self/fd/N as a shard path.
//
// Checks: the only exception is spindle::DataError; every member's data is
// exactly its size and lies inside the input; names are bounded by
// kMaxNameBytes; members come at increasing offsets inside the input, so the
// loop ends (at most one member per 512-byte block); the reader never claims
// an offset past the input's padded end; WebDataset yields the members TarReader
// gives, grouped by consecutive key, fields never lost or repeated, labels
// parse or throw DataError. Any other exception, crash or sanitizer report fails.

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include <spindle/sources.hpp>

#include "fuzz_support.hpp"

using namespace spindle;

namespace {

int shard_fd() {
  static const int fd = [] {
    const int f = memfd_create("tar_reader_fuzz", MFD_CLOEXEC);
    SPINDLE_FUZZ_CHECK(f >= 0, "memfd_create failed");
    return f;
  }();
  return fd;
}

struct Member {
  std::string name;
  std::size_t bytes;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const int fd = shard_fd();
  SPINDLE_FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate failed");
  SPINDLE_FUZZ_CHECK(size == 0 || pwrite(fd, data, size, 0) == static_cast<ssize_t>(size), "pwrite failed");

  std::vector<Member> members;
  bool tar_ok = true;
  try {
    TarReader r(fd, "fuzz.tar");
    SPINDLE_FUZZ_CHECK(r.file_size() == size, "file_size %llu != input %zu",
                       static_cast<unsigned long long>(r.file_size()), size);
    uint64_t last = 0;
    while (auto m = r.next()) {
      SPINDLE_FUZZ_CHECK(members.size() <= size / TarReader::kBlock, "more members than blocks");
      SPINDLE_FUZZ_CHECK(m->data.size() == m->size, "data %zu != size %llu", m->data.size(),
                         static_cast<unsigned long long>(m->size));
      SPINDLE_FUZZ_CHECK(m->offset + TarReader::kBlock + m->size <= size, "member at %llu of %llu bytes past input %zu",
                         static_cast<unsigned long long>(m->offset), static_cast<unsigned long long>(m->size), size);
      SPINDLE_FUZZ_CHECK(members.empty() || m->offset > last, "member offsets do not increase");
      SPINDLE_FUZZ_CHECK(m->name.size() <= TarReader::kMaxNameBytes, "name of %zu bytes", m->name.size());
      SPINDLE_FUZZ_CHECK(r.offset() <= size + TarReader::kBlock - 1, "offset %llu past input %zu",
                         static_cast<unsigned long long>(r.offset()), size);
      last = m->offset;
      members.push_back({m->name, m->data.size()});
    }
    SPINDLE_FUZZ_CHECK(!r.next().has_value(), "a member after the end");
  } catch (const DataError&) {
    tar_ok = false;  // refused: the documented outcome for a corrupt shard
  } catch (const std::exception& e) {
    SPINDLE_FUZZ_CHECK(false, "TarReader threw a non-DataError: %s", e.what());
  }

  // WebDataset over the same bytes: the members above, grouped by key.
  std::size_t fields = 0, field_bytes = 0, samples = 0;
  bool wds_ok = true;
  try {
    WebDataset ds({"/proc/self/fd/" + std::to_string(fd)});
    std::string prev_key;
    ds.for_each_in_shard(0, [&](WdsSample&& s) {
      SPINDLE_FUZZ_CHECK(!s.fields.empty(), "a sample without fields");
      SPINDLE_FUZZ_CHECK(samples == 0 || s.key != prev_key, "two consecutive samples with key '%s'", s.key.c_str());
      prev_key = s.key;
      ++samples;
      fields += s.fields.size();
      for (const auto& [ext, bytes] : s.fields) field_bytes += bytes.size();
      try {
        (void)WebDataset::label_of(s);
      } catch (const DataError&) {
      }
      return true;
    });
  } catch (const DataError&) {
    wds_ok = false;
  } catch (const std::exception& e) {
    SPINDLE_FUZZ_CHECK(false, "WebDataset threw a non-DataError: %s", e.what());
  }
  if (tar_ok && wds_ok) {
    // Every member that has a key is one field of one sample.
    std::size_t keyed = 0, keyed_bytes = 0;
    std::string key, field;
    for (const Member& m : members) {
      const bool meta = m.name.find('/') == std::string::npos && m.name.starts_with("__") && m.name.ends_with("__");
      if (!meta && WebDataset::split_key(m.name, key, field)) ++keyed, keyed_bytes += m.bytes;
    }
    SPINDLE_FUZZ_CHECK(fields == keyed && field_bytes == keyed_bytes, "%zu fields (%zu bytes) for %zu keyed members (%zu bytes)",
                       fields, field_bytes, keyed, keyed_bytes);
  }
  // The same bytes: a shard the reader refuses cannot pass as a WebDataset.
  SPINDLE_FUZZ_CHECK(tar_ok || !wds_ok, "WebDataset read a shard TarReader refused");
  return 0;
}
