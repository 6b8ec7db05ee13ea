#include <spindle/shm_segment.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>

#include <spindle/error.hpp>

namespace bip = boost::interprocess;

namespace spindle {
namespace {

std::atomic<unsigned> g_counter{0};

std::string mib(std::size_t bytes) {
  return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB";
}

}  // namespace

int ShmSegment::reclaim_stale(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  const std::size_t plen = std::strlen(kPrefix);
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, kPrefix, plen) != 0) continue;
    long pid = std::strtol(e->d_name + plen, nullptr, 10);
    if (pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // owner alive
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;  // Linux 5.14+
#endif

void ShmSegment::reserve(int fd, std::byte* base, std::size_t offset, std::size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  if (int rc = posix_fallocate(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes)); rc != 0) {
    struct statvfs vfs {};
    std::string free_text = statvfs("/dev/shm", &vfs) == 0
                                ? mib(static_cast<std::size_t>(vfs.f_bavail) * vfs.f_frsize) + " free"
                                : "free space unknown";
    SPINDLE_THROW(SharedMemoryError,
                  "spindle: cannot reserve " + mib(bytes) + " of shared memory in /dev/shm for " + what + ": " +
                      std::strerror(rc) + " (/dev/shm has " + free_text +
                      "). Lower batch_size, prefetch_factor or num_workers, or give the machine "
                      "more /dev/shm (e.g. docker run --shm-size=...).");
  }
  // Map every page now, so reading a batch takes no page faults (a 3 MiB
  // batch would otherwise cost 768 of them). Best effort: older kernels lack it.
  madvise(base + offset, bytes, kMadvPopulateWrite);
}

void ShmSegment::reserve(std::size_t offset, std::size_t bytes, const std::string& what) const {
  reserve(fd_, data_, offset, bytes, what);
}

ShmSegment::ShmSegment(std::size_t bytes, const std::string& what, std::size_t reserve_bytes) : size_(bytes) {
  reclaim_stale();
  const std::string name = std::string(kPrefix) + std::to_string(getpid()) + "." +
                           std::to_string(g_counter.fetch_add(1));
  try {
    {
      bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write);
      // The name goes at once, before the segment is sized, mapped or backed: only the
      // microseconds of this block can strand it (a SIGKILL here; reclaim_stale covers that).
      struct Unlink {
        const std::string& n;
        ~Unlink() { bip::shared_memory_object::remove(n.c_str()); }
      } unlink{name};
      // Kept (close-on-exec) so the segment can be handed to workers that are
      // not forks of this process (see zygote.hpp), and so slots can grow.
      fd_ = fcntl(shm.get_mapping_handle().handle, F_DUPFD_CLOEXEC, 0);
      if (fd_ < 0) SPINDLE_THROW_ERRNO("spindle: cannot keep the shared memory segment for " + what);
    }
    try {
      // A sparse file of the whole size: only reserved ranges take memory.
      if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
        SPINDLE_THROW_ERRNO("spindle: cannot size the shared memory segment for " + what + " to " + mib(bytes));
      // MAP_NORESERVE: the window is address space, not memory, until reserved.
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd_, 0);
      if (p == MAP_FAILED)
        SPINDLE_THROW_ERRNO("spindle: mmap of " + mib(bytes) + " of address space for " + what +
                            " failed (ulimit -v? lower max_batch_bytes)");
      data_ = static_cast<std::byte*>(p);
      reserve(0, std::min(reserve_bytes, bytes), what);
    } catch (...) {  // no destructor runs for a half-built segment
      if (data_) munmap(data_, size_);
      close(fd_);
      throw;
    }
  } catch (const bip::interprocess_exception& e) {
    SPINDLE_THROW(SharedMemoryError, "spindle: cannot create shared memory segment /dev/shm/" + name +
                                         " for " + what + ": " + e.what() +
                                         ". Check the open-file limit (ulimit -n) and that /dev/shm is a "
                                         "writable tmpfs.");
  }
}

void ShmSegment::seal() const {
  if (size_ != 0 && mprotect(data_, size_, PROT_READ) != 0)
    SPINDLE_THROW_ERRNO("spindle: cannot make a shared memory segment read-only");
}

ShmSegment::~ShmSegment() {
  if (data_) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

SegmentView::SegmentView(int fd) {
  fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (fd_ < 0) SPINDLE_THROW_ERRNO("spindle: cannot keep the descriptor of a shared memory segment");
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    const int e = errno;
    close(fd_);
    errno = e;
    SPINDLE_THROW_ERRNO("spindle: cannot read the size of a shared memory segment");
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ != 0) {
    void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      close(fd_);
      errno = e;
      SPINDLE_THROW_ERRNO("spindle: cannot map a shared memory segment of " + mib(size_) + " read-only");
    }
    data_ = static_cast<const std::byte*>(p);
  }
}

SegmentView::~SegmentView() {
  if (data_) munmap(const_cast<std::byte*>(data_), size_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace spindle
