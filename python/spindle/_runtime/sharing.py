"""What the workers get of the dataset (``share="auto"``), and how much each worker pays for it.

``share_for_workers(dataset, share, forked)`` is the one call a front end makes where it builds the
dataset its workers see. With ``"auto"`` the large attributes made of plain values (lists, tuples,
dicts of str/bytes/int/float/bool/None) are replaced by :mod:`spindle.shared <.shared_containers>` containers in
a shallow copy of the dataset, so workers read the same pages instead of copying them as reference
counts change. For forked workers a list or tuple is read in place (``SharedList.inherited``: no
segment, nothing built or held twice); a dict, and anything for spawned workers, is stored once in a
segment, whose descriptor a spawned worker is handed instead of the data. The user's own object is
never changed. The walk goes one level into the dataset's attributes and
into wrapped datasets (``Subset.dataset``, ``ConcatDataset.datasets``, a wrapper's ``dataset``).

``MemoryWatch`` reads each worker's private memory (USS, /proc/<pid>/smaps_rollup through
``_core.process_memory``) while an epoch runs, and warns once when it grew past a threshold.
"""

from __future__ import annotations

import copy
import logging
import sys
import time
import types
import warnings
import weakref
from typing import Any, Callable, Optional

from .. import _core
from .shared_containers import SharedDict, SharedList, is_shared

__all__ = ["share_for_workers", "check_share", "MemoryWatch", "worker_memory", "MIN_SHARED_BYTES",
           "MIN_SHARED_ITEMS", "WORKER_GROWTH_WARN_BYTES"]

log = logging.getLogger("spindle")

# An attribute is converted when it has this many items, or its Python objects take this many bytes
# (estimated from a sample): below both, what a worker copies is not worth a segment.
MIN_SHARED_ITEMS = 100_000
MIN_SHARED_BYTES = 1 << 20
# A worker whose private memory grows by more than this within one epoch is warned about (once).
WORKER_GROWTH_WARN_BYTES = 256 << 20
_MAX_DEPTH = 3  # the dataset, a wrapped dataset, and one more (Subset of a ConcatDataset's member)
_SAMPLE = 32

# (id(owner), attribute, forked) -> (the value converted, its len, its container, or None: not convertible).
# Each start of a loader finds the conversion made by an earlier one while the owner keeps the same
# object of the same length; the entry goes with the owner.
_memo: dict[tuple[int, str, bool], tuple[Any, int, Optional[Any]]] = {}
# What the last walk found too large and could not (or was told not to) share: the memory watch names it.
_unshared: list[str] = []


def check_share(share: Any) -> str:
    """``share`` as the fronts accept it: "auto" or "off"."""
    if share not in ("auto", "off"):
        raise ValueError(f"share should be \"auto\" (large plain-value attributes of the dataset go to shared "
                         f"memory once) or \"off\", but got share={share!r}")
    return share


def share_for_workers(dataset: Any, share: str = "auto", forked: bool = True) -> Any:
    """The dataset the workers should get: with ``share="auto"``, a shallow copy whose large plain-value
    attributes are shared containers (one INFO line on logger "spindle" per conversion); the dataset
    itself where nothing is converted, or with ``share="off"``. `forked`: the workers are forked from
    this process (or are its threads), so a list can be read in place."""
    _unshared.clear()
    if check_share(share) == "off":
        _note_unshared(dataset, "dataset", 0, convert=False)
        return dataset
    return _visit(dataset, "dataset", 0, set(), forked)


def _is_container(value: Any) -> bool:
    return type(value) in (list, tuple, dict)


def _deep_size(obj: Any, budget: int = 64) -> int:
    """Bytes of obj's Python objects, following lists/tuples/dicts up to `budget` objects."""
    size = sys.getsizeof(obj)
    if budget <= 0:
        return size
    if type(obj) is dict:
        for k, v in list(obj.items())[:budget]:
            size += _deep_size(k, budget // 4) + _deep_size(v, budget // 4)
    elif type(obj) in (list, tuple, set, frozenset):
        for x in list(obj)[:budget] if type(obj) in (set, frozenset) else obj[:budget]:
            size += _deep_size(x, budget // 4)
    return size


def _estimate_bytes(value: Any) -> int:
    """The Python objects of a container, estimated from up to _SAMPLE items spread over it."""
    n = len(value)
    if n == 0:
        return sys.getsizeof(value)
    items = list(value.items()) if type(value) is dict else value
    step = max(1, n // _SAMPLE)
    sample = [items[i] for i in range(0, n, step)][:_SAMPLE]
    per_item = sum(_deep_size(x) for x in sample) / len(sample)
    return sys.getsizeof(value) + int(per_item * n)


def _large(value: Any) -> bool:
    return len(value) >= MIN_SHARED_ITEMS or _estimate_bytes(value) >= MIN_SHARED_BYTES


def _looks_like_dataset(value: Any) -> bool:
    """An object the walk goes into: an instance with attributes that reads items (a wrapped dataset)."""
    if isinstance(value, (type, types.ModuleType, types.FunctionType)) or _is_container(value) or is_shared(value):
        return False
    cls = type(value)
    return isinstance(getattr(value, "__dict__", None), dict) and (hasattr(cls, "__getitem__") or hasattr(cls, "__iter__"))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _describe(value: Any) -> str:
    return f"{type(value).__name__} of {len(value):,} {'entries' if type(value) is dict else 'items'}"


def _convert(owner: Any, name: str, value: Any, path: str, forked: bool) -> Optional[Any]:
    """value as a shared container (memoized per owner, attribute and kind of worker), or None if it
    cannot be."""
    key = (id(owner), name, forked)
    memo = _memo.get(key)
    if memo is not None and memo[0] is value and memo[1] == len(value):
        return memo[2]
    estimate = _estimate_bytes(value)
    if forked and type(value) is not dict and _core.plain_values(value):
        converted = SharedList.inherited(value)
        converted._origin = path
        log.info("spindle: %s (%s, ~%s as Python objects) is read in place by the forked workers, its items "
                 "copied out on each read so its pages stay shared (share=\"off\" lets each worker copy "
                 "what it reads)", path, _describe(value), _mib(estimate))
        return _remember(owner, key, value, converted)
    try:
        converted = SharedDict(value) if type(value) is dict else SharedList(value)
    except TypeError as exc:
        log.info("spindle: %s (%s, ~%s as Python objects) stays private to each worker: %s", path,
                 _describe(value), _mib(estimate), str(exc).removeprefix("spindle.shared: "))
        converted = None
        _unshared.append(f"{path} ({_describe(value)}, ~{_mib(estimate)}: not plain values)")
    else:
        converted._origin = path
        log.info("spindle: %s (%s, ~%s as Python objects) is shared with the workers as one %s segment "
                 "(spindle.shared; share=\"off\" keeps a copy per worker)", path, _describe(value), _mib(estimate),
                 _mib(converted.nbytes))
    return _remember(owner, key, value, converted)


def _remember(owner: Any, key: tuple, value: Any, converted: Optional[Any]) -> Optional[Any]:
    if key not in _memo:
        try:
            weakref.finalize(owner, _memo.pop, key, None)
        except TypeError:  # not weak-referenceable: converted again at each start
            return converted
    _memo[key] = (value, len(value), converted)
    return converted


def _visit(obj: Any, path: str, depth: int, seen: set[int], forked: bool) -> Any:
    """obj, or a shallow copy of it with its large plain attributes shared and its wrapped datasets visited."""
    attrs = getattr(obj, "__dict__", None)
    if depth >= _MAX_DEPTH or not isinstance(attrs, dict) or id(obj) in seen or is_shared(obj):
        return obj
    seen.add(id(obj))
    replaced: dict[str, Any] = {}
    for name, value in list(attrs.items()):
        where = f"{path}.{name}"
        if _is_container(value) and len(value) and not _holds_datasets(value):
            if _large(value):
                converted = _convert(obj, name, value, where, forked)
                if converted is not None:
                    replaced[name] = converted
        elif type(value) in (list, tuple) and _holds_datasets(value):  # ConcatDataset.datasets
            members = [_visit(m, f"{where}[{i}]", depth + 1, seen, forked) for i, m in enumerate(value)]
            if any(m is not o for m, o in zip(members, value)):
                replaced[name] = type(value)(members)
        elif _looks_like_dataset(value):
            visited = _visit(value, where, depth + 1, seen, forked)
            if visited is not value:
                replaced[name] = visited
    if not replaced:
        return obj
    try:
        twin = copy.copy(obj)
        twin_attrs = twin.__dict__
    except Exception as exc:  # noqa: BLE001 - a dataset that cannot be copied is shared as it is
        log.info("spindle: %s cannot be copied (%s: %s), so its attributes stay private to each worker",
                 path, type(exc).__name__, exc)
        return obj
    if twin is obj or twin_attrs is attrs:
        return obj
    twin_attrs.update(replaced)
    return twin


def _holds_datasets(value: Any) -> bool:
    return (type(value) in (list, tuple) and 0 < len(value) <= 256
            and all(_looks_like_dataset(m) for m in value))


def _note_unshared(obj: Any, path: str, depth: int, convert: bool) -> None:
    """share="off": the large attributes a worker will copy, for the memory watch to name."""
    attrs = getattr(obj, "__dict__", None)
    if depth >= _MAX_DEPTH or not isinstance(attrs, dict):
        return
    for name, value in list(attrs.items()):
        if _is_container(value) and len(value) and not _holds_datasets(value) and _large(value):
            _unshared.append(f"{path}.{name} ({_describe(value)}, ~{_mib(_estimate_bytes(value))}; share=\"off\")")
        elif _looks_like_dataset(value):
            _note_unshared(value, f"{path}.{name}", depth + 1, convert)


# ------------------------------------------------------------------ per-worker private memory

def worker_memory(pid: int) -> Optional[Any]:
    """The worker's memory (rss, pss, uss, swap in bytes) now; None if it is gone or unreadable."""
    if pid <= 0:
        return None
    try:
        return _core.process_memory(pid)
    except (OSError, RuntimeError):
        return None


_warned = False  # once per process: the cause is the same for every loader of one dataset


class MemoryWatch:
    """Reads the workers' private memory now and then during an epoch; warns once (per process) when
    one grew by more than ``WORKER_GROWTH_WARN_BYTES`` since the epoch's first look at it.

    One worker per look, in turn, a look every `period` seconds: the kernel walks a process's page
    tables to sum smaps_rollup (tens of milliseconds for a worker forked from a large consumer, more
    on a busy machine), which must not stall the consumer's next()."""

    def __init__(self, worker_pids: Callable[[], list[int]], period: float = 5.0) -> None:
        self._pids = worker_pids
        self._period = period
        self._next = time.monotonic() + period / 4
        self._first: dict[int, int] = {}  # pid -> USS at the first look
        self._turn = 0

    def poll(self) -> None:
        """Cheap unless a period has passed; call it per batch."""
        global _warned
        if _warned or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self._period
        pids = self._pids()
        if not pids:
            return
        worker_id = self._turn % len(pids)
        self._turn += 1
        for pid in [pids[worker_id]]:
            memory = worker_memory(pid)
            if memory is None:
                continue
            first = self._first.setdefault(pid, memory.uss)
            grown = memory.uss - first
            if grown > WORKER_GROWTH_WARN_BYTES:
                _warned = True
                cause = ("likely cause: " + "; ".join(_unshared) + ". "
                         if _unshared else
                         "likely cause: the dataset's Python objects (lists of paths or annotation dicts), "
                         "copied page by page into each worker as reading them changes their reference counts. ")
                warnings.warn(
                    f"spindle: worker {worker_id} (pid {pid}) grew its private memory by {_mib(grown)} this epoch "
                    f"(to {_mib(memory.uss)}); every worker pays this again. {cause}Fix: keep such data in "
                    "spindle.shared(...) containers or numpy arrays, and leave the loader's share=\"auto\" on "
                    "(it converts large lists/dicts of plain values). See docs/shared_memory.md.",
                    RuntimeWarning, stacklevel=3)
                return
