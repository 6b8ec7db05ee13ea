"""Checkpoint and exact resume: the loaders' state dicts and per-sample random streams.

A loader's state is where it stands in its sequence of batches: the epoch,
how many batches of it were handed out, and what the epoch's order and random
draws derive from (a seed, or for the torch drop-in the states of the torch
generators its sampler draws from at the start of the epoch). No sample, batch
or index list is kept, so the state is a few hundred bytes (a few KiB with
torch generator states) and JSON-able; it carries a format name and a version.

Resuming recomputes the epoch's order and skips the batches already handed
out. Batch k of an epoch is made of the same samples whatever the worker
count (in order, batches are cut from the order before any worker sees them),
so a loader may resume with another ``num_workers``. What a dataset draws at
random is made independent of the worker too: the worker reseeds Python's
``random``, numpy's global generator (and torch's CPU generator) before each
batch from (seed, epoch, the batch's sample indices) in ``spindle.DataLoader``
(:class:`BatchSeeds`), and before each sample from (seed, epoch, sample index)
in the torch drop-in's ``StatefulDataLoader`` (:class:`Reseeded`).
"""

from __future__ import annotations

import base64
import hashlib
import mmap
import random
import sys
from typing import Any, Iterator, Mapping, Optional

import numpy as np

__all__ = ["STATE_VERSION", "sample_seed", "batch_seed", "Reseeded", "BatchSeeds", "EpochCell", "Position", "Progress", "new_state", "check_state", "dataset_key",
           "bytes_to_json", "json_to_bytes", "torch_imported"]

STATE_VERSION = 2
# Version 1 lacks the epoch's re-splits (elastic resume): it reads as an epoch never re-split.
READ_VERSIONS = (1, 2)
_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a bijection of 64-bit integers that scatters nearby inputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def torch_imported() -> bool:
    """Whether torch is imported here (spindle never imports it): then its CPU generator is reseeded too."""
    return "torch" in sys.modules


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The 64-bit seed of sample `index` in `epoch` of a loader seeded with `seed`."""
    return _mix(_mix(_mix(seed & _MASK) ^ (epoch & _MASK)) ^ (index & _MASK))


def batch_seed(seed: int, epoch: int, indices: Any) -> int:
    """The 64-bit seed of the batch made of sample `indices` (in order) in `epoch` of a loader seeded
    with `seed`: its indices as little-endian int64, hashed (BLAKE2b, 8 bytes), mixed as in sample_seed."""
    digest = hashlib.blake2b(np.asarray(indices, dtype="<i8").tobytes(), digest_size=8).digest()
    return _mix(_mix(_mix(seed & _MASK) ^ (epoch & _MASK)) ^ int.from_bytes(digest, "little"))


def _seed_generators(s: int, torch_cpu: bool) -> None:
    random.seed(s)
    np.random.seed(s & 0xFFFFFFFF)
    if torch_cpu:
        sys.modules["torch"].default_generator.manual_seed(s >> 1)  # torch wants a seed below 2**63


class BatchSeeds:
    """``spindle.DataLoader``'s random streams: before each batch, the worker calls this with the
    batch's sample indices, which seeds ``random``, numpy's global generator (and, with
    ``torch_cpu``, torch's default CPU generator) from ``batch_seed(seed, epoch, indices)``; the
    batch's samples then draw in order.

    A batch is made of the same samples whatever the worker count or mode, and after a resume
    (batches are cut from the epoch's order before any worker sees them), so its draws are the
    same too. Seeding is paid once a batch rather than once a sample: it costs several times a tiny
    in-memory sample (bench/python/reseed_bench.py, docs/benchmarks.md)."""

    def __init__(self, seed: int, epoch: "int | EpochCell", torch_cpu: bool = False) -> None:
        self._seed = seed
        self._epoch = epoch
        self._torch = bool(torch_cpu)

    def __call__(self, indices: Any) -> None:
        epoch = self._epoch if isinstance(self._epoch, int) else self._epoch.get()
        _seed_generators(batch_seed(self._seed, epoch, indices), self._torch)


class Reseeded:
    """The dataset as workers see it when per-sample randomness must not depend on the worker:
    ``dataset[i]`` runs after ``random``, numpy's global generator (and, with ``torch_cpu``,
    torch's default CPU generator) are seeded from ``sample_seed(seed, epoch, i)``.

    So a sample draws the same augmentation whichever worker loads it, and a loader resumed
    with another worker count draws what the uninterrupted run drew. The same sample index
    twice in one epoch (padding, sampling with replacement) draws alike."""

    def __init__(self, dataset: Any, seed: int, epoch: "int | EpochCell", torch_cpu: bool = False) -> None:
        self.dataset = dataset
        self._seed = _mix(seed & _MASK)
        self._epoch = epoch
        self._key = -1
        self._key_epoch = -1
        # torch's default CPU generator, looked up in the worker (a Generator does not pickle for
        # spawned workers); torch.manual_seed would also walk CUDA/MPS/XPU at every call.
        self._torch = bool(torch_cpu)

    def __getitem__(self, index: Any) -> Any:
        epoch = self._epoch if isinstance(self._epoch, int) else self._epoch.get()
        if epoch != self._key_epoch:
            self._key, self._key_epoch = _mix(self._seed ^ (epoch & _MASK)), epoch
        _seed_generators(_mix(self._key ^ (int(index) & _MASK)), self._torch)
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class EpochCell:
    """The epoch number in 8 bytes of anonymous shared memory, inherited by forked workers:
    persistent workers read the epoch the consumer set before it handed them the epoch's
    order (the runtime's queue orders the write before their claims)."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 8)

    def set(self, epoch: int) -> None:
        self._map[:8] = int(epoch).to_bytes(8, "little")

    def get(self) -> int:
        return int.from_bytes(self._map[:8], "little")


class Position:
    """How far an epoch's iterator got: kept by the loader (not the iterator itself, so that
    dropping the iterator still stops its workers)."""

    def __init__(self, epoch: int, yielded: int, resplits: Any = ()) -> None:
        self.epoch = epoch
        self.yielded = yielded  # batches of this epoch handed out, counting those skipped on resume
        self.resplits = resplits  # the epoch's earlier re-splits (spindle._state.elastic), () if none
        self.finished = False


class Progress:
    """An epoch's iterator that counts the batches it hands out into a :class:`Position`."""

    def __init__(self, it: Iterator[Any], position: Position) -> None:
        self._it = it
        self.position = position

    def __iter__(self) -> "Progress":
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            self.position.finished = True
            raise
        self.position.yielded += 1
        return batch

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_it":
            raise AttributeError(name)
        return getattr(self._it, name)


def shard_field(shard: Any) -> dict[str, Any]:
    """The ``shard`` field of a state: [rank, world_size] of a Shard, or None unsharded."""
    return dict(shard=None if shard is None else [shard.rank, shard.world_size])


def mid_epoch_out_of_order() -> ValueError:
    """The error of a state asked for mid-epoch while batches are handed out of order."""
    return ValueError("spindle: state_dict() mid-epoch needs in_order=True: out of order, the batches handed "
                      "out are not a prefix of the epoch, so no position resumes it")


def new_state(fmt: str, **fields: Any) -> dict[str, Any]:
    """A state dict of format `fmt` at the current version."""
    return {"format": fmt, "version": STATE_VERSION, **fields}


def check_state(state: Mapping[str, Any], fmt: str, expected: Mapping[str, Any]) -> None:
    """Refuses a state of another format or version, or made for another dataset/loader setting
    (each key of `expected` must match), naming what differs and what to do."""
    if not isinstance(state, Mapping) or state.get("format") != fmt:
        found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"spindle: this is not a {fmt} state (its format is {found!r}); pass the dict "
                         f"that {fmt}.state_dict() returned")
    if state.get("version") not in READ_VERSIONS:
        raise ValueError(f"spindle: {fmt} state version {state.get('version')!r} is not supported by this "
                         f"spindle (it reads versions {', '.join(map(str, READ_VERSIONS))})")
    wrong = [f"{key}: state has {state.get(key)!r}, this loader {value!r}" for key, value in expected.items()
             if _jsonish(state.get(key)) != _jsonish(value)]
    if wrong:
        raise ValueError(f"spindle: the {fmt} state was saved by a loader set up differently, so the batches "
                         f"after resuming would not be the ones it would have yielded ({'; '.join(wrong)}). "
                         "Build the loader with the same dataset and settings as the one that saved it.")


def dataset_key(dataset: Any) -> dict[str, Any]:
    """The ``dataset`` setting of a loader's state: what a dataset says a state must match to resume
    it mid-epoch (``spindle.mix``: its sources' lengths, weights, seed and shuffle), else nothing."""
    key = getattr(dataset, "spindle_state_key", None)
    return {"dataset": key()} if callable(key) else {}


def _jsonish(value: Any) -> Any:
    """Tuples and lists compare alike (a state read back from JSON has lists)."""
    if isinstance(value, (tuple, list)):
        return [_jsonish(v) for v in value]
    return value


def bytes_to_json(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def json_to_bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))
