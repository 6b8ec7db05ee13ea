"""What a loader's workers may not take from the thread budget: the consumer's reserve, and the
threads each worker runs beyond its own. Facts of this process, known here; the core decides what fits.

- **The consumer's reserve**: what the training loop runs besides the loader. Its peak thread count
  so far (sampled at every start and by the thread watchdog, about once a second) less what it runs
  now, plus room for a burst: ``max(BURST_MIN, peak // BURST_FRACTION)`` (an async checkpoint's
  commit threads, an eval loop's executor). Without it a short budget leases every free task to
  workers, and the consumer's next ``pthread_create`` fails (orbax: "can't start new thread").
- **A worker's tasks**: 1 + the ``worker_threads`` of every runtime loaded in the consumer (forked
  workers inherit them), or the most threads the thread watchdog saw a worker of this process run
  (runtimes the workers load themselves), whichever is more (``docs/threads.md``).

Both go to the core with every start (``LoaderOptions.reserve_tasks`` and ``worker_tasks``,
``StartSpec.options``). The core holds them back from its grant (``start_holdback`` in
``budget_ledger.hpp``: under "shrink" the processes that fit run, and logical workers keep the data;
under "fail" and "wait" the workers asked are the user's contract, so only what leaves them fitting is
held back) and keeps the reserve free while batches flow (processes retire before a
``pthread_create`` fails: ``loader_autoscale.cpp``).
"""

from __future__ import annotations

import os
import sys
import threading

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


def _forget_in_child() -> None:
    """A forked child is another process: its peak starts from what it runs."""
    global _lock, _consumer_peak
    _lock = threading.Lock()
    _consumer_peak = 0


os.register_at_fork(after_in_child=_forget_in_child)
