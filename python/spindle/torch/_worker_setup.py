"""What a spindle.torch worker does before reading data, as torch's worker loop does it: seeds,
get_worker_info(), a DataPipe's sharding, then worker_init_fn; and torch's collate writing into the slot."""

from __future__ import annotations

import pickle
import random
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.graph_settings import apply_random_seed, apply_sharding

from .._runtime.worker import keep_per_logical_worker
from . import _compat
from ._transport import stack_into_slot


def reseed_stream(message: bytes, *, dataset: Any) -> None:
    """In a persistent stream worker, before a new epoch's iter(dataset): a DataPipe takes the
    epoch's shared seed (torch's _ResumeIteration)."""
    shared_seed = pickle.loads(message)
    if shared_seed is not None:
        apply_random_seed(dataset, torch.Generator().manual_seed(shared_seed))


def setup_torch_worker(worker_id: int, num_workers: int, *, base_seed: int, dataset: Any,
                        worker_init_fn: Optional[Callable[[int], None]], shared_seed: Optional[int] = None) -> None:
    """What torch's worker loop does before reading data: one intra-op thread,
    per-worker seeds for random/torch/numpy, an IterDataPipe's shared seed,
    get_worker_info(), a DataPipe's sharding by worker, the init hook."""
    torch.set_num_threads(1)
    seed = base_seed + worker_id
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_compat.generate_state(base_seed, worker_id))
    if shared_seed is not None:  # in place: the stream iterates this same object
        apply_random_seed(dataset, torch.Generator().manual_seed(shared_seed))
    _compat.set_worker_info(worker_id, num_workers, seed, dataset)
    if isinstance(dataset, (IterDataPipe, MapDataPipe)):  # torch's _sharding_worker_init_fn, one process group
        apply_sharding(dataset, num_workers, worker_id)
    _collate_into_the_slot()
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def _collate_into_the_slot() -> None:
    """In a worker, torch's default_collate stacks tensors into a new torch shared-memory segment
    per batch (it checks get_worker_info()), which torch's pipe then passes on. spindle's stack
    writes into the slot of the batch being collated instead (stack_into_slot), so the batch is
    written once and travels in place. Where that cannot run the stack runs as outside a worker,
    into the heap, not a fresh mmap whose pages fault in again for every batch (glibc's threshold
    for that stops at 32 MiB)."""

    def make(torch_fn: Callable[..., Any]) -> Callable[..., Any]:
        def stack(batch: Any, *, collate_fn_map: Any = None) -> Any:
            stacked = stack_into_slot(batch)
            if stacked is not None:
                return stacked
            info = _compat.worker_info()
            _compat.put_worker_info(None)
            try:
                return torch_fn(batch, collate_fn_map=collate_fn_map)
            finally:
                _compat.put_worker_info(info)
        return stack

    _compat.patch_collate_tensor_fn(make)
    _heap_not_mmap()


def _heap_not_mmap() -> None:
    """glibc's malloc keeps large blocks on the heap (no fresh mmap per batch to fault in again)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


# What get_worker_info() returns is one per logical worker when several share a process.
keep_per_logical_worker(_compat.worker_info, _compat.put_worker_info)
