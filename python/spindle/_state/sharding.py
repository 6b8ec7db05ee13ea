"""Rank sharding: which part of each epoch's global order this process loads.

Every rank draws the same global order (one shuffle per epoch from the same
seed) and keeps every ``world``-th sample starting at its ``rank``, exactly as
``torch.utils.data.DistributedSampler`` does: with ``drop_last=False`` the
order is padded by repeating its start until it divides evenly (every rank gets
the same number of samples, so collectives stay in step); with
``drop_last=True`` its tail is cut instead. The parts are disjoint (but for the
padding) and their union is the whole order.

``shard="auto"`` finds the rank and the world size the way the job was started:
torch.distributed if it is initialized, else JAX's process index and count
(only if JAX is already imported and runs more than one process), else the
environment of torchrun (``RANK``/``WORLD_SIZE``), Slurm
(``SLURM_PROCID``/``SLURM_NTASKS``) or Open MPI
(``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``); none of these means one
process (rank 0 of 1). Nothing here imports torch or JAX.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Optional

import numpy as np

__all__ = ["Shard", "resolve_shard", "cut_order", "shard_order", "shard_list"]

# (rank variable, world size variable, launcher) in the order they are tried.
_ENVIRONMENTS = (
    ("RANK", "WORLD_SIZE", "torchrun / torch.distributed"),
    ("SLURM_PROCID", "SLURM_NTASKS", "Slurm"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
)


@dataclasses.dataclass(frozen=True)
class Shard:
    """This process's place among the ranks: ``rank`` in ``[0, world_size)``, and where that came from."""

    rank: int
    world_size: int
    source: str = "explicit"


def resolve_shard(shard: Any) -> Optional[Shard]:
    """None (no sharding), ``"auto"``, or ``(rank, world_size)`` -> a checked :class:`Shard` or None."""
    if shard is None:
        return None
    if isinstance(shard, Shard):
        return _checked(shard.rank, shard.world_size, shard.source)
    if isinstance(shard, str):
        if shard != "auto":
            raise ValueError(f"shard should be None, 'auto' or (rank, world_size), but got shard={shard!r}")
        return _auto()
    try:
        rank, world = shard
    except (TypeError, ValueError):
        raise ValueError(f"shard should be None, 'auto' or (rank, world_size), but got shard={shard!r}") from None
    return _checked(rank, world, "explicit")


def _checked(rank: Any, world: Any, source: str) -> Shard:
    for name, value in (("rank", rank), ("world_size", world)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"shard: {name} should be an integer, but got {name}={value!r} (from {source})")
    rank, world = int(rank), int(world)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"shard: need 0 <= rank < world_size, but got rank={rank}, world_size={world} "
                         f"(from {source})")
    return Shard(rank, world, source)


def _auto() -> Shard:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return _checked(dist.get_rank(), dist.get_world_size(), "torch.distributed")
    jax = sys.modules.get("jax")
    if jax is not None:
        count = jax.process_count()
        if count > 1:
            return _checked(jax.process_index(), count, "jax.process_index()/process_count()")
    for rank_var, world_var, launcher in _ENVIRONMENTS:
        if rank_var in os.environ and world_var in os.environ:
            source = f"${rank_var}/${world_var} ({launcher})"
            try:
                rank, world = int(os.environ[rank_var]), int(os.environ[world_var])
            except ValueError:
                raise ValueError(f"shard='auto': {source} are not integers: {rank_var}={os.environ[rank_var]!r}, "
                                 f"{world_var}={os.environ[world_var]!r}") from None
            return _checked(rank, world, source)
    return Shard(0, 1, "no distributed launcher found: one process")


def cut_order(order: np.ndarray, world: int, drop_last: bool,
              pad_from: Optional[np.ndarray] = None) -> np.ndarray:
    """The order cut (drop_last) or padded to a multiple of `world`, as DistributedSampler does: the
    padding repeats `pad_from` (the order itself by default) from its start, cyclically."""
    n = len(order)
    if drop_last and n % world:
        return order[:n // world * world]
    padding = -n % world
    if padding and n:
        source = order if pad_from is None or not len(pad_from) else pad_from
        order = np.concatenate([order, np.resize(source, padding)])
    return order


def shard_order(order: np.ndarray, shard: Optional[Shard], drop_last: bool,
                pad_from: Optional[np.ndarray] = None) -> np.ndarray:
    """This rank's part of the epoch's global `order`, as DistributedSampler cuts it (the padding
    from `pad_from`'s start: the epoch's whole order when `order` is what remains of it)."""
    if shard is None:
        return order
    return np.ascontiguousarray(cut_order(order, shard.world_size, drop_last, pad_from)[shard.rank::shard.world_size])


def shard_list(items: list[Any], shard: Optional[Shard], what: str) -> list[Any]:
    """Items rank, rank + world, ... (WebDataset shards by rank); refuses a rank that would get none."""
    if shard is None:
        return items
    if len(items) < shard.world_size:
        raise ValueError(f"spindle: {len(items)} {what} cannot be split across {shard.world_size} ranks "
                         f"(rank {shard.rank} would get none); give at least one per rank, or split them "
                         "into more files")
    return items[shard.rank::shard.world_size]
