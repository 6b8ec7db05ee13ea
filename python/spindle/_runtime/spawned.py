"""Entry point of a spawned worker: ``python -m spindle._runtime.spawned --worker W --parent PID``.

Used instead of fork when the consumer must not be forked (torch's
``multiprocessing_context='spawn'`` or ``'forkserver'``, e.g. after CUDA was
initialized). The loader's segment is on descriptor 3 (see SpawnSpec in
runtime/include/spindle/detail/worker_pool.hpp) and the payload on descriptor 4;
the worker attaches to the segment and runs ``body(context, **kwargs)`` exactly
as a forked worker would.

The payload is pickled as multiprocessing pickles a ``Process`` it spawns
(``popen_spawn_posix``): with its ForkingPickler, while this module stands in
for the spawning Popen (``multiprocessing.context.set_spawning_popen``). So
what multiprocessing lets travel only to a process it spawns travels to these
workers too: ``Value``/``Array`` (their shared memory is handed over as a
descriptor), ``Lock``/``Semaphore``/``Event``/``Condition`` (named
semaphores), ``Queue``/``Pipe`` connections, the process authkey, and torch
tensors by torch's sharing strategy (torch registers its reductions with
ForkingPickler). Each descriptor a reduction asks to hand over
(``duplicate_for_child``) is passed on a fixed number after the payload's,
the same in every worker, so one payload serves them all.
"""

from __future__ import annotations

import argparse
import atexit
import io
import mmap
import multiprocessing.context
import multiprocessing.process
import multiprocessing.spawn
import os
import pickle
import sys
import threading
import traceback
from multiprocessing import resource_tracker
from multiprocessing.reduction import ForkingPickler
from multiprocessing.synchronize import SemLock
from typing import Any, Optional

from .._budget.caps import cap_worker_pools, one_thread_environment

SEGMENT_FD = 3
PAYLOAD_FD = 4  # then the descriptors handed over by reductions: 5, 6, ...


def main() -> int:
    parser = argparse.ArgumentParser(prog="spindle._runtime.spawned")
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args()
    # Every worker maps the one payload the consumer wrote (shipped once, not a pickle per worker
    # through a pipe) and unpickles from the mapping: no private copy of its bytes, and the file's
    # offset, shared by all the workers, is never used.
    stream = mmap.mmap(PAYLOAD_FD, 0, prot=mmap.PROT_READ)
    os.close(PAYLOAD_FD)
    current = multiprocessing.process.current_process()
    # As multiprocessing's spawn._main: while the main script is re-imported and
    # the payload unpickled, this process is bootstrapping, so a script without
    # an `if __name__ == "__main__":` guard that starts workers again is told so
    # (multiprocessing's RuntimeError) instead of spawning without end.
    current._inheriting = True  # type: ignore[attr-defined]
    try:
        preparation, tracker_fd = pickle.load(stream)
        if tracker_fd is not None:  # the consumer's resource tracker, as spawn_main inherits it
            resource_tracker._resource_tracker._fd = tracker_fd  # type: ignore[attr-defined]
        # Before the main script is re-imported (it may import torch, numpy,
        # JAX): pools then start capped, which they cannot be once started. The
        # environment was set before this interpreter imported numpy; this also
        # caps, through their APIs, the runtimes loaded so far that do not read
        # it (threadpoolctl). The worker body's _start() caps again once the
        # main script and the body's modules are loaded.
        cap_worker_pools()
        # multiprocessing's own preparation: sys.path, the working directory,
        # the start method, the authkey, the main script loaded as __mp_main__
        # so that its classes and functions unpickle.
        multiprocessing.spawn.prepare(preparation)
        body, kwargs = pickle.load(stream)
    finally:
        del current._inheriting  # type: ignore[attr-defined]
        stream.close()
    from .. import _core

    attached = _core.AttachedWorker(SEGMENT_FD, args.worker, args.parent)
    try:
        return body(attached.context, **kwargs) or 0
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


class _HandedOver:
    """A descriptor as the worker finds it (multiprocessing's popen_spawn_posix._DupFd)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def detach(self) -> int:
        return self.fd


class _Spawning:
    """Stands for multiprocessing's spawning Popen while the payload is pickled: what
    ``assert_spawning`` checks for, and where ``reduction.DupFd`` hands descriptors over."""

    DupFd = _HandedOver

    def __init__(self) -> None:
        self.fds: list[int] = []  # this process's descriptors, in the order the workers get them

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return PAYLOAD_FD + len(self.fds)


class _Pickler(ForkingPickler):
    """multiprocessing's pickler, refusing a semaphore of the 'fork' context as Python 3.12's own
    SemLock does: its name is unlinked at creation, so a spawned worker could only rebuild it from a
    pointer into another process (Python 3.11 pickles it, and the worker crashes with SIGSEGV)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, SemLock) and getattr(getattr(obj, "_semlock", None), "name", "") is None:
            raise RuntimeError("A SemLock created in a fork context is being shared with a process in a spawn "
                               "context. This is not supported. Please use the same context to create "
                               "multiprocessing objects and Process.")
        return NotImplemented


def _pickled(spawning: _Spawning, *objects: Any) -> bytes:
    """`objects` pickled one after another with multiprocessing's pickler, in its spawning context."""
    out = io.BytesIO()
    multiprocessing.context.set_spawning_popen(spawning)
    try:
        for obj in objects:
            _Pickler(out, pickle.HIGHEST_PROTOCOL).dump(obj)
    finally:
        multiprocessing.context.set_spawning_popen(None)
    return out.getvalue()


def _tracker_fd() -> Optional[int]:
    """The consumer's resource tracker's descriptor if one runs (none is started for the workers)."""
    return getattr(resource_tracker._resource_tracker, "_fd", None)


class WorkerPayload:
    """What the spawned workers are handed. ``fds`` (``spawn_fds``), in order: a
    memfd holding multiprocessing's preparation data and the pickled
    ``(body, kwargs)``, then every descriptor those pickles hand over. ``close()``
    (or the end of a ``with``) closes the memfd once the workers are started; the
    handed-over descriptors stay their owners'.

    Building one raises what pickling raises (a lambda or a local class in the
    dataset), before any worker starts, as multiprocessing's ``Process.start()``."""

    def __init__(self, body: Any, kwargs: dict[str, Any]) -> None:
        spawning = _Spawning()
        tracker = _tracker_fd()
        # multiprocessing's preparation data, as its spawn passes it (the
        # authkey pickles only in a spawning context, like here).
        preparation = multiprocessing.spawn.get_preparation_data("spindle-worker")
        handed_tracker = None if tracker is None else spawning.duplicate_for_child(tracker)
        data = _pickled(spawning, (preparation, handed_tracker), (body, kwargs))
        fd = os.memfd_create("spindle-worker-payload")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            os.close(fd)
            raise
        self.fds = [fd, *spawning.fds]

    def close(self) -> None:
        if self.fds:
            os.close(self.fds[0])
            self.fds = []

    def __enter__(self) -> "WorkerPayload":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run() -> None:
    """main(), then the end of a worker process as multiprocessing ends its children: the
    threads the dataset started are waited for, the exit handlers run (multiprocessing's
    flushes the queues a dataset put to; the user's atexit), the streams are flushed, and the
    process exits without tearing every module down. That teardown takes a second or more with
    torch loaded on a busy machine, past the consumer's grace for a closing worker, which would
    then be killed (exit code -9 where torch's worker exits with 0)."""
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, exit status 1
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # sys.exit("message"): printed, status 1
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream is not the worker's failure
            pass
    os._exit(code or 0)


def worker_argv() -> list[str]:
    """The program a spawned worker runs: this interpreter, with this process's
    sys.path (so that the dataset's own modules unpickle), then run()."""
    return [sys.executable, "-c",
            f"import sys; sys.path[:0] = {sys.path!r}; from spindle._runtime.spawned import run; run()"]


def worker_env() -> list[str]:
    """What a spawned worker's environment sets over the consumer's: one thread per runtime.

    In the environment the new interpreter starts with, not set by its first line: before
    that line the interpreter's site hooks run (a sitecustomize, a .pth file), and any that
    imports torch or numpy loads OpenMP or OpenBLAS, which size their pools once, at load."""
    return [f"{name}={value}" for name, value in one_thread_environment().items()]


if __name__ == "__main__":  # last: main() uses the helpers above
    run()
