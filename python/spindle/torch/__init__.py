"""spindle.torch.DataLoader: torch.utils.data.DataLoader on spindle's workers.

Change one import line::

    from spindle.torch import DataLoader   # was: from torch.utils.data import DataLoader

or, for loaders built by code you do not own (a framework), ``spindle.torch.install()``
(or ``SPINDLE_TORCH=1`` in the environment): every torch DataLoader with workers then
runs on spindle's, through torch's multi-process iterator.

The class is a subclass of torch's: its constructor validates the arguments and builds
the samplers (same exception types and messages), and ``len()``, the generator's draws
and the batch order are torch's. What changes is where batches are made and how they
travel: spindle's forked (or spawned), single-threaded workers write them into shared
memory, and you get tensors that are views of it (writable, valid for as long as you keep
them). Two transports, chosen by the worker for each batch:

- **arrays** (torch's default_collate, samples of tensors, numpy arrays and numbers of
  one shape within the batch): each field is written straight into its block of a slot
  and arrives as ``torch.from_numpy`` of it, as ``default_collate`` would have built it
  (dicts, namedtuples; tuples become lists, like default_collate).
- **pickled in parts** (any other collate_fn, strings or other objects, ragged samples,
  ``batch_size=None``): the worker runs the collate function and pickles its output with
  protocol 5, every large array and CPU tensor an out-of-band buffer copied once into the
  slot; the consumer gets them back as views of it.

Dataset code runs only in the workers, as in torch: nothing is read up front to size the
ring (each batch carries its layout; slots grow to fit), so an error in ``dataset[i]`` or
``worker_init_fn`` surfaces at ``next()``.

Differences from torch are listed in docs/torch_dropin.md.
"""

from __future__ import annotations

import numbers
import operator
import pickle
import random
import warnings
import weakref
from functools import partial
from typing import Any, Callable, Iterator, Optional, TypeVar

import numpy as np

from .._extras import require_extra

require_extra("torch", ("torch",), "spindle.torch")

import torch  # noqa: E402 - after the check that names the extra
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data import dataloader as _torch_dataloader
from torch.utils.data import BatchSampler, IterableDataset, IterDataPipe, MapDataPipe, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data._utils.collate import default_collate

from .. import _core
from .._runtime.epoch import EpochIterator
from .._runtime.stats import HasStats
from .._runtime.layout import BatchReader
from .._runtime.persistent import reset_or_restart
from .._runtime.sharing import check_share, share_for_workers
from .._runtime.start import StartSpec, start as start_runtime, start_method_of
from .._runtime.worker import run_stream_worker, run_worker
from .._state.sharding import resolve_shard
from ..errors import WorkerDiedError
from ._transport import CollatedBatches, load_pickled, stack_into_slot
from ._workers import WorkerProcess, torch_died

__all__ = ["DataLoader", "StatefulDataLoader", "install", "uninstall", "installed"]

_T_co = TypeVar("_T_co", covariant=True)


class _Engine(HasStats):
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
        self._keyed = False  # the persistent workers look indices up in an epoch's table (_ByPosition)
        self._fed = False  # the persistent runtime takes its batches as they are drawn (_Feed)

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

    def _resume_batches(self, batches: "_Batches", base_seed: int) -> tuple["_Batches", int]:
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
        sampler_iter = _index_iter(loader._index_sampler)
        reuse = self._torch.persistent_workers and self._runtime is not None
        if self._draws_as_persistent(reuse):
            base_seed = self._base_seed
        else:
            base_seed = self._base_seed = _draw(loader.generator)
            sampler_iter = self._first_epoch_sampler(sampler_iter)
        feed = None
        if self._draws_lazily():
            # torch draws prefetch_factor * num_workers batches now, then one for each batch it
            # hands out: an epoch left early leaves the sampler (and its generator) where torch's does.
            batches, feed = _Feed.first(loader, sampler_iter)
        else:
            batches = _Batches.read(loader, sampler_iter)
        batches, base_seed = self._resume_batches(batches, base_seed)
        if not len(batches):
            return iter(())
        dataset = shared = _for_workers(loader.dataset, self._share, not self._spawns())
        order, starts = batches.order, batches.starts
        if order is None:
            # A sampler yielding lists, slices, strings... (bulk loading with
            # batch_size=None): the runtime carries positions, the worker looks
            # each one up in this epoch's table. Workers keep the table they
            # were started with, so this epoch gets its own workers.
            order = np.arange(len(batches.keys), dtype=np.int64)
            dataset = _ByPosition(shared, batches.keys)
            if reuse:
                self.close()
                reuse = False
        capacity = max(batches.capacity, feed.capacity if feed is not None else 0)
        fed = feed is not None
        if reuse and (capacity > self._capacity or self._keyed or fed != self._fed):
            # outgrown slots, last epoch's table, or a runtime fed otherwise
            self.close()
            reuse = False
        setup = partial(_setup_torch_worker, base_seed=base_seed, dataset=shared,
                        worker_init_fn=loader.worker_init_fn)
        if not reuse:
            self._capacity = capacity
            self._fed = fed
        decode = self._decoder()

        def start() -> _core.Loader:
            transport = CollatedBatches(self._collate(), self._capacity, self._zero_copy(),
                                        batched_fetch=loader._auto_collation)
            workers_see = self._worker_dataset(dataset, self._spawns())
            # Batches go to workers as torch sends them: in order, batch k to worker
            # k mod N; out of order, to the next worker in turn with room (a slow
            # worker is skipped, and the batches it has wait for it).
            # Under a short budget the num_workers asked stay the batches' turns (logical workers).
            spec = StartSpec(num_workers=loader.num_workers, batch_capacity=self._capacity, assign_in_turn=True,
                             logical_workers=True, fed=fed, prefetch_factor=loader.prefetch_factor,
                             in_order=loader.in_order, timeout=loader.timeout, start_method=self._start_method())
            body = partial(run_worker, dataset=workers_see, transport=transport, setup=setup)
            # The warnings point at the user's iter(loader).
            runtime = start_runtime(spec, body, order=order, starts=starts, stacklevel=6)
            if self._torch.persistent_workers:
                self._keep(runtime)
                self._keyed = (isinstance(workers_see, _ByPosition)
                               or isinstance(getattr(workers_see, "dataset", None), _ByPosition))
            return runtime

        runtime, _ = reset_or_restart(self._runtime if self._torch.persistent_workers else None,
                                      lambda kept: kept.reset(order=order, starts=starts), start,
                                      close=self.close, failures=(Exception,))
        after_batch = feed.bind(runtime) if feed is not None else None
        if not self._torch.persistent_workers:
            return _TorchIterator(runtime, decode, owns=True, stats=self._stats_book(), after_batch=after_batch)
        self._persistent_epoch += 1
        return _TorchIterator(runtime, decode, owns=False, owner=self, epoch=self._persistent_epoch,
                              stats=self._stats_book(), after_batch=after_batch)

    def _draws_lazily(self) -> bool:
        """Hook: whether this epoch draws its sampler as torch's iterator does, a batch at a time
        (StatefulDataLoader replays an epoch's draws in one go instead)."""
        return True

    def _collate(self) -> Callable[[list], Any]:
        loader = self._torch
        return loader.collate_fn if loader._auto_collation else partial(_convert_one, loader.collate_fn)

    def _zero_copy(self) -> bool:
        # torch's own default_collate, named or not (torch puts it in collate_fn when none is
        # given): the array path, which builds exactly what it would have built.
        return self._torch._auto_collation and self._torch.collate_fn is default_collate

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
            from torch.utils.data._utils.pin_memory import pin_memory
            return lambda lease: pin_memory(decode(lease))
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
        shared_seed = _draw(loader.generator) if isinstance(loader.dataset, IterDataPipe) else None
        if self._torch.persistent_workers and self._stream_epochs > 0:
            base_seed = self._base_seed
        else:
            base_seed = self._base_seed = _draw(loader.generator)
            if shared_seed is not None:
                _draw(loader.generator)
        self._stream_epochs += 1
        stream_len = loader._IterableDataset_len_called

        def start() -> _core.Loader:
            n = loader.batch_size if loader._auto_collation else 1
            shared = _for_workers(loader.dataset, self._share, not self._spawns())
            setup = partial(_setup_torch_worker, base_seed=base_seed, dataset=shared,
                            worker_init_fn=loader.worker_init_fn, shared_seed=shared_seed)
            transport = CollatedBatches(self._collate(), n, self._zero_copy())
            # Under a short budget the num_workers asked stay the streams (logical workers); not for a
            # DataPipe, whose sharding is set in place on the one dataset object a process iterates.
            logical = not isinstance(loader.dataset, IterDataPipe)
            spec = StartSpec(num_workers=loader.num_workers, round_robin=True, logical_workers=logical,
                             batch_capacity=n, prefetch_factor=loader.prefetch_factor, in_order=loader.in_order,
                             timeout=loader.timeout, start_method=self._start_method())
            body = partial(run_stream_worker, dataset=shared, transport=transport, setup=setup,
                           batch_size=n, drop_last=loader.drop_last,
                           restart=partial(_reseed_stream, dataset=shared))
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
            return _TorchIterator(runtime, decode, owns=True, stream_len=stream_len, dataset=loader.dataset,
                                  stats=self._stats_book())
        self._persistent_epoch += 1
        return _TorchIterator(runtime, decode, owns=False, owner=self, epoch=self._persistent_epoch,
                              stream_len=stream_len, dataset=loader.dataset, stats=self._stats_book())

    def _keep(self, runtime: _core.Loader) -> None:
        """Keeps persistent workers; dropping this loader stops them, though the iterators'
        ``_workers`` views may still hold the runtime (to read how the workers ended)."""
        self._runtime, self._close_on_drop = runtime, _core.CloseOnDrop(runtime)

    def close(self) -> None:
        """Stops persistent workers now."""
        if self._runtime is not None:
            self._runtime.close()
        self._runtime = self._close_on_drop = None


class DataLoader(_Engine, _TorchDataLoader[_T_co]):
    """``torch.utils.data.DataLoader`` with spindle's workers: a subclass, so every ``isinstance``
    check of a framework passes, with torch's signature, defaults and attributes, so a framework
    that re-creates it from them (Lightning's distributed sampler injection) gets a spindle
    loader back.

    Generic like torch's (``DataLoader[list[torch.Tensor]]`` in annotations).

    Beyond torch's arguments, keyword-only and off by default (then nothing
    differs from torch): ``shard="auto"`` or ``shard=(rank, world_size)``
    loads this rank's part of a map-style dataset, exactly as
    ``sampler=DistributedSampler(dataset, world_size, rank, shuffle=shuffle,
    seed=shard_seed, drop_last=shard_drop_last)`` would, with ``set_epoch``
    called for each epoch (docs/distributed.md). These are kept as attributes
    of the same names, so a re-creation from the attributes keeps them.

    ``share="auto"`` (keyword-only too, but on by default; ``"off"`` gives the
    workers the dataset as torch does): when workers start, the dataset's large
    attributes made of plain values (lists, tuples, dicts of str, bytes,
    numbers, None), also those of wrapped datasets (``Subset``,
    ``ConcatDataset``), go to shared memory once (:func:`spindle.shared`), so
    the workers read them without each copying them; your dataset object is
    not changed (the workers get a shallow copy). One INFO line on logger
    "spindle" per conversion (docs/shared_memory.md)."""

    _peer: Any = _TorchDataLoader  # the class whose __init__ validates the arguments and builds the samplers

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Optional[Callable[[list], Any]] = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Optional[Callable[[int], None]] = None, multiprocessing_context: Any = None,
                 generator: Optional[torch.Generator] = None, *, prefetch_factor: Optional[int] = None,
                 persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True,
                 shard: Any = None, shard_drop_last: bool = False, shard_seed: int = 0, share: str = "auto",
                 **peer_options: Any) -> None:
        self._shard = resolve_shard(shard)
        self._share = check_share(share)
        if self._shard is not None:
            sampler, shuffle = _shard_sampler(self._shard, dataset, shuffle, sampler, batch_sampler,
                                              shard_seed, shard_drop_last), None
        # torch validates every argument and builds the samplers; its workers never start.
        self._peer.__init__(
            self, dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
            drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order, **peer_options)
        _check_counts(self)
        self.shard, self.shard_drop_last, self.shard_seed, self.share = shard, shard_drop_last, shard_seed, share
        self._init_engine()
        _adopt(self, sampler is not None, batch_sampler is not None)

    @property
    def _torch(self) -> Any:
        return self

    def __iter__(self) -> Any:
        if self.num_workers == 0:
            self._begin_epoch()  # a shard's sampler gets its epoch here too
            return self._peer.__iter__(self)  # single process: torch's own loop is what spindle would do
        return self._spindle_epoch()

    def _get_iterator(self) -> Any:
        # What torch's __iter__ would build; spindle's __iter__ above never calls it.
        if self.num_workers == 0:
            return self._peer._get_iterator(self)
        return self._spindle_epoch()


class _Served(_Engine):
    """The engine of a torch loader that is not a spindle.torch.DataLoader (after install())."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._init_engine()

    @property
    def _torch(self) -> Any:
        return self._loader


# torch's own iterator, also when SPINDLE_TORCH=1 put a stand-in in its place first (_autoinstall).
_TorchMultiProcessingIter = getattr(_torch_dataloader._MultiProcessingDataLoaderIter, "_torch_iterator",
                                    _torch_dataloader._MultiProcessingDataLoaderIter)


class _InstalledIterator:
    """What torch's DataLoader builds for ``num_workers > 0`` once :func:`install` ran (torch's
    ``_get_iterator`` names ``_MultiProcessingDataLoaderIter``): an epoch on spindle's workers,
    or torch's own iterator, with one warning naming why, for a loader spindle cannot serve.
    torch keeps it across epochs for persistent workers and calls ``_reset`` at each new one."""

    def __new__(cls, loader: Any) -> Any:
        if not _hook.everywhere and not _adopted(loader):
            return _TorchMultiProcessingIter(loader)
        reason = _cannot_serve(loader)
        if reason is not None:
            if reason not in _warned_fallbacks:
                _warned_fallbacks.add(reason)
                warnings.warn(f"spindle.torch.install(): this DataLoader runs on torch's workers: {reason}",
                              stacklevel=3)
            return _TorchMultiProcessingIter(loader)
        return super().__new__(cls)

    def __init__(self, loader: Any) -> None:
        self._engine = _Served(loader)
        self._epoch = self._engine._spindle_epoch()

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._epoch = self._engine._spindle_epoch()

    def __iter__(self) -> "_InstalledIterator":
        return self

    def __next__(self) -> Any:
        return next(self._epoch)

    def __len__(self) -> int:
        return len(self._engine._torch)

    @property
    def _workers(self) -> Any:
        return getattr(self._epoch, "_workers", [])

    def _shutdown_workers(self) -> None:
        close = getattr(self._epoch, "close", None)
        if close is not None:
            close()
        self._engine.close()

    def stats(self) -> dict[str, Any]:
        """The loader's statistics on spindle's workers (as spindle.torch.DataLoader.stats())."""
        return self._engine.stats()


_warned_fallbacks: set[str] = set()


def _cannot_serve(loader: Any) -> Optional[str]:
    """Why spindle's workers cannot stand in for torch's for `loader`, or None."""
    import torch.distributed as dist

    if isinstance(loader.dataset, IterDataPipe) and dist.is_available() and dist.is_initialized():
        return ("an IterDataPipe in a distributed job shares its shuffle seed over the process group "
                "(torch's _share_dist_seed), which spindle's iterator does not do")
    return None


class _Hook:
    """Whom the iterator in torch's place serves: every torch loader (install()), or only those a
    framework rebuilt from a spindle.torch.DataLoader's attributes (`adopted`: the samplers torch
    made for spindle loaders, and their datasets)."""

    everywhere = False
    adopted: dict[int, Any] = {}  # id(object) -> a weak reference to it, or the object itself


_hook = _Hook()


def _remember(thing: Any) -> None:
    key = id(thing)
    if thing is None or key in _hook.adopted:
        return
    try:
        _hook.adopted[key] = weakref.ref(thing, lambda _, key=key, table=_hook.adopted: table.pop(key, None))
    except TypeError:  # a list, a tuple: kept while this process lives
        _hook.adopted[key] = thing


def _is_remembered(thing: Any) -> bool:
    held = _hook.adopted.get(id(thing))
    return held is not None and (held() if isinstance(held, weakref.ref) else held) is thing


def _adopt(loader: "DataLoader", sampler_given: bool, batch_sampler_given: bool) -> None:
    """A loader that a framework rebuilds from `loader`'s attributes stays on spindle's workers: accelerate's
    prepare() makes its own torch DataLoader whose batch sampler wraps this one's (BatchSamplerShard,
    SkipBatchSampler), or whose dataset wraps this one's (IterableDatasetShard). The samplers torch made
    for this loader (never a user's object, which another loader may share) and the dataset are
    remembered, and torch's iterator is replaced; it serves every other loader as torch's own."""
    if not batch_sampler_given:
        _remember(loader.batch_sampler)
        if not sampler_given:
            _remember(loader.sampler)
    _remember(loader.dataset)
    _torch_dataloader._MultiProcessingDataLoaderIter = _InstalledIterator


def _adopted(loader: Any) -> bool:
    """`loader` (a torch loader that is not spindle's) was rebuilt from a spindle loader: its samplers
    lead to one a spindle loader's torch made (through `batch_sampler` and `sampler` attributes, as
    accelerate's wrappers hold them), or its dataset is a stream wrapping a spindle loader's."""
    frontier = [loader.batch_sampler, loader.sampler]
    for _ in range(3):
        if any(_is_remembered(s) for s in frontier if s is not None):
            return True
        frontier = [getattr(s, name, None) for s in frontier for name in ("batch_sampler", "sampler")]
    inner = getattr(loader.dataset, "dataset", None) if isinstance(loader.dataset, IterableDataset) else None
    return inner is not None and _is_remembered(inner)


def install() -> None:
    """Every ``torch.utils.data.DataLoader`` in this process with ``num_workers > 0`` runs on
    spindle's workers: torch's own class, the subclasses frameworks define (accelerate's
    ``DataLoaderShard``/``SkipDataLoader``) and the loaders HF's Trainer builds. The hook is
    torch's multi-process iterator (what ``DataLoader._get_iterator`` builds), so arguments,
    samplers, ``len()`` and the batch order stay torch's. ``SPINDLE_TORCH=1`` in the environment
    does the same for a program you do not edit. :func:`uninstall` restores torch's workers.
    Loaders whose class builds its own iterator (torchdata's StatefulDataLoader) are untouched.

    Without it, a loader that a framework rebuilds from a spindle.torch.DataLoader's attributes
    (accelerate's ``prepare()``) already stays on spindle's workers: it runs over a dataset a
    spindle loader was given."""
    _hook.everywhere = True
    _torch_dataloader._MultiProcessingDataLoaderIter = _InstalledIterator


def uninstall() -> None:
    """torch's own workers again for every DataLoader iterated from now on (but those rebuilt from a
    spindle.torch.DataLoader)."""
    _hook.everywhere = False


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _hook.everywhere and _torch_dataloader._MultiProcessingDataLoaderIter is _InstalledIterator


def _check_counts(loader: Any) -> None:
    """What torch's constructor accepts but its iterator then fails on, refused at construction with
    the error torch raises there: a worker count or prefetch factor that is not an integer (2.5)
    makes torch's ``range()`` raise TypeError "'float' object cannot be interpreted as an integer"."""
    operator.index(loader.num_workers)
    if loader.prefetch_factor is not None:
        operator.index(loader.prefetch_factor)


def _shard_sampler(shard: Any, dataset: Any, shuffle: Optional[bool], sampler: Any, batch_sampler: Any,
                   seed: int, drop_last: bool) -> Any:
    """The DistributedSampler that `shard` stands for; refuses what it cannot shard."""
    if isinstance(dataset, IterableDataset):
        raise ValueError("spindle: shard= needs a map-style dataset; an IterableDataset shards itself "
                         "(e.g. with torch.distributed.get_rank() and get_world_size() in its __iter__)")
    if sampler is not None or batch_sampler is not None:
        raise ValueError("spindle: shard= builds the sampler (a DistributedSampler) and cannot be combined with "
                         "sampler= or batch_sampler=; pass your own DistributedSampler as sampler= instead")
    return _ShardSampler(dataset, num_replicas=shard.world_size, rank=shard.rank, shuffle=bool(shuffle),
                         seed=seed, drop_last=drop_last)


class _ShardSampler(DistributedSampler):
    """shard='s DistributedSampler: the loader sets its epoch at each iter() unless someone else
    called set_epoch since the last one (`told`)."""

    told = False

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.told = True


class _TorchIterator(EpochIterator):
    """One epoch, with torch's words for a dead worker, and torch's warning when an
    IterableDataset yields more than the ``len(loader)`` read before ``iter()``."""

    def __init__(self, runtime: _core.Loader, decode: Callable[[Any], Any], *, stream_len: Optional[int] = None,
                 dataset: Any = None, **kwargs: Any) -> None:
        super().__init__(runtime, decode, **kwargs)
        self._stream_len = stream_len
        self._dataset = dataset
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


def _index_iter(index: Any) -> Iterator[Any]:
    """iter(index); for torch's own BatchSampler over its own RandomSampler (without replacement, each
    sample once: shuffle=True) an iterator of the same batches, drawing the same numbers from the same
    generator at the same moments, but keeping the epoch's permutation as one tensor. torch's holds it
    as a list of Python ints in the consumer for the whole epoch (40 bytes a sample: 115 MiB for 3M)."""
    if type(index) is BatchSampler and type(index.sampler) is RandomSampler and not index.sampler.replacement \
            and index.sampler._num_samples is None and type(index.batch_size) is int:
        return _shuffled_batches(index)
    return iter(index)


def _shuffled_batches(index: BatchSampler) -> Iterator[list[int]]:
    """BatchSampler(RandomSampler(...)).__iter__ of torch 2.x, the permutation kept as a tensor
    (test_torch_dropin.py checks batches and generator states against torch's at every step)."""
    sampler, batch_size, drop_last = index.sampler, index.batch_size, index.drop_last
    n = len(sampler.data_source)
    if n == 0:  # torch's own fails its own way
        yield from BatchSampler.__iter__(index)
        return
    generator = sampler.generator
    if generator is None:  # as RandomSampler: a generator seeded from the global one
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        generator = torch.Generator()
        generator.manual_seed(seed)
    perm = torch.randperm(n, generator=generator)
    full = n // batch_size
    for b in range(full):
        yield perm[b * batch_size:(b + 1) * batch_size].tolist()
    # RandomSampler ends with randperm(n)[:num_samples % n]: drawn when the sampler is asked past its
    # last sample, which BatchSampler does before its short last batch (or before it ends).
    torch.randperm(n, generator=generator)
    if n > full * batch_size and not drop_last:
        yield perm[full * batch_size:].tolist()


def _integer_order(keys: list[Any]) -> Optional[np.ndarray]:
    """The sampler's keys as int64 if every one is an integer (a bool too, as numbers.Integral
    has it), else None. numpy's own conversion decides the common case in one pass."""
    try:
        order = np.array(keys)
    except (ValueError, TypeError, OverflowError):  # ragged lists, odd objects
        order = None
    if order is not None and order.ndim == 1 and order.dtype.kind in "ib":
        return order.astype(np.int64, copy=False)
    if all(isinstance(i, numbers.Integral) for i in keys):  # e.g. ints past int64, custom Integrals
        try:
            return np.array([int(i) for i in keys], dtype=np.int64)
        except OverflowError:
            return None
    return None


class _Batches:
    """An epoch's batches: the sampler's keys in one sequence, cut at `starts` (one more entry than
    there are batches); `order` is the keys as int64 when every one is an integer, else None."""

    def __init__(self, keys: Any, starts: np.ndarray, order: Optional[np.ndarray]) -> None:
        self.keys = keys
        self.starts = starts
        self.order = order

    @classmethod
    def read(cls, loader: Any, sampler_iter: Any) -> "_Batches":
        """The epoch's batches, drawn from `sampler_iter` (an iter() of the loader's index sampler)."""
        index = loader._index_sampler
        if loader._auto_collation and type(index) is BatchSampler:
            # torch's own BatchSampler: its iterator draws nothing before its first batch, then cuts
            # iter(index.sampler) into runs of batch_size. Reading the sampler's keys in one go draws
            # the same; building the batches one by one in Python made the first batch wait 0.28 s
            # in order, 0.54 s shuffled, for ImageNet's 1.28M keys (now 0.03 s / 0.25 s).
            # torch's SequentialSampler iterates range(len(data_source)).
            if type(index.sampler) is SequentialSampler:
                keys: Any = np.arange(len(index.sampler.data_source), dtype=np.int64)
            else:
                keys = list(index.sampler)
            n = len(keys) - len(keys) % index.batch_size if index.drop_last else len(keys)
            if n < len(keys):
                keys = keys[:n]
            starts = np.append(np.arange(0, n, index.batch_size, dtype=np.int64), np.int64(n))
            return cls(keys, starts, keys if isinstance(keys, np.ndarray) else _integer_order(keys))
        if loader._auto_collation:
            batches = [list(b) for b in sampler_iter]
        else:
            batches = [[i] for i in sampler_iter]
        keys = [i for b in batches for i in b]
        return cls(keys, np.cumsum([0] + [len(b) for b in batches], dtype=np.int64), _integer_order(keys))

    @classmethod
    def of_order(cls, order: np.ndarray, batch_size: int, drop_last: bool) -> "_Batches":
        """An order of integer keys cut into runs of batch_size, as torch's BatchSampler cuts its sampler's."""
        n = len(order) - len(order) % batch_size if drop_last else len(order)
        keys = np.ascontiguousarray(order[:n], dtype=np.int64)
        return cls(keys, np.append(np.arange(0, n, batch_size, dtype=np.int64), np.int64(n)), keys)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def skip(self, k: int) -> "_Batches":
        """The batches after the first `k`."""
        first = int(self.starts[min(k, len(self))])
        return _Batches(self.keys[first:], self.starts[min(k, len(self)):] - first,
                        None if self.order is None else self.order[first:])

    @property
    def capacity(self) -> int:
        """The most samples in one batch."""
        return int(np.diff(self.starts).max())


class _Feed:
    """The rest of an epoch drawn as torch's iterator draws it: one batch from the index sampler for
    each batch handed out (or failed), fed to the runtime (``Loader.feed``), and the end of the
    sampler passed on (``Loader.end_feed``)."""

    def __init__(self, sampler_iter: Any, auto_collation: bool, capacity: int, ended: bool) -> None:
        self._sampler_iter = sampler_iter
        self._auto_collation = auto_collation
        self.capacity = capacity
        self._ended = ended
        self._runtime: Optional[_core.Loader] = None

    @classmethod
    def first(cls, loader: Any, sampler_iter: Any) -> tuple[_Batches, Optional["_Feed"]]:
        """The batches torch's iterator draws before its first ``next()`` (prefetch_factor per
        worker), and the feed of the rest; no feed when those keys are not all integers (the
        rest is then drawn now, for the workers' table of keys, _ByPosition) or when torch's
        batch size does not bound the batches (a batch sampler of another kind: drawn now)."""
        index = loader._index_sampler
        if not loader._auto_collation:
            capacity = 1
        elif isinstance(index, BatchSampler) and isinstance(getattr(index, "batch_size", None), int):
            capacity = index.batch_size  # (accelerate's SkipBatchSampler is a BatchSampler without one)
        else:
            return _Batches.read(loader, sampler_iter), None
        drawn, ended = [], False
        for _ in range(loader.prefetch_factor * loader.num_workers):
            try:
                drawn.append(next(sampler_iter))
            except StopIteration:
                ended = True
                break
        batches = [list(b) for b in drawn] if loader._auto_collation else [[i] for i in drawn]
        keys = [i for b in batches for i in b]
        order = _integer_order(keys)
        if order is None or any(len(b) > capacity for b in batches):
            if not ended:
                batches += [list(b) if loader._auto_collation else [b] for b in sampler_iter]
            keys = [i for b in batches for i in b]
            starts = np.cumsum([0] + [len(b) for b in batches], dtype=np.int64)
            return _Batches(keys, starts, _integer_order(keys)), None
        starts = np.cumsum([0] + [len(b) for b in batches], dtype=np.int64)
        return _Batches(order, starts, order), cls(sampler_iter, loader._auto_collation, capacity, ended)

    def bind(self, runtime: _core.Loader) -> Callable[[], None]:
        """Starts feeding `runtime` (this epoch's): the one to call after each batch."""
        self._runtime = runtime
        if self._ended:
            runtime.end_feed()
        return self.one

    def one(self) -> None:
        """Draws the next batch and feeds it, or ends the feed when the sampler is done."""
        if self._ended or self._runtime is None or self._runtime.closed:
            return
        try:
            batch = next(self._sampler_iter)
        except StopIteration:
            self._ended = True
            self._runtime.end_feed()
            return
        keys = list(batch) if self._auto_collation else [batch]
        order = _integer_order(keys)
        if order is None or len(order) > self.capacity:
            self._ended = True
            self._runtime.end_feed()
            raise TypeError(f"spindle: the sampler gave the batch {keys!r} after batches of at most "
                            f"{self.capacity} integer indices; spindle.torch feeds its workers batches of "
                            "integer indices of at most the batch size (non-integer keys work when every "
                            "key of the epoch is one)")
        self._runtime.feed(order=order, starts=np.array([0, len(order)], dtype=np.int64))


class _ByPosition:
    """The dataset as the workers see it when the sampler's indices are not integers:
    position p of this epoch's order stands for keys[p]."""

    def __init__(self, dataset: Any, keys: list[Any]) -> None:
        self.dataset = dataset
        self.keys = keys

    def __getitem__(self, position: int) -> Any:
        return self.dataset[self.keys[position]]

    def __getattr__(self, name: str) -> Any:
        # __getitems__ (a batched fetch, as torch's fetcher uses it) if the dataset has one.
        if name == "__getitems__" and hasattr(self.dataset, "__getitems__"):
            return lambda positions: self.dataset.__getitems__([self.keys[p] for p in positions])
        raise AttributeError(name)


def _for_workers(dataset: Any, share: str, forked: bool) -> Any:
    """The dataset the workers get (share="auto": its large plain attributes shared); a DataPipe graph
    as it is (torch's graph functions find its nodes by traversal, which a copy would split)."""
    if isinstance(dataset, (IterDataPipe, MapDataPipe)):
        return dataset
    return share_for_workers(dataset, share, forked)


def _convert_one(convert: Callable[[Any], Any], samples: list[Any]) -> Any:
    return convert(samples[0])  # batch_size=None: one sample per "batch", no collation


def _draw(generator: Optional[torch.Generator]) -> int:
    """One 64-bit seed from `generator` (torch's global one if None), drawn as torch's iterator draws it."""
    return torch.empty((), dtype=torch.int64).random_(generator=generator).item()


def _reseed_stream(message: bytes, *, dataset: Any) -> None:
    """In a persistent stream worker, before a new epoch's iter(dataset): a DataPipe takes the
    epoch's shared seed (torch's _ResumeIteration)."""
    shared_seed = pickle.loads(message)
    if shared_seed is not None:
        apply_random_seed(dataset, torch.Generator().manual_seed(shared_seed))


def _setup_torch_worker(worker_id: int, num_workers: int, *, base_seed: int, dataset: Any,
                        worker_init_fn: Optional[Callable[[int], None]], shared_seed: Optional[int] = None) -> None:
    """What torch's worker loop does before reading data: one intra-op thread,
    per-worker seeds for random/torch/numpy, an IterDataPipe's shared seed,
    get_worker_info(), a DataPipe's sharding by worker, the init hook."""
    torch.set_num_threads(1)
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_torch_worker._generate_state(base_seed, worker_id))
    if shared_seed is not None:  # in place: the stream iterates this same object
        apply_random_seed(dataset, torch.Generator().manual_seed(shared_seed))
    _torch_worker._worker_info = _torch_worker.WorkerInfo(
        id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    if isinstance(dataset, (IterDataPipe, MapDataPipe)):  # torch's _sharding_worker_init_fn, one process group
        apply_sharding(dataset, num_workers, worker_id)
    _collate_into_the_slot()
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def _collate_into_the_slot() -> None:
    """In a worker, torch's default_collate stacks tensors into a new torch shared-memory segment
    per batch (it checks get_worker_info()), which torch's pipe then passes on. spindle's stack
    writes into the slot of the batch being collated instead (stack_into_slot), so the batch is
    written once and travels in place. Where that cannot run the stack runs as outside a worker,
    into the heap, not a fresh mmap whose pages fault in again for every batch (glibc's threshold
    for that stops at 32 MiB)."""
    from torch.utils.data._utils import collate as _collate

    torch_fn = _collate.collate_tensor_fn

    def collate_tensor_fn(batch: Any, *, collate_fn_map: Any = None) -> Any:
        stacked = stack_into_slot(batch)
        if stacked is not None:
            return stacked
        info, _torch_worker._worker_info = _torch_worker._worker_info, None
        try:
            return torch_fn(batch, collate_fn_map=collate_fn_map)
        finally:
            _torch_worker._worker_info = info

    if _collate.default_collate_fn_map.get(torch.Tensor) is torch_fn:
        _collate.default_collate_fn_map[torch.Tensor] = collate_tensor_fn
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def __getattr__(name: str) -> Any:
    # StatefulDataLoader builds on DataLoader above: its module imports this one, and is
    # imported on first use, so the two do not import each other.
    if name == "StatefulDataLoader":
        from .stateful import StatefulDataLoader
        return StatefulDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
