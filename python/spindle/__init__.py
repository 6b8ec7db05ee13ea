"""spindle: a multi-process data loader with one thread budget and shared-memory batches.

`spindle.torch.DataLoader` (imported on demand, it needs torch) is the drop-in for
torch.utils.data.DataLoader.
"""

from . import errors
from ._core import ThreadBudget, ThreadPlan, count_process_threads
from .dataloader import DataLoader
from .errors import (
    BatchFailedError,
    LoaderTimeoutError,
    SharedMemoryError,
    SpindleError,
    ThreadBudgetError,
    WorkerDiedError,
    WorkerError,
)

__version__ = "0.1.0"

__all__ = [
    "DataLoader",
    "ThreadBudget",
    "ThreadPlan",
    "count_process_threads",
    "errors",
    "SpindleError",
    "ThreadBudgetError",
    "SharedMemoryError",
    "WorkerDiedError",
    "LoaderTimeoutError",
    "BatchFailedError",
    "WorkerError",
]
