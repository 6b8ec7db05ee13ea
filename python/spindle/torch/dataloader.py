"""spindle.torch.DataLoader: torch's DataLoader class, its epochs on spindle's workers (the engine)."""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional, TypeVar

import torch
from torch.utils.data import DataLoader as _TorchDataLoader

from . import _compat
from ._engine import Engine
from ._hook import adopt
from ._shard import shard_sampler
from .._runtime.sharing import check_share
from .._runtime.start import replacements_for
from .._state.sharding import resolve_shard

_T_co = TypeVar("_T_co", covariant=True)

# Keywords of the constructor that older torch releases lack, with their defaults: in_order (torch 2.6).
_NEWER_KEYWORDS = {"in_order": True}


class DataLoader(Engine, _TorchDataLoader[_T_co]):
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
    "spindle" per conversion (docs/shared_memory.md).

    ``on_worker_death="replace"`` (keyword-only; default ``"raise"``, torch's
    behaviour: the epoch ends with an error): a worker process lost mid-epoch
    (the OOM killer, a signal) is started again, with ``worker_init_fn`` and
    its seed, and the batch it was producing is produced again, so the epoch
    goes on with the same batches in the same order (a worker's own random
    generator starts again). At most ``max(3, num_workers)`` per epoch; a
    sample being produced at two losses is named, not retried. Map-style
    datasets only: an ``IterableDataset``'s lost worker still ends the epoch
    (docs/reliability.md)."""

    _peer: Any = _TorchDataLoader  # the class whose __init__ validates the arguments and builds the samplers

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Optional[Callable[[list], Any]] = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Optional[Callable[[int], None]] = None, multiprocessing_context: Any = None,
                 generator: Optional[torch.Generator] = None, *, prefetch_factor: Optional[int] = None,
                 persistent_workers: bool = False, pin_memory_device: str = "", in_order: bool = True,
                 shard: Any = None, shard_drop_last: bool = False, shard_seed: int = 0, share: str = "auto",
                 on_worker_death: str = "raise", **peer_options: Any) -> None:
        replacements_for(on_worker_death)  # checked now, not at the first epoch
        self._shard = resolve_shard(shard)
        self._share = check_share(share)
        if self._shard is not None:
            sampler, shuffle = shard_sampler(self._shard, dataset, shuffle, sampler, batch_sampler,
                                              shard_seed, shard_drop_last), None
        # torch validates every argument and builds the samplers; its workers never start. A keyword
        # this torch does not have yet (in_order before 2.6) is passed only when it is not the
        # default, so that torch refuses it as it would its own.
        keywords = dict(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                        pin_memory_device=pin_memory_device, in_order=in_order)
        for name, default in _NEWER_KEYWORDS.items():
            if keywords[name] == default and not _compat.accepts(self._peer, name):
                del keywords[name]
        self._peer.__init__(
            self, dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory,
            drop_last, timeout, worker_init_fn, multiprocessing_context, generator, **keywords, **peer_options)
        if "in_order" not in keywords:
            self.in_order = True
        _check_counts(self)
        self.shard, self.shard_drop_last, self.shard_seed, self.share = shard, shard_drop_last, shard_seed, share
        self.on_worker_death = on_worker_death
        self._init_engine()
        adopt(self, sampler is not None, batch_sampler is not None)

    @property
    def _torch(self) -> Any:
        return self

    def __iter__(self) -> Any:
        if _compat.FALLBACK is not None and self.num_workers > 0:
            _compat.warn_fallback()
            self._begin_epoch()
            return self._peer.__iter__(self)  # torch's own workers, through _get_iterator below
        if self.num_workers == 0:
            self._begin_epoch()  # a shard's sampler gets its epoch here too
            return self._peer.__iter__(self)  # single process: torch's own loop is what spindle would do
        return self._spindle_epoch()

    def _get_iterator(self) -> Any:
        # What torch's __iter__ would build; spindle's __iter__ above never calls it.
        if self.num_workers == 0 or _compat.FALLBACK is not None:
            return self._peer._get_iterator(self)
        return self._spindle_epoch()


def _check_counts(loader: Any) -> None:
    """What torch's constructor accepts but its iterator then fails on, refused at construction with
    the error torch raises there: a worker count or prefetch factor that is not an integer (2.5)
    makes torch's ``range()`` raise TypeError "'float' object cannot be interpreted as an integer"."""
    operator.index(loader.num_workers)
    if loader.prefetch_factor is not None:
        operator.index(loader.prefetch_factor)
