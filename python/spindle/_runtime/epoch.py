"""One epoch over a runtime Loader: the iterator every front end hands out (or wraps)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from .. import _core
from .._budget.caps import ThreadWatchdog
from ..errors import BatchFailedError
from .failures import reraise as _worker_exception
from .sharing import MemoryWatch
from .stats import StatsBook

# Where an epoch says that it copied batches out of the ring (INFO: silent unless asked for).
log = logging.getLogger("spindle")


class EpochIterator:
    """One epoch over a runtime Loader (its ring and its workers).

    With persistent workers the DataLoader owns the runtime Loader and hands
    it to each epoch's iterator; otherwise the iterator owns it and closes it
    at the end of the epoch.
    """

    def __init__(self, runtime: _core.Loader, decode: Callable[[_core.Batch], Any], *, owns: bool,
                 owner: Optional[Any] = None, epoch: int = 0,
                 reraise: Optional[Callable[[BatchFailedError], BaseException]] = None,
                 stats: Optional[StatsBook] = None, after_batch: Optional[Callable[[], None]] = None) -> None:
        self._runtime = runtime
        # Called once a batch is delivered or failed, before it is handed out or raised
        # (spindle.torch draws the next batch from the sampler there, as torch does).
        self._after_batch = after_batch
        self._stats = stats  # the front end's statistics: this runtime's counts join them
        if stats is not None:
            stats.track(runtime)
        self._decode = decode
        self._reraise = reraise or _worker_exception  # a failed batch's report -> the exception to raise
        self._watchdog = ThreadWatchdog(lambda: list(runtime.worker_pids))
        self._memory = MemoryWatch(lambda: list(runtime.worker_pids))
        self._owns = owns
        # Dropping an iterator that owns its runtime stops the workers, even while
        # something else (spindle.torch's `_workers` views) still holds the runtime.
        self._close_on_drop = _core.CloseOnDrop(runtime) if owns else None
        self._owner = owner
        self._epoch = epoch
        self._logged_copy = False

    def __iter__(self) -> "EpochIterator":
        return self

    @property
    def worker_pids(self) -> list[int]:
        """Pids of this iterator's worker processes."""
        return list(self._runtime.worker_pids)

    @property
    def plan(self) -> _core.ThreadPlan:
        """The thread plan: workers and arena threads granted by the budget."""
        return self._runtime.plan

    def __next__(self) -> Any:
        if self._owner is not None and self._owner._persistent_epoch != self._epoch:
            raise RuntimeError("spindle: this iterator belongs to an earlier epoch; with persistent_workers=True "
                               "starting a new epoch (iter(loader)) ends the previous iterator")
        try:
            lease = self._runtime.next()
        except BatchFailedError as failed:
            if self._after_batch is not None:
                self._after_batch()
            raise self._reraise(failed) from None
        except KeyboardInterrupt:
            # Ctrl-C while waiting: stop the workers before the interrupt
            # unwinds (a training script that catches it must not keep them).
            self._stop()
            raise
        self._watchdog.poll()
        self._memory.poll()
        if lease is None:
            if self._owns:
                self.close()
            raise StopIteration
        if self._after_batch is not None:
            self._after_batch()
        if lease.copied_out and not self._logged_copy:
            # Not a warning: keeping every batch (`list(loader)`) is ordinary torch
            # code, and the copy is what torch pays for every batch. The copy is
            # the protection (a kept batch is never overwritten, loading never
            # stalls); this only says that zero-copy stopped (docs/torch_dropin.md).
            self._logged_copy = True
            log.info("spindle: every one of the %d shared-memory slots is held by a batch you kept, so this "
                     "batch (and later ones while that lasts) was copied out of shared memory to keep loading. "
                     "Drop references to old batches (or copy what you keep) to stay zero-copy.",
                     self._runtime.num_slots)
        return self._decode(lease)

    @property
    def advised_processes(self) -> int:
        """An adaptive stream's advice: the processes the controller wants it on (0: none yet)."""
        return self._runtime.advised_processes

    def close(self, grace: float = 1.0) -> None:
        """Stops the workers (if this iterator owns them; a busy one gets ``grace`` seconds to finish
        its batch). Batches already delivered stay valid. Safe from any thread: a ``next()`` waiting
        elsewhere ends with StopIteration."""
        if self._owns:
            self._runtime.close(grace=grace)
            if self._stats is not None:
                self._stats.retire(self._runtime)

    def _stop(self) -> None:
        """Stops the workers now, whoever owns them (persistent ones restart next epoch)."""
        self._runtime.close(grace=0.05)
        if self._owner is not None:
            self._owner.close()
