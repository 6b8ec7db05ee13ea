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
workers): parallelism comes from the workers. Elements travel through spindle's shared ring
(no pipes, no queue threads): an element made only of numpy arrays (a batch after grain's
Batch) is written field by field and arrives as views of the slot, zero-copy; any other
element is pickled. The thread tree is the consumer's own threads + one per worker.

Iterators support ``get_state``/``set_state`` in grain's format.
"""

from __future__ import annotations

import copy
import logging
import operator
import pickle
from functools import partial
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .._extras import require_extra

require_extra("grain", ("grain",), "spindle.grain")

import grain  # noqa: E402 - after the check that names the extra

from .. import _core  # noqa: E402
from . import _compat  # noqa: E402
from ._elements import ArrayElements, first_row
from ._losses import Losses
from .._runtime.epoch import EpochIterator
from .._runtime.stats import HasStats, StatsBook
from .._runtime.forking import call_in_fork
from .._runtime.layout import BatchReader
from .._runtime.persistent import reset_or_restart
from .._runtime.start import StartSpec, replacements_for, start
from .._runtime.worker import batch_decoder, copy_per_logical_worker, current_logical_worker, run_stream_worker
from ..errors import ProcessesAdvised, WorkerDiedError

__all__ = ["AUTO", "DataLoader", "auto_workers", "mp_prefetch"]

# grain's own class, bound at import: the usual monkeypatch
# `grain.DataLoader = spindle.grain.DataLoader` must not make ours build itself.
_GrainDataLoader = _compat.grain_data_loader_class()
# grain's own IterDataset.mp_prefetch, bound at import for the same reason (a grain spindle does not
# serve runs it; a monkeypatched method that calls spindle.grain.mp_prefetch must not loop).
_GRAIN_MP_PREFETCH = grain.IterDataset.mp_prefetch


def mp_prefetch(ds: Any, options: Optional[Any] = None,
                worker_init_fn: Optional[Callable[[int, int], None]] = None,
                sequential_slice: bool = False, *, on_worker_death: str = "replace") -> grain.IterDataset:
    """Runs `ds` (a grain IterDataset) in spindle workers, like ``ds.mp_prefetch(options)``.

    The result is a grain IterDataset; its iterators support get_state/set_state.

    ``on_worker_death="replace"`` (the default): when a worker process is lost (the OOM killer, a
    signal, a runtime's abort), the workers start again from each slice's state after its last
    element delivered, as from a checkpoint: the elements go on exactly as without the loss, one
    WARNING (logger "spindle") per loss. At most ``max(3, num_workers)`` losses per iterator, and a
    worker lost twice at the same state (a poison element) is not restarted a third time: then
    ``WorkerDiedError`` names them. ``"raise"``: the first loss raises, as grain.

    ``options.num_workers="auto"``: spindle's choice (:func:`auto_workers`), see :class:`DataLoader`."""
    replacements_for(on_worker_death)
    options = options or grain.multiprocessing.MultiprocessingOptions(num_workers=10)
    auto = _is_auto(options.num_workers, "mp_prefetch's options.num_workers")
    if auto:
        options = _compat._replace(options, num_workers=auto_workers())
    operator.index(options.num_workers)  # 2.5: TypeError, as grain's own range() over the workers raises
    operator.index(options.per_worker_buffer_size)
    if options.num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {options.num_workers}")
    if options.num_workers == 0:
        return ds
    if _compat.FALLBACK is not None:
        _compat.warn_fallback()
        return _GRAIN_MP_PREFETCH(ds, options, **({} if worker_init_fn is None else {"worker_init_fn": worker_init_fn}),
                                  **({"sequential_slice": True} if sequential_slice else {}))
    if _compat.POOL:  # grain before 0.2.17: its own mp_prefetch stage, with spindle's pool
        if sequential_slice:
            raise TypeError(f"grain {_compat.installed_version()}'s mp_prefetch takes no sequential_slice "
                            "(grain 0.2.17 added it)")
        from ._pool import PrefetchDataset

        return PrefetchDataset(ds, options, worker_init_fn, losses=partial(Losses, on_worker_death))
    return _PrefetchDataset(ds, options.num_workers, max(1, options.per_worker_buffer_size), worker_init_fn,
                            sequential_slice, on_worker_death, auto=bool(auto))


AUTO = "auto"


def auto_workers() -> int:
    """The workers ``"auto"`` gives a grain pipeline: the core's count for this process's usable cpus
    (8 a cpu, at most 64: ``_core.auto_workers``). grain's elements and their order are defined by the
    worker count (worker w reads records w, w + N, ...), so this is chosen once, from the machine, and
    the processes that run those workers follow the load (:class:`DataLoader`)."""
    return _core.auto_workers()


def _is_auto(count: Any, what: str) -> bool:
    """Whether `count` asks for spindle's choice; on a grain spindle serves inside grain's own iterators
    (before 0.2.17) or not at all, a clear error: there the processes are grain's to fix."""
    if not isinstance(count, str) or count != AUTO:
        return False
    if _compat.FALLBACK is not None or _compat.POOL:
        raise ValueError(f"spindle.grain: {what}='auto' needs grain 0.2.17 or newer, where spindle runs the "
                         f"multi-process stage itself (grain {_compat.installed_version()} is installed): give a "
                         "number of workers")
    return True


class _PrefetchDataset(grain.IterDataset):
    """`parent` run in spindle workers: worker w iterates records w, w + N, ... of it."""

    def __init__(self, parent: Any, num_workers: int, buffer_size: int,
                 worker_init_fn: Optional[Callable[[int, int], None]], sequential_slice: bool,
                 on_worker_death: str = "replace", *, auto: bool = False) -> None:
        super().__init__(parent)
        self._auto = auto
        self._on_worker_death = on_worker_death
        self._num_workers = num_workers
        self._buffer_size = buffer_size
        self._worker_init_fn = worker_init_fn
        self._sequential_slice = sequential_slice
        self._loader_stats: Optional[StatsBook] = None  # spindle.grain.DataLoader's stats(), when it made this stage

    def __iter__(self) -> "_PrefetchIterator":
        it = _PrefetchIterator(self._parent, self._num_workers, self._buffer_size, self._worker_init_fn,
                               self._sequential_slice, self._on_worker_death, auto=self._auto)
        it._loader_stats = self._loader_stats
        return it

    @property
    def _element_spec(self) -> Any:
        return _compat.element_spec(self._parent)


class _PrefetchIterator(grain.DatasetIterator):
    """Elements from the workers in turn. Its state has grain's multi-process format
    (``next_index_in_cycle`` and one iterator state per worker), so grain's DataLoader
    checkpointing works on it unchanged.

    With ``auto``, the ``num_workers`` slices run on processes that follow the load: as many as cores
    are idle at first; the
    core's controller advises another count (the consumer waits and a core is free, the workers idle,
    the user's task budget runs short: ``Loader.advised_processes``), and the workers start again on
    that many from each slice's state after its last element delivered, as from a checkpoint, so the
    elements are those of a fixed run with ``num_workers``."""

    def __init__(self, ds: Any, num_workers: int, buffer_size: int,
                 worker_init_fn: Optional[Callable[[int, int], None]], sequential_slice: bool,
                 on_worker_death: str = "replace", *, auto: bool = False) -> None:
        super().__init__()
        self._auto = auto
        # The processes the slices run on: 0 is one a slice, or with auto the core's first count (the
        # cores idle now); then what the controller advised.
        self._processes = 0
        self._pickles_checked = False
        self._ds = ds
        self._losses = Losses(on_worker_death, num_workers)
        self._n = num_workers
        self._buffer_size = buffer_size
        self._worker_init_fn = worker_init_fn
        self._sequential_slice = sequential_slice
        self._states: Optional[list[Any]] = None  # each worker's iterator state after its last element
        self._next_in_cycle = 0
        # The workers, kept from the first element until close(): set_state(),
        # set_next_index() and repeat() epochs restart their slices in place
        # (Loader.reset_streams) instead of forking new ones, as grain keeps its.
        self._runtime: Optional[_core.Loader] = None
        self._it: Optional[EpochIterator] = None
        self._restart = False  # the workers must start again from self._states before the next element
        self._loader_stats: Optional[StatsBook] = None
        # As grain's prefetch iterator: the options set upstream reach the
        # iterators after this one (they share this context), and options set
        # downstream are merged into it before the first element, then carried
        # into the workers (_start).
        self._ctx.dataset_options = _compat.dataset_options(ds)

    def __next__(self) -> Any:
        while True:
            self.start_prefetch()
            try:
                worker, state, element = next(self._it)
                break
            except WorkerDiedError as died:
                self._after_loss(died)  # the workers start again from the states, or it raises
            except ProcessesAdvised:
                self._take_advice()  # advised while no element was ready: now, not after the one in flight
        self._states[worker] = state
        self._next_in_cycle = (worker + 1) % self._n
        if self._auto and self._runtime.advised_processes:
            self._take_advice()
        return element

    def _take_advice(self) -> None:
        """The controller wants the slices on another count of processes: they start again from
        the states kept after each one's last element delivered (on_resized logged why). The
        elements in flight are made again there, so the workers are not waited for: a busy one
        would finish its element first (0.2 s of a 16-record batch over HTTP, for nothing)."""
        self._processes = self._runtime.advised_processes
        self.close(grace=0.0)

    def _after_loss(self, died: WorkerDiedError) -> None:
        """A worker process was lost: the workers start again from each slice's state after its last
        element delivered (a checkpoint's restart: the same elements follow), or it raises (Losses)."""
        # Process p runs logical workers p, p + P, ... (fewer processes than workers: a short budget).
        processes = self._runtime.plan.num_workers if self._runtime is not None else self._n
        worker = died.worker if died.worker is not None else 0
        self._losses.start_again(died, pickle.dumps([self._states[w] for w in range(worker, self._n, processes)]))
        self.close()

    def start_prefetch(self) -> None:
        """Starts the workers now (or restarts their slices after set_state), so that elements are
        ready before the next ``next()``."""
        if self._it is None or self._restart:
            # A failure closed the loader (a worker died): new workers start from the state.
            runtime, started = reset_or_restart(self._runtime if self._it is not None else None,
                                                self._restart_slices, self._start, close=self.close, failures=())
            if started:
                self._runtime = runtime
                # This iterator owns the workers (close(), or when it is dropped): the
                # end of the elements leaves them waiting for a set_state(), as grain's
                # do under repeat().
                self._it = EpochIterator(runtime, batch_decoder(BatchReader(convert=first_row)), owns=False,
                                         stats=self._loader_stats)
        self._restart = False

    def _restart_slices(self, runtime: _core.Loader) -> None:
        """Each worker gets the state to continue from; batch 0 of the new cycle is asked of the
        worker that is next in it."""
        messages = [pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL) for state in self._states]
        runtime.reset_streams(first_worker=self._next_in_cycle, messages=messages)

    def _start(self) -> _core.Loader:
        n = self._n
        # As grain: a pipeline its workers could not be sent pickled raises here, in grain's words
        # (once: "auto" starts the workers again on other counts of processes).
        if not self._pickles_checked:
            _compat.check_pickles(self._ds, self._worker_init_fn)
            self._pickles_checked = True
        setup = partial(_slice_for_worker, ds=self._ds, sequential_slice=self._sequential_slice,
                        worker_init_fn=self._worker_init_fn, states=self._states,
                        options=self._ctx.dataset_options)
        if self._states is None:
            self._states = [None] * n  # None: the worker starts its slice from the beginning
        # Arrays zero-copy, anything else pickled; slots grow to the largest element.
        body = partial(run_stream_worker, dataset=_WorkerSlice(), transport=ArrayElements(), setup=setup, batch_size=1,
                       drop_last=False, restart=_WorkerSlice.restart)
        # grain's slices and checkpoint state are per worker of the count the user chose: under a
        # short budget those stay the data's (logical) workers, run by fewer processes.
        if self._auto and not self._processes and self._loader_stats is not None:
            # spindle.grain.DataLoader's next epoch: on the processes its last one ended on.
            self._processes = self._loader_stats.processes_at_end
        spec = StartSpec(round_robin=True, logical_workers=True, first_worker=self._next_in_cycle, num_workers=n,
                         batch_capacity=1, prefetch_factor=self._buffer_size, in_order=True,
                         adaptive=self._auto, processes=self._processes)
        return start(spec, body, order=np.empty(0, np.int64))

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the workers (starts them if needed)."""
        self.start_prefetch()
        return self._it.worker_pids

    def get_state(self) -> dict[str, Any]:
        if self._states is None:
            self._states = [None] * self._n
        fresh = [w for w, state in enumerate(self._states) if state is None]
        if fresh:  # workers that have not produced an element yet: the state of a new slice
            for w in fresh:
                self._states[w] = call_in_fork(partial(_initial_state, self._ds, self._n, w, self._sequential_slice,
                                                       self._ctx.dataset_options))
        return {
            "next_index_in_cycle": self._next_in_cycle,
            "next_index_in_datasets": self._n,
            "iterators_in_use_indices": list(range(self._n)),
            "iterators_in_use_states": [copy.deepcopy(s) for s in self._states],
            "exhausted": [False] * self._n,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if len(state["iterators_in_use_states"]) != self._n:
            raise ValueError(f"spindle.grain: the state is for {len(state['iterators_in_use_states'])} workers, "
                             f"this pipeline runs {self._n}")
        self._states = [copy.deepcopy(s) for s in state["iterators_in_use_states"]]
        self._next_in_cycle = state["next_index_in_cycle"] % self._n
        self._restart = self._it is not None

    def _get_next_index(self) -> int:
        """The index of the next element (one worker only, as in grain)."""
        self._need_one_worker("get_next_index")
        state = self.get_state()["iterators_in_use_states"][0]
        return call_in_fork(partial(_next_index_at, self._ds, state, self._ctx.dataset_options))

    def _set_next_index(self, index: int) -> None:
        """Continues from element `index` (one worker only, as in grain); the worker restarts there."""
        self._need_one_worker("set_next_index")
        state = call_in_fork(partial(_state_at_index, self._ds, index, self._ctx.dataset_options))
        self._states = [state]
        self._next_in_cycle = 0
        self._restart = self._it is not None

    def _need_one_worker(self, what: str) -> None:
        if self._n != 1:
            raise NotImplementedError(f"{what} is not supported for spindle.grain.mp_prefetch with more than one "
                                      f"worker ({self._n}), as in grain.")

    def close(self, grace: float = 1.0) -> None:
        """Stops the workers (a busy one gets ``grace`` seconds to finish before it is killed); the
        next element starts new ones from the current state."""
        if self._runtime is not None:
            self._runtime.close(grace=grace)
            if self._loader_stats is not None:
                self._loader_stats.retire(self._runtime)
        self._runtime = self._it = None
        self._restart = False

    def __del__(self) -> None:
        # grain's DatasetIterator.__del__ calls close(): a signal handled while
        # the workers stopped (Ctrl-C) would run inside this finalizer, and its
        # exception be printed and lost. The runtime Loader closes itself in C++
        # when this iterator's attributes go, after __del__ returns, so the
        # signal is raised in the code that dropped the iterator.
        pass


class _WorkerSlice:
    """In a worker: (worker id, iterator state, element) for each element of its slice. A
    process may run several (logical) workers' slices under a short budget: each has its own
    iterator, keyed by the logical worker."""

    iterators: dict[int, Any] = {}
    initial_states: dict[int, Any] = {}  # of each slice before its first element

    @staticmethod
    def restart(message: bytes) -> None:
        """A new stream (set_state, a repeat() epoch): the slice's iterator continues from the
        state the consumer sent, or from its beginning."""
        worker = current_logical_worker()
        state = pickle.loads(message) if message else None
        _WorkerSlice.iterators[worker].set_state(
            copy.deepcopy(_WorkerSlice.initial_states[worker]) if state is None else state)

    def __iter__(self) -> Iterator[Any]:
        worker = current_logical_worker()
        it = _WorkerSlice.iterators[worker]
        while True:
            try:
                element = next(it)
            except StopIteration:
                return
            yield worker, it.get_state(), element


def _slice_for_worker(worker_id: int, num_workers: int, *, ds: Any, sequential_slice: bool,
                      worker_init_fn: Optional[Callable[[int, int], None]],
                      states: Optional[list[Any]], options: Any) -> None:
    """In a worker (a fork, so `ds` is already this process's own copy): keep records
    worker_id, worker_id + N, ... exactly as grain slices for its own workers, and
    resume from `states[worker_id]` when given."""
    if worker_init_fn is not None:
        worker_init_fn(worker_id, num_workers)
    ds = copy_per_logical_worker(ds)  # slicing mutates the dataset
    it = _worker_iterator(ds, num_workers, worker_id, sequential_slice, options)
    _WorkerSlice.initial_states[worker_id] = it.get_state()
    if states is not None and states[worker_id] is not None:
        it.set_state(copy.deepcopy(states[worker_id]))
    _WorkerSlice.iterators[worker_id] = it


def _worker_iterator(ds: Any, num_workers: int, worker: int, sequential_slice: bool, options: Any) -> Any:
    """In a worker or a throwaway fork (slicing mutates `ds`): the iterator grain's worker
    `worker` runs. As in grain: one worker reads the whole pipeline unsliced (so a source
    that cannot be sliced works); the iterator knows its worker index and count (which
    seed random_map differently per worker); and the pipeline's options, including
    those set after mp_prefetch, apply inside the worker."""
    _compat.read_in_this_thread(ds)
    return _compat.worker_iterator(ds, num_workers, worker, sequential_slice, options)


def _initial_state(ds: Any, num_workers: int, worker: int, sequential_slice: bool, options: Any) -> Any:
    """In a throwaway fork: the iterator state of `worker`'s slice before any element."""
    return _worker_iterator(ds, num_workers, worker, sequential_slice, options).get_state()


def _next_index_at(ds: Any, state: Any, options: Any) -> int:
    """In a throwaway fork: the next index of the single worker's iterator at `state`."""
    it = _worker_iterator(ds, 1, 0, False, options)
    it.set_state(state)
    return _compat.next_index(it)


def _state_at_index(ds: Any, index: int, options: Any) -> Any:
    """In a throwaway fork: the state of the single worker's iterator set to continue at `index`."""
    it = _worker_iterator(ds, 1, 0, False, options)
    _compat.set_next_index(it, index)
    return it.get_state()


class DataLoader(HasStats):
    """``grain.DataLoader`` with spindle's workers; same keyword-only arguments, and
    ``on_worker_death`` (:func:`mp_prefetch`'s: a lost worker process is replaced by default).

    Iterators are grain's own DataLoaderIterator over a pipeline whose
    multi-process stage is spindle's, so ``get_state()``/``set_state()`` produce
    and accept grain's checkpoint format.

    ``worker_count="auto"`` (grain 0.2.17 and newer): the elements are those of
    :func:`auto_workers` workers (8 a cpu, at most 64), chosen once from the machine, so a
    checkpoint resumes on the same machine type; the processes that run them start at the cores idle then and follow
    the load (more while the training loop waits for elements and a core is free, fewer when it sets
    the pace or the user's task budget runs short), each change one INFO line (logger "spindle") and in
    ``stats()``. A change starts the workers again from each slice's state, as a checkpoint does.
    """

    def __init__(self, *, data_source: Any, sampler: Any, operations: Any = (),
                 worker_count: "Optional[int] | str" = 0, worker_buffer_size: int = 1, shard_options: Any = None,
                 read_options: Any = None, enable_profiling: bool = False, on_worker_death: str = "replace") -> None:
        replacements_for(on_worker_death)
        auto = _is_auto(worker_count, "worker_count")
        if auto:
            worker_count = auto_workers()
        if worker_count is not None:
            operator.index(worker_count)  # 2.5: TypeError, as grain's own range() over the workers raises
        operator.index(worker_buffer_size)
        if worker_count and worker_count < 0:
            raise ValueError("Worker count should be greater than or equal zero."
                             f"Current worker_count is {worker_count}.")
        self._pool_losses: Optional[Callable[[int], Losses]] = None
        if _compat.FALLBACK is not None or _compat.POOL:
            # grain's own loader, with grain's workers (a grain spindle does not serve), or with spindle's
            # pool in grain's pool's place (grain before 0.2.17: __iter__).
            if _compat.FALLBACK is not None:
                _compat.warn_fallback()
            else:
                self._pool_losses = partial(Losses, on_worker_death)
            self._grain = _GrainDataLoader(
                data_source=data_source, sampler=sampler, operations=operations, worker_count=worker_count,
                worker_buffer_size=worker_buffer_size, shard_options=shard_options, read_options=read_options,
                enable_profiling=enable_profiling)
            return
        # grain validates the arguments and builds the pipeline, without workers.
        self._grain = _GrainDataLoader(
            data_source=data_source, sampler=sampler, operations=operations, worker_count=0,
            worker_buffer_size=worker_buffer_size, shard_options=shard_options, read_options=read_options,
            enable_profiling=enable_profiling)
        workers = worker_count or 0
        if workers > 0:
            # spindle's multi-process stage under grain's own state wrapper.
            def stage(pipeline: Any) -> _PrefetchDataset:
                prefetch = _PrefetchDataset(pipeline, workers, max(1, worker_buffer_size), None, False,
                                            on_worker_death, auto=auto)
                prefetch._loader_stats = self._stats_book()
                return prefetch

            _compat.put_stage_under_state(self._grain, stage, workers)

    def __getattr__(self, name: str) -> Any:
        """grain's DataLoader's other attributes (``multiprocessing_options``, ...) are the grain loader's."""
        grain_loader = self.__dict__.get("_grain")
        if grain_loader is None:
            raise AttributeError(name)
        return getattr(grain_loader, name)

    def __iter__(self) -> Any:
        if self._pool_losses is not None:
            from ._pool import loader_iterator

            workers = self._grain.multiprocessing_options.num_workers
            return loader_iterator(self._grain, self._pool_losses(workers), stats=self._stats_book())
        return iter(self._grain)
