#pragma once
// The file reading that procfs.cpp and diagnostics.cpp share: one reader of a
// /proc file, one rule for "the process is gone". Private to runtime/src.

#include <sys/types.h>

#include <optional>
#include <string>

namespace spindle::procfs::files {

// The errors that mean "that process (or thread) is not there (any more)".
bool gone(int e) noexcept;

// The whole of a small file; nullopt if it (or its task) is gone, throws
// std::system_error for any other failure.
std::optional<std::string> read_or_gone(const std::string& path);

// The same, with any failure as absent (cgroup files, sysctls: advisory).
std::optional<std::string> read_if_readable(const std::string& path);

// <proc_root>/<pid>
std::string task_path(pid_t pid, const std::string& proc_root);

}  // namespace spindle::procfs::files
