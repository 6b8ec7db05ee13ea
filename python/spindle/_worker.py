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
from typing import Any, Callable, Optional

import numpy as np

from ._layout import BatchLayout


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


def run_worker(ctx: Any, dataset: Any, layout: BatchLayout, base_seed: int,
               worker_init_fn: Optional[Callable[[int], None]]) -> int:
    # Ctrl-C reaches the whole process group; the consumer handles it and
    # closes us, so a worker must not die with its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker_id = ctx.worker_id
    seed_worker(base_seed + worker_id)
    if worker_init_fn is not None:
        worker_init_fn(worker_id)

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
                payload = mem[geo["payload_offset"] + slot * stride:][:geo["slot_bytes"]]
                slots[slot] = (indices, layout.views(payload))
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
