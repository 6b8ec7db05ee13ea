"""``spindle.mix``: a map-style dataset drawing from several map-style sources in fixed proportions.

The schedule is stride scheduling (a low-discrepancy merge): source j, of normalized weight
p_j, has its k-th element at the virtual time ``(k + u_j) / p_j``, with a phase u_j in [0, 1)
drawn from the seed; the mix's element i is the i-th of all sources' elements in time order
(ties by source index). So among the first i elements, source j has ``i * p_j`` of them to
within one more than the number of sources, for every i; element i is a function of (seed,
weights, the sources' lengths, i) alone, the same in any process, for any worker count and
after any resume.

**Length.** The mix ends when a source runs out: it is every element scheduled before the time
``T = min_j len_j / p_j``, by which the source that runs out first has given all of its
elements and no source more than it has. So its length is within the number of sources of
grain's ``MapDataset.mix`` rule (``min_j len_j / p_j``), and no element comes twice. A
source of weight 0 is never drawn from and does not limit the length.

The schedule is built on first use (``len`` or an element) in O(L log L) time and kept as two
arrays (5 bytes an element, 9 for sources past 2**31 elements); forked workers share the parent's copy, a pickled mix
(spawned workers) carries its recipe and rebuilds it.

**In spindle's workers** the mix is read through ``spindle_routed()``: a ``_core.RoutedDataset``
viewing the same two arrays (buffer protocol) and holding the sources' bound ``__getitem__``, which
the C++ row reader recognizes and reads without a Python call of the mix's own per sample (the
source's ``__getitem__`` is the only Python left). It also owns what the mix says about an element:
``locate``, the out-of-range IndexError and the note a source's exception gets (the mix's index,
the source and its index). ``Mix.__getitem__`` (torch's own DataLoader, any caller) reads the same
arrays and gives exactly the same elements and errors.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence

import numpy as np

from .. import _core

__all__ = ["Mix", "mix"]


def mix(datasets: Sequence[Any], weights: Optional[Sequence[float]] = None, *, seed: int = 0,
        shuffle: bool = False) -> "Mix":
    """A map-style dataset whose elements come from `datasets` in the proportions `weights`
    (default: equal), each source's elements in their order (``shuffle=True``: in a permutation
    of each source drawn from the seed), each at most once, ending when a source runs out.

    Deterministic from (seed, i): the same for any worker count, and resumed exactly through a
    loader's state; the state records the mix (sources' lengths, weights, seed, shuffle) and a
    loader over another mix refuses a mid-epoch state of this one (docs/distributed.md)."""
    return Mix(datasets, weights, seed=seed, shuffle=shuffle)


class Mix:
    """The dataset :func:`mix` returns; ``locate(i)`` tells which source and element ``i`` is."""

    def __init__(self, datasets: Sequence[Any], weights: Optional[Sequence[float]] = None, *, seed: int = 0,
                 shuffle: bool = False) -> None:
        datasets = list(datasets)
        if not datasets:
            raise ValueError("spindle.mix: no datasets given; pass a list of map-style datasets")
        lengths = []
        for j, dataset in enumerate(datasets):
            if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
                raise TypeError(f"spindle.mix: datasets[{j}] ({type(dataset).__name__}) is not map-style (it needs "
                                "len() and [i]); mix iterable datasets with their own tools, or wrap them in a list")
            n = len(dataset)
            if n == 0:
                raise ValueError(f"spindle.mix: datasets[{j}] ({type(dataset).__name__}) is empty (len 0); a mix ends "
                                 "when a source runs out, so it would be empty: remove it or give it samples")
            lengths.append(int(n))
        self.weights = _checked_weights(weights, len(datasets))
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"spindle.mix: seed should be an integer, but got seed={seed!r}")
        self.datasets = datasets
        self.lengths = lengths
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self._sources: Optional[memoryview] = None  # element i's source, then its index there
        self._indices: Optional[memoryview] = None
        self._routed: Optional[_core.RoutedDataset] = None  # the reader over the two, for the workers
        self._get = [dataset.__getitem__ for dataset in datasets]

    def __reduce__(self) -> tuple[Any, ...]:
        # The recipe, not the schedule (nor its reader); a subclass stays itself, with its own attributes.
        extra = {k: v for k, v in self.__dict__.items() if k not in _MIX_FIELDS}
        return (_rebuild, (type(self), self.datasets, self.weights, self.seed, self.shuffle), extra or None)

    def _build(self) -> None:
        total = math.fsum(self.weights)
        p = [w / total for w in self.weights]
        phases = np.random.default_rng([self.seed, 0]).random(len(p))
        drawn = [j for j in range(len(p)) if p[j] > 0]
        end = min(self.lengths[j] / p[j] for j in drawn)  # grain's length rule, as a time
        times, sources, indices = [], [], []
        for j in drawn:
            t = (np.arange(self.lengths[j], dtype=np.float64) + phases[j]) / p[j]
            count = int(np.searchsorted(t, end, side="left"))
            times.append(t[:count])
            sources.append(np.full(count, j, dtype=np.int64))
            if self.shuffle:
                indices.append(np.random.default_rng([self.seed, 1, j]).permutation(self.lengths[j])[:count])
            else:
                indices.append(np.arange(count, dtype=np.int64))
        t, s, k = np.concatenate(times), np.concatenate(sources), np.concatenate(indices)
        order = np.lexsort((s, t))  # by time, ties by source
        source_type = np.uint8 if len(p) <= 256 else np.uint32
        index_type = np.int32 if max(self.lengths) < 2**31 else np.int64
        # memoryviews: indexing one gives a plain Python int, cheaper than a numpy scalar
        self._sources = memoryview(np.ascontiguousarray(s[order], dtype=source_type))
        self._indices = memoryview(np.ascontiguousarray(k[order], dtype=index_type))
        names = [f"datasets[{j}] ({type(dataset).__name__})" for j, dataset in enumerate(self.datasets)]
        self._routed = _core.RoutedDataset(self._sources, self._indices, self._get, names,
                                           f"sources of {self.lengths}, weights {self.weights}")

    def __len__(self) -> int:
        if self._sources is None:
            self._build()
        return len(self._sources)

    def locate(self, i: int) -> tuple[int, int]:
        """(source, index in that source) of element `i`; IndexError naming the range if out of it."""
        return self._reader().locate(i)

    def spindle_routed(self) -> Optional[_core.RoutedDataset]:
        """The reader spindle's workers use for this mix: the C++ row reader reads element i
        through it as ``sources[i]``, ``indices[i]`` and the source's ``__getitem__``, without
        calling ``Mix.__getitem__``; the same elements and errors. None for a subclass that
        reads its elements otherwise (its own ``__getitem__`` is then called)."""
        return self._reader() if type(self).__getitem__ is Mix.__getitem__ else None

    def _reader(self) -> _core.RoutedDataset:
        if self._routed is None:
            self._build()
        return self._routed

    def __getitem__(self, i: int) -> Any:
        # Outside spindle's workers (torch's own DataLoader, a loop): two memoryview lookups and
        # the source's own __getitem__, bound once; the checks run only when one fails.
        try:
            source, index = self._sources[i], self._indices[i]
        except (TypeError, IndexError):  # not built yet, or out of range
            source, index = self.locate(i)  # builds the schedule; raises, naming the range
        try:
            return self._get[source](index)
        except Exception as exc:
            exc.add_note(self._routed.describe(i))  # as the workers' reader notes it
            raise

    def spindle_state_key(self) -> dict[str, Any]:
        """What a loader's state records of this mix (a mid-epoch state resumes only the same mix)."""
        return {"mix_lengths": list(self.lengths), "weights": list(self.weights), "seed": self.seed,
                "shuffle": self.shuffle}

    def __repr__(self) -> str:
        return (f"spindle.mix(<{len(self.datasets)} datasets of {self.lengths}>, weights={self.weights}, "
                f"seed={self.seed}, shuffle={self.shuffle})")


# Mix's own attributes: the recipe travels as _rebuild's arguments, the schedule and its reader are rebuilt.
_MIX_FIELDS = ("weights", "datasets", "lengths", "seed", "shuffle", "_sources", "_indices", "_routed", "_get")


def _rebuild(cls: type, datasets: list[Any], weights: list[float], seed: int, shuffle: bool) -> Mix:
    mixed = cls.__new__(cls)
    Mix.__init__(mixed, datasets, weights, seed=seed, shuffle=shuffle)
    return mixed


def _checked_weights(weights: Optional[Sequence[float]], count: int) -> list[float]:
    if weights is None:
        return [1.0] * count
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise ValueError(f"spindle.mix: weights should be a sequence of {count} numbers, but got weights={weights!r}")
    weights = list(weights)
    if len(weights) != count:
        raise ValueError(f"spindle.mix: {count} datasets but {len(weights)} weights ({weights!r}); give one weight "
                         "per dataset")
    checked = []
    for j, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise ValueError(f"spindle.mix: weights[{j}] = {w!r} is not a number")
        w = float(w)
        if not math.isfinite(w):
            raise ValueError(f"spindle.mix: weights[{j}] = {w!r} is not a finite number; weights are proportions "
                             "(any non-negative scale)")
        if w < 0:
            raise ValueError(f"spindle.mix: weights[{j}] = {w!r} is negative; weights are non-negative proportions")
        checked.append(w)
    if not any(checked):
        raise ValueError(f"spindle.mix: every weight is zero ({weights!r}); at least one source needs a positive "
                         "weight")
    return checked
