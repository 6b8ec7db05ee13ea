"""Every name of grain's ``_src`` (and every private attribute of grain's objects) that spindle.grain
uses: the one module that knows grain's insides. Nothing else in spindle touches them.

spindle's workers need grain 0.2.17 or later: before it, grain's multi-process stage has none of
the names below (0.2.12-0.2.16 lack ``get_dataset_options``, ``get_next_index``/``set_next_index``,
``_MpContextIterDataset``; 0.2.12's DataLoader does not build on datasets at all). On such a grain,
on one newer than the tested range, or on one where a name is missing or takes other parameters,
spindle.grain's DataLoader and mp_prefetch are grain's own (grain's workers, grain's threads), with
one warning naming the version and the reason (:func:`warn_fallback`). ``SPINDLE_GRAIN_COMPAT=force``
tries spindle's workers on a newer grain all the same.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import re

from typing import Any, Callable, Optional

from .._peer_check import Fallback, first_missing, has_parameters

import grain

# The grain releases spindle.grain is tested on (make test-peers-versions runs grain's own tests of
# each); spindle's workers serve SERVED_FROM to NEWEST, grain's own workers run before that.
TESTED = ("0.2.12", "0.2.17", "0.2.18")
SERVED_FROM, NEWEST = (0, 2, 17), (0, 2, 18)


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


# --- the names, each as grain 0.2.17 and 0.2.18 have it -------------------------------------

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
            node._read_options = _replace(options, num_threads=0)
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


def _replace(options: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(options, **changes)


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
    }


def _sets(cls: Any, *attributes: str) -> Any:
    """`cls`'s constructor assigns each of `attributes` (read from its source: grain's are Python)."""
    source = inspect.getsource(cls.__init__)
    missing = [a for a in attributes if f"self.{a} =" not in source and f"self.{a}:" not in source]
    if missing:
        raise AttributeError(f"its constructor sets no {', '.join(missing)}")
    return cls


def incompatibility(version: str, needed: Optional[dict[str, Callable[[], Any]]] = None,
                    force: bool = False) -> Optional[str]:
    """Why spindle's workers cannot stand in for grain `version`'s (whose names `needed` looks up), or None."""
    try:
        release = version_of(version)
    except ValueError as exc:
        return str(exc)
    if version == UNKNOWN:  # grain without its package metadata (a source tree): its names decide
        force = True
    if not force and release > NEWEST:
        return (f"grain {version} is newer than the newest release spindle.grain was checked on "
                f"({TESTED[-1]}); set SPINDLE_GRAIN_COMPAT=force to try spindle's workers on it")
    if release < SERVED_FROM and not force:
        return (f"grain {version} is older than the first release spindle.grain's workers serve "
                f"({'.'.join(map(str, SERVED_FROM))}: its multi-process stage is what spindle replaces)")
    return first_missing("grain", version, _needed() if needed is None else needed)


_FALLBACK = Fallback(incompatibility(installed_version(), force=os.environ.get("SPINDLE_GRAIN_COMPAT") == "force"),
                     "spindle.grain: DataLoader and mp_prefetch run on grain's own workers")
FALLBACK: Optional[str] = _FALLBACK.reason


def warn_fallback(stacklevel: int = 2) -> None:
    """The one warning (per process) that the peer's own workers run, and why."""
    _FALLBACK.warn(stacklevel + 1)
