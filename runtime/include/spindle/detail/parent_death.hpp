#pragma once
// Not API. Makes a worker die with the consumer *process*, not with the
// consumer *thread* that started it.
//
// PR_SET_PDEATHSIG fires when the parent thread exits, and the kernel ties
// the parent to the thread that forked: a loader created in a thread that
// then exits would lose every worker (SIGKILL) while the process goes on.
// So the death signal is a real-time signal whose handler checks getppid():
// if the parent process is still ours (only its thread exited; the child was
// reparented within the same thread group), it returns; if the child was
// reparented to init or a subreaper, the consumer is gone and it _exits.
// The handler is async-signal-safe (getppid, _exit).

#include <sys/types.h>

namespace spindle::detail {

// The death signal: high in the real-time range, which neither glibc (it
// takes the first two) nor Python's signal handling uses.
int parent_death_signal() noexcept;

// In a child just forked or spawned from `parent`: arm the death signal, and
// exit at once if `parent` is already gone.
void die_with_process(pid_t parent) noexcept;

}  // namespace spindle::detail
