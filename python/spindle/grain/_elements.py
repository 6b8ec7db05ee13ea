"""spindle.grain's transport: one element per item, numpy arrays zero-copy, anything else pickled."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from .._runtime.layout import SlotWriter
from .._runtime.worker import read_stream_kept


class ArrayElements:
    """grain's transport: one element per item. An element made only of numpy
    arrays (of at least one dimension, nested in dicts/tuples/lists — e.g. a
    batch after grain's Batch) is written field by field and arrives as views
    of the slot (read it with ``BatchReader(convert=first_row)``); anything
    else (scalars, strings, objects) travels pickled, exactly as it was."""

    def __init__(self) -> None:
        self._writer = SlotWriter(1)

    def read_stream(self, ctx: Any, item: Any, stream: Any, first: Any, count: int, position: int) -> Any:
        return read_stream_kept(ctx, item, stream, first, count, position)

    def write(self, ctx: Any, item: Any, samples: list[Any], indices: list[int]) -> None:
        element = samples[0]
        if _only_arrays(element) and self._writer.write(ctx, item, samples[:1], indices) is None:
            return  # in the slot; else more fields than a slot's descriptor holds, or not arrays
        ctx.put_bytes(item, pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))


def _only_arrays(value: Any) -> bool:
    if type(value) is np.ndarray:
        return value.ndim >= 1 and value.dtype.kind in "biufc"
    if isinstance(value, dict):
        return bool(value) and all(_only_arrays(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return bool(value) and all(_only_arrays(v) for v in value)
    return False


def first_row(array: np.ndarray) -> np.ndarray:
    """The one element of a one-element batch, as a view (for ArrayElements)."""
    return array[0]
