"""spindle's workers for a grain before 0.2.17, whose DataLoader and ``mp_prefetch`` both run through
grain's pool (``grain_pool.MultiProcessIterator``): a producer function per worker, elements in turn.

:class:`Pool` keeps that contract on spindle's workers. Worker *w* runs the function grain's own worker
*w* would run, ``get_element_producer_fn(worker_index=w, worker_count=n)``, after ``worker_init_fn(w, n)``;
the elements come from the workers in turn from ``worker_index_to_start_reading``, skipping workers whose
producer has ended, and :meth:`get_last_worker_index` names the worker of the last one, which is what
grain's iterators record in their checkpoints. Everything around the pool (the state, the checkpoint
format, grain's shared-memory arrays) is grain's own: ``_compat.pool_fronts`` puts the pool in grain's
iterators. Unlike grain's pool (a reader thread, a thread pool as large as the buffer, a queue's feeder
thread per worker, spawned interpreters), the consumer runs no thread for it, and each worker reads
without grain's read threads.
"""

from __future__ import annotations

from multiprocessing import resource_tracker
from functools import partial
from typing import Any, Callable, Iterator, Optional

import numpy as np

from . import _compat
from ._elements import ArrayElements, first_row
from .._runtime.epoch import EpochIterator
from .._runtime.layout import BatchReader
from .._runtime.stats import StatsBook
from .._runtime.start import StartSpec, start
from .._runtime.worker import batch_decoder, copy_per_logical_worker, current_logical_worker, run_stream_worker


class Pool(_compat.pool_base()):  # type: ignore[misc]  # grain's class: its iterators check isinstance
    """``grain_pool.MultiProcessIterator`` (grain 0.2.12-0.2.16) on spindle's workers; a context manager,
    as grain's. grain's profiling events and statistics queues are accepted and not used."""

    def __init__(self, get_element_producer_fn: Any, multiprocessing_options: Any, worker_index_to_start_reading: int,
                 worker_init_fn: Optional[Callable[[int, int], None]] = None, *_grain_only: Any,
                 stats: Optional[StatsBook] = None, **_grain_only_named: Any) -> None:
        # grain's __init__ is not run: nothing of grain's reader is made.
        self._producer = get_element_producer_fn
        self._n = multiprocessing_options.num_workers
        self._buffer = max(1, multiprocessing_options.per_worker_buffer_size)
        self._first = worker_index_to_start_reading
        self._last_worker_index = worker_index_to_start_reading - 1
        self._worker_init_fn = worker_init_fn
        self._stats = stats
        self._runtime: Any = None
        self._it: Optional[EpochIterator] = None

    def start_prefetch(self) -> None:
        if self._it is not None:
            return
        # grain's operations write arrays into shared memory in the workers, which registers each with
        # multiprocessing's resource tracker; the consumer unlinks them. Started here, the one tracker
        # is inherited by the forked workers (started in each, a worker's tracker would report the
        # consumer's unlinked arrays as leaked when the worker exits).
        resource_tracker.ensure_running()
        # As grain's pool: a pipeline its workers could not be sent pickled raises here.
        _compat.check_producer_pickles(self._producer)
        setup = partial(_producer_for_worker, producer=self._producer, worker_init_fn=self._worker_init_fn)
        body = partial(run_stream_worker, dataset=_Produced(), transport=ArrayElements(), setup=setup,
                       batch_size=1, drop_last=False)
        # grain's producers are per worker of the count asked: under a short budget those stay the
        # data's (logical) workers, run by fewer processes.
        spec = StartSpec(round_robin=True, logical_workers=True, first_worker=self._first, num_workers=self._n,
                         batch_capacity=1, prefetch_factor=self._buffer, in_order=True)
        self._runtime = start(spec, body, order=np.empty(0, np.int64))
        self._it = EpochIterator(self._runtime, batch_decoder(BatchReader(convert=first_row)), owns=False,
                                 stats=self._stats)

    def stop_prefetch(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            if self._stats is not None:
                self._stats.retire(self._runtime)
        self._runtime = self._it = None

    def __enter__(self) -> "Pool":
        self.start_prefetch()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop_prefetch()

    def __iter__(self) -> "Pool":
        return self

    def __next__(self) -> Any:
        self.start_prefetch()
        worker, element = next(self._it)
        self._last_worker_index = worker
        return _compat.open_shared_memory(element)

    def get_last_worker_index(self) -> int:
        return self._last_worker_index

    @property
    def worker_pids(self) -> list[int]:
        self.start_prefetch()
        return self._it.worker_pids

    def __del__(self) -> None:
        # grain's __del__ stops its reader thread; the runtime Loader closes itself when this goes.
        pass


class _Produced:
    """In a worker: (logical worker, element) for each element grain's producer gives that worker."""

    iterators: dict[int, Iterator[Any]] = {}

    def __iter__(self) -> Iterator[Any]:
        worker = current_logical_worker()
        for element in _Produced.iterators[worker]:
            yield worker, element


def _producer_for_worker(worker_id: int, num_workers: int, *, producer: Any,
                         worker_init_fn: Optional[Callable[[int, int], None]]) -> None:
    """In a worker (a fork: `producer` is this process's own copy), as grain's worker starts: the
    worker_init_fn, then the producer's iterator for this worker, reading without threads."""
    if worker_init_fn is not None:
        worker_init_fn(worker_id, num_workers)
    producer = copy_per_logical_worker(producer)  # it slices its pipeline in place
    _compat.producer_reads_in_this_thread(producer)
    _Produced.iterators[worker_id] = producer(worker_index=worker_id, worker_count=num_workers)


# grain's DataLoaderIterator and mp_prefetch stage (0.2.12-0.2.16) with this pool in them.
loader_iterator, PrefetchDataset = _compat.pool_fronts(Pool) if _compat.POOL else (None, None)
