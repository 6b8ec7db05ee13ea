"""Every name of grain's ``_src`` (and every private attribute of grain's objects) that spindle.grain
uses: the one module that knows grain's insides. Nothing else in spindle touches them.

spindle's workers serve grain 0.2.12 to 0.2.18, in one of two ways:

- from 0.2.17, spindle runs grain's dataset pipeline itself (spindle.grain's ``_PrefetchDataset``):
  each worker slices the pipeline as grain's multi-process stage does, and the checkpoint is that
  stage's (the names under "the dataset stage" below);
- before 0.2.17 (0.2.12-0.2.16 lack ``get_dataset_options``, ``get_next_index``/``set_next_index`` and
  ``_MpContextIterDataset``, and 0.2.12's DataLoader does not build on datasets), grain's DataLoader
  and mp_prefetch both run through grain's pool, ``grain_pool.MultiProcessIterator``: spindle's
  ``_pool.Pool`` keeps that pool's contract on spindle's workers, inside grain's own iterators
  (the names under "grain's pool" below, checked on 0.2.12).

On a grain older than 0.2.12 or newer than the tested range, or one where a name is missing or takes
other parameters, spindle.grain's DataLoader and mp_prefetch are grain's own (grain's workers, grain's
threads), with one warning naming the version and the reason (:func:`warn_fallback`).
``SPINDLE_GRAIN_COMPAT=force`` tries spindle's workers on a newer grain all the same.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import pickle
import re

from typing import Any, Callable, Optional

from .._peer_check import Fallback, first_missing, has_parameters
from ..errors import WorkerDiedError

import grain

# The grain releases spindle.grain is tested on (make test-peers-versions runs grain's own tests of
# each); spindle's workers serve OLDEST to NEWEST: through grain's pool before DATASET_STAGE_FROM, as
# the dataset stage from it.
TESTED = ("0.2.12", "0.2.17", "0.2.18")
OLDEST, DATASET_STAGE_FROM, NEWEST = (0, 2, 12), (0, 2, 17), (0, 2, 18)


def version_of(text: str) -> tuple[int, int, int]:
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    if found is None:
        raise ValueError(f"not a grain version: {text!r}")
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


# What grain calls itself when it finds no package metadata (grain._src.core.version).
UNKNOWN = "0.0.1"


def installed_version() -> str:
    return getattr(grain, "__version__", None) or importlib.metadata.version("grain")


def _modules() -> tuple[Any, Any, Any, Any]:
    """grain's data_loader, dataset.base, dataset.dataset and transformations.prefetch (checked on 0.2.17-0.2.18)."""
    from grain._src.python import data_loader
    from grain._src.python.dataset import base, dataset
    from grain._src.python.dataset.transformations import prefetch

    return data_loader, base, dataset, prefetch


# --- the dataset stage: the names as grain 0.2.17 and 0.2.18 have them --------------------------

def grain_data_loader_class() -> Any:
    """grain's own DataLoader class (grain._src.python.data_loader.DataLoader), bound once: the usual
    monkeypatch `grain.DataLoader = spindle.grain.DataLoader` must not make ours build itself."""
    return _modules()[0].DataLoader


def element_spec(ds: Any) -> Any:
    return _modules()[2].get_element_spec(ds)


def dataset_options(ds: Any) -> Any:
    """The options set on `ds` and upstream of it (prefetch.get_dataset_options)."""
    return _modules()[3].get_dataset_options(ds)


def next_index(it: Any) -> int:
    return _modules()[2].get_next_index(it)


def set_next_index(it: Any, index: int) -> None:
    _modules()[2].set_next_index(it, index)


def worker_iterator(ds: Any, num_workers: int, worker: int, sequential_slice: bool, options: Any) -> Any:
    """The iterator grain's multi-process stage runs in worker `worker` of `num_workers`: `ds` sliced
    as grain slices it (mutates `ds`), aware of its worker index and count, with the pipeline's options."""
    _, base, dataset, prefetch = _modules()
    if num_workers > 1:
        prefetch._set_slice_iter_dataset(ds, slice(worker, None, num_workers), sequential_slice)
    ds = prefetch._MpContextIterDataset(ds, base.MultiprocessingContext(process_index=worker,
                                                                         process_count=num_workers))
    return iter(dataset.WithOptionsIterDataset(ds, options))


def check_pickles(ds: Any, worker_init_fn: Any) -> None:
    """Raises what grain raises when its workers could not be sent the pipeline or the worker_init_fn
    (grain pickles both for its spawned workers; spindle's forked ones would not need it, but grain's
    contract does): the pickling error, with grain's note naming the first dataset that cannot be."""
    import cloudpickle

    try:
        cloudpickle.dumps(ds)
    except Exception:
        _process_prefetch()._check_picklable(ds)  # raises with the note, where grain finds the dataset
        raise
    cloudpickle.dumps(worker_init_fn)


def read_in_this_thread(ds: Any) -> None:
    """Sets every read stage of the pipeline under `ds` (its nodes' `_read_options`) to read without threads."""
    seen, stack = set(), [ds]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        options = getattr(node, "_read_options", None)
        if isinstance(options, grain.ReadOptions) and options.num_threads != 0:
            node._read_options = _without_threads(options)
        stack.extend(getattr(node, "parents", ()))


def put_stage_under_state(loader: Any, make_stage: Callable[[Any], Any], workers: int) -> None:
    """In a grain DataLoader built for 0 workers (its pipeline is marker(state(pipeline))), puts
    make_stage(pipeline) under grain's own state wrapper, and records `workers` where grain reads the
    worker count (the state wrapper's `_worker_count`, the loader's `_multiprocessing_options`)."""
    marker = loader._dataset
    state = marker._parent
    state._parents = (make_stage(state._parent),)
    state._worker_count = workers
    loader._multiprocessing_options = _replace(loader._multiprocessing_options, num_workers=workers)


def _without_threads(options: Any) -> Any:
    """ReadOptions that read in the calling thread: num_threads=0 (before 0.2.17 grain's dataset prefetch
    makes a thread pool whenever its buffer is not empty, and a pool of 0 threads raises, so the buffer
    goes too; its reads are the same, one after another)."""
    if POOL:
        return _replace(options, num_threads=0, prefetch_buffer_size=0)
    return _replace(options, num_threads=0)


def _replace(options: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(options, **changes)


# --- grain's pool: the names as grain 0.2.12 has them (spindle's Pool in its place, before 0.2.17) ---

def _pool_modules() -> tuple[Any, Any, Any, Any]:
    """grain's grain_pool, data_loader, dataset.dataset and transformations.prefetch (checked on 0.2.12)."""
    from grain._src.python import data_loader, grain_pool
    from grain._src.python.dataset import dataset
    from grain._src.python.dataset.transformations import prefetch

    return grain_pool, data_loader, dataset, prefetch


# The key of the last worker read from, in the states of grain's DataLoaderIterator and of its
# multi-process prefetch iterator (grain's _LAST_WORKER_INDEX in both modules).
_LAST_WORKER_INDEX = "last_worker_index"


def pool_base() -> type:
    """grain_pool.MultiProcessIterator, the class spindle's Pool stands in for (grain's iterators check
    isinstance on it)."""
    return _pool_modules()[0].MultiProcessIterator


def open_shared_memory(element: Any) -> Any:
    """What grain's pool reader does to each element: the record's (or structure's) shared-memory array
    leaves, written by grain's own operations in the worker, opened here (and unlinked when dropped)."""
    return _pool_modules()[0]._open_shared_memory_for_structure(element)


def check_producer_pickles(producer: Any) -> None:
    """Raises what grain's pool raises when its workers could not be sent the producer: for
    mp_prefetch's, grain's own serialize() (its note names the first dataset that cannot be pickled);
    for a DataLoader's, its loader's data source, sampler and operations (the producer holds the
    loader, whose class the usual monkeypatch of ``data_loader.DataLoader`` would make cloudpickle
    copy by value)."""
    loader = getattr(getattr(producer, "_read_and_transform_data", None), "__self__", None)
    if loader is None:
        producer.serialize()
    else:
        import cloudpickle

        cloudpickle.dumps((loader._data_source, loader._sampler, loader._operations))


def producer_reads_in_this_thread(producer: Any) -> None:
    """In a worker: grain's element producer (a DataLoader's or mp_prefetch's) reads without threads."""
    loader = getattr(getattr(producer, "_read_and_transform_data", None), "__self__", None)
    if loader is not None:  # the DataLoader's producer: its loader's ReadOptions
        if loader._read_options.num_threads != 0:
            loader._read_options = _replace(loader._read_options, num_threads=0)
    else:  # mp_prefetch's producer: the read stages of its pipeline
        read_in_this_thread(producer._ds)


def pool_fronts(pool: type) -> tuple[Callable[..., Any], type]:
    """grain's own DataLoaderIterator and mp_prefetch stage (0.2.12), with `pool` made where grain makes
    grain_pool.MultiProcessIterator, and a lost worker answered by starting the pool again from the
    iterator's state (grain's own checkpoint, so the same elements follow). Returns
    (loader_iterator(loader, losses, **pool_args), PrefetchDataset); PrefetchDataset takes grain's
    MultiprocessPrefetchIterDataset's arguments, and `losses` and `pool_args` as keywords."""
    _, data_loader, dataset, prefetch = _pool_modules()

    class LoaderIterator(data_loader.DataLoaderIterator):
        def __init__(self, loader: Any, losses: Any, pool_args: dict[str, Any]) -> None:
            super().__init__(loader, loader._create_initial_state())
            self._spindle = (losses, pool_args)

        def _create_iterator(self) -> None:
            """grain 0.2.12's, with spindle's pool."""
            options = self._data_loader.multiprocessing_options
            if options.num_workers == 0:
                return super()._create_iterator()
            producer = data_loader.GetElementProducerFn(self._state, self._data_loader._read_and_transform_data)
            first = (self._state[_LAST_WORKER_INDEX] + 1) % options.num_workers
            self._raw_iterator = pool(producer, options, first, **self._spindle[1])
            self._iterator = data_loader._iterator_with_context(self._raw_iterator)

        def __next__(self) -> Any:
            while True:
                try:
                    return super().__next__()
                except WorkerDiedError as died:
                    state = self.get_state()  # the last element's: the pool starts again there
                    self._spindle[0].start_again(died, state)
                    self.set_state(state)

    def loader_iterator(loader: Any, losses: Any, **pool_args: Any) -> Any:
        return LoaderIterator(loader, losses, pool_args)

    class PrefetchIterator(prefetch._MultiprocessPrefetchDatasetIterator):
        def __init__(self, parent: Any, options: Any, worker_init_fn: Any, losses: Any,
                     pool_args: dict[str, Any]) -> None:
            super().__init__(parent, options, worker_init_fn)
            self._spindle = (losses, pool_args)

        def _create_iterator_context(self) -> Any:
            """grain 0.2.12's, with spindle's pool."""
            ds = dataset.WithOptionsIterDataset(self._iter_parent, self._ctx.dataset_options)
            producer = prefetch.GetElementProducerFn(self._state, ds)
            first = (self._state[_LAST_WORKER_INDEX] + 1) % self._multiprocessing_options.num_workers
            return pool(producer, self._multiprocessing_options, first, self._worker_init_fn, **self._spindle[1])

        def __next__(self) -> Any:
            while True:
                try:
                    return super().__next__()
                except WorkerDiedError as died:
                    self._spindle[0].start_again(died, pickle.dumps(self._state))
                    self.set_state(self._state)

        @property
        def worker_pids(self) -> list[int]:
            """Pids of the workers (starts them if needed)."""
            self.start_prefetch()
            return self._raw_iterator.worker_pids

    class PrefetchDataset(prefetch.MultiprocessPrefetchIterDataset):
        def __init__(self, parent: Any, multiprocessing_options: Any, worker_init_fn: Any = None, *,
                     losses: Optional[Callable[[], Any]] = None, **pool_args: Any) -> None:
            super().__init__(parent, multiprocessing_options, worker_init_fn)
            self._spindle = (losses, pool_args)

        def __iter__(self) -> Any:
            if self._multiprocessing_options.num_workers == 0:
                return self._parent.__iter__()
            make_losses = self._spindle[0] or _default_losses
            return PrefetchIterator(self._parent, self._multiprocessing_options, self._worker_init_fn,
                                    make_losses(self._multiprocessing_options.num_workers), self._spindle[1])

    return loader_iterator, PrefetchDataset


def _default_losses(num_workers: int) -> Any:
    from ._losses import Losses

    return Losses("replace", num_workers)


# --- the check ------------------------------------------------------------------------------



def _needed() -> dict[str, Callable[[], Any]]:
    def module(i: int) -> Any:
        return _modules()[i]

    return {
        "grain._src.python.data_loader.DataLoader(worker_count)":
            lambda: has_parameters(module(0).DataLoader.__init__, "worker_count", "data_source", "sampler"),
        "grain._src.python.data_loader.DataLoader's _dataset and _multiprocessing_options":
            lambda: _sets(module(0).DataLoader, "_dataset", "_multiprocessing_options"),
        "grain._src.python.dataset.base.MultiprocessingContext(process_index, process_count)":
            lambda: module(1).MultiprocessingContext(process_index=0, process_count=1),
        "grain._src.python.dataset.dataset.get_element_spec": lambda: module(2).get_element_spec,
        "grain._src.python.dataset.dataset.get_next_index": lambda: module(2).get_next_index,
        "grain._src.python.dataset.dataset.set_next_index": lambda: module(2).set_next_index,
        "grain._src.python.dataset.dataset.WithOptionsIterDataset": lambda: module(2).WithOptionsIterDataset,
        "grain._src.python.dataset.transformations.prefetch.get_dataset_options":
            lambda: module(3).get_dataset_options,
        "grain._src.python.dataset.transformations.prefetch._set_slice_iter_dataset(ds, sl, sequential_slice)":
            lambda: has_parameters(module(3)._set_slice_iter_dataset, "ds", "sl", "sequential_slice"),
        "grain._src.python.dataset.transformations.prefetch._MpContextIterDataset":
            lambda: module(3)._MpContextIterDataset,
        "grain._src.python.dataset.transformations.process_prefetch._check_picklable(ds)":
            lambda: has_parameters(_process_prefetch()._check_picklable, "ds"),
    }


def _process_prefetch() -> Any:
    from grain._src.python.dataset.transformations import process_prefetch

    return process_prefetch


def _needed_pool() -> dict[str, Callable[[], Any]]:
    def module(i: int) -> Any:
        return _pool_modules()[i]

    return {
        "grain._src.python.grain_pool.MultiProcessIterator(get_element_producer_fn, multiprocessing_options, "
        "worker_index_to_start_reading, worker_init_fn)":
            lambda: has_parameters(module(0).MultiProcessIterator.__init__, "get_element_producer_fn",
                                   "multiprocessing_options", "worker_index_to_start_reading", "worker_init_fn"),
        "grain._src.python.grain_pool._open_shared_memory_for_structure":
            lambda: module(0)._open_shared_memory_for_structure,
        "grain._src.python.data_loader.DataLoader(worker_count)":
            lambda: has_parameters(module(1).DataLoader.__init__, "worker_count", "data_source", "sampler"),
        "grain._src.python.data_loader.DataLoader's _create_initial_state, _read_and_transform_data":
            lambda: (module(1).DataLoader._create_initial_state, module(1).DataLoader._read_and_transform_data),
        "grain._src.python.data_loader.DataLoader's _read_options, _data_source, _sampler, _operations":
            lambda: _sets(module(1).DataLoader, "_read_options", "_data_source", "_sampler", "_operations"),
        "grain._src.python.data_loader.DataLoaderIterator(data_loader, state) and its _create_iterator":
            lambda: (has_parameters(module(1).DataLoaderIterator.__init__, "data_loader", "state"),
                     module(1).DataLoaderIterator._create_iterator),
        "grain._src.python.data_loader.DataLoaderIterator's _data_loader, _state, _raw_iterator, _iterator":
            lambda: _sets(module(1).DataLoaderIterator, "_data_loader", "_state", "_raw_iterator", "_iterator"),
        "grain._src.python.data_loader.GetElementProducerFn(state, read_and_transform_data)":
            lambda: has_parameters(module(1).GetElementProducerFn.__init__, "state", "read_and_transform_data"),
        "grain._src.python.data_loader._iterator_with_context": lambda: module(1)._iterator_with_context,
        "grain._src.python.dataset.dataset.WithOptionsIterDataset": lambda: module(2).WithOptionsIterDataset,
        "grain._src.python.dataset.transformations.prefetch.MultiprocessPrefetchIterDataset(parent, "
        "multiprocessing_options, worker_init_fn)":
            lambda: has_parameters(module(3).MultiprocessPrefetchIterDataset.__init__, "parent",
                                   "multiprocessing_options", "worker_init_fn"),
        "grain._src.python.dataset.transformations.prefetch._MultiprocessPrefetchDatasetIterator"
        "._create_iterator_context":
            lambda: module(3)._MultiprocessPrefetchDatasetIterator._create_iterator_context,
        "grain._src.python.dataset.transformations.prefetch._MultiprocessPrefetchDatasetIterator's _iter_parent, "
        "_multiprocessing_options, _worker_init_fn, _state":
            lambda: _sets(module(3)._MultiprocessPrefetchDatasetIterator, "_iter_parent",
                          "_multiprocessing_options", "_worker_init_fn", "_state"),
        "grain._src.python.dataset.transformations.prefetch.GetElementProducerFn(state, ds) and its serialize":
            lambda: (has_parameters(module(3).GetElementProducerFn.__init__, "state", "ds"),
                     module(3).GetElementProducerFn.serialize),
        "grain's checkpoints' last_worker_index":
            lambda: _equal(module(1)._LAST_WORKER_INDEX, module(3)._LAST_WORKER_INDEX, _LAST_WORKER_INDEX),
    }


def _equal(*values: Any) -> None:
    if len(set(values)) != 1:
        raise ValueError(f"not one key: {values}")


def _sets(cls: Any, *attributes: str) -> Any:
    """`cls`'s constructor assigns each of `attributes` (read from its source: grain's are Python)."""
    source = inspect.getsource(cls.__init__)
    missing = [a for a in attributes if f"self.{a} =" not in source and f"self.{a}:" not in source]
    if missing:
        raise AttributeError(f"its constructor sets no {', '.join(missing)}")
    return cls


def uses_pool(version: str) -> bool:
    """Whether spindle serves grain `version` through grain's pool (before 0.2.17) rather than as the
    dataset stage. A grain without its package metadata: by which of the two it has."""
    if version == UNKNOWN:
        return first_missing("grain", version, _needed()) is not None
    return version_of(version) < DATASET_STAGE_FROM


def incompatibility(version: str, needed: Optional[dict[str, Callable[[], Any]]] = None,
                    force: bool = False) -> Optional[str]:
    """Why spindle's workers cannot stand in for grain `version`'s (whose names `needed` looks up: by
    default those of the way spindle serves that version), or None."""
    try:
        release = version_of(version)
    except ValueError as exc:
        return str(exc)
    if version == UNKNOWN:  # grain without its package metadata (a source tree): its names decide
        force = True
    if not force and release > NEWEST:
        return (f"grain {version} is newer than the newest release spindle.grain was checked on "
                f"({TESTED[-1]}); set SPINDLE_GRAIN_COMPAT=force to try spindle's workers on it")
    if release < OLDEST and not force:
        return (f"grain {version} is older than the oldest release spindle.grain serves "
                f"({'.'.join(map(str, OLDEST))})")
    if needed is None:
        needed = _needed_pool() if uses_pool(version) else _needed()
    return first_missing("grain", version, needed)


_FALLBACK = Fallback(incompatibility(installed_version(), force=os.environ.get("SPINDLE_GRAIN_COMPAT") == "force"),
                     "spindle.grain: DataLoader and mp_prefetch run on grain's own workers")
FALLBACK: Optional[str] = _FALLBACK.reason
# spindle's Pool in grain's pool's place (grain before 0.2.17), else the dataset stage.
POOL: bool = FALLBACK is None and uses_pool(installed_version())


def warn_fallback(stacklevel: int = 2) -> None:
    """The one warning (per process) that the peer's own workers run, and why."""
    _FALLBACK.warn(stacklevel + 1)
