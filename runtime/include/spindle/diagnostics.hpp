#pragma once
// What spindle's tools read about a process, beyond what the runtime needs
// (procfs.hpp): its resource limits and command line, integer sysctls, its
// memory maps, a blocked thread's stack pointer and the memory it points at.
// spindle doctor shows them, and limit_threads/doctor attribute a thread to the
// runtime that started it from its stack (spindle._budget.threads). No part of
// the loader calls these.
//
// Errors as procfs.hpp's: a process (or thread) that is gone is std::nullopt;
// another failure throws std::system_error with errno, or std::runtime_error
// for a file that does not parse. Every reader takes the /proc root so tests
// can point it at a fake tree.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <spindle/procfs.hpp>

namespace spindle::diagnostics {

using procfs::kProcRoot;

// One resource limit of /proc/<pid>/limits; nullopt: "unlimited".
struct ResourceLimit {
  std::string name;            // "Max processes", "Max open files", ...
  std::optional<uint64_t> soft;
  std::optional<uint64_t> hard;
};

// Parses the text of a limits file (a header line, then one limit a line:
// the name, the soft and hard values, maybe a unit). Throws
// std::runtime_error for a limit line whose values are neither numbers nor
// "unlimited".
std::vector<ResourceLimit> parse_limits(std::string_view text);

// /proc/<pid>/limits parsed; nullopt if the process is gone. Another uid's
// process can be read (the file is world-readable).
std::optional<std::vector<ResourceLimit>> read_limits(pid_t pid, const std::string& proc_root = kProcRoot);

// /proc/<pid>/cmdline split at its NUL bytes; nullopt if the process is gone.
// A kernel thread's is empty.
std::optional<std::vector<std::string>> read_cmdline(pid_t pid, const std::string& proc_root = kProcRoot);

// An integer sysctl, named as sysctl(8) names it ("kernel.threads-max"), from
// /proc/sys; nullopt if it is absent, unreadable, or not an integer.
std::optional<int64_t> read_sysctl_int(const std::string& name, const std::string& proc_root = kProcRoot);

// One line of /proc/<pid>/maps.
struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;   // one past the last byte
  std::string perms;  // "r-xp", ...
  std::string path;   // the mapped file, a pseudo-name ("[stack]"), or empty for anonymous memory
};

// Parses the text of a maps file. Throws std::runtime_error for a line
// without an address range.
std::vector<Mapping> parse_maps(std::string_view text);

// /proc/<pid>/maps parsed; nullopt if the process is gone. Reading another
// process's needs ptrace access (std::system_error otherwise).
std::optional<std::vector<Mapping>> read_maps(pid_t pid, const std::string& proc_root = kProcRoot);

// Where a thread stands, from /proc/<pid>/task/<tid>/syscall.
struct ThreadSyscall {
  bool running = false;                   // on a CPU now: no saved registers
  std::optional<uint64_t> stack_pointer;  // when blocked (in a system call or not)
};

// Parses the text of a syscall file ("running", or "<nr> <args>... <sp> <pc>",
// nr -1 when blocked outside a system call).
ThreadSyscall parse_syscall(std::string_view text);

// /proc/<pid>/task/<tid>/syscall parsed; nullopt if the thread is gone. It
// needs ptrace access (std::system_error otherwise).
std::optional<ThreadSyscall> read_thread_syscall(pid_t pid, pid_t tid, const std::string& proc_root = kProcRoot);

// `length` bytes of another process's memory at `address`, from
// /proc/<pid>/mem (fewer where the range ends in unmapped memory); nullopt if
// the process is gone. Needs ptrace access (same uid and Yama's ptrace_scope
// 0, or root): std::system_error (EACCES/EPERM) otherwise; EIO for an address
// that is not mapped.
std::optional<std::string> read_memory(pid_t pid, uint64_t address, std::size_t length,
                                       const std::string& proc_root = kProcRoot);

}  // namespace spindle::diagnostics
