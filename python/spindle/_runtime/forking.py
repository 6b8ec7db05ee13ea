"""Around spindle's own forks."""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import sys
import threading
import warnings
from typing import Any, Callable, Iterator, Optional

from .._budget.caps import openblas_capped_across_forks


# How long a helper process (call_in_fork) waits for its task of the thread budget.
HELPER_WAIT_S = 30.0


# Whether the consumer's garbage collector ran when it entered forking(): None
# outside it. A child forked inside it reads its inherited copy (started_in_fork).
_collecting_at_fork: Optional[bool] = None


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Around spindle's own forks: keeps the garbage collector out of what the
    children inherit, silences JAX's at-fork warning, and caps the consumer's
    OpenBLAS for the children to inherit.

    The recipe of Python's docs for a fork without exec: the collector is
    disabled across the forks (here, in the consumer) and each child freezes
    what it inherited before it enables its own collector again
    (started_in_fork). So unreachable cycles the consumer had not collected
    yet (an earlier loader's iterator held by a traceback, a pool, a progress
    bar) are never finalized inside a worker, where their finalizers would
    wait on locks and threads that exist only in the consumer; and the
    child's collector does not write to the inherited objects' pages, so
    they stay shared. The consumer's own collector is left as it was: its
    generations are untouched (a freeze there would push its young garbage
    into the oldest generation, where a dropped loader's workers and shared
    memory would wait for a full collection).

    JAX warns on every fork of a process where it runs, because a child that
    calls into JAX can deadlock. spindle's children run only spindle's code and
    the dataset's, with JAX_PLATFORMS=cpu set; the warning stays true for
    dataset code that calls JAX (docs/architecture.md, "Forking safely").
    OpenBLAS cannot be capped in the child without starting its pool there
    (``_caps.openblas_capped_across_forks``).
    """
    global _collecting_at_fork, _tracker_lock_at_fork
    parent = os.getpid()
    enabled = gc.isenabled()
    gc.disable()
    _collecting_at_fork = enabled
    tracker_lock = _resource_tracker_lock()
    if tracker_lock is not None and not tracker_lock.acquire(timeout=TRACKER_LOCK_WAIT_S):
        tracker_lock = None  # held that long: a thread died holding it, and the children get it as it is
    _tracker_lock_at_fork = tracker_lock
    try:
        with warnings.catch_warnings(), openblas_capped_across_forks():
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
            yield
    finally:
        if os.getpid() == parent:
            _collecting_at_fork = _tracker_lock_at_fork = None
            if tracker_lock is not None:
                tracker_lock.release()
            if enabled:
                gc.enable()


# multiprocessing's resource tracker lock, held by forking() across spindle's forks (None outside).
_tracker_lock_at_fork: Optional[Any] = None
TRACKER_LOCK_WAIT_S = 5.0


def _resource_tracker_lock() -> Optional[Any]:
    """The lock multiprocessing's resource tracker takes for every shared memory or semaphore registered
    and unlinked, if multiprocessing's tracker is in use here. A consumer thread (grain's pool unlinking
    its shared-memory arrays, a user's) can hold it at a fork; a child that then makes a shared-memory
    array (grain's batch operation does, in every worker) would wait on it forever. So forking() holds
    it across spindle's forks, as the logging module holds its lock across every fork, and each child
    releases its copy (started_in_fork)."""
    module = sys.modules.get("multiprocessing.resource_tracker")
    return getattr(getattr(module, "_resource_tracker", None), "_lock", None)


# The forking() entered by enter_fork() (a fork the runtime makes on its own), None when none.
_runtime_fork: Optional[contextlib.AbstractContextManager[None]] = None


def enter_fork() -> None:
    """Called by the core's fork hooks before each of spindle's forks. A fork the runtime makes on
    its own (a lost worker's replacement, from ``next()``) gets what forking() gives the workers a
    loader starts; inside forking() already, nothing."""
    global _runtime_fork
    if _collecting_at_fork is not None:
        return
    context = forking()
    context.__enter__()
    _runtime_fork = context


def leave_fork() -> None:
    """The core's fork hooks, after each fork, in the consumer: leaves what enter_fork() entered."""
    global _runtime_fork
    context, _runtime_fork = _runtime_fork, None
    if context is not None:
        context.__exit__(None, None, None)


def forked_worker(body: Callable[[Any], int]) -> Callable[[Any], int]:
    """The ``worker_main`` of a loader's forked workers: ``body(ctx)`` run as
    multiprocessing runs a forked child's target (its ``Process._bootstrap``),
    between started_in_fork() and ended_in_fork()."""
    def main(ctx: Any) -> int:
        started_in_fork()
        try:
            return body(ctx)
        finally:
            ended_in_fork()
    return main


def started_in_fork() -> None:
    """First thing in a child forked inside forking(); elsewhere (a spawned worker,
    the consumer) it does nothing.

    Freezes every object the child inherited (its collector never examines
    them), then collects again if the consumer did. And, if the consumer uses
    multiprocessing, does what multiprocessing does first in a forked child:
    the consumer's children and exit finalizers are not this process's, and
    the after-fork callbacks run (a ``Queue`` the consumer has used gets a new
    feeder thread here, without which what a worker puts is never sent; a
    manager's proxy takes its own reference)."""
    global _collecting_at_fork, _tracker_lock_at_fork
    if _collecting_at_fork is None:
        return
    if _tracker_lock_at_fork is not None:  # the consumer's forking() held it at the fork: this copy is ours
        _tracker_lock_at_fork.release()
        _tracker_lock_at_fork = None
    gc.freeze()
    if _collecting_at_fork:
        gc.enable()
    _collecting_at_fork = None
    if (process := sys.modules.get("multiprocessing.process")) is not None:
        process._children = set()  # type: ignore[attr-defined]
    if (util := sys.modules.get("multiprocessing.util")) is not None:
        util._finalizer_registry.clear()  # type: ignore[attr-defined]
        util._run_after_forkers()  # type: ignore[attr-defined]


def ended_in_fork() -> None:
    """Last thing in a forked worker, as multiprocessing ends a forked child: its
    exit finalizers run (a ``Queue``'s joins its feeder thread, so what the worker
    put is sent), then the threads the dataset started are waited for. The
    consumer's ``atexit`` handlers do not run here, as in multiprocessing."""
    if (util := sys.modules.get("multiprocessing.util")) is not None:
        util._exit_function()  # type: ignore[attr-defined]
    threading._shutdown()  # type: ignore[attr-defined]


def call_in_fork(fn: Callable[[], Any]) -> Any:
    """Returns fn() computed in a forked child (its own copy-on-write copy of
    everything fn touches); re-raises its exception here.

    Used only where a computation would mutate state this process must keep
    (grain's initial iterator state of a worker slice). The child holds a
    lease of one task in the budget ledger until it is reaped. The child dies with
    this process (PR_SET_PDEATHSIG) and is killed and reaped if this process
    is interrupted while waiting; the result comes back over a private pipe
    that no user code writes to.
    """
    from .._core import lease_tasks

    # Its one task from the node's budget, like a worker's: waited for (up to
    # HELPER_WAIT_S, then ThreadBudgetError with the numbers) rather than a failed fork.
    lease = lease_tasks(1, budget_policy="wait", timeout=HELPER_WAIT_S)
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    try:
        with forking():
            pid = os.fork()
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        lease.release()
        raise
    if pid == 0:  # child
        code = 1
        try:
            started_in_fork()
            os.close(read_fd)
            _die_with_parent(parent)
            try:
                payload = pickle.dumps(("ok", fn()))
                code = 0
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
                exc.__traceback__ = None
                try:
                    payload = pickle.dumps(("error", exc))
                except Exception:
                    payload = pickle.dumps(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
            with os.fdopen(write_fd, "wb") as out:
                out.write(payload)
        finally:
            os._exit(code)
    lease.started(1)
    os.close(write_fd)
    try:
        try:
            with os.fdopen(read_fd, "rb") as inp:
                data = inp.read()
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        _, status = os.waitpid(pid, 0)
    finally:
        lease.release()  # the helper is reaped
    if not data:
        raise RuntimeError(f"spindle: the helper process (pid {pid}) died ({_describe(status)}) before answering")
    kind, value = pickle.loads(data)
    if kind == "error":
        raise value
    return value


def _die_with_parent(parent: int) -> None:
    """In a forked child: SIGKILL when `parent` dies (and exit now if it already has)."""
    from .. import _core

    if not _core.arm_parent_death(parent, signal.SIGKILL):
        os._exit(1)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"
