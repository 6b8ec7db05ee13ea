"""Keep a worker to its lease of one thread.

Two halves:

- ``cap_worker_pools()`` runs first thing in every worker, before any user
  code: it sets the environment that thread-pool runtimes read when they start
  (OpenMP, MKL, OpenBLAS, numexpr, TensorFlow, XLA/JAX) and caps the pools of
  runtimes already loaded in the consumer and inherited by the fork (torch's
  intra-op pool, OpenBLAS).
- ``ThreadWatchdog`` runs in the consumer: it looks at each worker's threads
  (``/proc/<pid>/task``) about once a second and warns, once per loader, about
  a worker running more threads than its lease, naming them, so the code that
  started them can be found.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import warnings
from typing import Callable

# Read by each runtime when its pool starts; a worker is one thread.
_ONE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "JAX_PLATFORMS": "cpu",  # workers never touch an accelerator
}
_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def one_thread_environment() -> dict[str, str]:
    """The environment variables that make runtimes start single-threaded pools."""
    env = dict(_ONE_THREAD_ENV)
    flags = os.environ.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = flags if "xla_cpu_multi_thread_eigen" in flags else (flags + " " + _XLA_FLAGS).strip()
    return env


def cap_worker_pools() -> None:
    """Caps thread pools in this (worker) process before user code runs."""
    os.environ.update(one_thread_environment())
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already used in the consumer; its inter-op pool starts lazily, on demand only
    # OpenBLAS already loaded in the consumer is deliberately left alone: its
    # openblas_set_num_threads() would itself start the pool it is meant to
    # cap (nproc - 1 threads after a fork). If dataset code calls BLAS in a
    # worker, the watchdog names the threads.


def thread_names(pid: int) -> list[str]:
    """Names of the threads of process `pid` (empty if it is gone)."""
    names = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return names
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return names


class ThreadWatchdog:
    """Warns once when a worker holds more threads than its lease."""

    def __init__(self, worker_pids: Callable[[], list[int]], lease: int = 1, period: float = 1.0) -> None:
        self._pids = worker_pids
        self._lease = lease
        self._period = period
        self._next = time.monotonic() + period / 4  # first look soon after start
        self.warned = False

    def poll(self) -> None:
        """Cheap unless a period has passed; call it per batch."""
        if self.warned or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self._period
        for worker_id, pid in enumerate(self._pids()):
            names = thread_names(pid)
            if len(names) > self._lease:
                self.warned = True
                counts = collections.Counter(names[1:])  # the first task is the worker's own thread
                listed = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counts.most_common())
                warnings.warn(
                    f"spindle: worker {worker_id} (pid {pid}) runs {len(names)} threads, over its lease of "
                    f"{self._lease}: {listed}. Dataset code started a thread pool in the worker, or a library's "
                    "fork handler did (torch restarts one pool thread in every child of a process that called "
                    "torch.set_num_threads). Cap it (torch.set_num_threads(1), OMP_NUM_THREADS=1, TF/XLA "
                    "thread options), create it lazily outside the workers, or use "
                    "multiprocessing_context='spawn'. Every worker's extra threads count against ulimit -u.",
                    RuntimeWarning, stacklevel=3)
                return
