"""spindle.grain: grain's multi-process loading on spindle's workers.

- ``DataLoader(data_source=, sampler=, operations=, worker_count=, ...)``: grain's
  own ``grain.DataLoader`` builds and validates the pipeline (with no workers of
  its own); spindle runs it with ``worker_count`` forked, single-threaded workers.
- ``mp_prefetch(ds, options)``: the same for a dataset-API pipeline, in place of
  ``ds.mp_prefetch(options)``.

As in grain, worker *w* runs the pipeline over the records at positions
``w, w + N, w + 2N, ...`` (grain's own slicing), and elements come from the
workers in turn, skipping workers whose slice is exhausted: the same elements
in the same order as grain. Unlike grain, a worker reads without a thread
pool (grain's ReadOptions.num_threads, 16 by default, is set to 0 in the
workers): parallelism comes from the workers. Elements travel through spindle's shared ring as
pickled pytrees (no pipes, no queue threads); the thread tree is the
consumer's own threads + one per worker.

Not yet: ``get_state``/``set_state`` (checkpointing), zero-copy transport of
batched arrays (docs/torch_dropin.md lists what the torch drop-in does).
"""

from __future__ import annotations

import dataclasses
import pickle
from functools import partial
from typing import Any, Callable, Iterator, Optional

import numpy as np
import grain
from grain._src.python.dataset.transformations import prefetch as _grain_prefetch

from . import _core
from ._probe import forking, run_forked
from ._worker import PickledBatches, run_stream_worker
from .dataloader import _WorkerIterator

__all__ = ["DataLoader", "mp_prefetch"]

_MIN_SLOT = 64 * 1024


def mp_prefetch(ds: Any, options: Optional[Any] = None,
                worker_init_fn: Optional[Callable[[int, int], None]] = None,
                sequential_slice: bool = False) -> "_Prefetched":
    """Runs `ds` (a grain IterDataset) in spindle workers, like ``ds.mp_prefetch(options)``."""
    options = options or grain.multiprocessing.MultiprocessingOptions(num_workers=10)
    if options.num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {options.num_workers}")
    return _Prefetched(ds, options.num_workers, max(1, options.per_worker_buffer_size), worker_init_fn,
                       sequential_slice)


class _Prefetched:
    """An iterable over a grain pipeline run by spindle workers; each iter() is a fresh pass."""

    def __init__(self, ds: Any, num_workers: int, buffer_size: int,
                 worker_init_fn: Optional[Callable[[int, int], None]], sequential_slice: bool) -> None:
        self._ds = ds
        self._num_workers = num_workers
        self._buffer_size = buffer_size
        self._worker_init_fn = worker_init_fn
        self._sequential_slice = sequential_slice

    def __iter__(self) -> Iterator[Any]:
        if self._num_workers == 0:
            return iter(self._ds)
        n = self._num_workers
        setup = partial(_slice_for_worker, ds=self._ds, sequential_slice=self._sequential_slice,
                        worker_init_fn=self._worker_init_fn)
        slot_bytes = run_forked(partial(_probe_slot_bytes, self._ds, setup, n))
        pickled = PickledBatches(lambda elements: elements[0], slot_bytes)
        body = partial(run_stream_worker, dataset=_WorkerSlice(), layout=pickled, setup=setup, batch_size=1,
                       drop_last=False)
        with forking():
            runtime = _core.Loader(
                order=np.empty(0, np.int64), round_robin=True, worker_main=lambda ctx: body(ctx),
                num_workers=n, batch_capacity=1, slot_bytes=slot_bytes, prefetch_factor=self._buffer_size,
                in_order=True)
        return _WorkerIterator(runtime, pickled.read, owns=True)


class _WorkerSlice:
    """Iterates the worker's slice of the pipeline, set up by _slice_for_worker in that worker."""

    dataset: Any = None

    def __iter__(self) -> Iterator[Any]:
        return iter(_WorkerSlice.dataset)


def _slice_for_worker(worker_id: int, num_workers: int, *, ds: Any, sequential_slice: bool,
                      worker_init_fn: Optional[Callable[[int, int], None]]) -> None:
    """In a worker (a fork, so `ds` is already this process's own copy): keep records
    worker_id, worker_id + N, ... exactly as grain slices for its own workers."""
    if worker_init_fn is not None:
        worker_init_fn(worker_id, num_workers)
    _grain_prefetch._set_slice_iter_dataset(ds, slice(worker_id, None, num_workers), sequential_slice)
    _read_in_this_thread(ds)
    _WorkerSlice.dataset = ds


def _read_in_this_thread(ds: Any) -> None:
    """Sets every read stage of the worker's pipeline to read without threads.

    grain's reads run in a pool of ReadOptions.num_threads (16 by default) in
    every worker: 16 workers x 16 threads is the thread explosion spindle
    exists to prevent. A spindle worker is one thread; parallelism comes from
    the workers. The order of elements does not depend on read threads.
    """
    seen, stack = set(), [ds]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        options = getattr(node, "_read_options", None)
        if isinstance(options, grain.ReadOptions) and options.num_threads != 0:
            node._read_options = dataclasses.replace(options, num_threads=0)
        stack.extend(getattr(node, "parents", ()))


def _probe_slot_bytes(ds: Any, setup: Callable[[int, int], None], num_workers: int) -> int:
    """In a throwaway fork, as worker 0: twice the pickled size of its first element (>= 64 KiB)."""
    setup(0, num_workers)
    for element in _WorkerSlice.dataset:
        size = len(pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))
        return max(_MIN_SLOT, 2 * size + PickledBatches.HEADER)
    return _MIN_SLOT


class DataLoader:
    """``grain.DataLoader`` with spindle's workers; same keyword-only arguments."""

    def __init__(self, *, data_source: Any, sampler: Any, operations: Any = (), worker_count: Optional[int] = 0,
                 worker_buffer_size: int = 1, shard_options: Any = None, read_options: Any = None,
                 enable_profiling: bool = False) -> None:
        if worker_count and worker_count < 0:
            raise ValueError("Worker count should be greater than or equal zero."
                             f"Current worker_count is {worker_count}.")
        # grain validates the arguments and builds the pipeline, without workers.
        self._grain = grain.DataLoader(
            data_source=data_source, sampler=sampler, operations=operations, worker_count=0,
            worker_buffer_size=worker_buffer_size, shard_options=shard_options, read_options=read_options,
            enable_profiling=enable_profiling)
        self._worker_count = worker_count or 0
        self._buffer_size = max(1, worker_buffer_size)

    def __iter__(self) -> Iterator[Any]:
        if self._worker_count == 0:
            return iter(self._grain)
        # grain's pipeline for 0 workers is marker(state(pipeline)); run `pipeline` in our workers.
        pipeline = self._grain._dataset._parent._parent
        return iter(_Prefetched(pipeline, self._worker_count, self._buffer_size, None, False))
