#pragma once
// Data sources of native pipelines: where a sample's raw inputs come from.
//
// | source       | layout on disk                              | access                         |
// |--------------|---------------------------------------------|--------------------------------|
// | ImageFolder  | root/<class>/<...>/<file>.<IMG_EXTENSIONS>  | map-style, read(i)             |
// | ArraySource  | a .npy file (memory-mapped) or a buffer     | map-style, row(i), zero-copy   |
// | WebDataset   | tar shards, members grouped by key          | streamed, one shard at a time  |
//
// Fork safety: no source keeps an open file descriptor or a lock between
// calls. ImageFolder opens, preads and closes a file per read; WebDataset opens
// its shard per pass; ArraySource holds only a read-only mapping (inherited
// unchanged by a fork). So a source built in the consumer and used in forked
// workers shares no file offset and no lock, and every read is safe from
// several threads at once.
//
// Errors: bad data (a corrupt shard, an unusable .npy header, a malformed
// label) throws spindle::DataError naming the file, key and byte offset; a file
// that cannot be opened throws std::system_error naming it; an index out of
// range throws std::out_of_range.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <spindle/error.hpp>

namespace spindle {

// One sample's raw inputs: the encoded bytes (e.g. a JPEG) and its label, plus
// where it came from (for error messages).
struct Record {
  std::vector<std::byte> data;
  int64_t label = -1;
  std::string origin;  // "root/cls/file.jpg" or "shard.tar:key"
};

// ImageNet layout, with torchvision.datasets.ImageFolder's rule: the classes
// are the subfolders of `root` (symlinks followed, hidden ones included),
// sorted by name (bytewise, as Python sorts str); class index = position in
// that list. Samples are every file below a class folder (recursively,
// following symlinks) whose name ends in one of torchvision's IMG_EXTENSIONS
// (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case), in the order of
// sorted(os.walk(class_dir)) then sorted(file names); the decoders read every
// one of those formats (a file they cannot read fails when it is decoded,
// naming it). A class with no image, or a root with
// no class folder, is a DataError (torchvision: FileNotFoundError).
class ImageFolder {
 public:
  explicit ImageFolder(std::string root);

  std::size_t size() const noexcept { return paths_.size(); }
  const std::vector<std::string>& classes() const noexcept { return classes_; }
  const std::string& root() const noexcept { return root_; }
  // The file of sample i (root/cls/.../file) and its class index.
  const std::string& path(std::size_t i) const;
  int64_t label(std::size_t i) const;
  // Reads the whole file of sample i (open + pread + close: no shared state).
  Record read(std::size_t i) const;

 private:
  std::string root_;
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<int32_t> labels_;
};

// Arrays: a .npy file memory-mapped read-only, or a caller's buffer (not
// owned: it must outlive the source). Sample i = row i of a C-order array of
// at least one dimension. dtype is numpy's type string ("<f4", "|u1", ...).
class ArraySource {
 public:
  // Maps `path` read-only. Refuses (DataError) a fortran-order array, an
  // object or structured dtype, a 0-d array, and a file shorter than its
  // header says.
  static ArraySource from_npy(const std::string& path);
  // `shape` includes the rows; `data` must hold prod(shape) items of `dtype`.
  ArraySource(const void* data, std::string dtype, std::vector<int64_t> shape);

  std::size_t size() const noexcept { return static_cast<std::size_t>(shape_.empty() ? 0 : shape_[0]); }
  const std::string& dtype() const noexcept { return dtype_; }
  const std::vector<int64_t>& shape() const noexcept { return shape_; }
  std::vector<int64_t> row_shape() const { return {shape_.begin() + 1, shape_.end()}; }
  std::size_t itemsize() const noexcept { return itemsize_; }
  std::size_t row_bytes() const noexcept { return row_bytes_; }
  // All rows, contiguous (row_bytes() * size() bytes).
  const std::byte* data() const noexcept { return data_; }
  std::span<const std::byte> row(std::size_t i) const;
  // Where the data lives ("a.npy" or "<memory>"), for messages.
  const std::string& origin() const noexcept { return origin_; }

  // Bytes of one item of a numpy type string, or 0 if spindle cannot carry
  // it as plain bytes (object, structured, datetime, ...).
  static std::size_t itemsize_of(const std::string& dtype) noexcept;

 private:
  struct Mapping;
  ArraySource() = default;
  void init(std::string dtype, std::vector<int64_t> shape);

  std::shared_ptr<const Mapping> mapping_;  // null for a caller's buffer
  const std::byte* data_ = nullptr;
  std::string dtype_;
  std::vector<int64_t> shape_;
  std::size_t itemsize_ = 0;
  std::size_t row_bytes_ = 0;
  std::string origin_ = "<memory>";
};

// One member of a tar archive: a regular file's name and contents.
struct TarMember {
  std::string name;
  uint64_t size = 0;
  std::vector<std::byte> data;
  uint64_t offset = 0;  // byte offset of its (first) header in the archive
};

// Streaming reader of ustar, GNU and pax tar archives over a file descriptor:
// reads header after header with pread (its own offset, never the fd's), so it
// never extracts anything and never reads past the file's size as fstat gave
// it. next() yields regular files only; directories, links, devices and fifos
// are skipped, as webdataset does. Validates each header's checksum and octal
// (or GNU base-256) fields without overflow, bounds names to kMaxNameBytes,
// applies GNU long names ('L') and pax 'path'/'size' records (local 'x' and
// global 'g'). Any corruption throws DataError naming the archive and the byte
// offset. Stricter than Python's tarfile in one way: an archive must end with
// an end-of-archive (zero) block, so a shard truncated exactly between two
// members is reported instead of silently losing its tail.
class TarReader {
 public:
  static constexpr std::size_t kBlock = 512;
  static constexpr std::size_t kMaxNameBytes = 4096;           // PATH_MAX
  static constexpr std::size_t kMaxPaxBytes = std::size_t{1} << 20;  // one extended header

  // Opens `path` (closed by the destructor).
  explicit TarReader(const std::string& path);
  // Reads `fd` (a regular file or memfd; not closed); `name` is for messages.
  TarReader(int fd, std::string name);
  ~TarReader();
  TarReader(TarReader&& other) noexcept;
  TarReader& operator=(TarReader&&) = delete;
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  // The next regular file, or nothing at the end of the archive.
  std::optional<TarMember> next();
  const std::string& name() const noexcept { return name_; }
  uint64_t file_size() const noexcept { return file_size_; }
  // Where the next header will be read.
  uint64_t offset() const noexcept { return offset_; }

 private:
  [[noreturn]] void fail(uint64_t at, const std::string& what) const;
  void read_exact(uint64_t at, void* dst, std::size_t n) const;

  int fd_ = -1;
  bool owns_fd_ = false;
  std::string name_;
  uint64_t file_size_ = 0;
  uint64_t offset_ = 0;
  bool done_ = false;
  std::map<std::string, std::string> global_pax_;
};

// A WebDataset sample: the members of one shard sharing a key.
struct WdsSample {
  std::string key;
  std::map<std::string, std::vector<std::byte>> fields;  // by extension: "jpg", "png", "cls", "json"
  std::string origin;                                    // "shard.tar:key"
};

// WebDataset: tar shards whose members are grouped by key, as webdataset does.
// A member "dir/0001.seg.png" has key "dir/0001" (directory kept, basename up
// to its FIRST dot) and field "seg.png" (the rest, lower-cased); members with
// no dot, or whose basename starts with one, are skipped; consecutive members
// with the same key form one sample; a field twice in one sample is a
// DataError; top-level "__*__" metadata members are skipped. Shards are read
// streaming (never extracted), one pass each, and assigned to workers whole.
class WebDataset {
 public:
  explicit WebDataset(std::vector<std::string> shards);

  std::size_t num_shards() const noexcept { return shards_.size(); }
  const std::vector<std::string>& shards() const noexcept { return shards_; }
  // Shards of worker `worker` of `num_workers`: s = worker, worker + n, ...
  // (webdataset's split_by_worker).
  std::vector<std::size_t> shards_of_worker(std::size_t worker, std::size_t num_workers) const;
  // The samples of shard s in order; `visit` returns false to stop early.
  void for_each_in_shard(std::size_t s, const std::function<bool(WdsSample&&)>& visit) const;

  // From "cls" (decimal text) or "json" ({"label": n}) if present, else -1.
  // A present but malformed label is a DataError naming the sample.
  static int64_t label_of(const WdsSample& sample);
  // Splits a member name into (key, field) by webdataset's rule; false if the
  // member is not part of any sample.
  static bool split_key(const std::string& name, std::string& key, std::string& field);

 private:
  std::vector<std::string> shards_;
};

// Pull-style reading of one shard (what for_each_in_shard runs on; the Python
// iterator uses it so the GIL is released per sample).
class WdsShardReader {
 public:
  WdsShardReader(const WebDataset& ds, std::size_t shard);
  std::optional<WdsSample> next();
  const std::string& shard() const noexcept { return shard_; }

 private:
  std::string shard_;
  TarReader tar_;
  std::optional<TarMember> pending_;  // first member of the next sample
  bool ended_ = false;
};

}  // namespace spindle
