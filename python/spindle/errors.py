"""Exceptions raised by spindle.

Every class derives from :class:`SpindleError`, a :class:`RuntimeError`, so code
written for torch's DataLoader (which raises ``RuntimeError`` for dead workers
and timeouts) keeps working.
"""

from __future__ import annotations

__all__ = [
    "SpindleError",
    "ThreadBudgetError",
    "ThreadBudgetWarning",
    "SharedMemoryError",
    "WorkerDiedError",
    "LoaderTimeoutError",
    "BatchFailedError",
    "WorkerError",
    "DataError",
    "DecodeError",
]


class SpindleError(RuntimeError):
    """Base class of every error spindle raises itself."""


class ThreadBudgetError(SpindleError):
    """The requested workers do not fit the thread budget (ulimit -u, pids.max, max_threads)."""


class ThreadBudgetWarning(RuntimeWarning):
    """A loader runs with fewer workers than asked (budget_policy="shrink"); the message has the numbers."""


class SharedMemoryError(SpindleError):
    """Shared memory for the batch ring could not be created (e.g. /dev/shm too small)."""


class WorkerDiedError(SpindleError):
    """A worker process died; the message names its pid, signal or exit code and its batch."""


class LoaderTimeoutError(SpindleError):
    """No batch arrived within ``timeout`` seconds; the message names the worker and sample."""


class BatchFailedError(SpindleError):
    """Raw report of a batch a worker could not produce (the runtime's view).

    The Python loader turns it back into the worker's own exception; this class
    is seen directly only when that is impossible.
    """

    def __init__(self, message: str, worker_id: int = -1, pid: int = 0, batch_id: int = -1,
                 payload: bytes = b"") -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.batch_id = batch_id
        self.payload = payload


class WorkerError(SpindleError):
    """A worker raised an exception that could not be re-created in the consumer."""


class DataError(SpindleError, ValueError):
    """Input data is malformed: a corrupt or truncated tar shard, an unusable .npy file, a bad label.

    The message names the file (shard, key, byte offset) and what to change. A
    :class:`ValueError` too, as Python code expects for bad input.
    """


class DecodeError(SpindleError, ValueError):
    """Encoded image bytes could not be decoded (truncated, corrupt, empty, not a JPEG/PNG).

    The message carries the decoder's own words (libjpeg-turbo's or libspng's). A
    ``ValueError`` too, as PIL raises for bad image data.
    """
