"""A worker's failure, both ends: packed into the slot in the worker, re-created in the consumer.

A Python exception in a worker fails only its batch: the worker pickles it (with its
traceback, sample index, worker id and pid) into the slot as the batch's payload, and
the consumer's next() re-raises it as the same exception type with the worker's
traceback as a note.
"""

from __future__ import annotations

import logging
import os
import pickle
import traceback
from typing import Optional

from ..errors import BatchFailedError, WorkerError


def worker_replaced(message: str) -> None:
    """The core's line when a lost worker was started again (``max_replacements``): one WARNING on
    the "spindle" logger per replacement."""
    logging.getLogger("spindle").warning("%s", message)


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


def reraise(failed: BatchFailedError) -> BaseException:
    """Re-creates the worker's exception, with its traceback and sample index as a note."""
    try:
        report = pickle.loads(failed.payload)
    except Exception:
        return WorkerError(str(failed))
    where = (f"in spindle worker {report['worker_id']} (pid {report['pid']}) while loading sample index "
             f"{report['sample_index']} (batch {failed.batch_id})")
    note = f"Raised {where}. Traceback in the worker:\n{report['traceback']}"
    exc: Optional[BaseException] = None
    if report["exception"] is not None:
        try:
            exc = pickle.loads(report["exception"])
        except Exception:
            exc = None
    if exc is None:
        exc = WorkerError(f"{report['type']}: {report['text']} ({where})")
    exc.add_note(note)
    exc.sample_index = report["sample_index"]  # type: ignore[attr-defined]
    exc.worker_id = report["worker_id"]  # type: ignore[attr-defined]
    return exc
