"""spindle.torch's transport: torch batches into ring slots (in the workers), and back (in the consumer)."""

from __future__ import annotations

import io
import pickle
import threading
from typing import Any, Callable, Optional

import numpy as np
import torch

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
        parts = ctx.begin_parts(item)
        _collating.parts = parts  # torch's collate stacks tensors into the slot (stack_into_slot)
        try:
            batch = self._collate(samples)
        finally:
            _collating.parts = None
        put_pickled(parts, batch)


# The PartsWriter of the batch this thread is collating, if any (a worker thread, or a worker process).
_collating = threading.local()


def stack_into_slot(batch: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """torch's default_collate's stack of same-shaped CPU tensors, written into room of the slot of the
    batch being collated, so that it travels as a part in place: no private copy, no second copy into
    the slot. None where torch's own stack must run (no batch being collated here, tensors autograd
    tracks or of other layouts, or shapes that differ, which torch's stack then reports)."""
    parts = getattr(_collating, "parts", None)
    elem = batch[0]
    if parts is None or not _plain_cpu(elem) or any(x.requires_grad for x in batch):
        return None
    numel = sum(x.numel() for x in batch)
    if numel != len(batch) * elem.numel():
        return None
    if all(x.dtype == elem.dtype and x.shape == elem.shape for x in batch):
        rows = [x.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8).numpy() for x in batch]
        room = parts.gather(rows)  # copied in as the array path copies samples (streaming stores)
        return torch.from_numpy(room).view(elem.dtype).view(len(batch), *elem.shape)
    room = parts.allocate(numel * elem.element_size())  # torch's stack decides what mixed dtypes give
    out = torch.from_numpy(room).view(elem.dtype).view(len(batch), *elem.shape)
    return torch.stack(batch, 0, out=out)


def _plain_cpu(tensor: Any) -> bool:
    return type(tensor) is torch.Tensor and tensor.layout == torch.strided and tensor.device.type == "cpu" \
        and not tensor.is_quantized and not tensor.is_nested


# Buffers smaller than this stay inside the pickle stream: a part of its own costs more than it saves.
_IN_BAND_BYTES = 1024


class _Pickler(pickle.Pickler):
    """Protocol 5 with torch's CPU tensors reduced to out-of-band buffers, as numpy arrays already are
    (torch's own reduction copies a tensor's storage into the stream)."""

    def reducer_override(self, obj: Any) -> Any:
        if _plain_cpu(obj):
            dense = obj.detach().resolve_conj().resolve_neg().contiguous()
            raw = dense.reshape(-1).view(torch.uint8).numpy()
            return _tensor_from_part, (pickle.PickleBuffer(raw), str(dense.dtype)[len("torch."):],
                                       tuple(dense.shape), obj.requires_grad)
        return NotImplemented


def put_pickled(parts: Any, obj: Any) -> None:
    """Writes `obj` as the item's parts (a PartsWriter, payload_parts.hpp): the pickle stream, then each
    array's and tensor's bytes, in place where they already lie in the slot (stack_into_slot), else
    copied once, so the consumer gets them back as views of the slot."""
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < _IN_BAND_BYTES:
            return True
        buffers.append(buffer)
        return False

    stream = io.BytesIO()
    _Pickler(stream, protocol=5, buffer_callback=out_of_band).dump(obj)
    parts.add(stream.getbuffer())
    for buffer in buffers:
        parts.add(buffer.raw())
    parts.finish()


def load_pickled(lease: Any) -> Any:
    """The object put_pickled wrote, its arrays and tensors viewing the slot (they keep it leased)."""
    parts = lease.parts()
    return pickle.loads(parts[0], buffers=parts[1:])


def _tensor_from_part(part: Any, dtype: str, shape: tuple, requires_grad: bool) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(part, dtype=np.uint8)).view(getattr(torch, dtype)).reshape(shape)
    return tensor.requires_grad_() if requires_grad else tensor
