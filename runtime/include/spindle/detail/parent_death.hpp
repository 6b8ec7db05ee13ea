#pragma once
// Not API. Parent death is owned by <spindle/procfs.hpp> (procfs::die_with_process,
// procfs::parent_death_signal, and why the death signal is a real-time one).
// This header only forwards the old names for the callers not switched yet
// (worker_pool.cpp, worker_context.cpp); delete it once they include procfs.hpp.

#include <spindle/procfs.hpp>

namespace spindle::detail {
using procfs::die_with_process;
using procfs::parent_death_signal;
}  // namespace spindle::detail
