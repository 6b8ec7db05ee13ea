#pragma once
// Shared by the libFuzzer targets in this folder: reading the fuzzer's bytes,
// failing with a message, and zeroed buffers of an exact size (so
// AddressSanitizer flags any access one byte past what bytes_for() promised).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

#include <sanitizer/asan_interface.h>

// Aborts with the failed condition and a printf-style note; libFuzzer saves
// the input that got here as a crash artifact.
#define SPINDLE_FUZZ_CHECK(cond, ...)                                                       \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "\nfuzz check failed: %s\n  at %s:%d\n  ", #cond, __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                                                    \
      std::fputc('\n', stderr);                                                             \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

// With SPINDLE_FUZZ_TRACE set in the environment, a target prints each
// operation as it decodes it: run a crash artifact with it to read the story.
#define SPINDLE_FUZZ_TRACE(...)                  \
  do {                                           \
    if (::spindle::fuzz::tracing()) {            \
      std::fprintf(stderr, __VA_ARGS__);         \
      std::fputc('\n', stderr);                  \
    }                                            \
  } while (0)

namespace spindle::fuzz {

inline bool tracing() noexcept {
  static const bool on = std::getenv("SPINDLE_FUZZ_TRACE") != nullptr;
  return on;
}

// The fuzzer's input, read front to back; past the end every read is 0, so
// any input decodes to some valid run.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, std::size_t size) noexcept : p_(data), end_(data + size) {}
  uint8_t next() noexcept { return p_ < end_ ? *p_++ : 0; }
  bool empty() const noexcept { return p_ == end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// `size` zeroed bytes aligned to `align`, from the sanitizer's allocator.
class AlignedBuffer {
 public:
  AlignedBuffer(std::size_t size, std::size_t align)
      : size_(size), align_(align), data_(static_cast<std::byte*>(::operator new(size, std::align_val_t{align}))) {
    std::memset(data_, 0, size_);
  }
  ~AlignedBuffer() { ::operator delete(data_, std::align_val_t{align_}); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  std::size_t size_, align_;
  std::byte* data_;
};

// `size` zeroed bytes at a page boundary, mapped fresh (untouched pages cost
// nothing, unlike zeroing a heap block of a megabyte or two per input). The
// bytes after `size` up to the page end are poisoned for AddressSanitizer and
// the page after that is inaccessible, so an access past `size` still fails.
class ZeroedMapping {
 public:
  explicit ZeroedMapping(std::size_t size) : size_(size), mapped_(round_up(size) + kPage) {
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    SPINDLE_FUZZ_CHECK(p != MAP_FAILED, "mmap of %zu bytes failed", mapped_);
    data_ = static_cast<std::byte*>(p);
    mprotect(data_ + mapped_ - kPage, kPage, PROT_NONE);
    ASAN_POISON_MEMORY_REGION(data_ + size_, mapped_ - kPage - size_);
  }
  ~ZeroedMapping() {
    ASAN_UNPOISON_MEMORY_REGION(data_ + size_, mapped_ - kPage - size_);
    munmap(data_, mapped_);
  }
  ZeroedMapping(const ZeroedMapping&) = delete;
  ZeroedMapping& operator=(const ZeroedMapping&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::size_t kPage = 4096;
  static std::size_t round_up(std::size_t n) { return (n + kPage - 1) / kPage * kPage; }
  std::size_t size_, mapped_;
  std::byte* data_ = nullptr;
};

}  // namespace spindle::fuzz
