#pragma once
// How the runtime's forks and blocking waits meet the interpreter: the fork
// protocol os.fork() follows, and the polls that let Python's signal
// handlers run (Ctrl-C) while the runtime waits without the GIL.
#include <functional>
#include <string>

#include <spindle/launcher.hpp>
#include <spindle/loader.hpp>

namespace spindle::python {
// The interpreter's fork protocol, for every fork made from Python: the hooks
// take the GIL for the fork (the thread may hold it, or not: a replacement is
// forked from next()), and run spindle._runtime.forking's enter_fork() and
// leave_fork() around it.
ForkHooks interpreter_fork_hooks();
// Paces the ledger's "wait" policy: sleeps a poll period without the GIL
// (another thread may be the one giving a lease back) and raises on Ctrl-C.
std::function<void()> budget_poll();
// Loader::next's poll, called without the GIL: takes it and raises what a
// signal handler raised (KeyboardInterrupt), within one supervision period.
std::function<void()> next_poll();
// Loader::next's stall warning (LoaderOptions::on_stall), called without the
// GIL: warns spindle.errors.StallWarning; a warnings filter that raises
// leaves next() with that exception.
std::function<void(const std::string&)> stall_warning();
// LoaderOptions::on_replaced, called without the GIL: one line to
// spindle._runtime.failures.worker_replaced (logged at WARNING).
std::function<void(const std::string&)> worker_replaced();
// LoaderOptions::on_resized, called without the GIL: one INFO line on the
// "spindle" logger per change of the processes.
std::function<void(const std::string&)> processes_resized();
// The three above, set on a loader's options (every binding that makes a Loader).
void set_python_callbacks(LoaderOptions& o);
}  // namespace spindle::python
