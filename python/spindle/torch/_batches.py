"""spindle.torch's sampler replay: an epoch's batches, drawn from torch's samplers as torch's iterator
draws them (all at once, or a batch at a time for each batch handed out), and laid out for the runtime."""

from __future__ import annotations

import numbers
from typing import Any, Callable, Iterator, Optional

import numpy as np
from torch.utils.data import BatchSampler, SequentialSampler

from .. import _core
from . import _compat


def index_iter(index: Any) -> Iterator[Any]:
    """iter(index), or for shuffle=True's samplers the same batches with the permutation kept as a
    tensor (_compat.shuffled_batches)."""
    shuffled = _compat.shuffled_batches(index)
    return iter(index) if shuffled is None else shuffled


def integer_order(keys: list[Any]) -> Optional[np.ndarray]:
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


class Batches:
    """An epoch's batches: the sampler's keys in one sequence, cut at `starts` (one more entry than
    there are batches); `order` is the keys as int64 when every one is an integer, else None."""

    def __init__(self, keys: Any, starts: np.ndarray, order: Optional[np.ndarray]) -> None:
        self.keys = keys
        self.starts = starts
        self.order = order

    @classmethod
    def read(cls, loader: Any, sampler_iter: Any) -> "Batches":
        """The epoch's batches, drawn from `sampler_iter` (an iter() of the loader's index sampler)."""
        index = _compat.index_sampler(loader)
        if _compat.auto_collation(loader) and type(index) is BatchSampler:
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
            return cls(keys, starts, keys if isinstance(keys, np.ndarray) else integer_order(keys))
        if _compat.auto_collation(loader):
            batches = [list(b) for b in sampler_iter]
        else:
            batches = [[i] for i in sampler_iter]
        keys = [i for b in batches for i in b]
        return cls(keys, np.cumsum([0] + [len(b) for b in batches], dtype=np.int64), integer_order(keys))

    @classmethod
    def of_order(cls, order: np.ndarray, batch_size: int, drop_last: bool) -> "Batches":
        """An order of integer keys cut into runs of batch_size, as torch's BatchSampler cuts its sampler's."""
        n = len(order) - len(order) % batch_size if drop_last else len(order)
        keys = np.ascontiguousarray(order[:n], dtype=np.int64)
        return cls(keys, np.append(np.arange(0, n, batch_size, dtype=np.int64), np.int64(n)), keys)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def skip(self, k: int) -> "Batches":
        """The batches after the first `k`."""
        first = int(self.starts[min(k, len(self))])
        return Batches(self.keys[first:], self.starts[min(k, len(self)):] - first,
                        None if self.order is None else self.order[first:])

    @property
    def capacity(self) -> int:
        """The most samples in one batch."""
        return int(np.diff(self.starts).max())


class Feed:
    """The rest of an epoch drawn as torch's iterator draws it: one batch from the index sampler for
    each batch handed out (or failed), fed to the runtime (``Loader.feed``), and the end of the
    sampler passed on (``Loader.end_feed``)."""

    def __init__(self, sampler_iter: Any, auto_collation: bool, capacity: int, ended: bool) -> None:
        self._sampler_iter = sampler_iter
        self._batched = auto_collation
        self.capacity = capacity
        self._ended = ended
        self._runtime: Optional[_core.Loader] = None

    @classmethod
    def first(cls, loader: Any, sampler_iter: Any) -> tuple[Batches, Optional["Feed"]]:
        """The batches torch's iterator draws before its first ``next()`` (prefetch_factor per
        worker), and the feed of the rest; no feed when those keys are not all integers (the
        rest is then drawn now, for the workers' table of keys, ByPosition) or when torch's
        batch size does not bound the batches (a batch sampler of another kind: drawn now)."""
        index = _compat.index_sampler(loader)
        if not _compat.auto_collation(loader):
            capacity = 1
        elif isinstance(index, BatchSampler) and isinstance(getattr(index, "batch_size", None), int):
            capacity = index.batch_size  # (accelerate's SkipBatchSampler is a BatchSampler without one)
        else:
            return Batches.read(loader, sampler_iter), None
        drawn, ended = [], False
        for _ in range(loader.prefetch_factor * loader.num_workers):
            try:
                drawn.append(next(sampler_iter))
            except StopIteration:
                ended = True
                break
        batches = [list(b) for b in drawn] if _compat.auto_collation(loader) else [[i] for i in drawn]
        keys = [i for b in batches for i in b]
        order = integer_order(keys)
        if order is None or any(len(b) > capacity for b in batches):
            if not ended:
                batches += [list(b) if _compat.auto_collation(loader) else [b] for b in sampler_iter]
            keys = [i for b in batches for i in b]
            starts = np.cumsum([0] + [len(b) for b in batches], dtype=np.int64)
            return Batches(keys, starts, integer_order(keys)), None
        starts = np.cumsum([0] + [len(b) for b in batches], dtype=np.int64)
        return Batches(order, starts, order), cls(sampler_iter, _compat.auto_collation(loader), capacity, ended)

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
        keys = list(batch) if self._batched else [batch]
        order = integer_order(keys)
        if order is None or len(order) > self.capacity:
            self._ended = True
            self._runtime.end_feed()
            raise TypeError(f"spindle: the sampler gave the batch {keys!r} after batches of at most "
                            f"{self.capacity} integer indices; spindle.torch feeds its workers batches of "
                            "integer indices of at most the batch size (non-integer keys work when every "
                            "key of the epoch is one)")
        self._runtime.feed(order=order, starts=np.array([0, len(order)], dtype=np.int64))


class ByPosition:
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
