#pragma once
// ShmSegment: one shared-memory mapping, created eagerly and unlinked at once.
//
// Lifetime rule: the name exists only between creation and keeping a descriptor
// of it (microseconds), before the segment is sized, mapped or backed. Workers are forked after that and inherit the mapping, so no
// name can outlive the loader, whatever kills it. The one window where a
// SIGKILL could strand a name is covered by a janitor: every new segment first
// removes "spindle.<pid>.*" names whose <pid> is no longer alive.

#include <cstddef>
#include <memory>
#include <string>

namespace spindle {

class ShmSegment {
 public:
  // Creates a segment of `bytes` in /dev/shm and reserves the first
  // `reserve_bytes` (all of it by default) now (posix_fallocate), so too
  // little /dev/shm fails here with a clear SharedMemoryError instead of a
  // SIGBUS on first touch later. The rest is a sparse, mapped window that
  // reserve() backs later. `what` names the segment's use in that error.
  ShmSegment(std::size_t bytes, const std::string& what, std::size_t reserve_bytes = kAll);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  // A descriptor of the (already unlinked) segment, for passing to processes
  // that are not forks of this one.
  int fd() const noexcept { return fd_; }

  // Backs [offset, offset + bytes) with memory now and maps its pages in this
  // process; SharedMemoryError (with the sizes) if /dev/shm is too full.
  void reserve(std::size_t offset, std::size_t bytes, const std::string& what) const;
  // The same for any mapping `base` of the segment open as `fd` (a worker's).
  static void reserve(int fd, std::byte* base, std::size_t offset, std::size_t bytes, const std::string& what);

  // Makes this process's mapping read-only (and that of every process forked
  // after): for data written once and then only read (spindle.shared), so a
  // stray write faults instead of changing what every worker reads.
  void seal() const;

  static constexpr std::size_t kAll = static_cast<std::size_t>(-1);

  // Removes names left by dead owners; returns how many it removed.
  static int reclaim_stale(const std::string& dir = "/dev/shm");
  // The prefix every spindle segment name starts with.
  static constexpr const char* kPrefix = "spindle.";

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
};

// A read-only mapping of a whole segment that another process created, from a
// descriptor of it: one handed over to a spawned process, or one reopened through
// /proc/<pid>/fd/<n> (spindle.shared's containers). Keeps its own duplicate of
// the descriptor, so the caller may close theirs; the segment lives while any
// process maps or holds it open, and has no name to leak.
class SegmentView {
 public:
  explicit SegmentView(int fd);
  ~SegmentView();
  SegmentView(const SegmentView&) = delete;
  SegmentView& operator=(const SegmentView&) = delete;

  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  int fd() const noexcept { return fd_; }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
};

}  // namespace spindle
