"""Loader statistics as every front end returns them from ``stats()`` (docs/observability.md).

The counters live in the C++ core (``_core.Loader.stats()``: the consumer's wait histogram, each
worker's counters in shared memory); this module only adds up the runtime Loaders a front end
used across epochs, so that a DataLoader's figures cover its whole life, not one epoch.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .. import _core
from .sharing import worker_memory

__all__ = ["StatsBook", "HasStats"]


class StatsBook:
    """The statistics of one front-end loader: the epochs' runtimes that ended, folded together,
    plus the one running now. Safe to read from another thread (a metrics scrape)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._past = _core.LoaderStats()
        self._current: Optional[_core.Loader] = None
        self._processes_at_end = 0  # the processes the last runtime that ended ran (reset_stats keeps it)

    def track(self, runtime: _core.Loader) -> None:
        """``runtime`` is the one running now (a new epoch's, or the same persistent one)."""
        with self._lock:
            if self._current is runtime:
                return
            if self._current is not None:
                self._fold(self._current)
            self._current = runtime

    def retire(self, runtime: _core.Loader) -> None:
        """``runtime`` ended (its epoch is over): keep its counts, drop the reference."""
        with self._lock:
            if self._current is runtime:
                self._fold(runtime)
                self._current = None

    @property
    def processes_at_end(self) -> int:
        """The processes the runtime running now runs, else those the last one ended on (0: none
        yet). ``num_workers="auto"`` starts the next epoch there: what the controller found for
        this loader's data stands until the load changes, and each epoch need not find it again."""
        with self._lock:
            return self._current.processes if self._current is not None else self._processes_at_end

    def _fold(self, runtime: _core.Loader) -> None:
        """Adds an ended runtime's counts to the past; its processes and last change are the latest
        (``LoaderStats.merge`` keeps the receiver's: the newer one receives)."""
        newer = runtime.stats()
        self._processes_at_end = runtime.processes
        newer.merge(self._past)
        self._past = newer

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            if self._current is None:
                out = self._past.to_dict()
            else:
                now = self._current.stats()
                now.merge(self._past)
                out = now.to_dict()
        for worker in out["workers"]:
            # What each worker pays alone (its private pages, /proc/<pid>/smaps_rollup): a dataset of
            # Python objects that the workers copy shows here (docs/shared_memory.md); None: not running.
            memory = worker_memory(worker.get("pid", 0))
            worker["uss_bytes"] = None if memory is None else memory.uss
            worker["pss_bytes"] = None if memory is None else memory.pss
        return out

    def reset(self) -> None:
        with self._lock:
            self._past = _core.LoaderStats()
            if self._current is not None:
                self._current.reset_stats()


class HasStats:
    """``stats()`` and ``reset_stats()`` for a front-end loader (a mixin; the book is made on
    first use, so no front end's constructor changes)."""

    def _stats_book(self) -> StatsBook:
        book = self.__dict__.get("_spindle_stats")
        if book is None:
            book = self.__dict__["_spindle_stats"] = StatsBook()
        return book

    def stats(self) -> dict[str, Any]:
        """What this loader has done since it was made (or since :meth:`reset_stats`), over every
        epoch: ``batches``, ``samples``, ``skipped``, ``wait_s`` (time blocked in ``next()``),
        ``wait_p50_ms``/``wait_p95_ms``/``wait_max_ms`` (per batch), ``elapsed_s``, the ring now
        (``ring_slots``, ``ring_ready``, ``ring_in_flight``, ``ring_leased``), ``bytes_fetched``
        (URL shards), ``copied_out``, and ``workers``: per worker ``busy_s``, ``samples``,
        ``bytes_fetched``, what it is doing now (``batch``, ``sample``, ``busy_for_s``; -1: idle) and its
        memory now: ``uss_bytes`` (private: what this worker alone costs) and ``pss_bytes`` (its share of
        the shared pages too); None once it has exited.
        See docs/observability.md."""
        return self._stats_book().snapshot()

    def reset_stats(self) -> None:
        """Starts every counter of :meth:`stats` again from zero."""
        self._stats_book().reset()
