"""``spindle doctor``: the task limits of this node and who uses them.

``collect()`` gathers, from /proc and the cgroup tree, the limits that make
``fork``/``pthread_create`` fail with EAGAIN (``ulimit -u``, pids.max of every
cgroup level, kernel.threads-max, kernel.pid_max), the tasks of the uid, and
per process its threads grouped by runtime (``spindle._budget.threads``) with advice
on the option or variable that removes each pool. ``format_text()`` renders it
for a terminal; ``spindle doctor --json`` prints ``collect()`` as is.
"""

from __future__ import annotations

import collections
import os
import resource
from typing import Any

from . import _core
from ._core import ThreadBudget
from ._budget.runtimes import RUNTIMES
from ._budget.threads import mapped_libraries, name_prefix, process_threads, runtimes_of_libraries
from ._runtime.sharing import worker_memory

# What removes or shrinks each pool, one sentence per runtime, the variable first (the runtime table's).
ADVICE: dict[str, str] = {r.name: r.advice for r in RUNTIMES if r.advice}


def _status(pid: int) -> _core.ProcessStatus | None:
    """/proc/<pid>/status as the core's procfs reads it; None if the process is gone or unreadable."""
    try:
        return _core.process_status(pid)
    except OSError:
        return None


def _stat(pid: int) -> _core.ProcessStat | None:
    """/proc/<pid>/stat as the core's procfs reads it; None if the process is gone or unreadable."""
    try:
        return _core.process_stat(pid)
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    """The command line of `pid`, its arguments joined by spaces ("" for a kernel thread, or gone)."""
    try:
        return " ".join(_core.process_cmdline(pid) or []).strip()
    except OSError:
        return ""


def _nproc_limits(pid: int | None) -> tuple[int | None, int | None]:
    """RLIMIT_NPROC (soft, hard) of `pid` (None: this process); None = unlimited."""
    if pid is None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        return (None if soft == resource.RLIM_INFINITY else soft, None if hard == resource.RLIM_INFINITY else hard)
    try:
        limits = _core.process_limits(pid) or {}
    except OSError:
        return (None, None)
    return limits.get("Max processes", (None, None))


def cgroup_pids_levels(pid: int | None = None, cgroup_root: str = "/sys/fs/cgroup") -> list[dict[str, Any]]:
    """pids.max and pids.current of every level from the process's cgroup up to
    the root (v2, or the v1 pids hierarchy); levels without the files are left out.
    ThreadBudget reads the same levels (the core's procfs) and reports only the binding one."""
    return _core.cgroup_pids_levels(pid, cgroup_root=cgroup_root)


def _processes(uid: int) -> tuple[dict[int, int], int]:
    """({pid: ppid} of the user processes of real uid `uid`, tasks of all processes on the node)."""
    mine, node_tasks = {}, 0
    for pid in _core.process_ids():
        status = _status(pid)
        if status is None:
            continue
        node_tasks += status.threads
        if status.real_uid == uid and _cmdline(pid):
            mine[pid] = status.ppid  # an empty cmdline is a kernel thread
    return mine, node_tasks


def _descendants(pid: int, parents: dict[int, int]) -> list[int]:
    """The processes below `pid` (children, their children...) among `parents` ({pid: ppid})."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for child, parent in parents.items():
        children[parent].append(child)
    found, todo = [], list(children.get(pid, ()))
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return sorted(found)


def describe_process(pid: int) -> dict[str, Any] | None:
    """One process: its threads grouped by runtime and name prefix, with advice per pool."""
    status = _status(pid)
    if status is None:
        return None
    threads = process_threads(pid)
    libraries = mapped_libraries(pid) or []
    loaded = runtimes_of_libraries(libraries)
    groups: dict[str, dict[str, Any]] = {}
    for t in threads:
        g = groups.setdefault(t.runtime, {"runtime": t.runtime, "count": 0, "names": collections.Counter(),
                                          "attributed_by": set()})
        g["count"] += 1
        g["names"][name_prefix(t.name)] += 1
        g["attributed_by"].add(t.how)
    out_groups = []
    for g in sorted(groups.values(), key=lambda g: (g["runtime"] == "main thread", -g["count"])):
        entry = {"runtime": g["runtime"], "count": g["count"], "names": dict(g["names"].most_common()),
                 "attributed_by": sorted(g["attributed_by"])}
        if g["runtime"] in ADVICE:
            entry["advice"] = ADVICE[g["runtime"]]
        if g["runtime"] == "unattributed":
            entry["candidates"] = loaded
        out_groups.append(entry)
    cmdline = _cmdline(pid)
    parent = status.ppid
    worker = _is_spindle_worker(loaded, cmdline, parent)
    return {
        "pid": pid,
        "ppid": parent,
        "name": status.name,
        "cmdline": cmdline,
        "threads": len(threads),
        "spindle_worker": worker,
        # A worker's private memory (USS): a dataset the workers copy shows here (docs/shared_memory.md).
        # Workers only: reading it walks the page tables, tens of milliseconds for a large process.
        "uss_bytes": _uss(pid) if worker else None,
        "runtimes_loaded": loaded,
        "groups": out_groups,
    }


def _uss(pid: int) -> int | None:
    memory = worker_memory(pid)
    return None if memory is None else memory.uss


def _is_spindle_worker(loaded: list[str], cmdline: str, parent: int) -> bool:
    """A worker maps spindle's extension, as its consumer (the parent) does, and is either a fork of
    it (no exec: the same command line) or a spawned worker (`python -m spindle._runtime.spawned`). A program
    that a spindle consumer merely started (fork + exec, e.g. a test's subprocess) is not one."""
    if "spindle" not in loaded or "spindle" not in runtimes_of_libraries(mapped_libraries(parent) or []):
        return False
    return cmdline == _cmdline(parent) or "spindle._runtime.spawned" in cmdline


def collect(pid: int | None = None) -> dict[str, Any]:
    """Limits, use and headroom for the uid of `pid` (default: this process's
    uid), and every process of that uid (or just `pid`) with its thread pools."""
    if pid is not None and _stat(pid) is None:
        raise ProcessLookupError(f"spindle doctor: no process {pid} (looked for /proc/{pid})")
    status = None if pid is None else _status(pid)
    uid = os.getuid() if status is None else status.real_uid
    soft, hard = _nproc_limits(pid)
    budget = ThreadBudget(uid=uid, nproc_limit=soft)  # counts the uid's tasks as the loaders do
    levels = cgroup_pids_levels(pid)
    threads_max = _core.sysctl_int("kernel.threads-max")
    pid_max = _core.sysctl_int("kernel.pid_max")
    parents, node_tasks = _processes(uid)
    pids = list(parents)
    if pid is not None:
        pids = [pid]
        # and its spindle workers (forked, spawned, or forked by a zygote below it)
        below = _descendants(pid, parents)

    headroom: dict[str, int | None] = {
        # None: unlimited, or root (exempt). Not budget.nproc_headroom: for --pid the
        # limit is the target's, and an unlimited one would make ThreadBudget read ours.
        "nproc": None if soft is None or budget.nproc_exempt else max(0, soft - budget.uid_tasks),
        "cgroup": min((lv["max"] - lv["current"] for lv in levels if lv["max"] is not None), default=None),
        "threads_max": None if threads_max is None else threads_max - node_tasks,
        "pid_max": None if pid_max is None else pid_max - node_tasks,
    }
    bounded = {k: v for k, v in headroom.items() if v is not None}
    binding = min(bounded, key=bounded.get) if bounded else None

    processes = [p for p in (describe_process(p) for p in pids) if p is not None]
    if pid is not None:
        processes += [w for w in (describe_process(p) for p in below) if w is not None and w["spindle_worker"]]
    processes.sort(key=lambda p: -p["threads"])
    return {
        "limits": {
            "nproc_soft": soft,
            "nproc_hard": hard,
            "nproc_exempt": budget.nproc_exempt,
            "cgroup_pids": levels,
            "threads_max": threads_max,
            "pid_max": pid_max,
        },
        "use": {"uid": uid, "uid_tasks": budget.uid_tasks, "node_tasks": node_tasks},
        "leases": _leases(uid),
        "headroom": {**headroom, "min": bounded.get(binding) if binding else None, "binding": binding},
        "processes": processes,
        "target": pid,
    }


def _leases(uid: int) -> dict[str, Any]:
    """The node budget ledger of `uid` as found: its path, whether it is used, and its leases
    (pid, start_time, lease_id, tasks, pending = not started yet, alive)."""
    status = _core.ledger_status()
    if uid != os.getuid():
        return {"path": None, "usable": False, "entries": [],
                "note": f"the ledger of uid {uid} is read only by that uid (this is uid {os.getuid()})"}
    entries = _core.ledger_leases() if status["usable"] else []
    return {"path": status["path"] or None, "usable": status["usable"], "entries": entries,
            "note": status["warning"]}


def _fmt(v: int | None, none: str = "unlimited") -> str:
    return none if v is None else str(v)


def format_text(report: dict[str, Any], *, max_processes: int = 20) -> str:
    """The report for a terminal: limits, use, headroom, then processes by thread count."""
    lim, use, room = report["limits"], report["use"], report["headroom"]
    lines = ["Limits (fork and pthread_create fail with EAGAIN at the first one reached)"]
    exempt = "  (root: exempt)" if lim["nproc_exempt"] else ""
    lines.append(f"  ulimit -u (RLIMIT_NPROC)  soft {_fmt(lim['nproc_soft'])}, hard {_fmt(lim['nproc_hard'])}{exempt}")
    if lim["cgroup_pids"]:
        for lv in lim["cgroup_pids"]:
            lines.append(f"  cgroup pids.max           {_fmt(lv['max']):>9}  current {lv['current']:>6}  {lv['path']}")
    else:
        lines.append("  cgroup pids.max           no level sets one")
    lines.append(f"  kernel.threads-max        {_fmt(lim['threads_max'])}")
    lines.append(f"  kernel.pid_max            {_fmt(lim['pid_max'])}")
    lines.append("Use")
    lines.append(f"  {'tasks of uid ' + str(use['uid']):<25} {use['uid_tasks']}")
    lines.append(f"  {'tasks on the node':<25} {use['node_tasks']}")
    leases = report.get("leases")
    if leases is not None:
        where = leases["path"] or "none"
        lines.append(f"Leases (node budget ledger {where}; pending = granted, not started yet)")
        if leases["note"]:
            lines.append(f"  not used: {leases['note']}")
        elif not leases["entries"]:
            lines.append("  none")
        for e in leases["entries"]:
            alive = "alive" if e["alive"] else "dead (reclaimed at the next access)"
            lines.append(f"  pid {e['pid']:>7}  start {e['start_time']:>10}  lease {e['lease_id']:>3}  "
                         f"tasks {e['tasks']:>4}  pending {e['pending']:>4}  {alive}")
    lines.append("Headroom (tasks that can still start)")
    for key, label in (("nproc", "ulimit -u"), ("cgroup", "cgroup"), ("threads_max", "threads-max"),
                       ("pid_max", "pid_max")):
        v = room[key]
        note = ("exempt (root)" if key == "nproc" and lim["nproc_exempt"] else "unlimited") if v is None else str(v)
        mark = "   <- binding" if room["binding"] == key else ""
        lines.append(f"  {label:<25} {note}{mark}")
    procs = report["processes"]
    single = [p for p in procs if p["threads"] == 1]
    # --pid: the process and its workers, every one shown (the workers are single-threaded)
    shown = procs if report.get("target") is not None else [p for p in procs if p["threads"] > 1][:max_processes]
    lines.append(f"Processes of uid {use['uid']} ({len(procs)}; threads grouped by runtime, then name prefix)")
    advice: dict[str, str] = {}
    for p in shown:
        cmd = p["cmdline"] if len(p["cmdline"]) <= 60 else p["cmdline"][:57] + "..."
        worker = ""
        if p["spindle_worker"]:
            private = p.get("uss_bytes")
            worker = "  [spindle worker]" if private is None else f"  [spindle worker, {private / 2**20:.1f} MiB private]"
        lines.append(f"  {p['pid']:>7}  {p['threads']:>4} threads  {cmd}{worker}")
        for g in p["groups"]:
            names = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in g["names"].items())
            extra = ""
            if g["runtime"] == "unattributed":
                extra = f"  (libraries mapped: {', '.join(g['candidates']) or 'none known'}; {', '.join(g['attributed_by'])})"
            lines.append(f"           {g['count']:>4}  {g['runtime']:<16} {names}{extra}")
            if "advice" in g and g["runtime"] not in advice:
                advice[g["runtime"]] = g["advice"]
    if len(shown) < len(procs):
        rest = [p for p in procs if p not in shown]
        lines.append(f"  ... {len(rest)} more processes, {sum(p['threads'] for p in rest)} threads "
                     f"({len(single)} of them single-threaded; --json lists all)")
    if advice:
        lines.append("Advice (per pool found above)")
        for runtime, text in advice.items():
            lines.append(f"  {runtime}: {text}")
    return "\n".join(lines) + "\n"
