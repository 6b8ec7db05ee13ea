#pragma once
// File reading shared by the sources (not API): pread loops that retry on
// EINTR, treat a short file as bad data, and never move a shared file offset.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace spindle::detail {

// Reads exactly `n` bytes at `offset`; returns how many it got before end of
// file (fewer than `n` only if the file is shorter). Throws std::system_error.
std::size_t pread_full(int fd, void* dst, std::size_t n, uint64_t offset, const std::string& name);

// The whole file at `path` (open + fstat + pread + close).
std::vector<std::byte> read_whole_file(const std::string& path);

// An fd closed on scope exit.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

}  // namespace spindle::detail
