"""spindle.torch's transport (runs in the workers): torch batches into ring slots."""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional

from .._runtime.layout import Columns, SampleStructureError, SlotWriter
from .._runtime.worker import read_stream_kept


class CollatedBatches:
    """torch's transport: default collate over fixed-shape samples goes the
    zero-copy array path; anything else (a custom collate_fn, strings, ragged
    samples, batch_size=None) runs `collate` in the worker and travels pickled
    in the slot (the slot grows to fit)."""

    def __init__(self, collate: Callable[[list[Any]], Any], capacity: int, zero_copy: bool,
                 batched_fetch: bool = False) -> None:
        self._collate = collate
        self._writer = SlotWriter(capacity) if zero_copy else None
        self._batched_fetch = batched_fetch

    def read(self, ctx: Any, item: Any, dataset: Any) -> Optional[tuple[list[Any], list[int]]]:
        """As ArrayBatches.read on the array path; otherwise every sample, for collate. A dataset
        with ``__getitems__`` (a Hugging Face Dataset) is asked for the whole batch in one call, as
        torch's fetcher asks it when batching (`batched_fetch`): its samples may differ from
        ``dataset[i]``'s (HF gives float32 scalars there, float64 here)."""
        if self._batched_fetch:
            getitems = getattr(dataset, "__getitems__", None)
            if getitems:
                indices = list(item.indices)
                return getitems(indices), indices
        if self._writer is None:
            return ctx.read_samples(item, dataset)
        return self._writer.read(ctx, item, dataset)

    def read_stream(self, ctx: Any, item: Any, stream: Any, first: Any, count: int, position: int) -> Any:
        """A stream's batch, as SlotWriter.read_stream (without the array path: every sample kept)."""
        if self._writer is None:
            return read_stream_kept(ctx, item, stream, first, count, position)
        return self._writer.read_stream(ctx, item, stream, first, count, position)

    def write(self, ctx: Any, item: Any, samples: list[Any], indices: list[int]) -> None:
        writer = self._writer
        if writer is not None:
            if writer.write_as_last(ctx, item, samples):
                return
            # Samples the array path cannot lay out (ragged, or a tensor numpy cannot view,
            # such as a nested tensor): torch's collate decides, and raises torch's error if it must.
            laid_out = (SampleStructureError, RuntimeError, TypeError)
            try:
                description = writer.describe(samples[0], indices[0])
            except laid_out:
                description = None
            if description is not None:
                if writer.write_as(ctx, item, samples, description):
                    return
                try:
                    columns = Columns(samples, indices)
                except laid_out:
                    columns = None
                if columns is not None and writer.write_columns(ctx, item, columns):
                    return  # else more fields than a slot's descriptor holds: collated and pickled
        ctx.put_bytes(item, pickle.dumps(self._collate(samples), protocol=pickle.HIGHEST_PROTOCOL))
