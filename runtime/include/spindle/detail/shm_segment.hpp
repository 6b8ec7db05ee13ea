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

namespace spindle::detail {

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

}  // namespace spindle::detail
