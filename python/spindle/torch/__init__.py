"""spindle.torch.DataLoader: torch.utils.data.DataLoader's interface on spindle's workers.

Change one import line::

    from spindle.torch import DataLoader   # was: from torch.utils.data import DataLoader

Arguments, their validation (same exception types and messages), samplers,
batch samplers, the generator, ``len()`` and the batch order are torch's own:
this class builds a ``torch.utils.data.DataLoader`` for them and never lets it
start a worker. What changes is how batches travel: spindle's forked,
single-threaded workers write them into shared memory, and you get tensors
that are zero-copy views of it (writable, valid for as long as you keep them).

Two transports, chosen by the worker for each batch:

- **zero-copy** (default collate, samples made of tensors, numpy arrays and
  numbers of one shape within the batch): each field is written straight into
  its block of a slot and arrives as ``torch.from_numpy`` of it, exactly as
  ``default_collate`` would have built it (dicts, namedtuples; tuples become
  lists, like default_collate).
- **pickled** (a custom ``collate_fn``, strings or other objects, ragged
  samples, or ``batch_size=None``): the worker runs the collate function and
  pickles the batch into its slot; the consumer unpickles it. No pipes, no
  feeder threads.

Dataset code runs only in the workers, as in torch: nothing is read up front
to size the ring (each batch carries its layout; slots grow to fit), so an
error in ``dataset[i]`` or ``worker_init_fn`` surfaces at ``next()``.

Differences from torch are listed in docs/torch_dropin.md.
"""

from __future__ import annotations

import multiprocessing
import numbers
import operator
import pickle
import random
import warnings
from functools import partial
from typing import Any, Callable, Generic, Optional, TypeVar

import numpy as np

from .._extras import require_extra

require_extra("torch", ("torch",), "spindle.torch")

import torch  # noqa: E402 - after the check that names the extra
from torch.utils.data import DataLoader as _TorchDataLoader
from torch.utils.data import BatchSampler, IterableDataset, IterDataPipe, MapDataPipe, SequentialSampler
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding
from torch.utils.data._utils import worker as _torch_worker

from .. import _core
from .._budget.policy import resolve_policy, warn_if_shrunk
from .._runtime.epoch import EpochIterator
from .._runtime.stats import HasStats
from .._runtime.forking import forked_worker, forking
from .._runtime.layout import BatchReader
from .._runtime.persistent import reset_or_restart
from .._runtime.sharing import check_share, share_for_workers
from .._runtime.spawned import WorkerPayload, worker_argv, worker_env
from .._runtime.worker import batch_decoder, run_stream_worker, run_worker
from .._state.sharding import resolve_shard
from ..errors import WorkerDiedError
from ._transport import CollatedBatches
from ._workers import WorkerProcess, torch_died

__all__ = ["DataLoader", "StatefulDataLoader"]

_T_co = TypeVar("_T_co", covariant=True)


class DataLoader(HasStats, Generic[_T_co]):
    """``torch.utils.data.DataLoader`` with spindle's workers. Same signature and defaults.

    Generic like torch's (``DataLoader[list[torch.Tensor]]`` in annotations).

    Beyond torch's arguments, keyword-only and off by default (then nothing
    differs from torch): ``shard="auto"`` or ``shard=(rank, world_size)``
    loads this rank's part of a map-style dataset, exactly as
    ``sampler=DistributedSampler(dataset, world_size, rank, shuffle=shuffle,
    seed=shard_seed, drop_last=shard_drop_last)`` would, with ``set_epoch``
    called for each epoch (docs/distributed.md).

    ``share="auto"`` (keyword-only, on by default; ``"off"`` gives the workers
    the dataset as torch does): when workers start, the dataset's large
    attributes made of plain values (lists, tuples, dicts of str, bytes,
    numbers, None), also those of wrapped datasets (``Subset``,
    ``ConcatDataset``), go to shared memory once (:func:`spindle.shared`), so
    workers read them without each copying them; your dataset object is not
    changed (the workers get a shallow copy). One INFO line on logger
    "spindle" per conversion (docs/shared_memory.md)."""

    _peer = _TorchDataLoader  # the loader that validates the arguments and builds the samplers

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
        self._epochs_begun = 0  # iter() calls: the epoch number of a shard's DistributedSampler
        if self._shard is not None:
            sampler, shuffle = _shard_sampler(self._shard, dataset, shuffle, sampler, batch_sampler,
                                              shard_seed, shard_drop_last), None
        # torch validates every argument and builds the samplers; it starts no
        # worker until iterated, and we never iterate it with workers.
        self._torch = self._peer(
            dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
            drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order, **peer_options)
        _check_counts(self._torch)
        self._user_collate = collate_fn is not None
        self._runtime: Optional[_core.Loader] = None
        self._close_on_drop: Optional[_core.CloseOnDrop] = None
        self._capacity = 0
        self._base_seed = 0
        self._stream_epochs = 0
        self._runtime_epoch = 0
        self._persistent_epoch = 0
        self._keyed = False  # the persistent workers look indices up in an epoch's table (_ByPosition)

    # torch's public attributes, read-through.
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_torch":
            raise AttributeError(name)
        return getattr(self._torch, name)

    # Public attributes are torch's too: torch checks the assignment (batch_size,
    # sampler, batch_sampler, drop_last, dataset, persistent_workers raise
    # ValueError once the loader is built) and stores it where we read it.
    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or "_torch" not in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._torch, name, value)

    def __len__(self) -> int:
        return len(self._torch)

    def set_epoch(self, epoch: int) -> None:
        """With a shard: the epoch the next iteration shuffles for (DistributedSampler.set_epoch)."""
        self._epochs_begun = int(epoch)

    def _begin_epoch(self) -> None:
        """Hook at each iter(), before the sampler is iterated: a shard's sampler gets its epoch."""
        if self._shard is not None:
            self._torch.sampler.set_epoch(self._epochs_begun)
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

    def __iter__(self) -> Any:
        self._begin_epoch()
        return self._wrap(self._iter_epoch())

    def _iter_epoch(self) -> Any:
        loader = self._torch
        if loader.num_workers == 0:
            return iter(loader)  # single process: torch's own loop is already what spindle would do
        if loader.pin_memory and not torch.cuda.is_available():
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                          "then device pinned memory won't be used.", stacklevel=2)
        if isinstance(loader.dataset, IterableDataset):
            return self._iter_streams()
        # The same draws from `generator`, in the same order, as torch's
        # iterator: persistent workers keep the base seed of their first epoch.
        sampler_iter = iter(loader._index_sampler)
        reuse = self.persistent_workers and self._runtime is not None
        if self._draws_as_persistent(reuse):
            base_seed = self._base_seed
        else:
            base_seed = self._base_seed = _draw(loader.generator)
            sampler_iter = self._first_epoch_sampler(sampler_iter)
        batches, base_seed = self._resume_batches(_Batches.read(loader, sampler_iter), base_seed)
        if not len(batches):
            return iter(())
        dataset = shared = _for_workers(loader.dataset, self._share)
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
        capacity = batches.capacity
        if reuse and (capacity > self._capacity or self._keyed):  # outgrown slots, or last epoch's table
            self.close()
            reuse = False
        setup = partial(_setup_torch_worker, base_seed=base_seed, dataset=shared,
                        worker_init_fn=loader.worker_init_fn)
        if not reuse:
            self._capacity = capacity
        decode = self._decoder()

        def start() -> _core.Loader:
            transport = CollatedBatches(self._collate(), self._capacity, self._zero_copy(),
                                        batched_fetch=loader._auto_collation)
            workers_see = self._worker_dataset(dataset, self._spawns())
            # In order, batch k goes to worker k mod N, as torch sends it. Out of
            # order, torch gives a batch only to a worker with room (a slow worker
            # is skipped); here a free worker takes the next batch.
            options = _core.LoaderOptions()
            options.assign_in_turn = loader.in_order
            options.num_workers = loader.num_workers
            options.batch_capacity = self._capacity
            options.prefetch_factor = loader.prefetch_factor
            options.in_order = loader.in_order
            options.timeout = loader.timeout
            runtime = self._runtime_for(run_worker, dict(dataset=workers_see, transport=transport, setup=setup),
                                        options, order=order, starts=starts)
            if self.persistent_workers:
                self._keep(runtime)
                self._keyed = (isinstance(workers_see, _ByPosition)
                               or isinstance(getattr(workers_see, "dataset", None), _ByPosition))
            return runtime

        runtime, _ = reset_or_restart(self._runtime if self.persistent_workers else None,
                                      lambda kept: kept.reset(order=order, starts=starts), start,
                                      close=self.close, failures=(Exception,))
        if not self.persistent_workers:
            return _TorchIterator(runtime, decode, owns=True, stats=self._stats_book())
        self._persistent_epoch += 1
        return _TorchIterator(runtime, decode, owns=False, owner=self, epoch=self._persistent_epoch,
                              stats=self._stats_book())

    def _collate(self) -> Callable[[list], Any]:
        loader = self._torch
        return loader.collate_fn if loader._auto_collation else partial(_convert_one, loader.collate_fn)

    def _zero_copy(self) -> bool:
        return self._torch._auto_collation and not self._user_collate

    def _spawns(self) -> bool:
        """Workers as new interpreters: the loader's multiprocessing_context, or else the
        start method set globally (multiprocessing.set_start_method), is 'spawn' or 'forkserver'."""
        context = self._torch.multiprocessing_context
        if context is None:
            method = multiprocessing.get_start_method(allow_none=True)
        else:
            method = context if isinstance(context, str) else context.get_start_method()
        return method in ("spawn", "forkserver")

    def _runtime_for(self, body: Callable[..., int], kwargs: dict[str, Any], options: _core.LoaderOptions, *,
                     order: np.ndarray, starts: Optional[np.ndarray] = None) -> _core.Loader:
        """A runtime Loader whose workers run body(ctx, **kwargs): forked, or spawned (pickled payload)."""
        # torch's signature is fixed: the policy comes from $SPINDLE_BUDGET_POLICY (default "shrink").
        options.budget_policy = resolve_policy(None)
        if self._spawns():
            # Pickled in multiprocessing's spawning context, as torch's worker
            # Process arguments are: its synchronization primitives, shared
            # ctypes and tensors travel as they do to torch's workers.
            try:
                payload = WorkerPayload(body, kwargs)
            except (TypeError, AttributeError, pickle.PicklingError):
                warnings.warn(_PICKLE_ERROR_WORDS, stacklevel=5)
                raise
            with payload:
                runtime = _core.Loader(options, order=order, starts=starts, spawn_argv=worker_argv(),
                                       spawn_fds=payload.fds, spawn_env=worker_env())
        else:
            with forking():
                runtime = _core.Loader(options, order=order, starts=starts,
                                       worker_main=forked_worker(partial(body, **kwargs)))
        warn_if_shrunk(runtime, stacklevel=4)
        return runtime

    def _decoder(self) -> Callable[[Any], Any]:
        """Batch -> batch: tensors over the slot (or the unpickled batch), pinned when asked and possible."""
        decode = batch_decoder(BatchReader(convert=torch.from_numpy, tuples_as_lists=True))
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
        if self.persistent_workers and self._stream_epochs > 0:
            base_seed = self._base_seed
        else:
            base_seed = self._base_seed = _draw(loader.generator)
            if shared_seed is not None:
                _draw(loader.generator)
        self._stream_epochs += 1
        stream_len = loader._IterableDataset_len_called

        def start() -> _core.Loader:
            n = loader.batch_size if loader._auto_collation else 1
            shared = _for_workers(loader.dataset, self._share)
            setup = partial(_setup_torch_worker, base_seed=base_seed, dataset=shared,
                            worker_init_fn=loader.worker_init_fn, shared_seed=shared_seed)
            transport = CollatedBatches(self._collate(), n, self._zero_copy())
            options = _core.LoaderOptions()
            options.round_robin = True
            options.num_workers = loader.num_workers
            options.batch_capacity = n
            options.prefetch_factor = loader.prefetch_factor
            options.in_order = loader.in_order
            options.timeout = loader.timeout
            runtime = self._runtime_for(
                run_stream_worker, dict(dataset=shared, transport=transport, setup=setup, batch_size=n,
                                        drop_last=loader.drop_last,
                                        restart=partial(_reseed_stream, dataset=shared)),
                options, order=np.empty(0, np.int64))
            if self.persistent_workers:
                self._keep(runtime)
            return runtime

        runtime, _ = reset_or_restart(
            self._runtime if self.persistent_workers else None,
            lambda kept: kept.reset_streams(messages=[pickle.dumps(shared_seed)] * kept.plan.num_workers), start,
            close=self.close, failures=(Exception,))
        decode = self._decoder()
        if not self.persistent_workers:
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


# torch's words when its worker Process arguments do not pickle (its iterator warns, then re-raises).
_PICKLE_ERROR_WORDS = (
    "Got pickle error when attempting to start a worker Process. "
    "This might be because the worker Process arguments are not picklable. "
    "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
    "to 'forkserver', which requires the worker Process arguments to be picklable. "
    "You can also try multiprocessing.set_start_method('fork').")


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
    from torch.utils.data.distributed import DistributedSampler

    if isinstance(dataset, IterableDataset):
        raise ValueError("spindle: shard= needs a map-style dataset; an IterableDataset shards itself "
                         "(e.g. with torch.distributed.get_rank() and get_world_size() in its __iter__)")
    if sampler is not None or batch_sampler is not None:
        raise ValueError("spindle: shard= builds the sampler (a DistributedSampler) and cannot be combined with "
                         "sampler= or batch_sampler=; pass your own DistributedSampler as sampler= instead")
    return DistributedSampler(dataset, num_replicas=shard.world_size, rank=shard.rank, shuffle=bool(shuffle),
                              seed=seed, drop_last=drop_last)


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


def _for_workers(dataset: Any, share: str) -> Any:
    """The dataset the workers get (share="auto": its large plain attributes shared); a DataPipe graph
    as it is (torch's graph functions find its nodes by traversal, which a copy would split)."""
    return dataset if isinstance(dataset, (IterDataPipe, MapDataPipe)) else share_for_workers(dataset, share)


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
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def __getattr__(name: str) -> Any:
    # StatefulDataLoader builds on DataLoader above: its module imports this one, and is
    # imported on first use, so the two do not import each other.
    if name == "StatefulDataLoader":
        from .stateful import StatefulDataLoader
        return StatefulDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
