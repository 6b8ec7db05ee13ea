// diagnostics: what spindle's tools read about a process (limits, command
// lines, sysctls, maps, a blocked thread's stack), live and from fake /proc trees.
#include <spindle/diagnostics.hpp>

#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "test_support.hpp"

namespace spindle::diagnostics {
namespace {

using spindle::testing::eventually;
using spindle::testing::TempDir;
using spindle::testing::write_file;

// Proves: limits with spaces in their names, "unlimited" values and missing units parse; a value that
// is neither throws.
TEST(DiagnosticsLimits, ParsesNamesValuesAndUnlimited) {
  const std::string text =
      "Limit                     Soft Limit           Hard Limit           Units     \n"
      "Max cpu time              unlimited            unlimited            seconds   \n"
      "Max processes             4096                 8192                 processes \n"
      "Max open files            1024                 1048576              files     \n"
      "Max realtime priority     0                    0                    \n";
  const auto limits = parse_limits(text);
  ASSERT_EQ(limits.size(), 4u);
  EXPECT_EQ(limits[0].name, "Max cpu time");
  EXPECT_FALSE(limits[0].soft.has_value());
  EXPECT_FALSE(limits[0].hard.has_value());
  EXPECT_EQ(limits[1].name, "Max processes");
  EXPECT_EQ(limits[1].soft, 4096u);
  EXPECT_EQ(limits[1].hard, 8192u);
  EXPECT_EQ(limits[3].name, "Max realtime priority");
  EXPECT_EQ(limits[3].soft, 0u);
  EXPECT_THROW(parse_limits("Limit      Soft Limit  Hard Limit\nMax x      lots        7\n"), std::runtime_error);
  EXPECT_THROW(parse_limits("no header\n"), std::runtime_error);
}

// Proves: this process's "Max processes" is what getrlimit(RLIMIT_NPROC) says.
TEST(DiagnosticsLimits, OwnMaxProcessesIsRlimitNproc) {
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NPROC, &rl), 0);
  const auto limits = read_limits(::getpid());
  ASSERT_TRUE(limits.has_value());
  const auto it = std::find_if(limits->begin(), limits->end(), [](const auto& l) { return l.name == "Max processes"; });
  ASSERT_NE(it, limits->end());
  EXPECT_EQ(it->soft.has_value(), rl.rlim_cur != RLIM_INFINITY);
  if (it->soft) {
    EXPECT_EQ(*it->soft, rl.rlim_cur);
  }
}

// Proves: a command line splits at its NUL bytes (an empty one is a kernel thread's); a missing process
// is nullopt; an integer sysctl reads by its dotted name, an absent or non-integer one is nullopt.
TEST(DiagnosticsCmdlineSysctl, FakeTree) {
  TempDir dir;
  write_file(dir.path() / "7" / "cmdline", std::string("python\0-m\0a b\0", 14));
  write_file(dir.path() / "8" / "cmdline", "");
  write_file(dir.path() / "sys" / "kernel" / "threads-max", "125000\n");
  write_file(dir.path() / "sys" / "kernel" / "ostype", "Linux\n");
  const auto args = read_cmdline(7, dir.path().string());
  ASSERT_TRUE(args.has_value());
  EXPECT_EQ(*args, (std::vector<std::string>{"python", "-m", "a b"}));
  EXPECT_EQ(read_cmdline(8, dir.path().string()), std::vector<std::string>{});
  EXPECT_FALSE(read_cmdline(9, dir.path().string()).has_value());
  EXPECT_EQ(read_sysctl_int("kernel.threads-max", dir.path().string()), 125000);
  EXPECT_FALSE(read_sysctl_int("kernel.ostype", dir.path().string()).has_value());
  EXPECT_FALSE(read_sysctl_int("kernel.pid_max", dir.path().string()).has_value());
  EXPECT_GT(read_sysctl_int("kernel.pid_max").value_or(0), 0);
}

// Proves: maps lines parse with paths holding spaces, pseudo-names and anonymous memory; this process's
// maps hold the code of this test; a line without an address range throws.
TEST(DiagnosticsMaps, ParsesLinesAndOwnCode) {
  const auto maps = parse_maps(
      "7f00a000-7f00b000 r-xp 00001000 08:01 1234   /opt/lib/my lib.so (deleted)\n"
      "7ffd0000-7ffd2000 rw-p 00000000 00:00 0      [stack]\n"
      "7f00c000-7f00d000 rw-p 00000000 00:00 0\n");
  ASSERT_EQ(maps.size(), 3u);
  EXPECT_EQ(maps[0].start, 0x7f00a000u);
  EXPECT_EQ(maps[0].end, 0x7f00b000u);
  EXPECT_EQ(maps[0].perms, "r-xp");
  EXPECT_EQ(maps[0].path, "/opt/lib/my lib.so (deleted)");
  EXPECT_EQ(maps[1].path, "[stack]");
  EXPECT_EQ(maps[2].path, "");
  EXPECT_THROW(parse_maps("not a map\n"), std::runtime_error);
  const auto own = read_maps(::getpid());
  ASSERT_TRUE(own.has_value());
  const auto code = reinterpret_cast<uint64_t>(&parse_maps);
  EXPECT_TRUE(std::any_of(own->begin(), own->end(), [code](const Mapping& m) {
    return m.start <= code && code < m.end && m.perms.find('x') != std::string::npos;
  }));
}

// Proves: a syscall line gives the stack pointer (second to last field) of a blocked thread, and
// "running" none; a live blocked thread's stack pointer lies in its process's memory, which reads back.
TEST(DiagnosticsSyscall, StackPointerAndMemory) {
  EXPECT_TRUE(parse_syscall("running\n").running);
  const auto blocked = parse_syscall("202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd1234 0x7f001000\n");
  EXPECT_FALSE(blocked.running);
  EXPECT_EQ(blocked.stack_pointer, 0x7ffd1234u);
  EXPECT_EQ(parse_syscall("-1 0x7ffd0008 0x7f001000\n").stack_pointer, 0x7ffd0008u);

  const uint64_t value = 0x5eed5eed12345678ull;
  const auto bytes = read_memory(::getpid(), reinterpret_cast<uint64_t>(&value), sizeof value);
  ASSERT_TRUE(bytes.has_value());
  ASSERT_EQ(bytes->size(), sizeof value);
  uint64_t back = 0;
  std::memcpy(&back, bytes->data(), sizeof back);
  EXPECT_EQ(back, value);

  std::atomic<bool> stop{false};
  std::atomic<pid_t> tid{0};
  std::thread sleeper([&] {
    tid = static_cast<pid_t>(::gettid());
    while (!stop) ::poll(nullptr, 0, 5);
  });
  ASSERT_TRUE(eventually(std::chrono::seconds(5), [&] { return tid.load() != 0; }));
  std::optional<uint64_t> sp;
  ASSERT_TRUE(eventually(std::chrono::seconds(5), [&] {
    auto state = read_thread_syscall(::getpid(), tid.load());
    if (state && state->stack_pointer) sp = state->stack_pointer;
    return sp.has_value();
  }));
  stop = true;
  sleeper.join();
  const auto own = read_maps(::getpid());
  ASSERT_TRUE(own.has_value());
  EXPECT_TRUE(std::any_of(own->begin(), own->end(), [&](const Mapping& m) { return m.start <= *sp && *sp < m.end; }));
  EXPECT_FALSE(read_thread_syscall(::getpid(), 1 << 30).has_value());
}

}  // namespace
}  // namespace spindle::diagnostics
