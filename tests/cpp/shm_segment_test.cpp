// ShmSegment: shared memory that has no name once constructed, a janitor that
// removes names left by dead processes only, and a clear error when /dev/shm
// is too small.
#include <spindle/error.hpp>
#include <spindle/shm_segment.hpp>

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle {
namespace {

using spindle::testing::spindle_shm_names;
using namespace std::chrono_literals;

// A file in /dev/shm named like a segment of `pid`, removed at scope end if
// the test did not see it removed.
class FakeShmName {
 public:
  explicit FakeShmName(pid_t pid, const std::string& suffix = "0")
      : name_(std::string(ShmSegment::kPrefix) + std::to_string(pid) + "." + suffix), path_("/dev/shm/" + name_) {
    const int fd = open(path_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw std::runtime_error("cannot create " + path_ + ": " + std::strerror(errno));
    close(fd);
  }
  ~FakeShmName() { unlink(path_.c_str()); }
  FakeShmName(const FakeShmName&) = delete;
  FakeShmName& operator=(const FakeShmName&) = delete;
  bool exists() const { return access(path_.c_str(), F_OK) == 0; }
  const std::string& name() const { return name_; }

 private:
  std::string name_, path_;
};

// Proves: a constructed segment has no name left in /dev/shm, yet is usable.
TEST(ShmSegment, IsUnlinkedAsSoonAsItIsConstructed) {
  ASSERT_TRUE(spindle_shm_names(getpid()).empty()) << "a name from before this test";
  {
    ShmSegment a(1 << 20, "test segment a");
    ShmSegment b(3 * 4096 + 5, "test segment b");
    EXPECT_TRUE(spindle_shm_names(getpid()).empty()) << "the segments still have names";
    ASSERT_NE(a.data(), nullptr);
    EXPECT_EQ(a.size(), std::size_t{1} << 20);
    EXPECT_EQ(b.size(), 3u * 4096 + 5);
    std::memset(a.data(), 0x5A, a.size());
    std::memset(b.data(), 0xA5, b.size());
    EXPECT_EQ(a.data()[a.size() - 1], std::byte{0x5A});
    EXPECT_EQ(b.data()[0], std::byte{0xA5});
  }
  EXPECT_TRUE(spindle_shm_names(getpid()).empty());
}

// Proves: a forked child writes bytes its parent reads, as workers share the ring.
TEST(ShmSegment, ForkedChildSharesTheBytes) {
  ShmSegment seg(4096, "test segment");
  std::memset(seg.data(), 0, seg.size());
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::memcpy(seg.data(), "from the child", 15);
    _exit(0);
  }
  const int status = spindle::testing::wait_child(pid, 10s);
  ASSERT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_STREQ(reinterpret_cast<const char*>(seg.data()), "from the child");
}

// Proves: reclaim_stale removes a dead pid's name and keeps a live pid's.
TEST(ShmSegment, ReclaimStaleRemovesNamesOfDeadOwnersOnly) {
  const pid_t dead = spindle::testing::reaped_pid();
  FakeShmName stale(dead);
  FakeShmName live(getpid(), "live-test");
  ASSERT_TRUE(stale.exists());
  // Another test process may run the janitor concurrently and remove the stale
  // name first, so the count is not checked exactly; the outcome is.
  EXPECT_GE(ShmSegment::reclaim_stale(), 0);
  EXPECT_FALSE(stale.exists()) << stale.name() << " belongs to dead pid " << dead << " and should be removed";
  EXPECT_TRUE(live.exists()) << live.name() << " belongs to this live process and must be kept";
}

// Proves: constructing a segment runs the janitor, so a crash's leftovers go at the next start.
TEST(ShmSegment, ConstructionReclaimsStaleNames) {
  FakeShmName stale(spindle::testing::reaped_pid());
  ShmSegment seg(4096, "test segment");
  EXPECT_FALSE(stale.exists());
}

// Proves: reclaim_stale(dir) removes (and counts) a dead name in `dir` itself, not in /dev/shm.
TEST(ShmSegment, ReclaimStaleHonoursItsDirectoryArgument) {
  spindle::testing::TempDir dir;
  const pid_t dead = spindle::testing::reaped_pid();
  const auto path = dir.path() / (std::string(ShmSegment::kPrefix) + std::to_string(dead) + ".0");
  spindle::testing::write_file(path, "");
  EXPECT_EQ(ShmSegment::reclaim_stale(dir.path().string()), 1);
  EXPECT_FALSE(std::filesystem::exists(path)) << path << " should have been removed";
}

// Exit codes of the too-small-/dev/shm child.
enum : int {
  kOk = 0,
  kNoPrivilege = 77,
  kSetupFailed = 10,
  kNoThrow = 11,
  kWrongType = 12,
  kVagueMessage = 13,
  kLeftName = 14,
};

// Proves: too little /dev/shm fails at construction with a SharedMemoryError saying size, place, fix.
TEST(ShmSegment, TooSmallDevShmGivesAClearSharedMemoryError) {
  // A child with its own mount namespace mounts a 1 MiB /dev/shm and reports by exit code.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0) _exit(errno == EPERM ? kNoPrivilege : kSetupFailed);
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(kSetupFailed);
    if (mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") != 0) _exit(errno == EPERM ? kNoPrivilege : kSetupFailed);
    int rc = kNoThrow;
    try {
      ShmSegment seg(16 << 20, "the test ring");
    } catch (const SharedMemoryError& e) {
      const std::string m = e.what();
      rc = kOk;
      for (const char* part : {"16 MiB", "/dev/shm", "the test ring", "1 MiB free", "shm-size"})
        if (m.find(part) == std::string::npos) rc = kVagueMessage;
      if (rc != kOk) std::fprintf(stderr, "message: %s\n", m.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "wrong exception: %s\n", e.what());
      rc = kWrongType;
    }
    if (rc == kOk && !spindle_shm_names(getpid()).empty()) rc = kLeftName;
    std::fflush(nullptr);
    _exit(rc);
  }
  const int status = spindle::testing::wait_child(pid, 30s);
  ASSERT_NE(status, -1) << "child hung";
  ASSERT_TRUE(WIFEXITED(status)) << "child died by signal " << WTERMSIG(status);
  if (WEXITSTATUS(status) == kNoPrivilege) GTEST_SKIP() << "no privilege to mount a private /dev/shm";
  EXPECT_NE(WEXITSTATUS(status), kSetupFailed) << "could not mount a 1 MiB /dev/shm";
  EXPECT_NE(WEXITSTATUS(status), kNoThrow) << "16 MiB in a 1 MiB /dev/shm did not throw";
  EXPECT_NE(WEXITSTATUS(status), kWrongType) << "threw something other than SharedMemoryError";
  EXPECT_NE(WEXITSTATUS(status), kVagueMessage) << "the message lacks size, place, use or remedy";
  EXPECT_NE(WEXITSTATUS(status), kLeftName) << "the failed segment left its name in /dev/shm";
  EXPECT_EQ(WEXITSTATUS(status), kOk);
}

}  // namespace
}  // namespace spindle
