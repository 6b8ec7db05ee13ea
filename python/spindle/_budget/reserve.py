"""What a loader's workers may not take from the thread budget: the consumer's reserve, and the
threads each worker runs beyond its own.

The core plans one task per worker and keeps ``kReserve`` (2) for the rest of the consumer when it
sizes the arena (``thread_budget.hpp``). Two things it cannot know are added here, on the Python
side, where the runtimes are known:

- **The consumer's reserve**: what the training loop runs besides the loader. Its peak thread count
  so far (sampled at every start and by the thread watchdog, about once a second) less what it runs
  now, plus room for a burst: ``max(BURST_MIN, peak // BURST_FRACTION)`` (an async checkpoint's
  commit threads, an eval loop's executor). Without it a short budget leases every free task to
  workers, and the consumer's next ``pthread_create`` fails (orbax: "can't start new thread").
- **A worker's tasks**: 1 + the ``worker_threads`` of every runtime loaded in the consumer (forked
  workers inherit them), or the most threads the thread watchdog saw a worker of this process run
  (runtimes the workers load themselves), whichever is more (``docs/threads.md``).

Both are held back from the core's grant by a lease of the node's budget ledger taken just before
it and given back once the workers run (``held_back``): the grant sees them as pending tasks, so a
"shrink" start runs the processes that fit (logical workers keep the data). Under "fail" and "wait"
the workers asked are the user's contract: only what leaves them fitting is held back (it comes out
of the arena), so neither policy refuses or waits where it did not.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Iterator, Optional

from . import runtimes

BURST_MIN = 8
"""Tasks always left for the consumer beyond its peak: an async checkpoint (orbax's commit thread and
its executors), an eval loader's arena, a logging thread."""
BURST_FRACTION = 4
"""And a quarter of its peak when that is more: a consumer running many threads starts more at once."""

_lock = threading.Lock()
_consumer_peak = 0
_worker_seen = 1


def note_consumer_threads() -> int:
    """Samples this process's thread count, keeps its peak, and returns the count."""
    global _consumer_peak
    from .. import _core

    try:
        now = _core.count_process_threads(os.getpid())
    except OSError:  # no descriptor left to read /proc with: the start that follows says so
        return _consumer_peak
    with _lock:
        _consumer_peak = max(_consumer_peak, now)
    return now


def consumer_reserve() -> int:
    """Tasks to leave free for this (consumer) process: its peak less what it runs now, plus a burst."""
    now = note_consumer_threads()
    return max(0, _consumer_peak - now) + max(BURST_MIN, _consumer_peak // BURST_FRACTION)


def note_worker_threads(n: int) -> None:
    """A worker of this process was seen running `n` threads (the watchdog): later starts lease that."""
    global _worker_seen
    with _lock:
        _worker_seen = max(_worker_seen, n)


def worker_lease() -> int:
    """Tasks one worker takes by the runtime table: its own thread and the ``worker_threads`` of the
    runtimes loaded here, which forked workers inherit (the thread watchdog's threshold)."""
    return 1 + sum(r.worker_threads for r in runtimes.RUNTIMES if r.module is not None and r.module in sys.modules)


def planned_worker_tasks() -> int:
    """Tasks a start counts per worker: ``worker_lease()``, or the most threads a worker of this process
    was seen running (runtimes the workers load themselves, such as polars), whichever is more."""
    return max(worker_lease(), _worker_seen)


def holdback(free: Optional[int], num_workers: int, policy: str, reserve: int, lease: int) -> int:
    """Tasks to hold back from a grant of `num_workers` workers when `free` tasks are free (None:
    unlimited), so that the workers' extra threads (`lease` - 1 each) and the consumer's `reserve`
    stay free: under "shrink", all of it, leaving at least one worker; under "fail" and "wait", only
    what leaves `num_workers` fitting."""
    if free is None or free <= 0:
        return 0
    wanted = reserve + (lease - 1) * num_workers
    if policy != "shrink":
        return max(0, min(wanted, free - num_workers))
    fit = max(1, min(num_workers, (free - reserve) // lease))
    return free - fit if fit < num_workers else min(wanted, free - fit)


@contextlib.contextmanager
def held_back(num_workers: int, policy: str) -> Iterator[None]:
    """Around the core's grant (the Loader's construction): a ledger lease of what the workers may
    not take (``holdback``), given back when the block ends: the workers then run (in /proc) and the
    consumer's reserve is free again for its own threads."""
    from .. import _core

    reserve, lease = consumer_reserve(), planned_worker_tasks()
    probe = _core.reserve_stopping(0)
    try:
        free = _core.ledger_available(probe)
    finally:
        probe.release()
    held = _core.reserve_stopping(holdback(free, num_workers, policy, reserve, lease))
    try:
        yield
    finally:
        held.release()


def _forget_in_child() -> None:
    """A forked child is another process: its peak starts from what it runs."""
    global _lock, _consumer_peak
    _lock = threading.Lock()
    _consumer_peak = 0


os.register_at_fork(after_in_child=_forget_in_child)
