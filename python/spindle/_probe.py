"""Run a function in a throwaway forked process and return its (pickled) result.

The loaders need one sample (or one collated batch) to size their ring slots.
Reading it in the consumer would run dataset code there: a dataset that lazily
opens a file handle, an LMDB environment or an HDF5 file on first access would
then open it in the consumer, and every worker forked later would inherit and
share it, which such libraries do not survive. The probe runs in a forked
child instead, as worker 0 would, and only its result comes back.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import traceback
import warnings
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Around spindle's own forks: silences JAX's at-fork warning.

    JAX warns on every fork of a process where it runs, because a child that
    calls into JAX can deadlock. spindle's children run only spindle's code and
    the dataset's, with JAX_PLATFORMS=cpu set; the warning stays true for
    dataset code that calls JAX (docs/architecture.md, "Forking safely").
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        yield


def run_forked(fn: Callable[[], Any]) -> Any:
    """Returns fn() computed in a forked child; re-raises its exception here.

    If the result cannot be pickled back, fn() runs again in this process.
    """
    read_fd, write_fd = os.pipe()
    with forking():
        pid = os.fork()
    if pid == 0:  # child
        os.close(read_fd)
        code = 0
        try:
            try:
                result = fn()
                try:
                    payload = pickle.dumps(("ok", result))
                except Exception:
                    payload = pickle.dumps(("unpicklable", None))
            except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
                code = 1
                exc.add_note("".join(traceback.format_exception(exc)))
                exc.__traceback__ = None
                try:
                    payload = pickle.dumps(("error", exc))
                except Exception:
                    payload = pickle.dumps(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))
            with os.fdopen(write_fd, "wb") as out:
                out.write(payload)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as inp:
        data = inp.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"spindle: the process probing the first sample (pid {pid}) died "
                           f"({_describe(status)}) before answering; the dataset crashed reading it")
    kind, value = pickle.loads(data)
    if kind == "error":
        raise value
    if kind == "unpicklable":
        # The result holds something only this process can name (a class or
        # function defined inside a function): compute it here after all.
        return fn()
    return value


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status)}"
