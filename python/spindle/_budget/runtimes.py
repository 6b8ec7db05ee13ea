"""The thread-pool runtimes spindle knows, in one table: for each, the
environment variables it reads, the libraries and thread names that tell its
threads apart, the call that caps it once loaded, and the advice a user gets.

Every user of these facts reads them here: the workers' caps
(``_budget.caps``), ``spindle.limit_threads`` (``spindle.limits``), the
thread attribution of ``spindle doctor`` (``_budget.threads``) and its advice
(``spindle.doctor``). The C++ core knows none of them (its workers run no
other runtime; the facts are Python APIs and variables), so the table lives on
the Python side.

Order matters: the first runtime whose library (or thread-name) pattern
matches a thread wins.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import os
import re
import sys
import threading
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Runtime:
    """One thread-pool runtime and how to keep it to n threads."""

    name: str
    """What spindle calls it in reports ("OpenBLAS", "torch", "tokenizers")."""
    variables: tuple[str, ...] = ()
    """Thread-count variables it reads (when it loads or starts its pool); set to n."""
    worker_environment: tuple[tuple[str, str], ...] = ()
    """Further variables a worker sets, whatever n (a switch, not a count)."""
    libraries: str | None = None
    """Pattern on the file name of a library it maps; tells its unnamed threads by their stack."""
    thread_names: str | None = None
    """Pattern on the names it gives its threads."""
    module: str | None = None
    """The Python module whose import means it is loaded; the cap call gets that module."""
    cap: Callable[[Any, int], bool] | None = None
    """Caps the loaded runtime to n threads through its own API (never raises it); False if some
    of its pools could no longer be capped. For a runtime loaded before the variables could reach it."""
    in_workers: bool = True
    """The cap call is safe in a forked worker; False where the variables do it there and the call
    would not (OpenCV)."""
    at_import: bool = False
    """The cap call also runs when `module` is imported later (no variable does it: onnxruntime)."""
    sized_at_import: bool = False
    """It sizes its pool when it is imported and has no call to change it (polars): loaded, it is
    already running at its size, threads seen or not."""
    worker_threads: int = 0
    """Threads it still runs in a worker at its cap, beside the worker's own, once used: pools that
    have no zero setting and threads no variable stops (measured: ``docs/threads.md``). A worker's
    lease counts them (``_budget.reserve.worker_lease``)."""
    threadpoolctl: str | None = None
    """threadpoolctl's name for it (``internal_api``): a native pool threadpoolctl sets once loaded."""
    limit: str = ""
    """How ``spindle.limit_threads`` reports it: "threadpoolctl" (its variables, or threadpoolctl once
    loaded), "table" (its variables and cap call, from this row), "own" (a function of
    ``spindle.limits`` for this runtime), or "" (not reported)."""
    advice: str = ""
    """What removes or shrinks its pools, the variable first."""


def _cap_torch(torch: Any, n: int) -> bool:
    if not hasattr(torch, "set_num_interop_threads"):
        return True  # still importing
    if torch.get_num_threads() > n:
        torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(min(n, torch.get_num_interop_threads()))
    except RuntimeError:
        return False  # already used: its inter-op pool starts lazily, on demand only
    return True


def _cap_pyarrow(pyarrow: Any, n: int) -> bool:
    # Arrow's pools (a Hugging Face datasets.Dataset reads through them) start threads on
    # demand, up to the CPU count (IO: 8); one is the least Arrow takes.
    if not hasattr(pyarrow, "set_io_thread_count"):
        return True
    if pyarrow.cpu_count() > n:
        pyarrow.set_cpu_count(n)
    if pyarrow.io_thread_count() > n:
        pyarrow.set_io_thread_count(n)
    return True


def _cap_opencv(cv2: Any, n: int) -> bool:
    # OpenCV's parallel_for pool reads OPENCV_FOR_THREADS_NUM when it first runs, so a worker needs
    # no call: a pool the consumer started before the fork leaves the child running parallel_for on
    # its own thread (OpenCV's fork handler), and one not started yet reads the variable. The call is
    # for limit_threads only: in a forked child of a consumer that used the pool, cv2.setNumThreads
    # hung in about 1 of 8 runs (opencv-python-headless 5.1, pthreads backend), and in a fresh
    # process setNumThreads(1) then cv2.resize left 2 more threads than the variable does.
    if hasattr(cv2, "setNumThreads") and cv2.getNumThreads() > n:
        cv2.setNumThreads(n)
    return True


def _cap_numba(numba: Any, n: int) -> bool:
    # numba reads NUMBA_NUM_THREADS at import into numba.config, and launches that many threads at
    # its first parallel call; numba.set_num_threads would launch them first, so before the launch
    # the count itself is lowered.
    config = getattr(numba, "config", None)
    if config is None:
        return True
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if parallel is not None and parallel._is_initialized:
        if numba.get_num_threads() > n:
            numba.set_num_threads(n)
        return parallel.NUM_THREADS <= n  # the launched threads stay
    if config.NUMBA_NUM_THREADS > n:
        config.NUMBA_NUM_THREADS = n
    if parallel is not None and parallel.NUM_THREADS > n:
        parallel.NUM_THREADS = n
    return True


def _cap_onnxruntime(ort: Any, n: int) -> bool:
    # onnxruntime reads no variable: each InferenceSession sizes its intra-op pool from the cores
    # unless SessionOptions.intra_op_num_threads is set. Sessions made from now on without a count
    # get n; a count the user set is kept.
    session = getattr(ort, "InferenceSession", None)
    if session is None:
        return True
    if getattr(session, "_spindle_threads", None) is not None:
        session._spindle_threads = min(session._spindle_threads, n)
        return True
    init = session.__init__

    def __init__(self: Any, path_or_bytes: Any, sess_options: Any = None, *args: Any, **kwargs: Any) -> None:
        if sess_options is None:
            sess_options = ort.SessionOptions()
        cap = type(self)._spindle_threads
        if sess_options.intra_op_num_threads == 0:
            sess_options.intra_op_num_threads = cap
        if sess_options.inter_op_num_threads == 0:
            sess_options.inter_op_num_threads = cap
        init(self, path_or_bytes, sess_options, *args, **kwargs)

    session.__init__ = __init__
    session._spindle_threads = n
    return True


_ONNX_ADVICE = ("onnxruntime.SessionOptions(): intra_op_num_threads = n and inter_op_num_threads = n for each "
                "InferenceSession (no variable sets them), or spindle.limit_threads(n) before the sessions are made")

RUNTIMES: tuple[Runtime, ...] = (
    Runtime("OpenBLAS", ("OPENBLAS_NUM_THREADS",), libraries=r"(?i)openblas", threadpoolctl="openblas",
            limit="threadpoolctl",
            advice="set OPENBLAS_NUM_THREADS=n before numpy is imported (its pool starts at import and never "
                   "shrinks), or call spindle.limit_threads(n) before importing numpy"),
    Runtime("OpenMP", ("OMP_NUM_THREADS",), libraries=r"^(libgomp|libiomp5|libomp)[.-]",
            thread_names=r"^(omp_|gomp)", threadpoolctl="openmp", limit="threadpoolctl",
            advice="set OMP_NUM_THREADS=n before the library loads (torch: torch.set_num_threads(n) at any "
                   "time), or spindle.limit_threads(n)"),
    Runtime("MKL", ("MKL_NUM_THREADS",), libraries=r"^libmkl_", threadpoolctl="mkl", limit="threadpoolctl",
            advice="set MKL_NUM_THREADS=n before MKL loads, or spindle.limit_threads(n)"),
    Runtime("BLIS", ("BLIS_NUM_THREADS",), libraries=r"^libblis", threadpoolctl="blis", limit="threadpoolctl",
            advice="set BLIS_NUM_THREADS=n before BLIS loads, or spindle.limit_threads(n)"),
    # No variable of its own is set: reported only once loaded (threadpoolctl sets its backend's count).
    Runtime("FlexiBLAS", threadpoolctl="flexiblas", limit="threadpoolctl",
            advice="spindle.limit_threads(n), or threadpoolctl.threadpool_limits(n)"),
    Runtime("Accelerate", ("VECLIB_MAXIMUM_THREADS",),
            advice="set VECLIB_MAXIMUM_THREADS=n before numpy is imported (macOS), or spindle.limit_threads(n)"),
    Runtime("numexpr", ("NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS"), libraries=r"^interpreter\.cpython",
            advice="set NUMEXPR_MAX_THREADS=n and NUMEXPR_NUM_THREADS=n before numexpr is imported, or "
                   "numexpr.set_num_threads(n), or spindle.limit_threads(n)"),
    # XLA's named pools, whichever of JAX and TensorFlow loaded XLA (_budget.threads tells them apart).
    Runtime("XLA", thread_names=r"(?i)^tf_XLA|^XLA|^pjrt"),
    Runtime("JAX/XLA", ("PJRT_NPROC",),
            (("JAX_PLATFORMS", "cpu"),  # workers never touch an accelerator
             ("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")),
            libraries=r"(?i)^(libjax_common|_jax|_xla|xla_extension)[.-]|pjrt", limit="own",
            advice="set PJRT_NPROC=n before JAX's first computation (sizes its XLAPjRtCpuClient and XLAEigen "
                   "pools to n each; about 10 other XLA threads have no knob in jaxlib 0.10), or "
                   "spindle.limit_threads(n) before the first computation"),
    Runtime("TensorFlow", ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"),
            libraries=r"(?i)tensorflow|^_pywrap_tf", thread_names=r"^tf_", limit="own",
            advice="set TF_NUM_INTEROP_THREADS=n and TF_NUM_INTRAOP_THREADS=n before TensorFlow starts, or "
                   "tf.config.threading.set_inter_op_parallelism_threads(n) / set_intra_op_parallelism_threads(n) "
                   "before the first op; tf.data: options.threading.private_threadpool_size; or "
                   "spindle.limit_threads(n)"),
    Runtime("torch", libraries=r"^(libtorch|libc10|libshm|_C\.cpython)", thread_names=r"^pt_", module="torch",
            cap=_cap_torch, limit="own",
            advice="torch.set_num_threads(n), and torch.set_num_interop_threads(n) before the first inter-op "
                   "use; pt_autograd_* threads are one per device type used by backward"),
    Runtime("tokenizers", ("RAYON_NUM_THREADS",), (("TOKENIZERS_PARALLELISM", "false"),),
            libraries=r"^tokenizers\.", module="tokenizers", limit="table",
            advice="set TOKENIZERS_PARALLELISM=false (read at every batch call), or RAYON_NUM_THREADS=n before "
                   "its first batch call (sizes its rayon pool), or spindle.limit_threads(n)"),
    Runtime("OpenCV", ("OPENCV_FOR_THREADS_NUM",), libraries=r"^(cv2\.|libopencv_)", module="cv2",
            cap=_cap_opencv, in_workers=False, limit="table",
            advice="cv2.setNumThreads(n) (any time), or OPENCV_FOR_THREADS_NUM=n before its first parallel call, "
                   "or spindle.limit_threads(n)"),
    # Its CPU and IO pools refuse a count of 0: one thread each, started by any read.
    Runtime("Arrow", ("ARROW_IO_THREADS",), libraries=r"^libarrow", module="pyarrow", cap=_cap_pyarrow,
            worker_threads=2, limit="table",
            advice="pyarrow.set_cpu_count(n) and pyarrow.set_io_thread_count(n) (any time; the CPU pool also "
                   "reads OMP_NUM_THREADS, the IO pool ARROW_IO_THREADS, at its start), or "
                   "spindle.limit_threads(n)"),
    # polars's own jemalloc runs background threads; without them it purges inline. At
    # POLARS_MAX_THREADS=1, polars 2.1 still runs 4 threads once a query ran (its pool's polars-0, the
    # tokio runtime's one worker: POLARS_ASYNC_THREAD_COUNT, the streaming engine's async-executor-0,
    # and polars-ooc-cleaner, started at import with no switch), plus tokio blocking threads that file
    # scans start on demand, up to POLARS_MAX_BLOCKING_THREAD_COUNT (default 512; at 1 polars warns of
    # a possible deadlock, at 2 it does not).
    Runtime("polars", ("POLARS_MAX_THREADS", "POLARS_ASYNC_THREAD_COUNT"),
            (("_RJEM_MALLOC_CONF", "background_thread:false"), ("POLARS_MAX_BLOCKING_THREAD_COUNT", "2")),
            libraries=r"^(_polars_runtime|polars)\.", thread_names=r"^(polars-|tokio-rt|async-executor)",
            module="polars", sized_at_import=True, worker_threads=6, limit="table",
            advice="set POLARS_MAX_THREADS=n (and POLARS_ASYNC_THREAD_COUNT=n, POLARS_MAX_BLOCKING_THREAD_COUNT "
                   "for file scans) before polars is imported (it sizes its pool at import and has no "
                   "call to change it), or spindle.limit_threads(n) before importing polars; a forked child of "
                   "a process that ran a polars query deadlocks in its next one: use "
                   "multiprocessing_context='spawn' there"),
    Runtime("numba", ("NUMBA_NUM_THREADS",), libraries=r"^(workqueue|omppool|tbbpool)\.", module="numba",
            cap=_cap_numba, limit="table",
            advice="set NUMBA_NUM_THREADS=n before numba is imported, or numba.set_num_threads(n) after its "
                   "first parallel call, or spindle.limit_threads(n)"),
    Runtime("onnxruntime", libraries=r"^(onnxruntime_pybind11_state|libonnxruntime)", module="onnxruntime",
            cap=_cap_onnxruntime, at_import=True, limit="table", advice=_ONNX_ADVICE),
    Runtime("TBB", libraries=r"^libtbb", limit="own",
            advice="TBB pools are capped only by tbb::global_control in the code that uses TBB; spindle's own "
                   "arena is sized by its ThreadBudget (DataLoader max_threads)"),
    Runtime("grain", thread_names=r"^grain", limit="own",
            advice="grain.ReadOptions(num_threads=n), or spindle.limit_threads(n) before the ReadOptions are made"),
    Runtime("spindle", libraries=r"^_core\.cpython", thread_names=r"^spindle",
            advice="spindle's threads are budgeted: lower num_workers or max_threads"),
    Runtime("Python threads", libraries=r"^(python\d|libpython\d)",
            advice="threading.Thread and executors: grain's read threads (ReadOptions(num_threads=n); "
                   "spindle.limit_threads(n) lowers the default), concurrent.futures max_workers, user code"),
)

BY_NAME: dict[str, Runtime] = {r.name: r for r in RUNTIMES}

# Threads a library starts once in a process, for itself, that no cap a user knows of changes:
# Arrow's bundled jemalloc purges freed memory in a background thread of this name, started in a
# worker where Arrow allocates (a Hugging Face dataset, pyarrow loaded by dataset code).
HOUSEKEEPING_THREADS = ("jemalloc_bg_thd",)

# Libraries that run every thread's first and last frames; never the answer.
SYSTEM_LIBRARIES = re.compile(r"^(libc|libpthread|ld-linux|libstdc\+\+|libgcc_s|libm|libdl|librt)[.-]")

LIBRARY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (r.name, re.compile(r.libraries)) for r in RUNTIMES if r.libraries)
NAME_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (r.name, re.compile(r.thread_names)) for r in RUNTIMES if r.thread_names)


def environment(n: int) -> dict[str, str]:
    """Every runtime's thread-count variables set to n (the variables `limit_threads(n)` sets)."""
    return {var: str(n) for r in RUNTIMES for var in r.variables}


def worker_environment() -> dict[str, str]:
    """What a worker's environment holds so that runtimes start one-thread pools: every count
    variable at 1 and the switches; XLA_FLAGS is added to, not replaced."""
    env = environment(1)
    for r in RUNTIMES:
        env.update(r.worker_environment)
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" in flags:
        env["XLA_FLAGS"] = flags
    elif flags:
        env["XLA_FLAGS"] = flags + " " + env["XLA_FLAGS"]
    return env


def cap_worker_runtimes() -> dict[str, bool]:
    """In a worker: runs the cap call (to one thread) of every runtime loaded in this process
    ({name: fully capped}) that is safe to call there; runtimes that read no variable are capped
    when they are imported later."""
    done = {}
    n = 1
    for r in RUNTIMES:
        if r.cap is None or r.module is None or not r.in_workers:
            continue
        module = sys.modules.get(r.module)
        if module is not None:
            done[r.name] = r.cap(module, n)
        elif r.at_import:
            after_import(r.module, lambda m, cap=r.cap: cap(m, n))
    return done


# Post-import hooks: a knob only an API sets (torch's inter-op count, grain's
# default, onnxruntime's sessions) is applied when the module is imported, before the caller uses it.
_hooks: dict[str, list[Callable[[Any], Any]]] = {}
_hooks_lock = threading.Lock()


def after_import(name: str, hook: Callable[[Any], Any]) -> None:
    """Runs hook(module) now if `name` is imported, else right after its import."""
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    with _hooks_lock:
        _hooks.setdefault(name, []).append(hook)
        if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PostImportFinder())


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a hooked module so that its
    hooks run once the module has executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _HookedLoader(spec.loader, fullname)
                return spec
            if spec is not None:
                return spec
        return None


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        with _hooks_lock:
            hooks = _hooks.pop(self._name, [])
        for hook in hooks:
            hook(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)
