"""Elastic resume: continue an epoch on another number of ranks, every sample of it once.

An epoch has one global order G (from the seed and the epoch). A sharded run at world size W
cuts G as DistributedSampler does (padded from G's start, or its tail dropped, to a multiple
of W) and rank r takes every W-th sample from r on. A state records where its rank stands:
the epoch, the batches it handed out, its shard, the sharding rule, and the earlier
*re-splits* of the epoch (below). That is all a loader at another world size needs:

- **What was consumed.** Rank r of W consumed the first ``c_r = min(batches_r * batch_size,
  len(part_r))`` samples of its part. With one state, the ranks are taken to have advanced in
  lock step (DDP: every rank takes a step per batch, and often rank 0 alone saves), so every
  ``c_r`` is that rank's; with the list of every old rank's state, each its own.
- **What remains.** The samples of G that no rank consumed, in G's order.
- **The re-split.** The remainder is cut over the new W' ranks by the same rule (padding from
  G's start, or dropping the tail), applied once to what remains, and rank r' takes every
  W'-th sample from r' on. So across the old ranks' consumed samples and the new ranks' parts,
  every sample of the epoch comes once (the padding repeats some, as DistributedSampler's
  does; dropping leaves up to W' - 1 out).

A state saved after a re-split lists it (world size and each rank's consumed samples), so an
epoch may be re-split again; the next epoch is a fresh one at the new world size. With the
same world size the remainder's cut is exactly the old ranks' parts less their consumed
samples: the loader resumes as without elasticity (each rank from its own state, or in lock
step from any one).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from .checkpoint import check_state
from .sharding import Shard, cut_order, shard_order

__all__ = ["Resplit", "Resume", "read_resume", "rank_part", "resolve", "resplits_json", "load_position", "stream_resume_check"]


@dataclasses.dataclass(frozen=True)
class Resplit:
    """An earlier stretch of the epoch: `world_size` ranks, rank r consumed ``consumed[r]``
    samples of its part of what remained then."""

    world_size: int
    consumed: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Resume:
    """A loaded position: the epoch, its earlier re-splits, and the saving ranks' progress
    (``batches[r]`` for each old rank, or ``lock_step`` for all of them)."""

    epoch: int
    resplits: tuple[Resplit, ...]
    world_size: int
    batches: Mapping[int, int]
    lock_step: Optional[int]

    def of_rank(self, rank: int) -> int:
        return self.lock_step if self.lock_step is not None else self.batches[rank]


def resplits_json(resplits: Sequence[Resplit]) -> list[dict[str, Any]]:
    return [{"world_size": r.world_size, "consumed": list(r.consumed)} for r in resplits]


def _resplits(state: Mapping[str, Any], fmt: str) -> tuple[Resplit, ...]:
    found = []
    for entry in state.get("resplits") or ():
        try:
            world, consumed = int(entry["world_size"]), tuple(int(c) for c in entry["consumed"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"spindle: the {fmt} state's resplits entry {entry!r} is not "
                             "{'world_size': int, 'consumed': [int, ...]}; pass the dict state_dict() returned") from None
        if len(consumed) != world:
            raise ValueError(f"spindle: the {fmt} state's resplits entry {entry!r} lists {len(consumed)} ranks' "
                             f"counts for world_size {world}")
        found.append(Resplit(world, consumed))
    return tuple(found)


def _shard_of(state: Mapping[str, Any], fmt: str) -> tuple[int, int]:
    shard = state.get("shard")
    if shard is None:
        return 0, 1  # unsharded: rank 0 of 1
    try:
        rank, world = (int(v) for v in shard)
    except (TypeError, ValueError):
        raise ValueError(f"spindle: the {fmt} state's shard {shard!r} is not [rank, world_size]") from None
    return rank, world


def read_resume(states: Any, fmt: str, batches_key: str = "batches") -> Resume:
    """The position in one state, or in the list of every old rank's states (checked: one epoch,
    one world size, each rank once, the same earlier re-splits), each already checked by the caller."""
    if isinstance(states, Mapping):
        _, world = _shard_of(states, fmt)
        return Resume(int(states["epoch"]), _resplits(states, fmt), world, {}, int(states[batches_key]))
    states = list(states)
    if not states:
        raise ValueError(f"spindle: load_state_dict got an empty list; pass one {fmt} state, or every rank's")
    shards = [_shard_of(s, fmt) for s in states]
    worlds = sorted({w for _, w in shards})
    if len(worlds) > 1:
        raise ValueError(f"spindle: the {fmt} states are of different world sizes {worlds} (shards {shards}); "
                         "pass the states that the ranks of one run saved at the same step")
    world = worlds[0]
    ranks = [r for r, _ in shards]
    missing = sorted(set(range(world)) - set(ranks))
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if missing or twice:
        raise ValueError(f"spindle: {len(states)} {fmt} states for world size {world}: ranks {missing} missing, "
                         f"ranks {twice} twice; pass every rank's state once, or one state if the ranks advanced "
                         "in lock step")
    for key, values in (("epoch", [int(s["epoch"]) for s in states]),
                        ("resplits", [_resplits(s, fmt) for s in states])):
        if len(set(values)) > 1:
            shown = ", ".join(f"rank {r}: {v!r}" for r, v in zip(ranks, values))
            raise ValueError(f"spindle: the {fmt} states differ in {key} ({shown}); pass the states that the "
                             "ranks of one run saved at the same step")
    return Resume(int(states[0]["epoch"]), _resplits(states[0], fmt), world,
                  {r: int(s[batches_key]) for r, s in zip(ranks, states)}, None)


def _consume(order: np.ndarray, remaining: np.ndarray, split: Resplit, drop_last: bool) -> np.ndarray:
    """What remains of `remaining` after `split`'s ranks consumed the first samples of their parts."""
    world = split.world_size
    cut = cut_order(remaining, world, drop_last, pad_from=order)
    positions = np.arange(len(cut))
    counts = np.asarray(split.consumed, dtype=np.int64)
    taken = cut[positions // world < counts[positions % world]]
    size = int(max(order.max(initial=-1), remaining.max(initial=-1))) + 1
    consumed = np.zeros(size, dtype=bool)
    consumed[taken] = True
    return remaining[~consumed[remaining]]


def rank_part(order: np.ndarray, resplits: Sequence[Resplit], shard: Optional[Shard], drop_last: bool) -> np.ndarray:
    """This rank's part of the epoch whose global order is `order`, after the epoch's earlier
    re-splits (none: exactly shard_order's cut)."""
    remaining = order
    for split in resplits:
        remaining = _consume(order, remaining, split, drop_last)
    return shard_order(remaining, shard, drop_last, pad_from=order)


def resolve(global_order: Callable[[int], np.ndarray], resume: Resume, shard: Optional[Shard], drop_last: bool,
            batch_size: int) -> tuple[tuple[Resplit, ...], int]:
    """Where this rank (`shard`) resumes the epoch whose global order is ``global_order(epoch)``: the
    epoch's re-splits so far (rank_part cuts this rank's part from them) and the batches of the part
    to skip."""
    here = shard or Shard(0, 1)
    if resume.world_size == here.world_size:
        # The same ranks: each continues its own part (today's resume, also from its own state).
        return resume.resplits, resume.of_rank(here.rank)
    order = global_order(resume.epoch)
    remaining = order
    for split in resume.resplits:
        remaining = _consume(order, remaining, split, drop_last)
    world = resume.world_size
    per_rank = len(remaining) // world if drop_last else -(-len(remaining) // world)  # every old rank's
    consumed = tuple(min(resume.of_rank(r) * batch_size, per_rank) for r in range(world))
    if not any(consumed):
        return resume.resplits, 0  # nothing consumed since: the remainder is cut afresh
    return resume.resplits + (Resplit(world, consumed),), 0


_FREE_AT_EPOCH_START = ("samples", "dataset")


def load_position(states: Any, fmt: str, settings: Mapping[str, Any], shard: Optional[Shard], drop_last: bool,
                  batch_size: int, global_order: Callable[[int], np.ndarray]) -> tuple[int, tuple[Resplit, ...], int]:
    """A loader's load_state_dict: `states` (one state, or every old rank's) checked against the loader's
    `settings` (all but the shard, which may differ) -> (epoch, its re-splits, batches of this rank's part to skip).

    A state at the start of an epoch (no batch of it handed out) holds no position in the data: the
    dataset may differ (its length, a mix's weights), the epoch number carries over."""
    listed = [states] if isinstance(states, Mapping) or not isinstance(states, (list, tuple)) else list(states)
    for state in listed:
        if isinstance(state, Mapping) and state.get("batches") == 0 and not state.get("resplits"):
            check_state(state, fmt, {k: v for k, v in settings.items() if k not in _FREE_AT_EPOCH_START})
        else:
            check_state(state, fmt, settings)
    resume = read_resume(states, fmt)
    resplits, skip = resolve(global_order, resume, shard, drop_last, batch_size)
    return resume.epoch, resplits, skip


def stream_resume_check(states: Any, fmt: str, shard: Optional[Shard]) -> None:
    """Refuses a mid-epoch state of a stream (a WebDataset) from another world size, saying why."""
    here = (shard or Shard(0, 1)).world_size
    listed = [states] if isinstance(states, Mapping) or not isinstance(states, (list, tuple)) else list(states)
    for state in listed:
        if not isinstance(state, Mapping):
            return  # check_state names what it is
        rank, world = _shard_of(state, fmt)
        if world != here and (state.get("batches") or state.get("resplits")):
            raise ValueError(
                f"spindle: this WebDataset state was saved mid-epoch by rank {rank} of {world} (after "
                f"{state.get('batches')} batches of epoch {state.get('epoch')}), and this loader has world size "
                f"{here}. A stream is split by shard file and read in order, so what the old ranks consumed is a "
                "count of batches within each rank's files, not a set of samples that a new split could leave "
                f"out. Resume this epoch with world size {world}, or from a state taken at an epoch's end "
                "(it loads at any world size).")
