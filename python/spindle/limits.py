"""``spindle.limit_threads(n)``: cap the thread pools of the other runtimes in
the consumer process, and say which ones were already running.

Every runtime sizes its pools from the CPU count when it starts, and most
never shrink them. Set before they start, the knobs below keep each pool to
``n`` threads; called after, the call still caps what each runtime's API can
change, and the report names every runtime whose threads already exist.

What is set, per runtime (docs/threads.md has the table):

- OpenMP, MKL, OpenBLAS, BLIS, numexpr: their ``*_NUM_THREADS`` variables,
  read when the library loads; for those already loaded, threadpoolctl sets
  the count through the library's API: later calls use at most ``n``, but the
  threads the pool already holds stay (numpy's OpenBLAS, torch's libgomp),
  and the report counts them.
- torch: ``torch.set_num_threads`` / ``torch.set_num_interop_threads``, now
  if torch is imported, else when it is (an import hook). The inter-op count
  can be set only before the pool is first used.
- JAX/XLA: ``PJRT_NPROC``, read when JAX creates its CPU client (at its first
  computation, not at import), sizes its two CPU pools (XLAPjRtCpuClient and
  XLAEigen) to ``n`` each. About 10 more XLA threads (compiler pool, slow-op
  alarm) have no knob in jaxlib 0.10. ``--xla_cpu_multi_thread_eigen=false``
  and ``intra_op_parallelism_threads`` in XLA_FLAGS change no thread count
  there, so they are not set: they would only slow the consumer.
- TensorFlow: ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``, and
  ``tf.config.threading`` if TensorFlow is imported (it refuses once its
  context exists).
- grain: the default of ``grain.ReadOptions.num_threads`` (16) becomes ``n``
  for ReadOptions made from now on, which covers ``to_iter_dataset()`` and
  ``grain.DataLoader`` without read_options. An explicit
  ``ReadOptions(num_threads=k)`` is left alone.
- tokenizers, OpenCV, Arrow, polars, numba, onnxruntime: their variables
  (RAYON_NUM_THREADS, OPENCV_FOR_THREADS_NUM, ARROW_IO_THREADS,
  POLARS_MAX_THREADS, NUMBA_NUM_THREADS) and, if loaded, their own calls
  (``cv2.setNumThreads``, ``pyarrow.set_cpu_count``/``set_io_thread_count``,
  numba's thread count); onnxruntime reads no variable, so sessions made
  without a thread count get ``n`` (an import hook). polars sizes its pool at
  import and has no call: imported before, it is reported as running.
- TBB: nothing to set (oneTBB reads no variable); spindle's own arena is
  sized from its ThreadBudget.

The variables, patterns, calls and advice per runtime are the runtime table's
(``spindle._budget.runtimes``), shared with the workers' caps and ``spindle doctor``.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
from typing import Any, Callable

from ._budget import runtimes
from ._budget.threads import process_threads

try:
    import threadpoolctl
except ImportError:  # a declared dependency; without it loaded pools are reported, not capped
    threadpoolctl = None

# The states a RuntimeLimit reports:
CAPPED = "capped"
"""The runtime's pools now hold at most n threads."""
AT_START = "capped when it starts"
"""Not started yet: what was set now (variables, an import hook) caps it when it starts."""
PARTLY = "partly capped"
"""Some of its threads have no knob (JAX/XLA: about 11 besides its two sized pools)."""
RUNNING = "already running"
"""It started threads before the call that it cannot remove: call limit_threads earlier."""
NOT_CAPPED = "not capped"
"""There is nothing to set for it (TBB reads no variable)."""


@dataclasses.dataclass(frozen=True)
class RuntimeLimit:
    """What limit_threads did for one runtime."""

    runtime: str
    """The runtime's name, e.g. "OpenBLAS", "torch", "JAX/XLA"."""
    state: str
    """One of CAPPED, AT_START, PARTLY, RUNNING, NOT_CAPPED (their text: "capped", ...)."""
    how: str
    """The knob that was set, and what it covers."""
    threads: int
    """Threads of this runtime in the process when limit_threads ran."""
    advice: str = ""
    """For "already running" and "not capped": what to do instead."""

    def __str__(self) -> str:
        running = f" ({self.threads} threads exist)" if self.threads else ""
        text = f"{self.runtime:<11} {self.state}{running}: {self.how}"
        return text + (f"; {self.advice}" if self.advice else "")


@dataclasses.dataclass(frozen=True)
class ThreadLimitReport:
    """What ``limit_threads(n)`` capped, per runtime, and what it could not."""

    n: int
    """The n limit_threads was called with."""
    runtimes: tuple[RuntimeLimit, ...]
    """One RuntimeLimit per runtime (``report["torch"]`` finds one by name)."""
    environment: dict[str, str]
    """The thread variables in effect after the call."""
    threads_before: int
    """Threads of the process when limit_threads ran."""

    def __getitem__(self, runtime: str) -> RuntimeLimit:
        for r in self.runtimes:
            if r.runtime == runtime:
                return r
        raise KeyError(f"no runtime {runtime!r} in the report; it has {[r.runtime for r in self.runtimes]}")

    @property
    def already_running(self) -> tuple[RuntimeLimit, ...]:
        """Runtimes whose threads existed before the call and could not all be removed."""
        return tuple(r for r in self.runtimes if r.state == RUNNING)

    def __str__(self) -> str:
        lines = [f"spindle.limit_threads({self.n}): the process had {self.threads_before} threads"]
        lines += [f"  {r}" for r in self.runtimes]
        return "\n".join(lines)


def limit_threads(n: int) -> ThreadLimitReport:
    """Caps the thread pools of OpenMP, MKL, OpenBLAS, BLIS, numexpr, torch,
    JAX/XLA, TensorFlow, grain, tokenizers, OpenCV, Arrow, polars, numba and
    onnxruntime in this process to ``n`` threads each, and
    reports, per runtime, how (or that it was already running and what to do).

    Call it first thing in the consumer, before importing numpy, torch, jax,
    tensorflow or polars: most runtimes size their pools once, when they start, and never
    shrink them. Variables the user already set lower are kept. Workers of a
    spindle loader need none of this: they cap themselves to one thread.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"spindle.limit_threads: n must be an integer >= 1, got {n!r}")
    existing = collections.Counter(t.runtime for t in process_threads(os.getpid()))
    threads_before = sum(existing.values())

    environment = {var: _cap_variable(var, n) for var in runtimes.environment(n)}

    # Which runtimes are reported, and how, is the runtime table's (its `limit` field), in its order.
    loaded = _threadpoolctl_pools()
    results: list[RuntimeLimit] = []
    for runtime in runtimes.RUNTIMES:
        if runtime.limit == "threadpoolctl":
            result = _cap_loaded_native(runtime, loaded.get(runtime.threadpoolctl or "", []), n, existing)
        elif runtime.limit == "table":
            result = _cap_from_table(runtime, n, existing)
        elif runtime.limit == "own":
            result = _OWN[runtime.name](n, existing)
        else:
            continue
        if result is not None:
            results.append(result)
    return ThreadLimitReport(n, tuple(results), environment, threads_before)


def _cap_variable(var: str, n: int) -> str:
    """Sets `var` to n unless it already holds a smaller positive integer."""
    current = os.environ.get(var, "")
    if current.isdigit() and 0 < int(current) <= n:
        return current
    os.environ[var] = str(n)
    return str(n)


def _threadpoolctl_pools() -> dict[str, list[Any]]:
    """The native pools threadpoolctl finds loaded, by its name for them (``internal_api``)."""
    loaded: dict[str, list[Any]] = collections.defaultdict(list)
    if threadpoolctl is not None:
        for lib in threadpoolctl.ThreadpoolController().lib_controllers:
            loaded[lib.internal_api].append(lib)
    return loaded


def _cap_loaded_native(runtime: runtimes.Runtime, libs: list[Any], n: int,
                       existing: collections.Counter) -> RuntimeLimit | None:
    """OpenMP, MKL, OpenBLAS, BLIS, FlexiBLAS: through threadpoolctl if loaded, else the environment
    (None: not loaded, and no variable of its own to set)."""
    name = runtime.name
    variables = "=".join((*runtime.variables, str(n)))
    if not libs:
        if not runtime.variables:
            return None
        how = f"{variables} (read when it loads)"
        if threadpoolctl is None and existing[name]:
            return RuntimeLimit(name, RUNNING, how, existing[name], "pip install threadpoolctl to cap a loaded library")
        return RuntimeLimit(name, AT_START, how, existing[name])
    was = []
    for lib in libs:
        count = lib.num_threads
        was.append(count)
        if count > n:  # only lower: raising OpenBLAS's count starts threads
            lib.set_num_threads(n)
    how = f"loaded, set to {n} threads through threadpoolctl (was {max(was)})"
    # A pool of n threads runs n - 1 threads beside the caller.
    if existing[name] > n - 1:
        # OpenBLAS (pthreads) and libgomp: lowering the count stops no thread.
        return RuntimeLimit(name, RUNNING, how, existing[name],
                            f"its pool threads stay until the process exits: set {variables} before "
                            "it loads, or call spindle.limit_threads first thing")
    return RuntimeLimit(name, CAPPED, how, existing[name])


def _cap_torch(n: int, existing: collections.Counter) -> RuntimeLimit:
    cap = runtimes.BY_NAME["torch"].cap
    assert cap is not None
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "set_num_interop_threads"):
        runtimes.after_import("torch", lambda t: cap(t, n))
        return RuntimeLimit("torch", AT_START, f"torch.set_num_threads({n}) and torch.set_num_interop_threads({n}) "
                            "when torch is imported (import hook)", existing["torch"])
    interop_set = cap(torch, n)
    how = f"torch.set_num_threads({n})"
    if interop_set:
        return RuntimeLimit("torch", CAPPED, how + f", torch.set_num_interop_threads({n})", existing["torch"])
    return RuntimeLimit("torch", RUNNING, how + "; its inter-op pool was already started or sized "
                        f"({torch.get_num_interop_threads()} threads)", existing["torch"],
                        f"call spindle.limit_threads before torch's first inter-op use "
                        "(torch.jit.fork, some ops)")


def _cap_jax(n: int, existing: collections.Counter) -> RuntimeLimit:
    how = (f"PJRT_NPROC={os.environ['PJRT_NPROC']}: sizes XLA's two CPU pools (XLAPjRtCpuClient, XLAEigen) "
           "when JAX creates its CPU client, at its first computation; about 10 more XLA threads (compiler "
           "pool, alarm) have no knob")
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and getattr(bridge, "_backends", None):
        return RuntimeLimit("JAX/XLA", RUNNING, how, existing["JAX/XLA"],
                            "its backends already exist and keep their pools: call spindle.limit_threads "
                            "(or set PJRT_NPROC) before JAX's first computation")
    return RuntimeLimit("JAX/XLA", PARTLY, how, existing["JAX/XLA"])


def _cap_tensorflow(n: int, existing: collections.Counter) -> RuntimeLimit:
    how = (f"TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS = {n} (read when TensorFlow starts its "
           "runtime); tf.data's own pools: options.threading.private_threadpool_size")
    tf = sys.modules.get("tensorflow")
    if tf is None or not hasattr(tf, "config"):
        return RuntimeLimit("TensorFlow", AT_START, how, existing["TensorFlow"])
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(n)
    except RuntimeError:  # "cannot be modified after initialization"
        return RuntimeLimit("TensorFlow", RUNNING, how, existing["TensorFlow"],
                            "its context already exists: call spindle.limit_threads before the first op")
    return RuntimeLimit("TensorFlow", CAPPED, f"tf.config.threading intra/inter-op = {n}; " + how,
                        existing["TensorFlow"])


def _cap_grain(n: int, existing: collections.Counter) -> RuntimeLimit:
    runtimes.after_import("grain._src.python.options", lambda m: _set_grain_default(m, n))
    how = (f"the default ReadOptions.num_threads becomes min(16, {n}) for ReadOptions made from now on "
           "(to_iter_dataset(), grain.DataLoader without read_options); pass "
           f"ReadOptions(num_threads={n}) where you set it yourself")
    python_threads = existing["Python threads"] + existing["grain"]
    if python_threads:
        return RuntimeLimit("grain", PARTLY, how, python_threads,
                            "threads already started by existing iterators (counted here with every Python "
                            "thread) stay")
    return RuntimeLimit("grain", CAPPED, how, 0)


def _set_grain_default(options: Any, n: int) -> None:
    init = options.ReadOptions.__init__
    defaults = init.__defaults__  # (num_threads, prefetch_buffer_size) in grain 0.2
    if defaults and isinstance(defaults[0], int) and defaults[0] > n:
        init.__defaults__ = (n, *defaults[1:])


def _cap_from_table(runtime: runtimes.Runtime, n: int, existing: collections.Counter) -> RuntimeLimit:
    """A runtime capped as the table says: its variables (read when it starts its pool), and its cap
    call now if it is loaded (onnxruntime: when it is imported, by an import hook)."""
    threads = existing[runtime.name]
    variables = ", ".join(f"{var}={n}" for var in runtime.variables)
    module = sys.modules.get(runtime.module) if runtime.module else None
    if module is None:
        if runtime.at_import and runtime.cap is not None:
            runtimes.after_import(runtime.module, lambda m: runtime.cap(m, n))
            return RuntimeLimit(runtime.name, AT_START, f"capped to {n} threads when it is imported (import hook)",
                                threads)
        return RuntimeLimit(runtime.name, AT_START, f"{variables} (read when it starts its pool)", threads)
    if runtime.cap is None:
        # Loaded, and no call changes its pool: the variables reach it only if it has not sized it yet.
        how = f"{variables} (read when it sizes its pool; it is loaded)"
        if threads or runtime.sized_at_import:
            return RuntimeLimit(runtime.name, RUNNING, how, threads, runtime.advice)
        return RuntimeLimit(runtime.name, AT_START, how, threads)
    capped = runtime.cap(module, n)
    how = f"loaded, capped to {n} threads through its API" + (f"; {variables}" if variables else "")
    if not capped or threads > n:
        return RuntimeLimit(runtime.name, RUNNING, how, threads,
                            "threads it started before the call may stay: " + runtime.advice)
    return RuntimeLimit(runtime.name, CAPPED, how, threads)


def _report_tbb(n: int, existing: collections.Counter) -> RuntimeLimit:
    return RuntimeLimit(
        "TBB", NOT_CAPPED, "oneTBB reads no environment variable; spindle's own arena is sized from its "
        "ThreadBudget", existing["TBB"],
        "" if not existing["TBB"] else "a library running its own TBB pool must cap it with tbb::global_control")


# The runtimes whose row says limit="own": what limit_threads does for each is code, not a table row.
_OWN: dict[str, Callable[[int, collections.Counter], RuntimeLimit]] = {
    "torch": _cap_torch, "JAX/XLA": _cap_jax, "TensorFlow": _cap_tensorflow, "grain": _cap_grain, "TBB": _report_tbb}
