"""The one way a front end starts a runtime Loader: a frozen :class:`StartSpec`, then :func:`start`
(workers running a Python body, forked or spawned) or :func:`start_pipeline` (a native pipeline's
C++ workers, forked or on arena threads).

Both build the ``_core.LoaderOptions`` from the spec, with the short-budget policy the front end
resolved, else the core's resolution (``$SPINDLE_BUDGET_POLICY``, else "shrink"), start the workers with the
consumer's reserve and the workers' runtime threads held back from the grant (``_budget.reserve``), and warn once
(``ThreadBudgetWarning``) when the budget started fewer workers than asked. A front end only
builds the spec. The spec's defaults are ``_core.LoaderOptions()``'s: the C++ core owns them.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import pickle
import warnings
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import _core
from .._budget.policy import warn_if_shrunk
from .._budget.reserve import consumer_reserve, planned_worker_tasks
from .forking import forked_worker, forking
from .spawned import WorkerPayload, worker_argv, worker_env

# Read once: every default below is the core's (loader.hpp), none is written here. The fronts'
# signatures read theirs here too (prefetch_factor, max_batch_bytes).
LOADER_DEFAULTS = _core.LoaderOptions()
_DEFAULTS = LOADER_DEFAULTS

START_METHODS = ("fork", "spawn", "forkserver")

# torch's words when a worker's arguments do not pickle (its multi-process iterator),
# given before the pickling error itself is raised.
PICKLE_ERROR_WORDS = (
    "Got pickle error when attempting to start a worker Process. "
    "This might be because the worker Process arguments are not picklable. "
    "Python 3.14+ changed the multiprocessing start method in non-Mac POSIX platforms "
    "to 'forkserver', which requires the worker Process arguments to be picklable. "
    "You can also try multiprocessing.set_start_method('fork').")


ON_WORKER_DEATH = ("replace", "raise")


def replacements_for(on_worker_death: str) -> int:
    """The core's ``max_replacements`` for a front end's ``on_worker_death``: "raise" none (a lost
    worker ends the epoch with WorkerDiedError); "replace" the core's count for the processes the
    loader gets (``_core.replacement_limit``: one per process, at least 3; a poison sample is stopped
    at its second death anyway)."""
    if on_worker_death not in ON_WORKER_DEATH:
        raise ValueError(f"on_worker_death should be one of {', '.join(map(repr, ON_WORKER_DEATH))}, "
                         f"but got {on_worker_death!r}")
    return _core.REPLACE_EACH_WORKER if on_worker_death == "replace" else 0


@dataclasses.dataclass(frozen=True)
class StartSpec:
    """How a front end wants its runtime Loader started. Fields mirror ``_core.LoaderOptions``
    (same names, same defaults), plus:

    - ``logical_workers``: with ``round_robin`` or ``assign_in_turn``, a short budget runs the
      ``num_workers`` asked as logical workers on fewer processes (logical l on process l mod P):
      the data (streams, batch turns, seeds, worker info) is that of ``num_workers`` workers.
      ``processes`` (0: all) runs them on at most that many by choice (adaptive streams' advice).
      With ``adaptive`` where any worker takes any batch, ``processes`` (0: the cores idle now) is
      the count to start on: the front end's last epoch's (``StatsBook.processes_at_end``).
    - ``budget_policy``: "shrink", "wait" or "fail"; None reads ``$SPINDLE_BUDGET_POLICY``
      (default "shrink") when the loader starts.
    - ``start_method``: "fork" (the default) or, for workers that must be new interpreters
      (the consumer must not be forked: CUDA initialized, torch's ``multiprocessing_context``),
      "spawn" or "forkserver" (both spawn). Native pipelines always fork (or use threads).
    - ``pickle_warning``: warned before the error when spawned workers' arguments do not pickle
      (torch's words by default; spindle.torch passes what the installed torch says, or None).
    """

    num_workers: int = _DEFAULTS.num_workers
    batch_capacity: int = _DEFAULTS.batch_capacity
    max_batch_bytes: int = _DEFAULTS.max_batch_bytes
    prefetch_factor: int = _DEFAULTS.prefetch_factor
    in_order: bool = _DEFAULTS.in_order
    assign_in_turn: bool = _DEFAULTS.assign_in_turn
    round_robin: bool = _DEFAULTS.round_robin
    logical_workers: bool = _DEFAULTS.logical_workers
    processes: int = _DEFAULTS.processes
    fed: bool = _DEFAULTS.fed
    first_worker: int = _DEFAULTS.first_worker
    timeout: float = _DEFAULTS.timeout
    max_threads: Optional[int] = _DEFAULTS.max_threads
    max_replacements: int = _DEFAULTS.max_replacements
    adaptive: bool = _DEFAULTS.adaptive
    budget_policy: Optional[str] = None
    start_method: str = "fork"
    pickle_warning: Optional[str] = PICKLE_ERROR_WORDS

    def __post_init__(self) -> None:
        if self.start_method not in START_METHODS:
            raise ValueError(f"start_method should be one of {', '.join(map(repr, START_METHODS))}, "
                             f"but got {self.start_method!r}")

    @property
    def spawns(self) -> bool:
        """Workers are new interpreters (their body and its arguments are pickled)."""
        return self.start_method != "fork"

    def options(self) -> _core.LoaderOptions:
        """The core's options for this spec. A policy the front end resolved (dataloader, pipeline) is
        set as it is; None is resolved now, by the core (torch and grain: ``$SPINDLE_BUDGET_POLICY``)."""
        options = _core.LoaderOptions()
        for field in dataclasses.fields(self):
            if field.name not in ("budget_policy", "start_method", "pickle_warning"):
                setattr(options, field.name, getattr(self, field.name))
        options.budget_policy = (self.budget_policy if self.budget_policy is not None
                                 else _core.resolve_budget_policy())
        # What the core keeps free of the budget, at the start and while batches flow: the consumer's
        # threads beyond the loader, and each worker's runtimes (facts of this process, known here).
        options.reserve_tasks = consumer_reserve()
        options.worker_tasks = planned_worker_tasks()
        return options


def start_method_of(context: Any = None) -> str:
    """The start method a front end's workers use: that of `context` (a multiprocessing context or
    a method's name, torch's ``multiprocessing_context``), else the one set globally
    (``multiprocessing.set_start_method``), else "fork"."""
    if context is None:
        method = multiprocessing.get_start_method(allow_none=True)
    else:
        method = context if isinstance(context, str) else context.get_start_method()
    return method if method in START_METHODS else "fork"


def start(spec: StartSpec, body: Callable[[Any], Any], *, order: np.ndarray, starts: Optional[np.ndarray] = None,
          drop_last: bool = False, stacklevel: int = 1) -> _core.Loader:
    """A runtime Loader over `order` whose workers each run ``body(ctx)``: forked, or spawned with
    `body` pickled as multiprocessing pickles a Process it spawns (then a body that does not pickle
    raises what pickling raises, after torch's warning, before any worker starts).

    `stacklevel` names the frame the warnings point at: 1 is the caller of start()."""
    options = spec.options()
    if spec.spawns:
        try:
            payload = WorkerPayload(body, {})
        except (TypeError, AttributeError, pickle.PicklingError):
            if spec.pickle_warning is not None:
                warnings.warn(spec.pickle_warning, stacklevel=stacklevel + 1)
            raise
        with payload:
            runtime = _core.Loader(options, order=order, starts=starts, drop_last=drop_last,
                                   spawn_argv=worker_argv(), spawn_fds=payload.fds, spawn_env=worker_env())
    else:
        with forking():
            runtime = _core.Loader(options, order=order, starts=starts, drop_last=drop_last,
                                   worker_main=forked_worker(body))
    warn_if_shrunk(runtime, stacklevel=stacklevel + 1)
    return runtime


def start_pipeline(spec: StartSpec, pipeline: Any, *, order: np.ndarray, seed: int, epoch: int, threads: bool,
                   drop_last: bool = False, stream_starts: Sequence[int] = (), stacklevel: int = 1) -> _core.Loader:
    """A runtime Loader running a native ``_core.Pipeline`` over `order` in batches of
    ``spec.batch_capacity``: forked C++ workers, or the arena's threads with `threads`
    (the core's make_pipeline_loader sets slot sizes, a stream's round robin over its logical
    workers, and the skip ratio). A stream's `stream_starts`: each logical worker's
    ``Batch.stream_position`` of its last batch delivered (empty: from the start).
    The same policy and warning as :func:`start`."""
    options = spec.options()
    starts = [int(p) for p in stream_starts]
    if threads:
        runtime = _core.pipeline_loader(pipeline, options, order=order, drop_last=drop_last, threads=True,
                                        seed=seed, epoch=epoch, stream_starts=starts)
    else:
        with forking():
            runtime = _core.pipeline_loader(pipeline, options, order=order, drop_last=drop_last, threads=False,
                                            seed=seed, epoch=epoch, stream_starts=starts)
    warn_if_shrunk(runtime, stacklevel=stacklevel + 1)
    return runtime
