"""What every benchmark result records next to its numbers: the machine and the versions.

Numbers from bench/python are only comparable within one run (they are
reported as ratios between peers measured side by side), but the machine
still says how to read them: on 2 cores the consumer and the workers share
the CPUs, on 16 they do not.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception as exc:  # a missing peer is recorded, not fatal
        return f"not importable ({type(exc).__name__})"


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: other work on the machine skews every peer's numbers."""
    return [round(x, 2) for x in os.getloadavg()]


def _git_revision() -> str:
    """The repository commit, with "+dirty" when the tree has uncommitted changes."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev or "unknown") + ("+dirty" if dirty else "")


def _spindle_install() -> dict[str, Any]:
    """When the imported spindle extension was built, and whether the sources changed since.

    The benchmarks measure the installed package, which can lag the working
    tree (`make install-py` rebuilds it); the git revision alone would hide that.
    """
    try:
        import spindle._core as core
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    built = os.path.getmtime(core.__file__)
    repo = Path(__file__).resolve().parents[2]
    newer = sorted(str(f.relative_to(repo)) for top in ("runtime", "python") if (repo / top).is_dir()
                   for f in (repo / top).rglob("*") if f.is_file() and "__pycache__" not in f.parts
                   and f.stat().st_mtime > built)
    return {"extension": core.__file__,
            "built": datetime.datetime.fromtimestamp(built, datetime.timezone.utc).isoformat(timespec="seconds"),
            "sources_changed_since_build": newer}


def machine_info() -> dict[str, Any]:
    """The machine, the interpreter and the libraries the numbers came from."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "spindle": _version("spindle"),
        "git": _git_revision(),
        "spindle_install": _spindle_install(),
        "uid": os.getuid(),
        "load_average_at_start": load_average(),
    }


def _busy_cpu_seconds() -> float:
    """CPU time all CPUs spent not idle since boot (first line of /proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _live_descendants_cpu_seconds() -> float:
    """CPU time so far of this process's live descendants (workers not yet reaped), from /proc/*/stat."""
    parent_of: dict[int, int] = {}
    ticks_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        parent_of[int(entry)] = int(fields[1])                    # field 4: ppid
        ticks_of[int(entry)] = int(fields[11]) + int(fields[12])  # fields 14, 15: utime, stime
    tree, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent_of.items() if ppid in frontier and pid not in tree}
        tree |= frontier
    return sum(ticks_of[pid] for pid in tree) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU time of this process and of its children: reaped ones (os.times) and live ones (/proc)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _live_descendants_cpu_seconds()


class ForeignCpu:
    """Measures the CPU time the rest of the machine used while a benchmark ran.

    Busy time of all CPUs minus this process and its children (live or reaped). On a
    machine shared with other jobs this says how much they took from the run;
    the number is rounded to the kernel's 10 ms tick and includes kernel threads.
    """

    def __enter__(self) -> "ForeignCpu":
        self._busy0, self._own0, self._wall0 = _busy_cpu_seconds(), _own_cpu_seconds(), os.times().elapsed
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = os.times().elapsed - self._wall0
        self.busy_s = _busy_cpu_seconds() - self._busy0
        self.own_s = _own_cpu_seconds() - self._own0
        self.foreign_s = max(0.0, self.busy_s - self.own_s)

    def summary(self) -> dict[str, float]:
        nproc = len(os.sched_getaffinity(0))
        return {"wall_s": round(self.wall_s, 1), "machine_busy_cpu_s": round(self.busy_s, 1),
                "own_cpu_s": round(self.own_s, 1), "foreign_cpu_s": round(self.foreign_s, 1),
                "foreign_share_of_machine": round(self.foreign_s / (self.wall_s * nproc), 3)}


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Writes bench/results/<name>.json (via a .tmp file, so a killed run leaves no half file)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path
