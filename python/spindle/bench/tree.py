"""Measuring a process tree from outside: the one code path every benchmark uses.

A loader's cost on a node is its whole tree: the consumer and every process it
started (workers, grain's spawned interpreters, multiprocessing's resource
tracker), with all their threads, because RLIMIT_NPROC counts threads of a uid
and memory is shared between forked workers. Everything here reads /proc only,
so it measures any loader the same way, from a process outside the tree.

- threads and processes: ``/proc/<pid>/stat`` fields num_threads and ppid;
- memory: PSS (``/proc/<pid>/smaps_rollup``), which splits a shared page among the
  processes that map it, so a tree's PSS sums to what it really holds;
- CPU: the consumer's ``getrusage`` (itself and the workers it reaped) plus the
  utime + stime of what is still running; the machine's busy time (/proc/stat) beside
  it says how much other work took.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Self

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcStat:
    """One process as /proc/<pid>/stat shows it."""

    ppid: int
    threads: int
    cpu_s: float           # utime + stime
    children_cpu_s: float  # cutime + cstime: reaped children


def _stat(pid: int) -> Optional[ProcStat]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:  # exited while we looked
        return None
    fields = data.rsplit(b")", 1)[1].split()  # the command name may hold spaces and ')'
    return ProcStat(ppid=int(fields[1]), threads=int(fields[17]),        # fields 4 and 20
                    cpu_s=(int(fields[11]) + int(fields[12])) / _TICK,    # 14, 15: utime, stime
                    children_cpu_s=(int(fields[13]) + int(fields[14])) / _TICK)  # 16, 17: cutime, cstime


class ProcessTree:
    """The processes under a root, cheap enough to poll every few milliseconds beside a loader.

    Reading every /proc/*/stat costs about 1.2 ms in Python with 80 processes (and
    more on a busy machine). A process's parent only changes when that parent dies
    (init adopts it), so each pid's ppid is read once; a poll lists /proc and reads
    only the stat files of new pids and of the tree's own.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self._ppid: dict[int, int] = {}

    def stats(self) -> dict[int, ProcStat]:
        """{pid: ProcStat} of the root and all its descendants, now (empty once the root is gone)."""
        live = {int(e) for e in os.listdir("/proc") if e.isdigit()}
        for pid in self._ppid.keys() - live:
            del self._ppid[pid]
        for pid in live - self._ppid.keys():
            st = _stat(pid)
            if st is not None:
                self._ppid[pid] = st.ppid
        children: dict[int, list[int]] = {}
        for pid, ppid in self._ppid.items():
            children.setdefault(ppid, []).append(pid)
        tree: dict[int, ProcStat] = {}
        stack = [self.root]
        while stack:
            pid = stack.pop()
            st = _stat(pid)
            if st is None:
                continue
            if pid != self.root and st.ppid != self._ppid.get(pid):
                self._ppid[pid] = st.ppid  # adopted by init: no longer in the tree
                continue
            tree[pid] = st
            stack.extend(children.get(pid, ()))
        return tree

    def threads(self) -> dict[int, int]:
        """{pid: threads} of the root and all its descendants, now."""
        return {pid: st.threads for pid, st in self.stats().items()}


def tree_threads(root: int) -> dict[int, int]:
    """Threads of `root` and of each of its descendants, by pid (one look)."""
    return ProcessTree(root).threads()


def pss_kib(pid: int) -> int:
    """Proportional set size of one process in KiB (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def uid_tasks(uid: int) -> int:
    """Tasks (threads) whose real uid is `uid`: what the kernel compares with RLIMIT_NPROC."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid:
            total += int(fields["Threads"])
    return total


@dataclass
class TreePeaks:
    """What a TreeSampler saw: peaks over its polls."""

    threads: int = 0
    processes: int = 0
    pss_kib: int = 0
    pss_settled: bool = False  # pss_kib is from a look at an unchanging tree (else: no such look yet)
    uid_tasks: int = 0
    polls: int = 0
    pids_seen: set[int] = field(default_factory=set)


class Poller:
    """Calls `poll()` from a daemon thread of this process every `period_s`, from entering
    the `with` block until leaving it: the thread under every sampler of a benchmark
    (TreeSampler here; samplers of the bench/python scripts subclass it too)."""

    def __init__(self, period_s: float, name: str) -> None:
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def poll(self) -> None:
        """One look; what it looks at is the subclass's."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            time.sleep(self.period_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class TreeSampler(Poller):
    """Polls the tree under `root` from a thread of this process until stopped.

    Every `period_s`: threads and processes of the tree; every `pss_every`-th poll,
    its PSS (smaps_rollup walks the page tables, so it costs more). With `uid`, also
    the tasks of that uid machine-wide, which is what `ulimit -u` is checked against
    (`root` None: only those).
    """

    def __init__(self, root: Optional[int], *, period_s: float = 0.01, pss_every: int = 5,
                 uid: Optional[int] = None) -> None:
        super().__init__(period_s, name="spindle-bench-sampler")
        self.root, self.pss_every, self.uid = root, pss_every, uid
        self.peaks = TreePeaks()
        self.tree = ProcessTree(root) if root is not None else None

    def poll(self) -> None:
        """One look at the tree."""
        tree = self.tree.stats() if self.tree is not None else {}
        p = self.peaks
        if tree:
            p.threads = max(p.threads, sum(st.threads for st in tree.values()))
            p.processes = max(p.processes, len(tree))
            p.pids_seen.update(tree)
            if p.polls % self.pss_every == 0:
                total = sum(pss_kib(pid) for pid in tree)
                # PSS splits a shared page among the processes mapping it when each is read: a worker
                # forked or ended while the tree is read makes the sum count shared pages twice (or
                # not at all), so such a look counts only until a look at an unchanging tree.
                if self.tree.stats().keys() == tree.keys():
                    p.pss_kib = max(p.pss_kib, total) if p.pss_settled else total
                    p.pss_settled = True
                elif not p.pss_settled:
                    p.pss_kib = max(p.pss_kib, total)
        if self.uid is not None:
            p.uid_tasks = max(p.uid_tasks, uid_tasks(self.uid))
        p.polls += 1


def busy_cpu_seconds() -> float:
    """CPU time all CPUs spent not idle since boot (first line of /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / _TICK


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (/proc/loadavg): how loaded the machine was by anyone."""
    return [round(x, 2) for x in os.getloadavg()]
