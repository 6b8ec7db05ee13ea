"""Keep a worker to its lease of one thread.

Three parts:

- ``cap_worker_pools()`` runs first thing in every worker, before any user
  code: it sets the environment that thread-pool runtimes read when they start
  (OpenMP, MKL, OpenBLAS, numexpr, TensorFlow, XLA/JAX) and caps, through
  their own APIs (threadpoolctl), the pools of runtimes already loaded in the
  consumer and inherited by the fork (torch's intra-op pool, OpenMP, MKL,
  BLIS, OpenBLAS built on OpenMP).
- ``openblas_capped_across_forks()`` runs in the consumer around spindle's
  forks, for the one runtime a worker cannot cap itself: OpenBLAS on pthreads
  (numpy's and scipy's wheels), see ``_restarts_its_pool_when_capped``; the
  consumer's pool, stopped by the forks and restarted after them, is held in
  a lease of the budget ledger meanwhile.
- ``ThreadWatchdog`` runs in the consumer: it looks at each worker's threads
  (``/proc/<pid>/task``) about once a second and warns, once per loader, about
  a worker running more threads than its lease, naming them by runtime, so the
  code that started them can be found; the count it saw is what the next start
  counts per worker (``_budget.reserve``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
import warnings
from typing import Any, Callable, Iterator, Optional

from . import reserve, runtimes

try:
    import threadpoolctl  # imported here, in the consumer, so that forked workers find it loaded
except ImportError:  # a declared dependency; without it loaded pools stay uncapped, and the watchdog says why
    threadpoolctl = None

def one_thread_environment() -> dict[str, str]:
    """The environment variables that make runtimes start single-threaded pools (the runtime table's)."""
    return runtimes.worker_environment()


def cap_worker_pools() -> None:
    """Caps thread pools in this (worker) process before user code runs: the variables for runtimes
    not started yet, and each loaded runtime's own cap call (torch, Arrow, numba; onnxruntime when it
    is imported), for those loaded in the consumer before the fork."""
    os.environ.update(one_thread_environment())
    runtimes.cap_worker_runtimes()
    cap_loaded_pools()


def cap_loaded_pools() -> None:
    """Sets every thread-pool runtime loaded in this (worker) process to one
    thread through its own API, for the worker's lifetime (nothing without
    threadpoolctl; the watchdog's warning then says so).

    The environment above cannot reach these: a runtime reads it once, when it
    is loaded, and these were loaded in the consumer before the fork. OpenBLAS
    on pthreads is skipped: capping it here would start its pool (see
    ``_restarts_its_pool_when_capped``); it arrives capped from the consumer
    instead (``openblas_capped_across_forks``).
    """
    if threadpoolctl is None:
        return
    for lib in threadpoolctl.ThreadpoolController().lib_controllers:
        if not _restarts_its_pool_when_capped(lib):
            lib.set_num_threads(1)


def _restarts_its_pool_when_capped(lib: Any) -> bool:
    """OpenBLAS built on pthreads, in a forked child, cannot be capped without
    starting its pool.

    Its fork handler stops the pool in the parent (pthread_atfork), and every
    entry point restarts it lazily in the child, openblas_set_num_threads()
    included: called in a fresh worker it first starts nproc - 1 threads, which
    it never stops, then records the new count. A BLAS call, on the other hand,
    starts no thread when the recorded count is 1. So the count is set to 1 in
    the consumer just before the fork (where the pool is running and setting it
    starts nothing), and the worker inherits it: capped in the child, the
    pool holds a thread from the cap on; inherited, the worker stays at one.
    """
    return lib.internal_api == "openblas" and lib.threading_layer == "pthreads"


_fork_lock = threading.Lock()
_forks_in_progress = 0
_openblas_to_restore: list[tuple[Any, int, Any]] = []  # (controller, its count, the lease of its pool)


@contextlib.contextmanager
def openblas_capped_across_forks() -> Iterator[None]:
    """In the consumer, around spindle's forks: OpenBLAS (pthreads) runs one
    thread, so that workers inherit that count; the consumer's count is put
    back afterwards.

    Putting it back restarts the consumer's pool at once rather than at its
    next BLAS call (OpenBLAS's fork handler stopped it). BLAS called by other
    consumer threads meanwhile runs single-threaded. Loaders forking from
    several threads at once share one cap, restored when the last finishes.

    The pool's n - 1 threads are in a lease of the budget ledger from before
    they stop until they run again (``_core.reserve_stopping``): no loader of
    this uid, the one about to fork here included, takes their tasks while
    they are down, so the restart finds its room.
    """
    global _forks_in_progress
    consumer = os.getpid()
    with _fork_lock:
        _forks_in_progress += 1
        if _forks_in_progress == 1:
            for lib in _consumer_openblas():
                if (n := lib.get_num_threads()) and n > 1:
                    from .._core import reserve_stopping

                    lease = reserve_stopping(n - 1)  # while they still run: counted twice, never zero times
                    lib.set_num_threads(1)
                    _openblas_to_restore.append((lib, n, lease))
    try:
        yield
    finally:
        # A forked child leaving the block (run_forked's) keeps the cap, as a worker does.
        if os.getpid() == consumer:
            with _fork_lock:
                _forks_in_progress -= 1
                if _forks_in_progress == 0:
                    while _openblas_to_restore:
                        lib, n, lease = _openblas_to_restore.pop()
                        try:
                            _restore_if_room(lib, n, lease)
                        finally:
                            lease.release()  # running again (counted by /proc), or not restarted


_openblas_libs: dict[frozenset[str], list[Any]] = {}
_warned_kept_capped = False


def _restore_if_room(lib: Any, n: int, lease: Any) -> None:
    """Puts the consumer's OpenBLAS back to `n` threads, which starts n - 1 of
    them at once, in the room `lease` kept for them. Another process of this
    uid that takes no leases (a runtime other than spindle) may still have
    taken it: a failed pthread_create makes OpenBLAS raise SIGINT in this
    process, so if the budget (ulimit -u, pids.max, less every other lease's
    pending tasks) has no room for them now, OpenBLAS stays at one thread,
    with one warning naming the numbers."""
    global _warned_kept_capped
    from .._core import ledger_available

    try:
        room = ledger_available(lease)
    except Exception:  # noqa: BLE001 - no budget readable: restore as before
        room = None
    if room is None or room >= n - 1:
        lib.set_num_threads(n)
        return
    if not _warned_kept_capped:
        _warned_kept_capped = True
        warnings.warn(
            f"spindle: kept numpy's OpenBLAS at 1 thread in this process after starting workers: restoring its "
            f"{n} threads would start {n - 1} more with only {room} tasks of headroom left under ulimit -u / "
            "pids.max (taken meanwhile by a process that does not use spindle's ledger; a failed pthread_create "
            "makes OpenBLAS abort with SIGINT). Set OPENBLAS_NUM_THREADS, or call spindle.limit_threads(n) "
            "before importing numpy, to choose the count yourself.",
            RuntimeWarning, stacklevel=4)


def _consumer_openblas() -> list[Any]:
    """threadpoolctl's controllers of the OpenBLAS builds (pthreads) loaded here,
    found once per set of loaded modules (the scan reads /proc/self/maps).
    Best effort: with no descriptor left to read it, nothing is capped."""
    if threadpoolctl is None:
        return []
    key = frozenset(name for name in ("numpy", "scipy", "torch", "sklearn") if name in sys.modules)
    if key not in _openblas_libs:
        try:
            libs = threadpoolctl.ThreadpoolController().lib_controllers
        except OSError:
            return []
        _openblas_libs[key] = [lib for lib in libs if _restarts_its_pool_when_capped(lib)]
    return _openblas_libs[key]


def _forget_forks_in_child() -> None:
    """A child starts with no fork in progress and a free lock (another
    consumer thread may have held it at the fork)."""
    global _fork_lock, _forks_in_progress
    _fork_lock = threading.Lock()
    _forks_in_progress = 0
    _openblas_to_restore.clear()  # the parent's leases: dropping the copies gives nothing back


os.register_at_fork(after_in_child=_forget_forks_in_child)


def thread_names(pid: int) -> list[str]:
    """Names of the threads of process `pid` (empty if it is gone)."""
    from .. import _core

    try:
        return [name for _, name in (_core.process_threads(pid) or [])]
    except OSError:
        return []


_NO_THREADPOOLCTL = (
    " threadpoolctl is not installed, so BLAS and OpenMP pools loaded in the consumer (numpy's OpenBLAS) are "
    "not capped in workers, and a worker's first matrix product starts one: pip install threadpoolctl.")


def _housekeeping(names: list[str]) -> int:
    """How many of a process's threads (`names`, its own first) are housekeeping threads, one of each name."""
    return sum(1 for name in runtimes.HOUSEKEEPING_THREADS if name in names[1:])


SECOND_LOOK_S = 0.1
"""A worker over its lease is looked at again this soon: a pool is still there, a moment's thread is not."""


class ThreadWatchdog:
    """Warns once when a worker holds more threads than its lease, naming them by runtime, and samples
    the consumer's thread count for its reserve (``_budget.reserve``).

    The lease is a worker's own thread and what the runtimes loaded in the consumer still run in it at
    their caps (the runtime table's ``worker_threads``: Arrow's two pool threads). A worker seen over
    it is remembered, so that the next start in this process counts what its workers ran."""

    def __init__(self, worker_pids: Callable[[], list[int]], lease: Optional[int] = None,
                 period: float = 1.0) -> None:
        self._pids = worker_pids
        self._lease = reserve.worker_lease() if lease is None else lease
        self._period = period
        self._next = time.monotonic() + period / 4  # first look soon after start
        self.warned = False
        self._over: set[int] = set()  # workers over their lease at the last look

    def poll(self) -> None:
        """Cheap unless a period has passed; call it per batch."""
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self._period
        reserve.note_consumer_threads()
        if self.warned:
            return
        # Over its lease at two looks in a row: a thread that lives for a moment (a library's
        # short-lived helper) is not a pool that stays.
        over, self._over = self._over, set()
        for worker_id, pid in enumerate(self._pids()):
            names = thread_names(pid)
            if len(names) - _housekeeping(names) > self._lease:
                # Counted for the next start at once (all of them are tasks: over-counting a moment's
                # thread costs a process, under-counting a pool costs a failed pthread_create)...
                reserve.note_worker_threads(len(names))
                self._over.add(pid)
                if pid not in over:  # ...warned about at the second look, a tenth of a second on
                    self._next = min(self._next, time.monotonic() + SECOND_LOOK_S)
                    continue
                self.warned = True
                warnings.warn(self._report(worker_id, pid, len(names)), RuntimeWarning, stacklevel=3)
                return

    def _report(self, worker_id: int, pid: int, running: int) -> str:
        """What the worker runs beyond its own thread, by runtime (``_budget.threads``), and what to do."""
        from .threads import process_threads

        groups: dict[str, collections.Counter[str]] = {}
        for t in process_threads(pid):
            if t.runtime != "main thread":
                groups.setdefault(t.runtime, collections.Counter())[t.name] += 1
        listed = "; ".join(
            f"{runtime} x{sum(c.values())} (" + ", ".join(f"{n} x{k}" if k > 1 else n for n, k in c.most_common()) + ")"
            for runtime, c in sorted(groups.items(), key=lambda g: -sum(g[1].values())))
        known = all(runtime in runtimes.BY_NAME and sum(c.values()) - _housekeeping(["", *c.elements()])
                    <= runtimes.BY_NAME[runtime].worker_threads for runtime, c in groups.items())
        head = (f"spindle: worker {worker_id} (pid {pid}) runs {running} threads, over its lease of {self._lease}: "
                f"{listed or 'threads gone before they could be named'}. ")
        if groups and known:
            return head + (
                "These runtimes run that many threads at their least in every worker (docs/threads.md), more than "
                f"this loader's start counted: the next loader started in this process counts {running} tasks per "
                "worker. Every worker's threads count against ulimit -u.")
        return head + (
            "Dataset code started them in the worker (a thread pool, or a multiprocessing Queue's feeder thread: one "
            "per Queue the worker puts to), or, in a forked worker, a library's fork handler did (torch restarts one "
            "pool thread in every child of a process that called torch.set_num_threads; "
            "multiprocessing_context='spawn' avoids it). Cap pools (torch.set_num_threads(1), OMP_NUM_THREADS=1, "
            "TF/XLA thread options) or create them lazily outside the workers. Every worker's extra threads count "
            "against ulimit -u." + _NO_THREADPOOLCTL * (threadpoolctl is None))
