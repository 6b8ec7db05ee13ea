"""Every private name of torch (and torchdata) that spindle.torch uses, and every torch behaviour it
re-implements: the one module that knows torch's insides. Nothing else in spindle touches them.

Each name says which torch releases it was checked on. :func:`incompatibility` looks them all up
once, at import, together with the version: on a torch outside the tested range, or one where a
name is missing or takes other parameters, spindle.torch runs every loader on torch's own workers
(its DataLoader is then torch's, its ``install()`` does nothing), and :func:`warn_fallback` says so
once, naming the version and the reason. spindle never fails where torch works, and never gives
another order silently.

``SPINDLE_TORCH_COMPAT=force`` in the environment tries spindle's workers on a torch outside the
tested range anyway (the names must still be there): for checking a new release.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import BatchSampler, RandomSampler
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import dataloader as _dataloader
from torch.utils.data._utils import collate as _collate
from torch.utils.data._utils import worker as _worker

from .._peer_check import Fallback, first_missing, has_parameters

# The torch releases spindle.torch is tested on (make test-peers-versions runs torch's own
# test_dataloader.py of each with spindle patched in; make test runs the oldest and the newest
# local one). A minor release inside the range is supported; one after it falls back.
TESTED = ("2.4.1", "2.8.0", "2.13.0", "2.14.1")
OLDEST, NEWEST = (2, 4), (2, 14)


def version_of(text: str) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.13.0+cpu", "2.15.0.dev20261201")."""
    found = re.match(r"(\d+)\.(\d+)", text)
    if found is None:
        raise ValueError(f"not a torch version: {text!r}")
    return int(found.group(1)), int(found.group(2))


# --- the names: each line says what it is and since when it is so -------------------------
# (checked on every release in TESTED unless it says otherwise)

# The multi-process iterator DataLoader._get_iterator builds (torch.utils.data.dataloader's module
# global): install() puts spindle's in its place. torch calls `_reset(loader, first_iter=False)` on it
# for each epoch of persistent workers and `_shutdown_workers()` when done; its `_workers` are
# multiprocessing.Process-like.
ITERATOR_MODULE = "torch.utils.data.dataloader"
ITERATOR_NAME = "_MultiProcessingDataLoaderIter"


def torch_iterator() -> Any:
    """The class in torch's place now (spindle's after install())."""
    return getattr(_dataloader, ITERATOR_NAME)


# torch's own iterator class, also when SPINDLE_TORCH=1 put a stand-in in its place first
# (spindle._autoinstall keeps torch's on the stand-in as `_torch_iterator`).
TORCH_ITERATOR = getattr(torch_iterator(), "_torch_iterator", torch_iterator())


def put_iterator(cls: Any) -> None:
    setattr(_dataloader, ITERATOR_NAME, cls)


def index_sampler(loader: Any) -> Any:
    """DataLoader._index_sampler: the batch sampler when batching, else the sampler."""
    return loader._index_sampler


def auto_collation(loader: Any) -> bool:
    """DataLoader._auto_collation: whether batches are made from a batch sampler."""
    return loader._auto_collation


def stream_len(loader: Any) -> Optional[int]:
    """DataLoader._IterableDataset_len_called: len(loader) as read before iter(), for torch's warning."""
    return loader._IterableDataset_len_called


def in_order(loader: Any) -> bool:
    """DataLoader.in_order (added in torch 2.6; before, batches are always in order)."""
    return getattr(loader, "in_order", True)


@functools.lru_cache(maxsize=None)
def accepts(cls: Any, name: str) -> bool:
    """Whether `cls`'s constructor takes the keyword `name` (in_order: torch >= 2.6; torchdata >= 0.10)."""
    parameters = _parameters(cls.__init__)
    return name in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def generate_state(base_seed: int, worker_id: int) -> Any:
    """torch.utils.data._utils.worker._generate_state: numpy's seed in torch's worker `worker_id`."""
    return _worker._generate_state(base_seed, worker_id)


def set_worker_info(worker_id: int, num_workers: int, seed: int, dataset: Any) -> None:
    """What get_worker_info() returns in this process (torch's module global `_worker_info`)."""
    _worker._worker_info = _worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)


def worker_info() -> Any:
    return _worker._worker_info


def put_worker_info(info: Any) -> None:
    _worker._worker_info = info


def patch_collate_tensor_fn(make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replaces torch's default_collate's function for tensors (`collate_tensor_fn` in
    `default_collate_fn_map`, torch >= 2.0) with make(torch's), unless someone else replaced it."""
    torch_fn = _collate.collate_tensor_fn
    if _collate.default_collate_fn_map.get(torch.Tensor) is torch_fn:
        _collate.default_collate_fn_map[torch.Tensor] = make(torch_fn)


@functools.lru_cache(maxsize=None)
def pickle_warning() -> Optional[str]:
    """The warning torch's iterator gives before a spawned worker's arguments fail to pickle, as torch's
    own module words it (torch 2.13 and 2.14 have one; 2.4 and 2.8 give none): None where it has none."""
    import ast

    for node in ast.walk(ast.parse(inspect.getsource(_dataloader))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("Got pickle error"):
            return node.value
    return None



def pin_memory(data: Any) -> Any:
    """torch.utils.data._utils.pin_memory.pin_memory, as torch's pin-memory thread applies it."""
    from torch.utils.data._utils.pin_memory import pin_memory as pin

    return pin(data)


# --- torch behaviours spindle re-implements -------------------------------------------------

def shuffled_batches(index: Any) -> Optional[Iterator[list[int]]]:
    """For torch's own BatchSampler over its own RandomSampler without replacement (shuffle=True),
    an iterator of the same batches, drawing the same numbers from the same generator at the same
    moments, but keeping the epoch's permutation as one tensor (torch's holds a list of Python ints
    for the whole epoch: 40 bytes a sample, 115 MiB for 3M). None for any other index sampler.

    RandomSampler.__iter__ and BatchSampler.__iter__ as in torch 2.4 to 2.14 (test_torch_dropin.py
    checks batches and generator states against torch's at every step, on each tested release)."""
    if not (type(index) is BatchSampler and type(index.sampler) is RandomSampler and not index.sampler.replacement
            and index.sampler._num_samples is None and type(index.batch_size) is int):
        return None
    return _shuffled_batches(index)


def _shuffled_batches(index: Any) -> Iterator[list[int]]:
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


def draw_seed(generator: Optional[torch.Generator]) -> int:
    """One 64-bit seed from `generator` (torch's global one if None), as torch's iterator draws its base seed."""
    return torch.empty((), dtype=torch.int64).random_(generator=generator).item()


def distributed_order(sampler: Any, epoch: int) -> Any:
    """DistributedSampler's order of all samples for `epoch`, before it pads and cuts it per rank
    (its __iter__: randperm seeded with seed + epoch, or the identity without shuffle)."""
    import numpy as np

    if not sampler.shuffle:
        return np.arange(len(sampler.dataset))
    generator = torch.Generator()
    generator.manual_seed(sampler.seed + epoch)
    return torch.randperm(len(sampler.dataset), generator=generator).numpy()


# --- the check ------------------------------------------------------------------------------

def _parameters(fn: Any) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


def _needed() -> dict[str, Callable[[], Any]]:
    """Each name spindle.torch's workers need, and how to look it up (raises if it is gone)."""
    probe = TorchDataLoader(range(1))
    return {
        f"{ITERATOR_MODULE}.{ITERATOR_NAME}": torch_iterator,
        f"{ITERATOR_NAME}._reset(loader, first_iter)": lambda: has_parameters(TORCH_ITERATOR._reset, "loader", "first_iter"),
        f"{ITERATOR_NAME}._shutdown_workers": lambda: TORCH_ITERATOR._shutdown_workers,
        "DataLoader._get_iterator": lambda: TorchDataLoader._get_iterator,
        "DataLoader._index_sampler": lambda: index_sampler(probe),
        "DataLoader._auto_collation": lambda: auto_collation(probe),
        "DataLoader._IterableDataset_len_called": lambda: stream_len(probe),
        "torch.utils.data._utils.worker._generate_state(base_seed, worker_id)":
            lambda: has_parameters(_worker._generate_state, "base_seed", "worker_id"),
        "torch.utils.data._utils.worker._worker_info": lambda: _worker._worker_info,
        "torch.utils.data._utils.worker.WorkerInfo(id, num_workers, seed, dataset)":
            lambda: _worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=None),
        "torch.utils.data._utils.collate.collate_tensor_fn(batch, collate_fn_map)":
            lambda: has_parameters(_collate.collate_tensor_fn, "batch", "collate_fn_map"),
        "torch.utils.data._utils.collate.default_collate_fn_map[torch.Tensor]":
            lambda: _collate.default_collate_fn_map[torch.Tensor],
        "torch.utils.data._utils.pin_memory.pin_memory": lambda: __import__(
            "torch.utils.data._utils.pin_memory", fromlist=["pin_memory"]).pin_memory,
        "RandomSampler._num_samples": lambda: RandomSampler(range(1))._num_samples,
    }




def incompatibility(version: str, needed: Optional[dict[str, Callable[[], Any]]] = None,
                    force: bool = False) -> Optional[str]:
    """Why spindle's workers cannot stand in for torch's `version` (whose names `needed` looks up),
    or None. `force`: a version outside the tested range is tried all the same."""
    try:
        minor = version_of(version)
    except ValueError as exc:
        return str(exc)
    if not force and minor > NEWEST:
        return (f"torch {version} is newer than the newest release spindle.torch was checked on "
                f"({TESTED[-1]}); set SPINDLE_TORCH_COMPAT=force to try spindle's workers on it")
    if not force and minor < OLDEST:
        return f"torch {version} is older than the oldest release spindle.torch supports ({TESTED[0]})"
    return first_missing("torch", version, _needed() if needed is None else needed)


_FALLBACK = Fallback(incompatibility(torch.__version__, force=os.environ.get("SPINDLE_TORCH_COMPAT") == "force"),
                     "spindle.torch: every DataLoader runs on torch's own workers")
FALLBACK: Optional[str] = _FALLBACK.reason


def warn_fallback(stacklevel: int = 2) -> None:
    """The one warning (per process) that the peer's own workers run, and why."""
    _FALLBACK.warn(stacklevel + 1)
