"""spindle.torch's engine: one torch loader's epochs on spindle's workers. torch's loader holds the
arguments, the samplers and the generator; the engine draws from them as torch's iterator does
(_batches), starts or reuses the runtime, and hands out the epoch's iterator."""

from __future__ import annotations

import pickle
import warnings
from functools import partial
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import IterableDataset, IterDataPipe, MapDataPipe
from torch.utils.data import default_collate
from torch.utils.data.distributed import DistributedSampler

from .. import _core
from .._runtime.epoch import EpochIterator
from .._runtime.layout import BatchReader
from .._runtime.persistent import reset_or_restart
from .._runtime.sharing import share_for_workers
from .._runtime.start import StartSpec, replacements_for, start as start_runtime, start_method_of
from .._runtime.stats import HasStats
from .._runtime.worker import run_stream_worker, run_worker
from ..errors import WorkerDiedError
from . import _compat
from ._batches import Batches, ByPosition, Feed, index_iter
from ._transport import CollatedBatches, load_pickled
from ._worker_setup import reseed_stream, setup_torch_worker
from ._workers import WorkerProcess, torch_died


class Engine(HasStats):
    """spindle's workers for one torch loader, ``self._torch``: a spindle.torch.DataLoader itself,
    or (after :func:`install`) any other ``torch.utils.data.DataLoader`` whose multi-process
    iterator spindle serves. torch's loader holds the arguments, the samplers and the generator;
    this holds the persistent runtime and the draws that persistent workers keep."""

    _shard: Any = None
    _share: str = "auto"  # share_for_workers: large plain attributes of the dataset go to shared memory

    def _init_engine(self) -> None:
        self._epochs_begun = 0  # iter() calls: the epoch number of a shard's DistributedSampler
        self._runtime: Optional[_core.Loader] = None
        self._close_on_drop: Optional[_core.CloseOnDrop] = None
        self._capacity = 0
        self._base_seed = 0
        self._stream_epochs = 0
        self._runtime_epoch = 0
        self._persistent_epoch = 0
        self._keyed = False  # the persistent workers look indices up in an epoch's table (ByPosition)
        self._fed = False  # the persistent runtime takes its batches as they are drawn (Feed)

    @property
    def _torch(self) -> Any:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """With a shard: the epoch the next iteration shuffles for (DistributedSampler.set_epoch)."""
        self._epochs_begun = int(epoch)

    def _begin_epoch(self) -> None:
        """Hook at each iter(), before the sampler is iterated: a shard's sampler gets its epoch, unless
        a framework set it (sampler.set_epoch, as Lightning does each epoch): then that one wins."""
        if self._shard is not None:
            sampler = self._torch.sampler
            if not sampler.told:
                DistributedSampler.set_epoch(sampler, self._epochs_begun)
            sampler.told = False
            self._epochs_begun = sampler.epoch
        self._epochs_begun += 1

    def _draws_as_persistent(self, reuse: bool) -> bool:
        """Hook: whether this epoch draws as torch's persistent workers' later epochs (no new base seed)."""
        return reuse

    def _first_epoch_sampler(self, sampler_iter: Any) -> Any:
        """Hook: the sampler iterator of an epoch that starts its workers (torchdata's iterates its sampler
        again there, and its stateful RandomSampler draws its permutation at iter())."""
        return sampler_iter

    def _worker_dataset(self, dataset: Any, spawns: bool) -> Any:
        """Hook: the dataset as the workers see it (StatefulDataLoader reseeds per sample)."""
        return dataset

    def _resume_batches(self, batches: "Batches", base_seed: int) -> tuple["Batches", int]:
        """Hook: the epoch's batches still to load and the workers' base seed (a resumed epoch skips some)."""
        return batches, base_seed

    def _wrap(self, it: Any) -> Any:
        """Hook: the epoch's iterator as handed out (StatefulDataLoader counts its batches)."""
        return it

    def _spindle_epoch(self) -> Any:
        """One epoch on spindle's workers (num_workers > 0)."""
        self._begin_epoch()
        return self._wrap(self._iter_epoch())

    def _iter_epoch(self) -> Any:
        loader = self._torch
        if loader.pin_memory and not torch.cuda.is_available():
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                          "then device pinned memory won't be used.", stacklevel=2)
        if isinstance(loader.dataset, IterableDataset):
            return self._iter_streams()
        # The same draws from `generator`, in the same order, as torch's
        # iterator: persistent workers keep the base seed of their first epoch.
        sampler_iter = index_iter(_compat.index_sampler(loader))
        reuse = self._torch.persistent_workers and self._runtime is not None
        if self._draws_as_persistent(reuse):
            base_seed = self._base_seed
        else:
            base_seed = self._base_seed = _compat.draw_seed(loader.generator)
            sampler_iter = self._first_epoch_sampler(sampler_iter)
        feed = None
        if self._draws_lazily():
            # torch draws prefetch_factor * num_workers batches now, then one for each batch it
            # hands out: an epoch left early leaves the sampler (and its generator) where torch's does.
            batches, feed = Feed.first(loader, sampler_iter)
        else:
            batches = Batches.read(loader, sampler_iter)
        batches, base_seed = self._resume_batches(batches, base_seed)
        if not len(batches):
            return iter(())
        dataset = shared = for_workers(loader.dataset, self._share, not self._spawns())
        order, starts = batches.order, batches.starts
        if order is None:
            # A sampler yielding lists, slices, strings... (bulk loading with
            # batch_size=None): the runtime carries positions, the worker looks
            # each one up in this epoch's table. Workers keep the table they
            # were started with, so this epoch gets its own workers.
            order = np.arange(len(batches.keys), dtype=np.int64)
            dataset = ByPosition(shared, batches.keys)
            if reuse:
                self.close()
                reuse = False
        capacity = max(batches.capacity, feed.capacity if feed is not None else 0)
        fed = feed is not None
        if reuse and (capacity > self._capacity or self._keyed or fed != self._fed):
            # outgrown slots, last epoch's table, or a runtime fed otherwise
            self.close()
            reuse = False
        setup = partial(setup_torch_worker, base_seed=base_seed, dataset=shared,
                        worker_init_fn=loader.worker_init_fn)
        if not reuse:
            self._capacity = capacity
            self._fed = fed
        decode = self._decoder()

        def start() -> _core.Loader:
            transport = CollatedBatches(self._collate(), self._capacity, self._zero_copy(),
                                        batched_fetch=_compat.auto_collation(loader))
            workers_see = self._worker_dataset(dataset, self._spawns())
            # Batches go to workers as torch sends them: in order, batch k to worker
            # k mod N; out of order, to the next worker in turn with room (a slow
            # worker is skipped, and the batches it has wait for it).
            # Under a short budget the num_workers asked stay the batches' turns (logical workers).
            spec = StartSpec(num_workers=loader.num_workers, batch_capacity=self._capacity, assign_in_turn=True,
                             logical_workers=True, fed=fed, prefetch_factor=loader.prefetch_factor,
                             in_order=_compat.in_order(loader), timeout=loader.timeout, start_method=self._start_method(),
                             pickle_warning=_compat.pickle_warning() if self._spawns() else None,
                             max_replacements=replacements_for(getattr(loader, "on_worker_death", "raise")))
            body = partial(run_worker, dataset=workers_see, transport=transport, setup=setup)
            # The warnings point at the user's iter(loader).
            runtime = start_runtime(spec, body, order=order, starts=starts, stacklevel=6)
            if self._torch.persistent_workers:
                self._keep(runtime)
                self._keyed = (isinstance(workers_see, ByPosition)
                               or isinstance(getattr(workers_see, "dataset", None), ByPosition))
            return runtime

        runtime, _ = reset_or_restart(self._runtime if self._torch.persistent_workers else None,
                                      lambda kept: kept.reset(order=order, starts=starts), start,
                                      close=self.close, failures=(Exception,))
        after_batch = feed.bind(runtime) if feed is not None else None
        if not self._torch.persistent_workers:
            return _TorchIterator(runtime, decode, loader, owns=True, stats=self._stats_book(), after_batch=after_batch)
        self._persistent_epoch += 1
        return _TorchIterator(runtime, decode, loader, owns=False, owner=self, epoch=self._persistent_epoch,
                              stats=self._stats_book(), after_batch=after_batch)

    def _draws_lazily(self) -> bool:
        """Hook: whether this epoch draws its sampler as torch's iterator does, a batch at a time
        (StatefulDataLoader replays an epoch's draws in one go instead)."""
        return True

    def _collate(self) -> Callable[[list], Any]:
        loader = self._torch
        return loader.collate_fn if _compat.auto_collation(loader) else partial(_convert_one, loader.collate_fn)

    def _zero_copy(self) -> bool:
        # torch's own default_collate, named or not (torch puts it in collate_fn when none is
        # given): the array path, which builds exactly what it would have built.
        return _compat.auto_collation(self._torch) and self._torch.collate_fn is default_collate

    def _start_method(self) -> str:
        """The loader's multiprocessing_context, or else the start method set globally."""
        return start_method_of(self._torch.multiprocessing_context)

    def _spawns(self) -> bool:
        """Workers are new interpreters ('spawn' or 'forkserver')."""
        return self._start_method() != "fork"

    def _decoder(self) -> Callable[[Any], Any]:
        """Batch -> batch: tensors over the slot (or the batch pickled in parts, its tensors over the
        slot too), pinned when asked and possible."""
        arrays = BatchReader(convert=torch.from_numpy, tuples_as_lists=True)

        def decode(lease: Any) -> Any:
            return arrays.read(lease) if lease.kind == "arrays" else load_pickled(lease)

        if self._torch.pin_memory and torch.cuda.is_available():
            return lambda lease: _compat.pin_memory(decode(lease))
        return decode

    def _iter_streams(self) -> Any:
        """IterableDataset: each worker iterates its own copy; batches come round-robin from the
        workers whose streams have not ended, as torch's do."""
        loader = self._torch
        # torch's draws from `generator`, in its order: an IterDataPipe's shared
        # seed (every worker shuffles alike, then shards), then the base seed;
        # a new iterator then draws one more shared seed its workers never see.
        # With persistent workers torch draws the base seed once, for the first
        # epoch, and a shared seed per epoch. Persistent stream workers stay
        # (Loader.reset_streams): each calls iter(dataset) again, after a
        # DataPipe is re-seeded with the epoch's shared seed, as torch's
        # _ResumeIteration does.
        shared_seed = _compat.draw_seed(loader.generator) if isinstance(loader.dataset, IterDataPipe) else None
        if self._torch.persistent_workers and self._stream_epochs > 0:
            base_seed = self._base_seed
        else:
            base_seed = self._base_seed = _compat.draw_seed(loader.generator)
            if shared_seed is not None:
                _compat.draw_seed(loader.generator)
        self._stream_epochs += 1
        stream_len = _compat.stream_len(loader)

        def start() -> _core.Loader:
            n = loader.batch_size if _compat.auto_collation(loader) else 1
            shared = for_workers(loader.dataset, self._share, not self._spawns())
            setup = partial(setup_torch_worker, base_seed=base_seed, dataset=shared,
                            worker_init_fn=loader.worker_init_fn, shared_seed=shared_seed)
            transport = CollatedBatches(self._collate(), n, self._zero_copy())
            # Under a short budget the num_workers asked stay the streams (logical workers); not for a
            # DataPipe, whose sharding is set in place on the one dataset object a process iterates.
            logical = not isinstance(loader.dataset, IterDataPipe)
            spec = StartSpec(num_workers=loader.num_workers, round_robin=True, logical_workers=logical,
                             batch_capacity=n, prefetch_factor=loader.prefetch_factor, in_order=_compat.in_order(loader),
                             timeout=loader.timeout, start_method=self._start_method(),
                             pickle_warning=_compat.pickle_warning() if self._spawns() else None,
                             # asked for, a stream's loss is not replaced: the core's error says why
                             max_replacements=replacements_for(getattr(loader, "on_worker_death", "raise")))
            body = partial(run_stream_worker, dataset=shared, transport=transport, setup=setup,
                           batch_size=n, drop_last=loader.drop_last,
                           restart=partial(reseed_stream, dataset=shared))
            runtime = start_runtime(spec, body, order=np.empty(0, np.int64), stacklevel=7)
            if self._torch.persistent_workers:
                self._keep(runtime)
            return runtime

        runtime, _ = reset_or_restart(
            self._runtime if self._torch.persistent_workers else None,
            lambda kept: kept.reset_streams(messages=[pickle.dumps(shared_seed)] * kept.num_logical_workers), start,
            close=self.close, failures=(Exception,))
        decode = self._decoder()
        if not self._torch.persistent_workers:
            return _TorchIterator(runtime, decode, loader, owns=True, stream_len=stream_len,
                                  stats=self._stats_book())
        self._persistent_epoch += 1
        return _TorchIterator(runtime, decode, loader, owns=False, owner=self, epoch=self._persistent_epoch,
                              stream_len=stream_len, stats=self._stats_book())

    def _keep(self, runtime: _core.Loader) -> None:
        """Keeps persistent workers; dropping this loader stops them, though the iterators'
        ``_workers`` views may still hold the runtime (to read how the workers ended)."""
        self._runtime, self._close_on_drop = runtime, _core.CloseOnDrop(runtime)

    def close(self) -> None:
        """Stops persistent workers now."""
        if self._runtime is not None:
            self._runtime.close()
        self._runtime = self._close_on_drop = None


class _TorchIterator(EpochIterator):
    """One epoch, with torch's words for a dead worker, and torch's warning when an
    IterableDataset yields more than the ``len(loader)`` read before ``iter()``.

    It keeps the loader (and so its dataset, sampler and collate_fn) alive while it is iterated,
    as torch's iterator does: ``for b in DataLoader(MyDataset(), ...)`` holds no other reference,
    and a dataset's finalizers (a named semaphore's unlink) must not run while spawned workers
    are still unpickling it."""

    def __init__(self, runtime: _core.Loader, decode: Callable[[Any], Any], loader: Any, *,
                 stream_len: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(runtime, decode, **kwargs)
        self._loader = loader
        self._stream_len = stream_len
        self._dataset = loader.dataset
        self._num_yielded = 0
        self._pids = runtime.worker_pids

    @property
    def _workers(self) -> list[WorkerProcess]:
        """The workers as torch's iterator lists them (``multiprocessing.Process``-like views)."""
        return [WorkerProcess(self._runtime, w, pid) for w, pid in enumerate(self._pids)]

    def __next__(self) -> Any:
        try:
            data = super().__next__()
        except WorkerDiedError as died:
            raise torch_died(died) from None
        self._num_yielded += 1
        if self._stream_len is not None and self._num_yielded > self._stream_len:
            warnings.warn(
                f"Length of IterableDataset {self._dataset} was reported to be {self._stream_len}"
                f"(when accessing len(dataloader)), but {self._num_yielded} samples have been fetched. "
                "For multiprocessing data-loading, this could be caused by not properly configuring the "
                "IterableDataset replica at each worker. Please see "
                "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.",
                stacklevel=2)
        return data


def for_workers(dataset: Any, share: str, forked: bool) -> Any:
    """The dataset the workers get (share="auto": its large plain attributes shared); a DataPipe graph
    as it is (torch's graph functions find its nodes by traversal, which a copy would split)."""
    if isinstance(dataset, (IterDataPipe, MapDataPipe)):
        return dataset
    return share_for_workers(dataset, share, forked)


def _convert_one(convert: Callable[[Any], Any], samples: list[Any]) -> Any:
    return convert(samples[0])  # batch_size=None: one sample per "batch", no collation
