"""install(): spindle's workers under loaders built by code you do not own. The hook is torch's
multi-process iterator (what DataLoader._get_iterator builds; _compat owns its name): spindle's
iterator stands in its place and serves every torch loader (install()), or only those a framework
rebuilt from a spindle.torch.DataLoader's attributes (adopt())."""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Optional

from torch.utils.data import IterableDataset, IterDataPipe
from torch.utils.data.distributed import DistributedSampler

from . import _compat
from ._engine import Engine


class _Served(Engine):
    """The engine of a torch loader that is not a spindle.torch.DataLoader (after install())."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._init_engine()

    @property
    def _torch(self) -> Any:
        return self._loader


class InstalledIterator:
    """What torch's DataLoader builds for ``num_workers > 0`` once :func:`install` ran (torch's
    ``_get_iterator`` builds, _compat.ITERATOR_NAME): an epoch on spindle's workers,
    or torch's own iterator, with one warning naming why, for a loader spindle cannot serve.
    torch keeps it across epochs for persistent workers and calls ``_reset`` at each new one."""

    def __new__(cls, loader: Any) -> Any:
        if _compat.FALLBACK is not None:  # install() does not put this in torch's place then; a stale one
            _compat.warn_fallback(stacklevel=2)
            return _compat.TORCH_ITERATOR(loader)
        if not _hook.everywhere and not _adopted(loader):
            return _compat.TORCH_ITERATOR(loader)
        reason = cannot_serve(loader)
        if reason is not None:
            if reason not in _warned_fallbacks:
                _warned_fallbacks.add(reason)
                warnings.warn(f"spindle.torch.install(): this DataLoader runs on torch's workers: {reason}",
                              stacklevel=3)
            return _compat.TORCH_ITERATOR(loader)
        return super().__new__(cls)

    def __init__(self, loader: Any) -> None:
        self._engine = _Served(loader)
        self._epoch = self._engine._spindle_epoch()

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._epoch = self._engine._spindle_epoch()

    def __iter__(self) -> "InstalledIterator":
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


def cannot_serve(loader: Any) -> Optional[str]:
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
    live_after_prune = 64  # entries the table held after dead ones were last dropped


_hook = _Hook()


def _remember(thing: Any) -> None:
    """Remembers `thing` by a weak reference without a callback: a callback is Python code run while the
    loader is freed, where a signal handler's exception (Ctrl-C as its workers stop) would be lost as
    "Exception ignored". Dead entries are dropped as the table grows instead."""
    if thing is None or _is_remembered(thing):
        return
    if len(_hook.adopted) >= 2 * _hook.live_after_prune:
        for key in [k for k, held in _hook.adopted.items() if isinstance(held, weakref.ref) and held() is None]:
            del _hook.adopted[key]
        _hook.live_after_prune = max(64, len(_hook.adopted))
    try:
        _hook.adopted[id(thing)] = weakref.ref(thing)
    except TypeError:  # a list, a tuple: kept while this process lives
        _hook.adopted[id(thing)] = thing


def _is_remembered(thing: Any) -> bool:
    held = _hook.adopted.get(id(thing))
    return held is not None and (held() if isinstance(held, weakref.ref) else held) is thing


def adopt(loader: Any, sampler_given: bool, batch_sampler_given: bool) -> None:
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
    if _compat.FALLBACK is None:
        _compat.put_iterator(InstalledIterator)


def _adopted(loader: Any) -> bool:
    """`loader` (a torch loader that is not spindle's) was rebuilt from a spindle loader: its samplers
    lead to one a spindle loader's torch made (through `batch_sampler` and `sampler` attributes, as
    accelerate's wrappers hold them), its dataset is a stream wrapping a spindle loader's, or its sampler
    is a DistributedSampler over a spindle loader's dataset (Ray Train's prepare_data_loader)."""
    frontier = [loader.batch_sampler, loader.sampler]
    for _ in range(3):
        if any(_is_remembered(s) for s in frontier if s is not None):
            return True
        frontier = [getattr(s, name, None) for s in frontier for name in ("batch_sampler", "sampler")]
    inner = getattr(loader.dataset, "dataset", None) if isinstance(loader.dataset, IterableDataset) else None
    if inner is not None and _is_remembered(inner):
        return True
    # Ray Train's prepare_data_loader rebuilds a loader as DataLoader(dataset=loader.dataset,
    # sampler=DistributedSampler(loader.dataset), ...): a new sampler over the very dataset a spindle
    # loader was given.
    sampler = loader.sampler
    return (isinstance(sampler, DistributedSampler) and getattr(sampler, "dataset", None) is loader.dataset
            and _is_remembered(loader.dataset))


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
    if _compat.FALLBACK is not None:
        _compat.warn_fallback()
        return
    _hook.everywhere = True
    _compat.put_iterator(InstalledIterator)


def uninstall() -> None:
    """torch's own workers again for every DataLoader iterated from now on (but those rebuilt from a
    spindle.torch.DataLoader)."""
    _hook.everywhere = False


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _hook.everywhere and _compat.torch_iterator() is InstalledIterator
