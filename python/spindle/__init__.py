"""spindle: a multi-process data loader with one thread budget and shared-memory batches.

`spindle.torch.DataLoader` (imported on demand, it needs torch) is the drop-in for
torch.utils.data.DataLoader. `spindle.limit_threads(n)` caps the thread pools of the
other runtimes in the consumer; `spindle doctor` (or `python -m spindle doctor`) shows
the task limits and which pools use them. `spindle.shared(obj)` stores a list or dict of
plain values once in shared memory, for every worker to read without copying it.

`import spindle` loads neither numpy nor any thread-pool runtime (`DataLoader` is
imported on first use), so that `spindle.limit_threads(n)` can run before numpy's
OpenBLAS starts its pool.
"""

from typing import Any

from . import errors
from ._core import ArraySource, ImageFolder, ThreadBudget, ThreadPlan, WebDataset, auto_workers, count_process_threads
from .errors import (
    BatchFailedError,
    DataError,
    DecodeError,
    InternalError,
    LoaderTimeoutError,
    PeerVersionWarning,
    ProcessesAdvised,
    SharedMemoryError,
    SkipRatioError,
    SpindleError,
    StallWarning,
    ThreadBudgetError,
    ThreadBudgetWarning,
    WorkerDiedError,
    WorkerError,
)

from .limits import RuntimeLimit, ThreadLimitReport, limit_threads
from ._runtime.shared_containers import SharedDict, SharedList, shared

__all__ = [
    "DataLoader",
    "PipelineLoader",
    "mix",
    "Mix",
    "pipeline",
    "ThreadBudget",
    "ThreadPlan",
    "count_process_threads",
    "auto_workers",
    "limit_threads",
    "shared",
    "SharedList",
    "SharedDict",
    "ThreadLimitReport",
    "RuntimeLimit",
    "errors",
    *errors.__all__,
    "ops",
    "ImageFolder",
    "ArraySource",
    "WebDataset",
]


def __getattr__(name: str) -> Any:
    # These import numpy, whose OpenBLAS starts its pool at import: loaded on
    # first use, after a limit_threads(n) that wants to run before it.
    import importlib

    if name == "__version__":
        # One owner: pyproject.toml's version, as pip installed it (the package's metadata).
        from importlib.metadata import version

        return version("spindle")
    if name == "DataLoader":
        return importlib.import_module(".dataloader", __name__).DataLoader
    if name == "PipelineLoader":
        return importlib.import_module(".pipeline", __name__).PipelineLoader
    if name in ("mix", "Mix"):
        return getattr(importlib.import_module("._state.mix", __name__), name)
    if name in ("ops", "pipeline"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'spindle' has no attribute {name!r}")
