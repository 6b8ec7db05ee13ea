"""Samples <-> the fields of a batch (the Python side of the slot format).

A sample is a leaf (numpy array, numpy scalar, bool, int, float, or anything
with ``__array__``) or a nested dict / tuple / list / namedtuple of leaves.
Every sample of one batch must have the same structure, shapes and dtypes;
different batches may differ (each batch carries its own layout).

Where the bytes go is not decided here: the runtime's ``SlotLayout``
(runtime/include/spindle/slot_layout.hpp) owns the slot format. A worker hands
it the fields (dtype, shape) of the batch and the structure (pickled, opaque to
the runtime); it gets back one array per field over the slot and fills rows.
The consumer gets the arrays and the structure back from the slot itself.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional

import numpy as np

from ._core import SlotLayout, gather_rows

_SHAREABLE_KINDS = frozenset("biufc")  # bool, int, uint, float, complex


class SampleStructureError(ValueError):
    """A sample does not match the structure/shape/dtype of its batch's first sample."""

    def __init__(self, message: str, sample_index: int = -1) -> None:
        super().__init__(message)
        self.sample_index = sample_index


def _as_leaf(value: Any, path: str, index: int) -> np.ndarray:
    if type(value) is np.ndarray:
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    if isinstance(value, bool):
        return np.asarray(value, dtype=np.bool_)
    if isinstance(value, int):
        return np.asarray(value, dtype=np.int64)
    if isinstance(value, float):
        return np.asarray(value, dtype=np.float64)
    if hasattr(value, "__array__") and not isinstance(value, (str, bytes)):
        return np.asarray(value)  # e.g. a CPU torch.Tensor: a view, no copy
    raise SampleStructureError(
        f"sample {index}: field {path or '<sample>'} is a {type(value).__name__}; spindle batches numpy "
        "arrays, numpy scalars, bool, int and float, nested in dicts, tuples and lists. "
        "Convert it in __getitem__ (e.g. encode strings as integer ids).", index)


def flatten(value: Any, index: int, path: str = "", out: Optional[list] = None) -> tuple[Any, list]:
    """(structure, [(path, leaf array), ...]) of one sample."""
    leaves: list[tuple[str, np.ndarray]] = [] if out is None else out
    return _flatten(value, path, index, leaves), leaves


def _flatten(value: Any, path: str, index: int, out: list) -> Any:
    if isinstance(value, dict):
        return ("dict", type(value), tuple(
            (k, _flatten(v, f"{path}[{k!r}]", index, out)) for k, v in value.items()))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return ("namedtuple", type(value), tuple(
            _flatten(v, f"{path}.{f}", index, out) for f, v in zip(value._fields, value)))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, type(value), tuple(
            _flatten(v, f"{path}[{i}]", index, out) for i, v in enumerate(value)))
    out.append((path, _as_leaf(value, path, index)))
    return None


def _rebuild(tree: Any, leaves: Callable[[], Any], tuples_as_lists: bool) -> Any:
    if tree is None:
        return leaves()
    kind, cls, children = tree
    if kind == "dict":
        return cls((k, _rebuild(c, leaves, tuples_as_lists)) for k, c in children)
    if kind == "namedtuple":
        return cls(*(_rebuild(c, leaves, tuples_as_lists) for c in children))
    if kind == "tuple" and tuples_as_lists:
        cls = list
    return cls(_rebuild(c, leaves, tuples_as_lists) for c in children)


def _describe(tree: Any) -> str:
    if tree is None:
        return "leaf"
    kind, _, children = tree
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe(c)}" for k, c in children) + "}"
    return f"{kind}(" + ", ".join(_describe(c) for c in children) + ")"


_PY_SCALARS = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64)}


class Columns:
    """A batch of samples split into one column (list of leaf values) per field,
    checked to share the first sample's structure, shapes and dtypes."""

    def __init__(self, samples: list[Any], indices: list[int]) -> None:
        first = indices[0]
        self.tree, leaves = flatten(samples[0], first)
        self.paths = [path for path, _ in leaves]
        self.fields = []
        for path, leaf in leaves:
            if leaf.dtype.kind not in _SHAREABLE_KINDS:
                raise SampleStructureError(
                    f"sample {first}: field {path or '<sample>'} has dtype {leaf.dtype}, which cannot be "
                    "batched in shared memory; use bool, integer, float or complex arrays.", first)
            self.fields.append((leaf.dtype.str, leaf.shape))
        columns = self._flat_columns(samples)
        if columns is None:
            columns = self._checked_columns(samples, indices, leaves)
        self.columns = columns

    def _flat_columns(self, samples: list[Any]) -> Optional[list[list[Any]]]:
        """The common case at C speed: a bare leaf, or a flat tuple/list/dict of
        leaves, each an ndarray of exactly the field's shape and dtype or a
        Python bool/int/float where the field came from one. None if any
        sample differs in any way (the checked path then names it)."""
        tree = self.tree
        first = samples[0]
        if tree is None:
            columns = [samples]
        elif tree[0] in ("tuple", "list") and all(c is None for c in tree[2]):
            kind, n = type(first), len(first)
            if not all(type(s) is kind and len(s) == n for s in samples):
                return None
            columns = [list(c) for c in zip(*samples)]
        elif tree[0] == "dict" and type(first) is dict and all(c is None for _, c in tree[2]):
            keys = first.keys()
            if not all(type(s) is dict and s.keys() == keys for s in samples):
                return None
            columns = [[s[k] for s in samples] for k in keys]
        else:
            return None
        for column, (dtype, shape) in zip(columns, self.fields):
            kind = type(column[0])
            if kind is np.ndarray:
                dt = np.dtype(dtype)
                if not all(type(v) is np.ndarray and v.shape == shape and v.dtype == dt for v in column):
                    return None
            elif kind in _PY_SCALARS:
                if _PY_SCALARS[kind].str != dtype or not all(type(v) is kind for v in column):
                    return None
            else:
                return None
        return columns

    def _checked_columns(self, samples: list[Any], indices: list[int], leaves: list) -> list[list[Any]]:
        first = indices[0]
        columns = [[leaf] for _, leaf in leaves]
        bare = self.tree is None
        for sample, index in zip(samples[1:], indices[1:]):
            if bare:
                flat = [("", _as_leaf(sample, "", index))]
            else:
                tree, flat = flatten(sample, index)
                if tree != self.tree:
                    raise SampleStructureError(
                        f"sample {index} has structure {_describe(tree)}, but sample {first} (the first of "
                        f"its batch) had {_describe(self.tree)}; every sample of a batch must have the same "
                        "keys and nesting.", index)
            for column, (path, leaf), (dtype, shape) in zip(columns, flat, self.fields):
                if leaf.shape != shape or leaf.dtype.str != dtype:
                    raise SampleStructureError(
                        f"sample {index}: field {path or '<sample>'} has shape {leaf.shape} and dtype "
                        f"{leaf.dtype}, but sample {first} (the first of its batch) had shape {shape} and "
                        f"dtype {np.dtype(dtype)}. Samples of one batch must have the same shapes: pad, crop "
                        "or cast them in __getitem__.", index)
                column.append(leaf)
        return columns

    def write(self, arrays: list[np.ndarray]) -> None:
        """Copies every column into rows 0.. of its field's array."""
        for dst, column, (dtype, shape) in zip(arrays, self.columns, self.fields):
            count = len(column)
            if type(column[0]) in _PY_SCALARS:  # checked: all of that type
                dst[:count] = column
                continue
            if shape and all(type(v) is np.ndarray for v in column):
                if gather_rows(dst[:count], column, np.dtype(dtype).itemsize * int(np.prod(shape))):
                    continue  # streaming stores, one call
            for row, value in enumerate(column):
                dst[row] = value


class SlotWriter:
    """Worker side: writes a batch's columns into its ring slot, reusing
    layouts and pickled structures across batches of the same shape."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._layouts: dict[tuple, SlotLayout] = {}
        self._structures: dict[Any, bytes] = {}

    def write(self, ctx: Any, item: Any, columns: Columns) -> None:
        key = tuple(columns.fields)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = SlotLayout([(d, list(s)) for d, s in key], self._capacity)
        structure = self._structures.get(columns.tree)
        if structure is None:
            try:
                structure = pickle.dumps(columns.tree, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise SampleStructureError(
                    f"the structure of batch {item.batch_id} ({_describe(columns.tree)}) cannot be sent to the "
                    f"consumer: {exc}. Define the sample's container classes (e.g. namedtuples) at module "
                    "level.") from exc
            self._structures[columns.tree] = structure
        columns.write(ctx.begin_arrays(item, layout, structure))


class BatchReader:
    """Consumer side: a delivered array batch as the user's nested structure."""

    def __init__(self, convert: Optional[Callable[[np.ndarray], Any]] = None,
                 tuples_as_lists: bool = False) -> None:
        self._convert = convert
        self._tuples_as_lists = tuples_as_lists
        self._trees: dict[bytes, Any] = {}

    def read(self, lease: Any) -> Any:
        structure = lease.structure
        tree = self._trees.get(structure)
        if tree is None:
            tree = self._trees[structure] = pickle.loads(structure)
        return self.rebuild(tree, lease.arrays())

    def rebuild(self, tree: Any, arrays: list[np.ndarray]) -> Any:
        it = iter(arrays)
        convert = self._convert
        leaf = (lambda: next(it)) if convert is None else (lambda: convert(next(it)))
        return _rebuild(tree, leaf, self._tuples_as_lists)


def collate_local(samples: list[Any], indices: list[int], reader: BatchReader) -> Any:
    """In-process batching (num_workers=0) with the same checks and result as the workers'."""
    columns = Columns(samples, indices)
    arrays = [np.empty((len(samples),) + shape, np.dtype(dtype)) for dtype, shape in columns.fields]
    columns.write(arrays)
    return reader.rebuild(columns.tree, arrays)
