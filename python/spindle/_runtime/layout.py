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

from .._core import SampleRows, SlotLayout, gather_rows

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


def _fields(leaves: list, index: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(dtype string, shape) of each leaf of sample `index`; refuses dtypes a slot cannot hold."""
    for path, leaf in leaves:
        if leaf.dtype.kind not in _SHAREABLE_KINDS:
            raise SampleStructureError(
                f"sample {index}: field {path or '<sample>'} has dtype {leaf.dtype}, which cannot be "
                "batched in shared memory; use bool, integer, float or complex arrays.", index)
    return tuple((leaf.dtype.str, leaf.shape) for _, leaf in leaves)


def _walk(tree: Any) -> Optional[list[tuple]]:
    """The structure in preorder, as _core.SampleRows takes it; None if a container is one the
    C++ walk does not read exactly as _flatten does (a dict subclass, a sequence overriding
    iteration): such batches always take the Python path."""
    walk: list[tuple] = []

    def visit(node: Any) -> bool:
        if node is None:
            walk.append(("leaf",))
            return True
        kind, cls, children = node
        if kind == "dict":
            walk.append(("dict", tuple(k for k, _ in children)))
            return cls is dict and all(visit(c) for _, c in children)
        base = tuple if issubclass(cls, tuple) else list
        walk.append(("seq", cls, len(children)))
        return cls.__iter__ is base.__iter__ and cls.__len__ is base.__len__ and all(visit(c) for c in children)

    return walk if visit(tree) else None


def _scalar_type(dtype: str, shape: tuple[int, ...]) -> Any:
    """The numpy scalar type whose values a 0-d field takes as they are (None for other fields)."""
    dt = np.dtype(dtype)
    return dt.type if shape == () and dt.isnative else None


class Columns:
    """A batch of samples split into one column (list of leaf values) per field,
    checked to share the first sample's structure, shapes and dtypes."""

    def __init__(self, samples: list[Any], indices: list[int]) -> None:
        first = indices[0]
        self.tree, leaves = flatten(samples[0], first)
        self.paths = [path for path, _ in leaves]
        self.fields = list(_fields(leaves, first))
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
            elif issubclass(kind, np.generic) and shape == ():  # numpy scalars of one type
                if np.dtype(kind).str != dtype or not all(type(v) is kind for v in column):
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
            if not shape:  # 0-d: numpy scalars (checked: all of this dtype), in one conversion
                dst[:count] = column
                continue
            if shape and all(type(v) is np.ndarray for v in column):
                if gather_rows(dst[:count], column, np.dtype(dtype).itemsize * int(np.prod(shape))):
                    continue  # streaming stores, one call
            for row, value in enumerate(column):
                dst[row] = value


def fits_a_slot(fields: tuple[tuple[str, tuple[int, ...]], ...], structure: bytes) -> bool:
    """Whether a batch of these fields (dtype, shape) and this pickled structure fits one slot's
    descriptor; the limits are the runtime SlotLayout's. A batch that does not travels pickled."""
    return (len(fields) <= SlotLayout.MAX_FIELDS and len(structure) <= SlotLayout.MAX_STRUCTURE_BYTES
            and all(len(shape) <= SlotLayout.MAX_DIMS for _, shape in fields))


class _Plan:
    """What a worker needs to write batches of one structure: the runtime's
    layout (None: the batch does not fit a slot's descriptor), the pickled
    structure, and its compiled walk (None: the Python path)."""

    __slots__ = ("tree", "layout", "structure", "rows")

    def __init__(self, tree: Any, layout: Optional[SlotLayout], structure: bytes,
                 rows: Optional[SampleRows]) -> None:
        self.tree = tree
        self.layout = layout
        self.structure = structure
        self.rows = rows


class SlotWriter:
    """Worker side: writes a batch's samples into its ring slot.

    A batch is described by its first sample (``describe``); per description,
    once, the runtime lays it out and the walk over a sample is compiled to
    C++ (``SampleRows``). A batch whose every sample matches goes into the slot
    in one call (``WorkerContext.put_samples``); any other takes ``Columns``,
    which checks each sample in Python and names the one that differs.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._plans: dict[tuple, _Plan] = {}
        self._last: Optional[_Plan] = None  # tried first: batches mostly share one structure

    @staticmethod
    def describe(sample: Any, index: int) -> tuple:
        """(structure, fields) of a batch whose first sample is `sample`; raises
        SampleStructureError (or numpy's error) if a slot cannot hold it."""
        tree, leaves = flatten(sample, index)
        return tree, _fields(leaves, index)

    def read(self, ctx: Any, item: Any, dataset: Any) -> Optional[tuple[list[Any], list[int]]]:
        """Reads the item's samples (``dataset[i]``), writing each into the slot as it is read
        while every one matches the structure of the batch's first sample (the last batch's
        plan if it takes that sample, else one made for it). The worker thus never holds a
        batch of samples, only the one being copied and the one before it, as a plain loop over
        ``dataset[i]`` nearly does. None if the batch is in the slot (commit it); else (samples,
        indices) for ``write``, the samples already copied rebuilt from the slot exactly as
        they came. A first sample the slot cannot take goes to ``write`` with the rest, which
        names it (or, for torch, collates)."""
        first = ctx.read_sample(item, dataset)
        plan = self._plan_for(item, first)
        if plan is None:
            return ctx.read_samples(item, dataset, first)
        left = ctx.read_rows(item, dataset, plan.rows, first)
        if left is None:
            self._last = plan
            return None
        written, kinds, rest = left
        return self._rebuilt(ctx, item, plan, written, kinds) + rest, item.indices

    def read_stream(self, ctx: Any, item: Any, stream: Any, first: Any, count: int,
                    position: int) -> tuple[int, bool, Optional[BaseException], Optional[tuple[list[Any], list[int]]]]:
        """``read`` for a stream: `first` (already read, stream position `position`) and up to
        count - 1 more samples from `stream`, each written as read while they match the plan
        `first` picks. Returns (samples read, whether the stream ended, the exception the stream
        raised or None, and None if the batch is in the slot or else (samples, indices) for
        ``write``)."""
        plan = self._plan_for(item, first, position)
        read, ended, error, written, kinds, rest = ctx.read_stream_rows(
            item, stream, first, count, position, None if plan is None else plan.rows)
        del first
        if error is not None or written == read:
            if error is None:
                self._last = plan
            return read, ended, error, None
        samples = self._rebuilt(ctx, item, plan, written, kinds) + rest
        return read, ended, None, (samples, list(range(position, position + read)))

    def _plan_for(self, item: Any, sample: Any, index: Optional[int] = None) -> Optional[_Plan]:
        """The plan a batch whose first sample (number `index`; None: the item's first index) is
        `sample` is written with as it is read: the last batch's if it takes the sample exactly,
        else one made for it; None if the sample cannot be laid out or its structure is not one
        the C++ walk reads (``write`` then meets the same sample again, and reports, lays out or
        collates as it does)."""
        plan = self._last
        if plan is not None and plan.rows.takes(sample):
            return plan
        try:
            description = self.describe(sample, item.indices[0] if index is None else index)
            plan = self._plans.get(description) or self._plan(item, description)
        except Exception:
            return None
        return plan if plan.rows is not None else None

    @staticmethod
    def _rebuilt(ctx: Any, item: Any, plan: _Plan, count: int, kinds: bytes) -> list[Any]:
        """Samples 0..count-1 of the item's slot as they were before read_rows copied them:
        arrays (copies), Python bool/int/float and numpy scalars by `kinds`, in their containers."""
        if count == 0:
            return []
        arrays = ctx.begin_arrays(item, plan.layout, plan.structure)  # the same layout: rows stay
        fields = len(arrays)
        samples = []
        for s in range(count):
            leaves = iter(range(s * fields, (s + 1) * fields))

            def leaf() -> Any:
                at = next(leaves)
                value = arrays[at % fields][s]
                kind = kinds[at]
                if kind == 0:
                    return np.array(value)  # a copy: the slot is rewritten next
                return (None, int, float, bool, lambda v: v)[kind](value)

            samples.append(_rebuild(plan.tree, leaf, False))
        return samples

    def write(self, ctx: Any, item: Any, samples: list[Any], indices: list[int]) -> Optional[Columns]:
        """The batch into the item's slot; SampleStructureError names a sample that does not fit.
        None once written; the checked Columns, with nothing written, if the batch has more fields
        (or a larger structure) than a slot's descriptor holds: the caller sends it pickled."""
        if self.write_as_last(ctx, item, samples):
            return None
        if self.write_as(ctx, item, samples, self.describe(samples[0], indices[0])):
            return None
        columns = Columns(samples, indices)
        return None if self.write_columns(ctx, item, columns) else columns

    def write_as_last(self, ctx: Any, item: Any, samples: list[Any]) -> bool:
        """The batch in one C++ call if every sample, the first too, matches exactly the
        structure of the last batch written so (batches mostly share one); False (nothing
        written) otherwise. Saves describing the first sample."""
        last = self._last
        return last is not None and ctx.put_samples(item, last.rows, samples)

    def write_as(self, ctx: Any, item: Any, samples: list[Any], description: tuple) -> bool:
        """The batch in one C++ call if every sample matches `description` exactly; False
        (nothing written) otherwise. Call write_as_last first (its structure is not retried)."""
        plan = self._plans.get(description) or self._plan(item, description)
        if plan.rows is None or plan is self._last or not ctx.put_samples(item, plan.rows, samples):
            return False
        self._last = plan
        return True

    def write_columns(self, ctx: Any, item: Any, columns: Columns) -> bool:
        """The Python path: `columns` (already checked) into the slot; False (nothing written) if
        the batch does not fit a slot's descriptor (fits_a_slot)."""
        description = (columns.tree, tuple(columns.fields))
        plan = self._plans.get(description) or self._plan(item, description)
        if plan.layout is None:
            return False
        columns.write(ctx.begin_arrays(item, plan.layout, plan.structure))
        return True

    def _plan(self, item: Any, description: tuple) -> _Plan:
        tree, fields = description
        try:
            structure = pickle.dumps(tree, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SampleStructureError(
                f"the structure of batch {item.batch_id} ({_describe(tree)}) cannot be sent to the "
                f"consumer: {exc}. Define the sample's container classes (e.g. namedtuples) at module "
                "level.") from exc
        if not fits_a_slot(fields, structure):
            plan = self._plans[description] = _Plan(tree, None, structure, None)
            return plan
        layout = SlotLayout([(d, list(s)) for d, s in fields], self._capacity)
        walk = _walk(tree) if fields else None
        rows = None if walk is None else SampleRows(walk, layout, structure,
                                                    [_scalar_type(d, s) for d, s in fields])
        plan = self._plans[description] = _Plan(tree, layout, structure, rows)
        return plan


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


def stacked(columns: Columns, reader: BatchReader) -> Any:
    """The batch of `columns` in new arrays (not a slot), in its samples' structure."""
    arrays = [np.empty((len(columns.columns[0]) if columns.columns else 0,) + shape, np.dtype(dtype))
              for dtype, shape in columns.fields]
    columns.write(arrays)
    return reader.rebuild(columns.tree, arrays)


def collate_local(samples: list[Any], indices: list[int], reader: BatchReader) -> Any:
    """In-process batching (num_workers=0) with the same checks and result as the workers'."""
    return stacked(Columns(samples, indices), reader)
