"""spindle.DataLoader: batches of numpy arrays over shared memory.

Workers are forked processes with one thread each; batches are written by the
workers straight into a shared ring slot and handed to you as numpy views of
that slot, with no pickling and no copy. A slot stays reserved while any array
of its batch is alive, so kept batches are never overwritten.
"""

from __future__ import annotations

import numbers
import pickle
import warnings
from functools import partial
from typing import Any, Callable, Iterator, Optional

import numpy as np

from . import _core
from ._budget import resolve_policy, warn_if_shrunk
from ._caps import ThreadWatchdog
from ._forking import forking
from ._layout import BatchReader, collate_local
from ._worker import ArrayBatches, batch_decoder, run_worker, seed_worker
from .errors import BatchFailedError, SpindleError, WorkerError

__all__ = ["DataLoader"]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} should be an integer >= {minimum}, but got {name}={value!r}")
    return int(value)


class DataLoader:
    """Iterates a map-style dataset in batches, produced by forked workers.

    Args:
        dataset: supports ``len(dataset)`` and ``dataset[i]``; items are numpy
            arrays, numpy scalars, bool/int/float, or nested dicts, tuples,
            lists and namedtuples of them, with the same structure, shapes and
            dtypes for every item of one batch (batches may differ).
        batch_size: samples per batch.
        shuffle: draw a new permutation every epoch.
        num_workers: worker processes; 0 loads in the calling process.
        seed: makes shuffling and the workers' ``random``/``numpy`` seeds
            reproducible (epoch ``e`` uses ``(seed, e)``); None draws fresh
            entropy per epoch.
        timeout: seconds to wait for one batch before raising
            :class:`~spindle.errors.LoaderTimeoutError`; 0 (or inf) waits forever.
        drop_last: drop the last batch if it is short.
        prefetch_factor: batches in flight per worker.
        in_order: deliver batches in order; False delivers them as they finish.
        max_threads: cap on the tasks (processes + threads) the loader adds,
            on top of ulimit -u and the cgroup's pids.max.
        budget_policy: what to do when fewer tasks are free than
            ``num_workers`` needs (the live headroom less what other loaders
            of this uid on this node leased and have not started):
            ``"shrink"`` runs with as many workers as fit, with one
            :class:`~spindle.errors.ThreadBudgetWarning` naming the numbers;
            ``"wait"`` waits for leases to come back, up to ``timeout`` (0:
            without bound), then raises
            :class:`~spindle.errors.ThreadBudgetError`; ``"fail"`` raises it
            at once. None: ``$SPINDLE_BUDGET_POLICY``, else ``"shrink"``.
        worker_init_fn: called with the worker id in each worker before it
            loads anything.
        persistent_workers: keep the workers and the shared ring across
            epochs (no fork per epoch; workers keep their random state).
        max_batch_bytes: the largest batch (all fields) a ring slot may hold;
            address space set aside per slot, memory is used only as batches
            need it.

    Dataset code runs only in the workers: nothing is read in this process to
    plan the ring (each batch carries its own layout, and slots grow to fit).
    Ctrl-C while waiting raises KeyboardInterrupt and stops the workers;
    ``close()`` is safe from any thread.

    Batches are numpy arrays viewing shared memory; they are writable and stay
    valid for as long as you keep them, even after the loader is gone.

    Like torch's default collate, a worker first reads all samples of a batch,
    then copies them into the batch: a dataset must not return one buffer that
    it overwrites on the next ``dataset[i]`` (return a new array per item).
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False, num_workers: int = 0,
                 seed: Optional[int] = None, timeout: float = 0, drop_last: bool = False, *,
                 prefetch_factor: int = 2, in_order: bool = True, max_threads: Optional[int] = None,
                 worker_init_fn: Optional[Callable[[int], None]] = None,
                 persistent_workers: bool = False, max_batch_bytes: int = 1 << 30,
                 budget_policy: Optional[str] = None) -> None:
        self.dataset = dataset
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.num_workers = _check_int("num_workers", num_workers, 0)
        self.prefetch_factor = _check_int("prefetch_factor", prefetch_factor, 1)
        if not timeout >= 0:  # also NaN
            raise ValueError(f"timeout should be non-negative, but got timeout={timeout!r}")
        self.max_batch_bytes = _check_int("max_batch_bytes", max_batch_bytes, 1)
        if max_threads is not None:
            max_threads = _check_int("max_threads", max_threads, 0)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.timeout = float(timeout)
        self.drop_last = bool(drop_last)
        self.in_order = bool(in_order)
        self.max_threads = max_threads
        self.budget_policy = resolve_policy(budget_policy)
        self.worker_init_fn = worker_init_fn
        if persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.persistent_workers = bool(persistent_workers)
        self._workers: Optional[_core.Loader] = None
        self._persistent_epoch = 0
        self._epoch = 0

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _epoch_order(self) -> tuple[np.ndarray, int]:
        """This epoch's sample order (int64, already cut for drop_last) and the workers' base seed."""
        n = len(self.dataset)
        epoch = self._epoch
        self._epoch += 1
        entropy = [self.seed, epoch] if self.seed is not None else None
        rng = np.random.default_rng(entropy)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        if self.drop_last:
            order = order[:n - n % self.batch_size]
        worker_seed = int(rng.integers(0, 2**62))
        return np.ascontiguousarray(order, dtype=np.int64), worker_seed

    def __iter__(self) -> Iterator[Any]:
        order, worker_seed = self._epoch_order()
        if len(order) == 0:
            return iter(())
        if self.num_workers == 0:
            return _InProcessIterator(self, order, worker_seed)
        decode = batch_decoder(BatchReader())
        if not self.persistent_workers:
            return _WorkerIterator(self._start_workers(order, worker_seed), decode, owns=True)
        if self._workers is not None:
            try:
                self._workers.reset(order=order, drop_last=self.drop_last)
            except SpindleError:  # a worker died last epoch (already reported): start afresh
                self._workers.close()
                self._workers = None
        if self._workers is None:
            self._workers = self._start_workers(order, worker_seed)
        self._persistent_epoch += 1
        return _WorkerIterator(self._workers, decode, owns=False, owner=self, epoch=self._persistent_epoch)

    def _start_workers(self, order: np.ndarray, seed: int) -> _core.Loader:
        body = partial(run_worker, dataset=self.dataset, transport=ArrayBatches(self.batch_size),
                       setup=partial(_setup_worker, base_seed=seed, worker_init_fn=self.worker_init_fn))
        with forking():
            runtime = _core.Loader(
                order=order, drop_last=self.drop_last, worker_main=lambda ctx: body(ctx),
                num_workers=self.num_workers, batch_capacity=self.batch_size,
                max_batch_bytes=self.max_batch_bytes,
                prefetch_factor=self.prefetch_factor, in_order=self.in_order, timeout=self.timeout,
                max_threads=self.max_threads, budget_policy=self.budget_policy)
        warn_if_shrunk(runtime, stacklevel=3)
        return runtime

    def close(self) -> None:
        """Stops persistent workers now (they also stop when the loader is garbage-collected)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __del__(self) -> None:
        workers = getattr(self, "_workers", None)
        if workers is not None:
            workers.close()

    def thread_budget(self) -> _core.ThreadBudget:
        """The budget this loader's workers are checked against, read now."""
        return _core.ThreadBudget(max_threads=self.max_threads)


def _setup_worker(worker_id: int, num_workers: int, *, base_seed: int,
                  worker_init_fn: Optional[Callable[[int], None]]) -> None:
    seed_worker(base_seed + worker_id)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


class _InProcessIterator:
    """num_workers=0: the same layout and checks, in the calling process."""

    def __init__(self, loader: DataLoader, order: np.ndarray, seed: int) -> None:
        self._dataset = loader.dataset
        self._order = order
        self._batch_size = loader.batch_size
        self._next = 0
        self._reader = BatchReader()
        seed_worker(seed)

    def __iter__(self) -> "_InProcessIterator":
        return self

    def __next__(self) -> Any:
        if self._next >= len(self._order):
            raise StopIteration
        indices = self._order[self._next:self._next + self._batch_size].tolist()
        self._next += self._batch_size
        return collate_local([self._dataset[index] for index in indices], indices, self._reader)


class _WorkerIterator:
    """One epoch over a runtime Loader (its ring and its workers).

    With persistent workers the DataLoader owns the runtime Loader and hands
    it to each epoch's iterator; otherwise the iterator owns it and closes it
    at the end of the epoch.
    """

    def __init__(self, runtime: _core.Loader, decode: Callable[[_core.Lease], Any], *, owns: bool,
                 owner: Optional[Any] = None, epoch: int = 0,
                 reraise: Optional[Callable[[BatchFailedError], BaseException]] = None) -> None:
        self._loader = runtime
        self._decode = decode
        self._reraise = reraise or _reraise  # a failed batch's report -> the exception to raise
        self._watchdog = ThreadWatchdog(lambda: list(runtime.worker_pids))
        self._owns = owns
        self._owner = owner
        self._epoch = epoch
        self._warned_copy = False

    def __iter__(self) -> "_WorkerIterator":
        return self

    @property
    def worker_pids(self) -> list[int]:
        """Pids of this iterator's worker processes."""
        return list(self._loader.worker_pids)

    @property
    def plan(self) -> _core.ThreadPlan:
        """The thread plan: workers and arena threads granted by the budget."""
        return self._loader.plan

    def __next__(self) -> Any:
        if self._owner is not None and self._owner._persistent_epoch != self._epoch:
            raise RuntimeError("spindle: this iterator belongs to an earlier epoch; with persistent_workers=True "
                               "starting a new epoch (iter(loader)) ends the previous iterator")
        try:
            lease = self._loader.next()
        except BatchFailedError as failed:
            raise self._reraise(failed) from None
        except KeyboardInterrupt:
            # Ctrl-C while waiting: stop the workers before the interrupt
            # unwinds (a training script that catches it must not keep them).
            self._stop()
            raise
        self._watchdog.poll()
        if lease is None:
            if self._owns:
                self.close()
            raise StopIteration
        if lease.copied_out and not self._warned_copy:
            self._warned_copy = True
            warnings.warn(
                f"spindle: every one of the {self._loader.num_slots} shared-memory slots is held by a "
                "batch you kept, so this batch (and later ones while that lasts) was copied out of "
                "shared memory to keep loading. Drop references to old batches (or copy what you "
                "keep) to stay zero-copy.", RuntimeWarning, stacklevel=2)
        return self._decode(lease)

    def close(self) -> None:
        """Stops the workers (if this iterator owns them). Batches already delivered stay valid.
        Safe from any thread: a ``next()`` waiting elsewhere ends with StopIteration."""
        if self._owns:
            self._loader.close()

    def _stop(self) -> None:
        """Stops the workers now, whoever owns them (persistent ones restart next epoch)."""
        self._loader.close(grace=0.05)
        if self._owner is not None:
            self._owner.close()

    def __del__(self) -> None:
        if getattr(self, "_owns", False):
            self._loader.close()


def _reraise(failed: BatchFailedError) -> BaseException:
    """Re-creates the worker's exception, with its traceback and sample index as a note."""
    try:
        report = pickle.loads(failed.payload)
    except Exception:
        return WorkerError(str(failed))
    where = (f"in spindle worker {report['worker_id']} (pid {report['pid']}) while loading sample index "
             f"{report['sample_index']} (batch {failed.batch_id})")
    note = f"Raised {where}. Traceback in the worker:\n{report['traceback']}"
    exc: Optional[BaseException] = None
    if report["exception"] is not None:
        try:
            exc = pickle.loads(report["exception"])
        except Exception:
            exc = None
    if exc is None:
        exc = WorkerError(f"{report['type']}: {report['text']} ({where})")
    exc.add_note(note)
    exc.sample_index = report["sample_index"]  # type: ignore[attr-defined]
    exc.worker_id = report["worker_id"]  # type: ignore[attr-defined]
    return exc
