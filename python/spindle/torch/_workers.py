"""The workers of a spindle.torch iterator as torch's iterator lists them, and torch's words for a dead one."""

from __future__ import annotations

import os
import signal
import time
from typing import Optional

from .. import _core
from ..errors import WorkerDiedError


class WorkerProcess:
    """One worker, as an entry of torch's ``_workers`` (``multiprocessing.Process``-like:
    ``pid``, ``exitcode``, ``is_alive()``, ``join()``, ``terminate()``, ``kill()``).

    spindle's runtime reaps its workers (while ``next()`` waits, and at ``close()``) and
    records how each ended: ``exitcode`` is that record (0, the exit status, or minus the
    signal number, as multiprocessing reports it), ``None`` until the runtime has reaped
    the worker. A worker that has exited but is not reaped yet is not alive."""

    def __init__(self, runtime: _core.Loader, worker: int, pid: int) -> None:
        self._runtime = runtime
        self._worker = worker
        self.pid = pid

    @property
    def exitcode(self) -> Optional[int]:
        exits = self._runtime.worker_exits
        ended = exits[self._worker] if self._worker < len(exits) else None
        if ended is None:
            return None
        return -ended.code if ended.signaled else ended.code

    def is_alive(self) -> bool:
        if self.exitcode is not None:
            return False
        try:  # not reaped yet, so the pid is still this worker's: running, or a zombie
            stat = _core.process_stat(self.pid)
        except OSError:
            return False
        return stat is not None and stat.state not in ("Z", "X")

    def join(self, timeout: Optional[float] = None) -> None:
        """Waits until the worker is no longer alive, or `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.005)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        # Only a worker the runtime has not reaped: its pid cannot have passed to another process.
        if self.exitcode is None and self.is_alive():
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def __repr__(self) -> str:
        return f"<spindle.torch worker {self._worker} pid={self.pid} exitcode={self.exitcode}>"


def torch_died(died: WorkerDiedError) -> WorkerDiedError:
    """The runtime's dead-worker error with the sentence torch raises for it in front; fields kept."""
    if died.signal is not None:
        words = f"DataLoader worker (pid {died.pid}) is killed by signal: {signal.strsignal(died.signal)}. "
    elif died.exitcode is not None:
        words = f"DataLoader worker (pid(s) {died.pid}) exited unexpectedly. "
    else:
        words = ""
    return WorkerDiedError(words + str(died), pid=died.pid, exitcode=died.exitcode, signal=died.signal,
                           worker=died.worker, sample=died.sample, batch=died.batch)
