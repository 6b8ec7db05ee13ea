"""Which runtime each thread of a process belongs to, read from /proc.

Used by ``spindle doctor`` (any process of this uid) and by
``spindle.limit_threads`` (this process, to count the threads of runtimes
already running).

A thread is attributed in this order:

1. its name (``/proc/<pid>/task/<tid>/comm``), when the runtime names its
   threads: TensorFlow's and XLA's ``tf_*`` pools, torch's ``pt_*``, grain's
   and spindle's own;
2. otherwise (most pools are unnamed, and keep the process's name, ``python``)
   the library that started it: the outermost frame of its stack that lies in
   a shared library other than libc/libstdc++. The stack is read from
   ``/proc/<pid>/mem`` between the stack pointer of the thread's blocking
   system call (``/proc/<pid>/task/<tid>/syscall``) and the top of its stack
   mapping; a pool thread sleeps in a system call almost always. The top of a
   thread's stack holds its start frame (and glibc's ``struct pthread`` with
   the start routine), so the outermost library is the one whose code started
   the thread: OpenBLAS's ``blas_thread_server``, libgomp's
   ``gomp_thread_start``, XLA's ``tsl::PThread::ThreadFn`` in jaxlib,
   CPython's ``thread_run`` for every ``threading.Thread``. Reading another
   process's memory needs ptrace access (same uid and Yama's ptrace_scope 0,
   or root). A thread on a CPU at that instant is looked at again for up to
   0.2 s (pool threads spin a while after their work). Without access, or for
   a thread that stays busy, it is reported as unattributed, with the
   runtimes whose libraries the process has mapped as candidates.

So numpy's OpenBLAS pool threads resolve to ``libscipy_openblas64_*.so``,
torch's OpenMP intra-op threads to ``libgomp``, JAX's pool threads to
``libjax_common.so`` (some named ``tf_XLAEigen``), grain's read threads to the
python binary.
"""

from __future__ import annotations

import bisect
import dataclasses
import errno
import os
import re
import time

from .runtimes import LIBRARY_PATTERNS, NAME_PATTERNS, SYSTEM_LIBRARIES

# The runtime table's patterns: (runtime, pattern on a mapped library's file name) and (runtime,
# pattern on a thread name); the first match wins. Thread names are cut to 15 characters, and a
# runtime's longer names are refused by the kernel (the thread then keeps the process's name):
# XLA's pools named tf_XLAPjRtCpuClient and tf_PjRtCompilerThreadPool come out unnamed.
_SYSTEM_LIBS = SYSTEM_LIBRARIES
_LIBRARY_RUNTIMES = LIBRARY_PATTERNS
_NAME_RUNTIMES = NAME_PATTERNS


RUNNING = "it was running when looked at"  # no stack pointer to read its stack from
_LOOKS, _LOOK_AGAIN_S = 40, 0.005  # a thread found running is looked at for up to 0.2 s


@dataclasses.dataclass(frozen=True)
class ThreadInfo:
    """One thread of a process and the runtime it was attributed to."""

    tid: int
    name: str
    runtime: str  # "main thread", a runtime, "other" (a name we do not know), or "unattributed"
    how: str  # "name", "stack", "main", or why it could not be attributed


@dataclasses.dataclass
class _Mapping:
    lo: int
    hi: int
    path: str


def _maps(pid: int) -> list[tuple[int, int, str, str]] | None:
    """(start, end, perms, path) of every mapping of `pid` (the core's procfs); None: gone or unreadable."""
    from .. import _core

    try:
        return _core.process_maps(pid)
    except OSError:
        return None


def mapped_libraries(pid: int) -> list[str] | None:
    """File names of the shared objects and executables mapped by `pid` (None: unreadable)."""
    maps = _maps(pid)
    if maps is None:
        return None
    return sorted({os.path.basename(path) for _, _, _, path in maps if path.startswith("/")})


def name_prefix(name: str) -> str:
    """A thread name without its pool index: pt_autograd_0 -> pt_autograd."""
    return re.sub(r"[-_ #]?\d+$", "", name) or name


def runtimes_of_libraries(libraries: list[str]) -> list[str]:
    """The runtimes whose libraries are in `libraries`, in table order."""
    found = []
    for runtime, pattern in _LIBRARY_RUNTIMES:
        if runtime != "Python threads" and any(pattern.search(lib) for lib in libraries):
            found.append(runtime)
    return found


def _library_runtime(lib: str) -> str | None:
    for runtime, pattern in _LIBRARY_RUNTIMES:
        if pattern.search(lib):
            return runtime
    return None


def _name_runtime(name: str) -> str | None:
    for runtime, pattern in _NAME_RUNTIMES:
        if pattern.search(name):
            return runtime
    return None


class _StackReader:
    """Reads thread stacks of one process through the core's procfs (its maps, each thread's
    stack pointer, and its memory)."""

    _MAX_STACK = 512 * 1024  # the outermost frames are at the top; more is never needed

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.error: str | None = None
        self._exec: list[_Mapping] = []
        self._all: list[_Mapping] = []
        maps = _maps(pid)
        if maps is None:
            self.error = "its /proc/<pid>/maps is unreadable"
            return
        for lo, hi, perms, path in maps:
            self._all.append(_Mapping(lo, hi, path))
            if "x" in perms and path.startswith("/"):
                self._exec.append(_Mapping(lo, hi, os.path.basename(path)))
        self._exec.sort(key=lambda m: m.lo)
        self._starts = [m.lo for m in self._exec]

    def close(self) -> None:
        pass  # the core opens /proc/<pid>/mem per read

    def _library_at(self, address: int) -> str | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0 and address < self._exec[i].hi:
            return self._exec[i].path
        return None

    def outermost_library(self, tid: int) -> tuple[str | None, str]:
        """(the outermost non-system library on the thread's stack, or None; why not)."""
        from .. import _core

        if self.error is not None:
            return None, self.error
        try:
            sp = _core.thread_stack_pointer(self.pid, tid)
        except OSError:
            return None, "no ptrace access to its /proc/<pid>/task/<tid>/syscall"
        if sp is None:
            return None, "it exited while looked at"
        if sp == "running":  # on a CPU now, no saved stack pointer
            return None, RUNNING
        top = next((m.hi for m in self._all if m.lo <= sp < m.hi), None)
        if top is None:
            return None, "its stack pointer is in no mapping"
        start = max(sp, top - self._MAX_STACK)
        try:
            data = _core.read_process_memory(self.pid, start, top - start)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                self.error = f"no ptrace access to read its stacks ({e.strerror})"
                return None, self.error
            return None, f"its stack is unreadable ({e.strerror})"
        if data is None:
            return None, "it exited while looked at"
        outermost = None
        for word in memoryview(data).cast("Q") if len(data) % 8 == 0 else ():
            lib = self._library_at(word)
            if lib is not None and not _SYSTEM_LIBS.match(lib):
                outermost = lib
        return outermost, "" if outermost else "no library frame on its stack"


def process_threads(pid: int) -> list[ThreadInfo]:
    """Every thread of `pid` with its runtime (empty if the process is gone)."""
    from .. import _core  # the one reader of /proc's thread list and names

    try:
        listed = _core.process_threads(pid)
        stat = _core.process_stat(pid)
    except OSError:
        return []
    if listed is None or stat is None:
        return []
    reader: _StackReader | None = None
    found: dict[int, ThreadInfo] = {}
    running: dict[int, str] = {}  # tid -> name of the threads on a CPU when looked at
    main_name = stat.comm

    def attribute(tid: int, name: str) -> None:
        assert reader is not None
        lib, why = reader.outermost_library(tid)
        runtime = _library_runtime(lib) if lib else None
        if runtime is not None:
            found[tid] = ThreadInfo(tid, name, runtime, "stack")
        elif why == RUNNING:
            running[tid] = name
        else:
            unattributed(tid, name, why or f"started by {lib}")

    def unattributed(tid: int, name: str, why: str) -> None:
        if name != main_name:
            # Named by code we do not know: its name is the best account of it.
            found[tid] = ThreadInfo(tid, name, "other", "name")
        else:
            found[tid] = ThreadInfo(tid, name, "unattributed", why)

    try:
        for tid, name in sorted(listed):
            if tid == pid:
                found[tid] = ThreadInfo(tid, name, "main thread", "main")
                continue
            runtime = _name_runtime(name)
            if runtime is not None:
                found[tid] = ThreadInfo(tid, name, runtime, "name")
                continue
            if reader is None:
                reader = _StackReader(pid)
            attribute(tid, name)
        # A pool thread spins a while after its work before it sleeps (OpenBLAS,
        # libgomp): the ones found running are looked at again, together, until
        # they have been preempted or gone to sleep (up to _LOOKS x _LOOK_AGAIN_S).
        for _ in range(_LOOKS - 1):
            if not running:
                break
            time.sleep(_LOOK_AGAIN_S)
            for tid, name in list(running.items()):
                del running[tid]
                attribute(tid, name)
        for tid, name in running.items():
            unattributed(tid, name, "it was running each time it was looked at")
    finally:
        if reader is not None:
            reader.close()
    out = [found[tid] for tid, _ in sorted(listed) if tid in found]
    if any(t.runtime == "XLA" for t in out):
        # tf_XLA* pools belong to whichever of JAX and TensorFlow loaded XLA.
        owners = runtimes_of_libraries(mapped_libraries(pid) or [])
        xla = "JAX/XLA" if "JAX/XLA" in owners else "TensorFlow" if "TensorFlow" in owners else "XLA"
        out = [dataclasses.replace(t, runtime=xla) if t.runtime == "XLA" else t for t in out]
    return out
