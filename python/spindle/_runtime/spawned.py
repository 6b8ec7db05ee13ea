"""Entry point of a spawned worker: ``python -m spindle._runtime.spawned --worker W --parent PID``.

Used instead of fork when the consumer must not be forked (torch's
``multiprocessing_context='spawn'`` or ``'forkserver'``, e.g. after CUDA was
initialized). The loader's segment is on descriptor 3 (see SpawnSpec in
runtime/include/spindle/detail/worker_pool.hpp) and a pickled ``(body, kwargs)`` on
descriptor 4; the worker attaches to the segment and runs
``body(context, **kwargs)`` exactly as a forked worker would.
"""

from __future__ import annotations

import argparse
import multiprocessing.spawn
import os
import pickle
import sys
from typing import Any

from .._budget.caps import cap_worker_pools, one_thread_environment

SEGMENT_FD = 3
PAYLOAD_FD = 4


def main() -> int:
    parser = argparse.ArgumentParser(prog="spindle._runtime.spawned")
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args()
    with os.fdopen(PAYLOAD_FD, "rb") as f:
        preparation, inner = pickle.loads(os.pread(f.fileno(), os.fstat(f.fileno()).st_size, 0))
    # Before the main script is re-imported (it may import torch, numpy, JAX):
    # pools then start capped, which they cannot be once started. The
    # environment was set before this interpreter imported numpy; this also
    # caps, through their APIs, the runtimes loaded so far that do not read it
    # (threadpoolctl). The worker body's _start() caps again once the main
    # script and the body's modules are loaded.
    cap_worker_pools()
    _prepare(preparation)
    body, kwargs = pickle.loads(inner)
    from .. import _core

    attached = _core.AttachedWorker(SEGMENT_FD, args.worker, args.parent)
    try:
        return body(attached.context, **kwargs) or 0
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _preparation() -> dict[str, Any]:
    """What a new interpreter needs to unpickle objects defined in this program's
    main script: multiprocessing's own spawn preparation (sys.path, the main
    module's path, the working directory), without the process authkey."""
    data = multiprocessing.spawn.get_preparation_data("spindle-worker")
    data.pop("authkey", None)
    return data


def _prepare(data: dict[str, Any]) -> None:
    """In the new interpreter: load the parent's main script as __mp_main__, as
    multiprocessing's spawn does, so its classes and functions unpickle."""
    multiprocessing.spawn.prepare(data)


def worker_argv() -> list[str]:
    """The program a spawned worker runs: this interpreter, with this process's
    sys.path (so that the dataset's own modules unpickle), then main()."""
    # The environment comes first: importing spindle imports numpy, whose
    # OpenBLAS starts its pool at import time.
    return [sys.executable, "-c",
            f"import os; os.environ.update({one_thread_environment()!r}); import sys; "
            f"sys.path[:0] = {sys.path!r}; from spindle._runtime.spawned import main; sys.exit(main())"]


def payload_fd(body: Any, kwargs: dict[str, Any]) -> int:
    """A memfd holding the pickled (body, kwargs) for the workers; the caller closes it."""
    fd = os.memfd_create("spindle-worker-payload")
    inner = pickle.dumps((body, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    os.write(fd, pickle.dumps((_preparation(), inner), protocol=pickle.HIGHEST_PROTOCOL))
    return fd


if __name__ == "__main__":  # last: main() uses the helpers above
    sys.exit(main())
