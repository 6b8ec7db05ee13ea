"""spindle.DataLoader: batches of numpy arrays over shared memory.

Workers are forked processes with one thread each; batches are written by the
workers straight into a shared ring slot and handed to you as numpy views of
that slot, with no pickling and no copy. A slot stays reserved while any array
of its batch is alive, so kept batches are never overwritten.
"""

from __future__ import annotations

import numbers
import operator
import pickle
import sys
from functools import partial
from typing import Any, Callable, Iterator, Optional

import numpy as np

from . import _core
from ._runtime.epoch import EpochIterator
from ._runtime.stats import HasStats
from ._runtime.layout import BatchReader, SlotWriter, collate_local, stacked
from ._runtime.persistent import reset_or_restart
from ._runtime.sharing import check_share, share_for_workers
from ._runtime.start import LOADER_DEFAULTS, StartSpec, replacements_for, start
from ._runtime.worker import batch_decoder, run_worker, seed_worker
from ._state.checkpoint import BatchSeeds, EpochCell, Progress, dataset_key, torch_imported
from ._state.epoch_plan import EpochPlan
from ._state.sharding import resolve_shard

__all__ = ["DataLoader"]

_FORMAT = "spindle.DataLoader"


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} should be an integer >= {minimum}, but got {name}={value!r}")
    return int(value)


# The arguments torch's DataLoader also takes are checked as torch checks them: the same
# exception type and words (torch raises some of these only once iterated; here they are
# raised at construction).
def _check_num_workers(value: Any) -> int | str:
    if value == "auto":
        return value
    if value < 0:  # another str: TypeError from the comparison, as in torch
        raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
    return operator.index(value)  # 2.5: TypeError "'float' object cannot be interpreted as an integer"


def _check_batch_size(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:  # torch's BatchSampler
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={value}")
    return int(value)


def _check_prefetch_factor(value: Any) -> int:
    if value < 0:
        raise ValueError("prefetch_factor option should be non-negative")
    n = operator.index(value)
    if n == 0:  # torch would hang with no batch in flight; spindle needs one
        raise ValueError("prefetch_factor should be at least 1 (batches in flight per worker), but got "
                         "prefetch_factor=0")
    return n


def _check_dataset(dataset: Any) -> None:
    """Refuses an iterable-style dataset (no ``len()``/``dataset[i]``, or torch's IterableDataset) at
    construction, naming the loaders that take one."""
    torch_data = sys.modules.get("torch.utils.data")
    iterable = torch_data is not None and isinstance(dataset, torch_data.IterableDataset)
    if iterable or not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(
            f"spindle.DataLoader needs a map-style dataset (len(dataset) and dataset[i]), but got "
            f"{type(dataset).__name__}, an iterable-style dataset. For a stream, use spindle.torch.DataLoader "
            "(torch's interface: each worker iterates its own copy, batches come from the workers in turn) "
            "or spindle.grain.mp_prefetch for a grain IterDataset.")


def _check_timeout(value: Any) -> float:
    if value < 0:  # a str: TypeError from the comparison, as in torch
        raise ValueError("timeout option should be non-negative")
    if value != value:  # NaN
        raise ValueError(f"timeout should be a number of seconds >= 0, but got timeout={value!r}")
    return float(value)


class DataLoader(HasStats):
    """Iterates a map-style dataset in batches, produced by forked workers.

    Args:
        dataset: supports ``len(dataset)`` and ``dataset[i]``; items are numpy
            arrays, numpy scalars, bool/int/float, or nested dicts, tuples,
            lists and namedtuples of them, with the same structure, shapes and
            dtypes for every item of one batch (batches may differ), with any
            number of fields (beyond what a slot's descriptor holds, a batch
            travels pickled: the same arrays, copied once more). An
            iterable-style dataset (a stream) is refused with a TypeError:
            ``spindle.torch.DataLoader`` takes one.
        batch_size: samples per batch.
        shuffle: draw a new permutation every epoch.
        num_workers: worker processes; 0 loads in the calling process.
            ``"auto"``: spindle chooses, while batches flow: as many
            processes as cores are idle start (from the second epoch, as many as the last epoch ended
            on), more are added while your loop waits for data and a core
            is free, and one retires when the workers idle because your loop
            sets the pace, or when the user's task budget runs short. The
            batches are the same whatever the count (with ``seed``, also
            their random draws). Each change is one INFO line (logger
            "spindle") and shows in ``stats()`` ("processes",
            "resize_reason"); docs/node_budget.md.
        seed: makes shuffling and the random draws reproducible: epoch ``e``
            shuffles with ``(seed, e)``, and before each batch the worker
            seeds ``random``, numpy's global generator (and torch's CPU
            generator, if torch is imported) from ``(seed, e, the batch's
            sample indices)``; the batch's samples then draw in order. A batch
            is made of the same samples whatever the worker count, so
            augmentations do not depend on which worker (or how many) loaded
            it, and a resumed loader draws what the uninterrupted one drew.
            None draws fresh entropy once per loader for the order (0 when
            sharded: every rank must draw the same order, as
            DistributedSampler's default seed) and seeds each worker once,
            not each batch.
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
        shard: None (every sample), ``"auto"`` (the rank and world size of
            torch.distributed, JAX, torchrun, Slurm or Open MPI) or
            ``(rank, world_size)``: this process loads every world_size-th
            sample of the epoch's global order from its rank on, as torch's
            DistributedSampler (docs/distributed.md).
        shard_drop_last: with a shard, cut the order's tail so it divides by
            world_size (DistributedSampler's drop_last); False pads it by
            repeating its start, so every rank gets as many samples.
        share: ``"auto"`` (default): when workers start, the dataset's large
            attributes made of plain values (lists, tuples, dicts of str, bytes,
            numbers, None; over 100k items or ~1 MiB), also those of wrapped
            datasets, go to shared memory once (:func:`spindle.shared`), so the
            workers read them without copying them; one INFO line (logger
            "spindle") per conversion. Your dataset object is not changed: the
            workers get a shallow copy. ``"off"``: the workers get the dataset
            as it is (docs/shared_memory.md).
        on_worker_death: ``"replace"`` (default): a worker process lost
            mid-epoch (the OOM killer, a signal, a runtime's abort) is started
            again and the batch it was producing is produced again: the epoch
            goes on with the same batches in the same order, one WARNING
            (logger "spindle") per loss. At most ``max(3, num_workers)``
            (with ``"auto"``, of the most processes it may run) per epoch, and a sample being produced at two losses is not tried
            a third time: then ``WorkerDiedError`` names them
            (docs/reliability.md). ``"raise"``: the first loss raises.

    ``state_dict()`` / ``load_state_dict()`` checkpoint the position in the
    epoch (a small JSON-able dict); a loader given a state yields exactly the
    batches the saved one would have yielded next, also with another
    ``num_workers``.

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
                 prefetch_factor: int = LOADER_DEFAULTS.prefetch_factor, in_order: bool = True, max_threads: Optional[int] = None,
                 worker_init_fn: Optional[Callable[[int], None]] = None,
                 persistent_workers: bool = False, max_batch_bytes: int = LOADER_DEFAULTS.max_batch_bytes,
                 budget_policy: Optional[str] = None, shard: Any = None, shard_drop_last: bool = False,
                 share: str = "auto", on_worker_death: str = "replace") -> None:
        self.dataset = dataset
        _check_dataset(dataset)
        self.batch_size = _check_batch_size(batch_size)
        self.num_workers = _check_num_workers(num_workers)
        self.prefetch_factor = _check_prefetch_factor(prefetch_factor)
        timeout = _check_timeout(timeout)
        self.max_batch_bytes = _check_int("max_batch_bytes", max_batch_bytes, 1)
        if max_threads is not None:
            max_threads = _check_int("max_threads", max_threads, 0)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.timeout = float(timeout)
        self.drop_last = bool(drop_last)
        self.in_order = bool(in_order)
        self.max_threads = max_threads
        self.budget_policy = _core.resolve_budget_policy(budget_policy)
        self.worker_init_fn = worker_init_fn
        if persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.persistent_workers = bool(persistent_workers)
        self._runtime: Optional[_core.Loader] = None
        self._persistent_epoch = 0
        self.shard = resolve_shard(shard)
        self.shard_drop_last = bool(shard_drop_last)
        self.share = check_share(share)
        replacements_for(on_worker_death)  # checked now, not at the first epoch
        self.on_worker_death = on_worker_death
        # The epochs' orders, their entropy, the length per rank and the checkpointed position.
        self._plan = EpochPlan(dataset, self.batch_size, shuffle=self.shuffle, seed=seed, shard=self.shard,
                               shard_drop_last=self.shard_drop_last, drop_last=self.drop_last)
        self._epoch_cell = EpochCell()  # read by persistent workers (their per-sample seeds)

    def __len__(self) -> int:
        return len(self._plan)

    def __iter__(self) -> Iterator[Any]:
        position = self._plan.begin()
        order, worker_seed = self._plan.order(position.epoch, position.resplits)
        order = order[position.yielded * self.batch_size:]  # resuming: the batches already handed out
        return Progress(self._epoch_iterator(order, worker_seed, position.epoch), position)

    def _epoch_iterator(self, order: np.ndarray, worker_seed: int, epoch: int) -> Iterator[Any]:
        if len(order) == 0:
            return iter(())
        if self.num_workers == 0:
            return _InProcessIterator(self, order, worker_seed, self._batch_seeds(epoch))
        decode = batch_decoder(BatchReader())
        self._epoch_cell.set(epoch)
        if not self.persistent_workers:
            return EpochIterator(self._start_workers(order, worker_seed), decode, owns=True, stats=self._stats_book())
        self._runtime, _ = reset_or_restart(
            self._runtime, lambda kept: kept.reset(order=order, drop_last=self.drop_last),
            lambda: self._start_workers(order, worker_seed), close=self.close)
        self._persistent_epoch += 1
        return EpochIterator(self._runtime, decode, owns=False, owner=self, epoch=self._persistent_epoch,
                             stats=self._stats_book())

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: the epoch and the batches of it handed out (JSON-able, versioned).

        Taken mid-epoch, a loader given it resumes after the last batch handed out; taken
        after an epoch ended (or before any), at the start of the next epoch."""
        return self._plan.state(_FORMAT, {**self._state_settings(), **self._plan.shard_field()},
                                exact_mid_epoch=self.in_order or self.num_workers == 0)

    def load_state_dict(self, state: Any) -> None:
        """Makes the next ``iter()`` yield what the loader that saved `state` would have yielded next
        (any num_workers; the dataset, batch size, shuffle and seed must be the same).

        With a shard, `state` may come from another world size or rank (elastic resume,
        docs/distributed.md): one rank's state when the ranks advanced in lock step, else the list
        of every old rank's state; the rest of the epoch is re-split over this loader's world."""
        self._plan.load(state, _FORMAT, self._state_settings)

    def _state_settings(self) -> dict[str, Any]:
        return dict(seed=self._plan.entropy, samples=len(self.dataset), batch_size=self.batch_size,
                    shuffle=self.shuffle, drop_last=self.drop_last, shard_drop_last=self.shard_drop_last,
                    **dataset_key(self.dataset))

    def _batch_seeds(self, epoch: Any) -> Optional[BatchSeeds]:
        """With a seed, the generators reseeded before each batch from (seed, epoch, its indices), so
        draws do not depend on the worker count or a resume (~10 us a batch); without one, the
        workers' per-worker seeds only."""
        return BatchSeeds(self._plan.entropy, epoch, torch_imported()) if self.seed is not None else None

    def _start_workers(self, order: np.ndarray, seed: int) -> _core.Loader:
        auto = self.num_workers == "auto"
        # "auto": the next epoch starts on the processes the last one ended on (0: the cores idle now).
        spec = StartSpec(num_workers=0 if auto else self.num_workers, adaptive=auto,
                         processes=self._stats_book().processes_at_end if auto else 0, batch_capacity=self.batch_size,
                         max_batch_bytes=self.max_batch_bytes, prefetch_factor=self.prefetch_factor,
                         in_order=self.in_order, timeout=self.timeout, max_threads=self.max_threads,
                         budget_policy=self.budget_policy,
                         max_replacements=replacements_for(self.on_worker_death))
        body = partial(run_worker, dataset=share_for_workers(self.dataset, self.share, not spec.spawns),
                       transport=ArrayBatches(self.batch_size),
                       setup=partial(_setup_worker, base_seed=seed, worker_init_fn=self.worker_init_fn),
                       seed_batch=self._batch_seeds(self._epoch_cell))
        return start(spec, body, order=order, drop_last=self.drop_last, stacklevel=3)

    def close(self) -> None:
        """Stops persistent workers now (they also stop when the loader is dropped: the runtime Loader closes
        itself when its last reference goes)."""
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    def thread_budget(self) -> _core.ThreadBudget:
        """The budget this loader's workers are checked against, read now."""
        return _core.ThreadBudget(max_threads=self.max_threads)


class ArrayBatches:
    """spindle.DataLoader's transport: batches of fixed-structure samples, written
    field by field into the slot (zero-copy for the consumer). A batch whose samples
    differ in structure, shape or dtype fails with SampleStructureError naming the sample."""

    def __init__(self, capacity: int) -> None:
        self._writer = SlotWriter(capacity)
        self._reader = BatchReader()

    def read(self, ctx: Any, item: Any, dataset: Any) -> Optional[tuple[list[Any], list[int]]]:
        """The item's samples, written as read where they can be (SlotWriter.read): None if
        the batch is in the slot, else (samples, indices) for write."""
        return self._writer.read(ctx, item, dataset)

    def write(self, ctx: Any, item: Any, samples: list[Any], indices: list[int]) -> None:
        columns = self._writer.write(ctx, item, samples, indices)
        if columns is not None:
            # More fields (or a larger structure) than a slot's descriptor holds: the same
            # numpy batch, built here and pickled into the slot (a copy, not zero-copy).
            ctx.put_bytes(item, pickle.dumps(stacked(columns, self._reader), protocol=pickle.HIGHEST_PROTOCOL))


def _setup_worker(worker_id: int, num_workers: int, *, base_seed: int,
                  worker_init_fn: Optional[Callable[[int], None]]) -> None:
    seed_worker(base_seed + worker_id)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


class _InProcessIterator:
    """num_workers=0: the same layout and checks, in the calling process."""

    def __init__(self, loader: DataLoader, order: np.ndarray, seed: int,
                 seed_batch: Optional[Callable[[list[int]], None]]) -> None:
        self._dataset = loader.dataset
        self._seed_batch = seed_batch
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
        if self._seed_batch is not None:
            self._seed_batch(indices)
        return collate_local([self._dataset[index] for index in indices], indices, self._reader)
