"""A map-style loader's epochs: their orders, the seed they come from, their length, and the
position a checkpoint holds.

``spindle.DataLoader`` and ``spindle.PipelineLoader`` walk their epochs the same way: epoch
``e``'s global order is a permutation drawn from ``(entropy, e)`` (or ``arange`` without
shuffle), every rank draws the same and keeps its part (``rank_part``: DistributedSampler's cut,
after an elastic resume's re-splits), and a checkpoint is the epoch, the batches of it handed
out and its re-splits. :class:`EpochPlan` is the one owner of those facts; the fronts say what
a state must match (their settings) and run the epochs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sized

import numpy as np

from .checkpoint import Position, mid_epoch_out_of_order, new_state, shard_field
from .elastic import Resplit, load_position, rank_part, resplits_json, stream_resume_check
from .sharding import Shard

__all__ = ["EpochPlan"]


@dataclasses.dataclass(eq=False)
class EpochPlan:
    """The epochs of a loader over ``len(samples)`` samples in batches of `batch_size`.

    `seed` None draws the order's entropy once per plan (0 when sharded: every rank must draw the
    same order, as DistributedSampler's default seed is). ``epoch`` is the epoch the next
    :meth:`begin` runs; ``position`` is where the last begun epoch's iterator stands."""

    samples: Sized = dataclasses.field(repr=False)  # asked at each use: a dataset's length when needed
    batch_size: int
    _: dataclasses.KW_ONLY
    shuffle: bool
    seed: Optional[int]
    shard: Optional[Shard]
    shard_drop_last: bool
    drop_last: bool
    entropy: int = dataclasses.field(init=False)
    epoch: int = dataclasses.field(init=False, default=0)
    position: Optional[Position] = dataclasses.field(init=False, default=None)
    _skip: int = dataclasses.field(init=False, default=0)  # batches of the next epoch to skip (load)
    # the next epoch's earlier re-splits (an elastic resume)
    _resplits: tuple[Resplit, ...] = dataclasses.field(init=False, default=())

    def __post_init__(self) -> None:
        if self.seed is not None:
            self.entropy = int(self.seed)
        else:
            self.entropy = 0 if self.shard is not None else int(np.random.SeedSequence().entropy % 2**63)

    # --- lengths and orders -------------------------------------------------
    def samples_per_rank(self) -> int:
        n = len(self.samples)
        if self.shard is None:
            return n
        world = self.shard.world_size
        return n // world if self.shard_drop_last else -(-n // world)

    def __len__(self) -> int:
        """Batches of an epoch on this rank."""
        n = self.samples_per_rank()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _draw(self, epoch: int) -> tuple[np.ndarray, np.random.Generator]:
        n = len(self.samples)
        rng = np.random.default_rng([self.entropy, epoch])
        return (rng.permutation(n) if self.shuffle else np.arange(n)), rng

    def global_order(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s order of all samples (every rank draws the same)."""
        return self._draw(epoch)[0]

    def order(self, epoch: int, resplits: tuple[Resplit, ...] = ()) -> tuple[np.ndarray, int]:
        """This rank's order of epoch `epoch` (int64; with drop_last, its tail cut to whole batches)
        and a seed drawn after it from the same generator (the base of spindle.DataLoader's
        per-worker seeds)."""
        order, rng = self._draw(epoch)
        order = rank_part(order, resplits, self.shard, self.shard_drop_last)
        if self.drop_last:
            order = order[:len(order) - len(order) % self.batch_size]
        return np.ascontiguousarray(order, dtype=np.int64), int(rng.integers(0, 2**62))

    # --- running epochs -------------------------------------------------------
    def begin(self) -> Position:
        """Starts the next epoch (where a loaded state resumes, if one was loaded): its position,
        counting the batches it hands out from those a resume skips."""
        self.position = Position(self.epoch, self._skip, self._resplits)
        self.epoch += 1
        self._skip, self._resplits = 0, ()
        return self.position

    # --- checkpoints -----------------------------------------------------------
    def state(self, fmt: str, fields: Mapping[str, Any], *, exact_mid_epoch: bool = True) -> dict[str, Any]:
        """A state of format `fmt`: the epoch, the batches of it handed out and its re-splits, then
        `fields` (the settings a resume must match, the shard), in the order given.

        Taken mid-epoch, it resumes after the last batch handed out; taken after an epoch ended
        (or before any), at the start of the next one. `exact_mid_epoch` False (batches delivered
        out of order) refuses a state mid-epoch: no position would resume it."""
        position = self.position
        if position is None or position.finished:
            epoch, batches, resplits = self.epoch, self._skip, self._resplits
        else:
            if not exact_mid_epoch:
                raise mid_epoch_out_of_order()
            epoch, batches, resplits = position.epoch, position.yielded, position.resplits
        return new_state(fmt, epoch=epoch, batches=batches, resplits=resplits_json(resplits), **fields)

    def load(self, state: Any, fmt: str, settings: Callable[[], Mapping[str, Any]], *, stream: bool = False) -> None:
        """Makes the next :meth:`begin` resume where `state` (one state, or every old rank's) stands,
        checked against ``settings()``. Without a seed of its own, the plan first takes the state's
        entropy (so the settings, read after, hold it).
        A `stream` (read by shard file, not by index) resumes mid-epoch at its own world size only."""
        first = state[0] if isinstance(state, (list, tuple)) and state else state
        if self.seed is None and isinstance(first, dict) and isinstance(first.get("seed"), int):
            self.entropy = first["seed"]  # no seed of its own: the state's entropy is the order's
        if stream:
            stream_resume_check(state, fmt, self.shard)
        self.epoch, self._resplits, self._skip = load_position(
            state, fmt, settings(), self.shard, self.shard_drop_last, self.batch_size, self.global_order)
        self.position = None

    def shard_field(self) -> dict[str, Any]:
        """The ``shard`` field of a state: [rank, world_size], or None unsharded."""
        return shard_field(self.shard)
