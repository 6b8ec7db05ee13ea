"""Exceptions raised by spindle.

Every class derives from :class:`SpindleError`, a :class:`RuntimeError`, so code
written for torch's DataLoader (which raises ``RuntimeError`` for dead workers
and timeouts) keeps working. :class:`InternalError` (a bug in spindle) is an
:class:`AssertionError` too.

Errors are data: the runtime sets each exception's fields (``pid``, ``signal``,
``path``, ``key``...) where it raises it, and the bindings copy them onto these
attributes; read them instead of parsing the message.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "SpindleError",
    "ThreadBudgetError",
    "ThreadBudgetWarning",
    "StallWarning",
    "PeerVersionWarning",
    "SharedMemoryError",
    "WorkerDiedError",
    "LoaderTimeoutError",
    "ProcessesAdvised",
    "BatchFailedError",
    "WorkerError",
    "DataError",
    "DecodeError",
    "SkipRatioError",
    "InternalError",
]


class SpindleError(RuntimeError):
    """Base class of every error spindle raises itself."""


class ThreadBudgetError(SpindleError):
    """The requested workers do not fit the thread budget (ulimit -u, pids.max, max_threads)."""


class ThreadBudgetWarning(RuntimeWarning):
    """A loader runs with fewer workers than asked (budget_policy="shrink"); the message has the numbers."""


class StallWarning(RuntimeWarning):
    """``next()`` has waited longer than the stall threshold (``SPINDLE_STALL_WARNING`` seconds,
    default 30); the message says what each worker is doing (see docs/observability.md)."""


class PeerVersionWarning(UserWarning):
    """A drop-in runs on its peer's own workers (torch's, grain's): the installed peer is a release
    spindle was not checked on, or lacks a name spindle needs; the message names the version and why."""


class SharedMemoryError(SpindleError):
    """Shared memory for the batch ring could not be created (e.g. /dev/shm too small)."""


class WorkerDiedError(SpindleError):
    """A worker process died; the message names its pid, signal or exit code and its batch.

    Attributes (None where not known):
        pid: the worker's process id.
        exitcode: the status it passed to ``exit()``, if it exited.
        signal: the signal number that killed it (9 for SIGKILL, 11 for SIGSEGV), if one did.
        worker: its number among the loader's workers (0-based).
        sample: the sample index it was reading, if it had started one.
        batch: the batch it was producing, if it was not idle.
    """

    def __init__(self, message: str = "", *, pid: Optional[int] = None, exitcode: Optional[int] = None,
                 signal: Optional[int] = None, worker: Optional[int] = None, sample: Optional[int] = None,
                 batch: Optional[int] = None) -> None:
        super().__init__(message)
        self.pid = pid
        self.exitcode = exitcode
        self.signal = signal
        self.worker = worker
        self.sample = sample
        self.batch = batch


class LoaderTimeoutError(SpindleError):
    """No batch arrived within ``timeout`` seconds; the message names the worker and sample."""


class ProcessesAdvised(SpindleError):
    """Not a failure, and never seen through spindle's front ends: a runtime running streams with
    ``num_workers="auto"`` (spindle.grain) stopped waiting because its controller advised another
    count of processes (``advised_processes``); the front end starts the streams again on them."""


class BatchFailedError(SpindleError):
    """Raw report of a batch a worker could not produce (the runtime's view).

    The Python loader turns it back into the worker's own exception; this class
    is seen directly only when that is impossible.

    Attributes:
        worker_id, pid, batch_id: who failed, on which batch.
        payload: the worker's report, exactly as written (a pickled exception for a Python
            worker; the error's text for a native one).
        kind: what failed, from the slot's failure record: ``"python"`` (payload is a pickled
            exception), ``"decode"`` (a :class:`DecodeError`), ``"data"`` (a :class:`DataError`),
            ``"internal"`` (an :class:`InternalError`) or ``"other"``.
        path, key: the file (or shard) and sample key the failure names; None where not known.
    """

    def __init__(self, message: str, worker_id: int = -1, pid: int = 0, batch_id: int = -1,
                 payload: bytes = b"", *, kind: str = "other", path: Optional[str] = None,
                 key: Optional[str] = None) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.batch_id = batch_id
        self.payload = payload
        self.kind = kind
        self.path = path
        self.key = key


class WorkerError(SpindleError):
    """A worker raised an exception that could not be re-created in the consumer."""


class DataError(SpindleError, ValueError):
    """Input data is malformed: a corrupt or truncated tar shard, an unusable .npy file, a bad label.

    The message names the file (shard, key, byte offset) and what to change. A
    :class:`ValueError` too, as Python code expects for bad input.

    Attributes:
        path: the file or tar shard, None where not known.
        key: the sample's key in a WebDataset shard, None otherwise.
    """

    def __init__(self, message: str = "", *, path: Optional[str] = None, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path
        self.key = key


class DecodeError(SpindleError, ValueError):
    """Encoded image bytes could not be decoded (truncated, corrupt, empty, not a JPEG/PNG).

    The message carries the decoder's own words (libjpeg-turbo's or libspng's). A
    ``ValueError`` too, as PIL raises for bad image data.

    Attributes:
        path: the image file or tar shard, None where not known.
        key: the sample's key in a WebDataset shard, None otherwise.
    """

    def __init__(self, message: str = "", *, path: Optional[str] = None, key: Optional[str] = None) -> None:
        super().__init__(message)
        self.path = path
        self.key = key


class SkipRatioError(DataError):
    """A native pipeline with ``on_error("skip", max_ratio)`` skipped more than ``max_ratio`` of its samples.

    Raised by the runtime loader (judged from the 100th sample on, and when the epoch ends).

    Attributes:
        skipped: samples that could not be read and were replaced.
        samples: samples delivered so far this epoch.
        max_ratio: the limit that was exceeded.
    """

    def __init__(self, message: str = "", *, skipped: int = 0, samples: int = 0, max_ratio: float = 0.0) -> None:
        super().__init__(message)
        self.skipped = skipped
        self.samples = samples
        self.max_ratio = max_ratio


class InternalError(SpindleError, AssertionError):
    """A bug in spindle: a state its code believes cannot happen (spdl's ``InternalError``).

    An :class:`AssertionError` (as spdl registers it), and a :class:`SpindleError` like every
    error spindle raises. The message ends with the source location; please report it.
    """
