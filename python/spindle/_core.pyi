"""
spindle's C++ runtime (private; use the spindle package).
"""
from __future__ import annotations
import collections.abc
import typing
import typing_extensions
__all__: list[str] = ['AttachedWorker', 'Lease', 'Loader', 'ThreadBudget', 'ThreadPlan', 'WorkItem', 'WorkerContext', 'arena_extra_threads', 'count_process_threads', 'gather_rows']
class ThreadPlan:
    """
    What a loader may start: worker processes and extra arena threads.
    """
    @property
    def arena_threads(self) -> int:
        """
        Extra TBB threads the consumer may run (0: only the calling thread).
        """
    @property
    def budget(self) -> int | None:
        """
        The budget the plan was cut from (None: unlimited).
        """
    @property
    def num_workers(self) -> int:
        """
        Worker processes, one thread each.
        """
class ThreadBudget:
    """
    How many tasks (threads or processes) a loader may add, from RLIMIT_NPROC, the tasks this uid already runs, the cgroup's pids.max and an optional cap. Limits that do not apply read as None.
    """
    def __init__(self, *, max_threads: typing.SupportsInt | typing.SupportsIndex | None = None, proc_root: str = '/proc', cgroup_root: str = '/sys/fs/cgroup', uid: typing.SupportsInt | typing.SupportsIndex | None = None, nproc_limit: typing.SupportsInt | typing.SupportsIndex | None = None, nproc_exempt: bool | None = None, cpus: typing.SupportsInt | typing.SupportsIndex | None = None) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def plan(self, num_workers: typing.SupportsInt | typing.SupportsIndex) -> ThreadPlan:
        """
        Plan for num_workers workers; raises ThreadBudgetError, with the numbers, if they do not fit.
        """
    @property
    def budget(self) -> int | None:
        """
        min(nproc_headroom, cgroup_headroom, user_cap).
        """
    @property
    def cgroup_current(self) -> int:
        """
        pids.current of the binding cgroup level.
        """
    @property
    def cgroup_headroom(self) -> int | None:
        """
        Smallest pids.max - pids.current over our cgroup and its ancestors.
        """
    @property
    def cgroup_limit(self) -> int | None:
        """
        pids.max of the binding cgroup level.
        """
    @property
    def cpus(self) -> int:
        """
        CPUs this process may run on (affinity, cgroup cpu.max).
        """
    @property
    def nproc_exempt(self) -> bool:
        """
        True for root, which the kernel exempts from RLIMIT_NPROC.
        """
    @property
    def nproc_headroom(self) -> int | None:
        """
        nproc_limit - uid_tasks.
        """
    @property
    def nproc_limit(self) -> int | None:
        """
        RLIMIT_NPROC soft limit (ulimit -u).
        """
    @property
    def uid_tasks(self) -> int:
        """
        Threads of all processes of this real uid, from /proc.
        """
    @property
    def user_cap(self) -> int | None:
        """
        The max_threads cap.
        """
class Lease:
    """
    A delivered batch: its bytes stay valid, and its ring slot reserved, while this object or any buffer made from it lives.
    """
    @property
    def batch_id(self) -> int:
        ...
    @property
    def copied_out(self) -> bool:
        ...
    @property
    def count(self) -> int:
        ...
    @property
    def indices(self) -> list[int]:
        ...
class WorkItem:
    @property
    def batch_id(self) -> int:
        ...
    @property
    def count(self) -> int:
        ...
    @property
    def slot(self) -> int:
        ...
class WorkerContext:
    def claim(self) -> WorkItem | None:
        ...
    @typing.overload
    def commit(self, item: WorkItem) -> None:
        ...
    @typing.overload
    def commit(self, item: WorkItem, count: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def exhausted(self, item: WorkItem) -> None:
        ...
    def fail(self, item: WorkItem, report: bytes) -> None:
        ...
    def layout(self) -> dict:
        ...
    def memory(self) -> memoryview:
        """
        The whole shared segment, writable.
        """
    def set_sample(self, index: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def num_workers(self) -> int:
        ...
    @property
    def worker_id(self) -> int:
        ...
class AttachedWorker:
    """
    A spawned worker's mapping of the loader segment and its WorkerContext.
    """
    def __init__(self, segment_fd: typing.SupportsInt | typing.SupportsIndex, worker_id: typing.SupportsInt | typing.SupportsIndex, parent: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def context(self) -> WorkerContext:
        ...
class Loader:
    def __init__(self, *, order: typing_extensions.Buffer, drop_last: bool = False, starts: typing.Any = None, worker_main: collections.abc.Callable, num_workers: typing.SupportsInt | typing.SupportsIndex, batch_capacity: typing.SupportsInt | typing.SupportsIndex, slot_bytes: typing.SupportsInt | typing.SupportsIndex, prefetch_factor: typing.SupportsInt | typing.SupportsIndex = 2, in_order: bool = True, timeout: typing.SupportsFloat | typing.SupportsIndex = 0.0, max_threads: typing.SupportsInt | typing.SupportsIndex | None = None, round_robin: bool = False, assign_in_turn: bool = False, first_worker: typing.SupportsInt | typing.SupportsIndex = 0, spawn_argv: collections.abc.Sequence[str] | None = None, spawn_fds: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = []) -> None:
        ...
    def close(self) -> None:
        ...
    def next(self) -> typing.Any:
        ...
    def reset(self, *, order: typing_extensions.Buffer, drop_last: bool = False, starts: typing.Any = None) -> None:
        ...
    @property
    def copied_out(self) -> int:
        ...
    @property
    def num_batches(self) -> int:
        ...
    @property
    def num_slots(self) -> int:
        ...
    @property
    def plan(self) -> ThreadPlan:
        ...
    @property
    def worker_pids(self) -> list[int]:
        ...
def arena_extra_threads() -> int:
    """
    Extra threads the process's TBB arena may run, as last configured by a loader.
    """
def count_process_threads(pid: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Threads of process pid (entries of /proc/<pid>/task); 0 if it does not exist.
    """
def gather_rows(dst: typing_extensions.Buffer, rows: list, row_bytes: typing.SupportsInt | typing.SupportsIndex) -> bool:
    """
    Copies C-contiguous buffers of row_bytes each into consecutive rows of dst with streaming stores; False (nothing copied) if a row is not such a buffer.
    """
