#include <spindle/shm_segment.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
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

ShmSegment::ShmSegment(std::size_t bytes, const std::string& what) : size_(bytes) {
  reclaim_stale();
  const std::string name = std::string(kPrefix) + std::to_string(getpid()) + "." +
                           std::to_string(g_counter.fetch_add(1));
  try {
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write);
    // From here on the name must go whatever happens.
    struct Unlink {
      const std::string& n;
      ~Unlink() { bip::shared_memory_object::remove(n.c_str()); }
    } unlink{name};
    int fd = shm.get_mapping_handle().handle;
    if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
      struct statvfs vfs {};
      std::string free_text = statvfs("/dev/shm", &vfs) == 0
                                  ? mib(static_cast<std::size_t>(vfs.f_bavail) * vfs.f_frsize) + " free"
                                  : "free space unknown";
      SPINDLE_THROW(SharedMemoryError,
                    "spindle: cannot reserve " + mib(bytes) + " of shared memory in /dev/shm for " + what +
                        ": " + std::strerror(rc) + " (/dev/shm has " + free_text +
                        "). Lower batch_size, prefetch_factor or num_workers, or give the machine "
                        "more /dev/shm (e.g. docker run --shm-size=...).");
    }
    // MAP_POPULATE: map every page now, so the consumer reading a batch takes
    // no page faults (a 3 MiB batch would otherwise cost 768 of them).
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) SPINDLE_THROW_ERRNO("spindle: mmap of " + mib(bytes) + " for " + what + " failed");
    data_ = static_cast<std::byte*>(p);
    // Kept (close-on-exec) so the segment can be handed to workers that are
    // not forks of this process (see zygote.hpp).
    fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  } catch (const bip::interprocess_exception& e) {
    SPINDLE_THROW(SharedMemoryError, "spindle: cannot create shared memory segment /dev/shm/" + name +
                                         " for " + what + ": " + e.what());
  }
}

ShmSegment::~ShmSegment() {
  if (data_) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace spindle
