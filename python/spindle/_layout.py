"""BatchLayout: how samples of a fixed structure are stored in a ring slot.

A sample is a leaf (numpy array, numpy scalar, bool, int, float) or a nested
dict / tuple / list / namedtuple of leaves. The layout is taken from one probe
sample; every later sample must have the same structure, shapes and dtypes.

Slot layout (structure of arrays): for each leaf, in flattening order, one
C-contiguous block ``[batch_capacity, *leaf.shape]`` of ``leaf.dtype``, each
block starting on a 64-byte boundary. A batch of ``count`` samples is the first
``count`` rows of every block, so a short last batch needs no second layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ._core import gather_rows

_ALIGN = 64


class SampleStructureError(ValueError):
    """A sample does not match the structure/shape/dtype of the first sample."""

    def __init__(self, message: str, sample_index: int = -1) -> None:
        super().__init__(message)
        self.sample_index = sample_index


@dataclass(frozen=True)
class Leaf:
    path: str                 # "['image']", "[1]", "" for a bare leaf
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int               # of the leaf's block in the slot
    sample_bytes: int


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


def _flatten(value: Any, path: str, index: int, out: list[tuple[str, np.ndarray]]) -> Any:
    """Appends the leaves of `value` to `out`; returns its structure."""
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


def _rebuild(tree: Any, leaves: Callable[[], Any], tuples_as_lists: bool = False) -> Any:
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


class BatchLayout:
    """Writes samples into a slot (worker side) and views a slot as a batch (consumer side)."""

    def __init__(self, probe: Any, probe_index: int, batch_capacity: int) -> None:
        flat: list[tuple[str, np.ndarray]] = []
        self.tree = _flatten(probe, "", probe_index, flat)
        self.probe_index = probe_index
        self.batch_capacity = batch_capacity
        leaves = []
        offset = 0
        for path, arr in flat:
            nbytes = arr.dtype.itemsize * int(np.prod(arr.shape, dtype=np.int64))
            leaves.append(Leaf(path, arr.dtype, arr.shape, offset, nbytes))
            offset += -(-nbytes * batch_capacity // _ALIGN) * _ALIGN
        self.leaves = tuple(leaves)
        self.slot_bytes = max(offset, 1)
        self._bare = self.tree is None

    # ---------------------------------------------------------------- views
    def views(self, buffer: Any) -> list[np.ndarray]:
        """Full-capacity arrays, one per leaf, over `buffer` (a slot's bytes)."""
        raw = np.frombuffer(buffer, dtype=np.uint8, count=self.slot_bytes)
        return [raw[leaf.offset: leaf.offset + leaf.sample_bytes * self.batch_capacity]
                .view(leaf.dtype).reshape((self.batch_capacity,) + leaf.shape)
                for leaf in self.leaves]

    def allocate(self) -> list[np.ndarray]:
        """Private (non-shared) arrays for an in-process batch."""
        return [np.empty((self.batch_capacity,) + leaf.shape, leaf.dtype) for leaf in self.leaves]

    def unpack(self, arrays: list[np.ndarray], count: int, convert: Callable[[np.ndarray], Any] = None,
               tuples_as_lists: bool = False) -> Any:
        """The user-facing batch: the first `count` rows, in the sample's structure.

        `convert` maps each field's array (e.g. to a tensor); `tuples_as_lists`
        follows torch's default_collate, which returns a list for a tuple.
        """
        it = iter(arrays)
        if convert is None:
            return _rebuild(self.tree, lambda: next(it)[:count], tuples_as_lists)
        return _rebuild(self.tree, lambda: convert(next(it)[:count]), tuples_as_lists)

    # ---------------------------------------------------------------- writing
    def write_batch(self, arrays: list[np.ndarray], samples: list[Any], indices: list[int]) -> None:
        """Copies `samples` (dataset indices `indices`) into rows 0.. of `arrays`.

        Each field is copied in one call (streaming stores, or np.concatenate
        for non-contiguous rows) into its block when every sample's value is an
        array of exactly the expected shape and dtype;
        anything else goes row by row through write(), which converts scalars
        and raises the precise error.
        """
        if self._bare:
            columns = [samples]
        else:
            columns = [[] for _ in self.leaves]
            for sample, index in zip(samples, indices):
                flat: list[tuple[str, np.ndarray]] = []
                if _flatten(sample, "", index, flat) != self.tree:
                    self.write(arrays, 0, sample, index)  # raises the structure error
                for column, (_, value) in zip(columns, flat):
                    column.append(value)
        count = len(samples)
        for dst, leaf, column in zip(arrays, self.leaves, columns):
            shape, dtype = leaf.shape, leaf.dtype
            if shape and all(type(v) is np.ndarray and v.shape == shape and v.dtype == dtype for v in column):
                if not gather_rows(dst[:count], column, leaf.sample_bytes):  # a row is not contiguous
                    np.concatenate(column, axis=0, out=dst[:count].reshape((count * shape[0],) + shape[1:]))
            else:
                for row, (value, index) in enumerate(zip(column, indices)):
                    self._put(dst, leaf, row, _as_leaf(value, leaf.path, index), index)

    def write(self, arrays: list[np.ndarray], row: int, sample: Any, index: int) -> None:
        """Copies `sample` (dataset index `index`) into row `row` of `arrays`."""
        if self._bare:
            leaf = self.leaves[0]
            # Hot path (one array per sample): checks inlined, no helper calls.
            if type(sample) is np.ndarray and sample.shape == leaf.shape and sample.dtype == leaf.dtype:
                arrays[0][row] = sample
            else:
                self._put(arrays[0], leaf, row, _as_leaf(sample, "", index), index)
            return
        flat: list[tuple[str, np.ndarray]] = []
        tree = _flatten(sample, "", index, flat)
        if tree != self.tree:
            raise SampleStructureError(
                f"sample {index} has structure {_describe(tree)}, but sample {self.probe_index} had "
                f"{_describe(self.tree)}; every sample must have the same keys and nesting.", index)
        for dst, leaf, (_, value) in zip(arrays, self.leaves, flat):
            self._put(dst, leaf, row, value, index)

    def _put(self, dst: np.ndarray, leaf: Leaf, row: int, value: np.ndarray, index: int) -> None:
        if value.shape != leaf.shape or value.dtype != leaf.dtype:
            raise SampleStructureError(
                f"sample {index}: field {leaf.path or '<sample>'} has shape {value.shape} and dtype "
                f"{value.dtype}, but sample {self.probe_index} had shape {leaf.shape} and dtype "
                f"{leaf.dtype}. spindle batches fixed-shape samples: pad, crop or cast them in "
                "__getitem__.", index)
        dst[row] = value


def _describe(tree: Any) -> str:
    if tree is None:
        return "leaf"
    kind, _, children = tree
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe(c)}" for k, c in children) + "}"
    return f"{kind}(" + ", ".join(_describe(c) for c in children) + ")"
