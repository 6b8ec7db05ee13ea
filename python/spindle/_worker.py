"""The body of a worker process (runs in the forked child).

The runtime hands us a WorkerContext: we claim work items (a ring slot whose
header lists the sample indices), write each sample into the slot through the
BatchLayout, and publish the slot. A Python exception fails only its batch: it
is pickled into the slot for the consumer to re-raise, and the worker goes on.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import sys
import traceback
from typing import Any, Callable, Iterator

import numpy as np

from ._caps import cap_worker_pools


def pack_exception(exc: BaseException, index: int, worker_id: int, limit: int) -> bytes:
    """Pickles `exc` with the worker's traceback into at most `limit` bytes.

    Falls back to the exception's text when it cannot be pickled, and trims the
    traceback (keeping its end, where the error is) when the report is too big.
    """
    report = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "text": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
        "sample_index": index,
        "worker_id": worker_id,
        "pid": os.getpid(),
        "exception": None,
    }
    try:
        exc.__traceback__ = None
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # some exceptions pickle but cannot be re-created
        report["exception"] = blob
    except Exception:
        pass
    blob = pickle.dumps(report)
    if len(blob) > limit:
        report["exception"] = None
        keep = max(0, limit // 2)
        report["traceback"] = "... (trimmed)\n" + report["traceback"][-keep:]
        report["text"] = report["text"][:keep // 4]
        blob = pickle.dumps(report)
    return blob


def seed_worker(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)


class PickledBatches:
    """The general path: a batch of any Python objects, pickled into its slot.

    Used when samples do not fit a fixed layout (strings, variable shapes) or
    a custom collate function runs in the worker. Slot payload: an 8-byte
    little-endian length, then the pickle.
    """

    HEADER = 8

    def __init__(self, collate: Callable[[list[Any]], Any], slot_bytes: int) -> None:
        self.collate = collate
        self.slot_bytes = slot_bytes

    def write_batch(self, arrays: list[np.ndarray], samples: list[Any], indices: list[int]) -> None:
        payload = arrays[0]
        blob = pickle.dumps(self.collate(samples), protocol=pickle.HIGHEST_PROTOCOL)
        room = self.slot_bytes - self.HEADER
        if len(blob) > room:
            raise ValueError(
                f"spindle: the collated batch of samples {indices[:4]}... pickles to {len(blob)} bytes, more "
                f"than a slot holds ({room} bytes, sized from the first batch). Make batches more uniform in "
                "size, or return fixed-shape arrays so they take the zero-copy path.")
        payload[:self.HEADER] = np.frombuffer(len(blob).to_bytes(self.HEADER, "little"), np.uint8)
        payload[self.HEADER:self.HEADER + len(blob)] = np.frombuffer(blob, np.uint8)

    def views(self, buffer: Any) -> list[np.ndarray]:
        return [np.frombuffer(buffer, dtype=np.uint8, count=self.slot_bytes)]

    def read(self, buffer: Any) -> Any:
        raw = memoryview(buffer)
        n = int.from_bytes(raw[:self.HEADER], "little")
        return pickle.loads(raw[self.HEADER:self.HEADER + n])


def _slot_arrays(mem: Any, geo: dict[str, int], layout: Any, slot: int) -> list[np.ndarray]:
    """The layout's arrays over ring slot `slot` of the shared segment `mem`."""
    start = geo["payload_offset"] + slot * geo["slot_stride"]
    return layout.views(mem[start:start + geo["slot_bytes"]])


def _start(ctx: Any, setup: Callable[[int, int], Any]) -> bool:
    """Prepares a worker before any user code; False if `setup` raised.

    A failing setup (seeding, worker_init_fn, opening a stream) reaches the
    consumer as the exception itself, through the first item this worker
    claims; the worker then stops.
    """
    # Ctrl-C reaches the whole process group; the consumer handles it and
    # closes us, so a worker must not die with its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    cap_worker_pools()  # before any user code can start a pool
    try:
        setup(ctx.worker_id, ctx.num_workers)
        return True
    except Exception as exc:
        item = ctx.claim()
        if item is not None:
            exc.add_note(f"Raised while starting spindle worker {ctx.worker_id} (worker_init_fn or the "
                         "dataset's setup), before any sample.")
            ctx.fail(item, pack_exception(exc, -1, ctx.worker_id, ctx.layout()["slot_stride"]))
        return False


def run_worker(ctx: Any, dataset: Any, layout: Any, setup: Callable[[int, int], None]) -> int:
    """Claims batches until the loader closes. `layout` is a BatchLayout or
    PickledBatches; `setup(worker_id, num_workers)` seeds the worker and runs
    the user's init function before any sample is read."""
    if not _start(ctx, setup):
        return 1
    worker_id = ctx.worker_id
    mem = ctx.memory()
    geo = ctx.layout()
    cap, stride = geo["batch_capacity"], geo["slot_stride"]
    # The worker's crash record: the sample being loaded, read by the consumer
    # if this process dies.
    record = np.frombuffer(mem, dtype=np.int64, count=1, offset=geo["sample_record_offset"])
    slots: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
    try:
        while (item := ctx.claim()) is not None:
            slot = item.slot
            if slot not in slots:
                indices = np.frombuffer(mem, dtype=np.int64, count=cap,
                                        offset=geo["indices_offset"] + slot * cap * 8)
                slots[slot] = (indices, _slot_arrays(mem, geo, layout, slot))
            indices, arrays = slots[slot]
            index = -1
            try:
                batch_indices = indices[:item.count].tolist()
                samples = []
                append = samples.append
                for index in batch_indices:
                    record[0] = index
                    append(dataset[index])
                index = -1  # from here on, errors name their own sample
                layout.write_batch(arrays, samples, batch_indices)
                del samples
                ctx.commit(item)
            except Exception as exc:
                index = getattr(exc, "sample_index", index)
                ctx.fail(item, pack_exception(exc, index, worker_id, stride))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def run_stream_worker(ctx: Any, dataset: Any, layout: Any, setup: Callable[[int, int], None],
                      batch_size: int, drop_last: bool) -> int:
    """Round-robin mode: each claimed item asks for this worker's next batch of
    `batch_size` samples from its own `iter(dataset)` (which may shard itself by
    worker id); once the stream ends, every item is answered "exhausted"."""
    streams: list[Iterator[Any]] = []
    if not _start(ctx, lambda w, n: (setup(w, n), streams.append(iter(dataset)))):
        return 1
    stream = streams[0]
    worker_id = ctx.worker_id
    geo = ctx.layout()
    stride = geo["slot_stride"]
    mem = ctx.memory()
    record = np.frombuffer(mem, dtype=np.int64, count=1, offset=geo["sample_record_offset"])
    slots: dict[int, list[np.ndarray]] = {}
    position = 0  # samples this worker has read from its stream
    ended = False
    try:
        while (item := ctx.claim()) is not None:
            if ended:
                ctx.exhausted(item)
                continue
            samples: list[Any] = []
            try:
                for _ in range(batch_size):
                    record[0] = position
                    try:
                        samples.append(next(stream))
                    except StopIteration:
                        ended = True
                        break
                    position += 1
                if not samples or (drop_last and len(samples) < batch_size):
                    ended = True
                    ctx.exhausted(item)
                    continue
                if item.slot not in slots:
                    slots[item.slot] = _slot_arrays(mem, geo, layout, item.slot)
                first = position - len(samples)
                layout.write_batch(slots[item.slot], samples, list(range(first, position)))
                ctx.commit(item, len(samples))
            except Exception as exc:
                index = getattr(exc, "sample_index", position)
                ctx.fail(item, pack_exception(exc, index, worker_id, stride))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0
