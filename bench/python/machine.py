"""What every bench/python result records next to its numbers, from the package's harness.

The measuring code lives in one place, ``spindle.bench`` (``spindle bench`` is the
harness users run): ``spindle.bench.machine`` says what the machine and the versions
were, ``spindle.bench.tree`` measures process trees and the machine's busy time. This
module keeps the small interface the per-question scripts here were written against
(``machine_info``, ``load_average``, ``ForeignCpu``, ``write_results``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# spindle.bench is imported inside the functions: grain's spawned workers re-import the
# main module of grain_bench.py, which imports this one, and must not load spindle.

__all__ = ["RESULTS_DIR", "ForeignCpu", "child_result", "error_report", "kill_descendants", "load_average", "machine_info",
           "write_results"]

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
REPO = Path(__file__).resolve().parents[2]


def machine_info() -> dict[str, Any]:
    """The machine, the interpreter and the libraries the numbers came from; numpy, torch and
    spindle also as top-level keys, as the earlier results have them."""
    from spindle.bench import machine

    info = machine.machine_info(REPO)
    for name in ("numpy", "torch", "spindle"):
        info[name] = info["versions"].get(name) or "not importable"
    return info


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: other work on the machine skews every peer's numbers."""
    from spindle.bench.tree import load_average as spindle_load_average

    return spindle_load_average()


def _busy_cpu_seconds() -> float:
    from spindle.bench.tree import busy_cpu_seconds

    return busy_cpu_seconds()


def _own_cpu_seconds() -> float:
    """CPU time of this process and of its children: reaped ones (os.times) and live ones (/proc)."""
    from spindle.bench.tree import ProcessTree

    t = os.times()
    live = sum(st.cpu_s for pid, st in ProcessTree(os.getpid()).stats().items() if pid != os.getpid())
    return t.user + t.system + t.children_user + t.children_system + live


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


def error_report(exc: BaseException, traceback_chars: int) -> dict[str, str]:
    """What a child script of a benchmark reports of the exception it is handling: the type and
    the first line of its text (what the parent prints), and the traceback's last characters."""
    import traceback

    text = str(exc).strip()
    return {"error": f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}",
            "traceback_tail": "".join(traceback.format_exception(exc))[-traceback_chars:]}


def kill_descendants() -> None:
    """SIGKILLs every descendant of this process, deepest first (a child script's way out that does
    not wait on grain's or torch's atexit joins: its descendants hold its stdout)."""
    import signal

    from spindle.bench.tree import ProcessTree

    me = os.getpid()
    # stats() lists the tree parents before children, so reversed it is deepest first.
    for pid in reversed([pid for pid in ProcessTree(me).stats() if pid != me]):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def child_result(cmd: list[str], timeout: float = 900) -> dict[str, Any]:
    """Runs one measurement in a fresh child process (`cmd`), which prints its numbers as one
    ``RESULT {json}`` line: those numbers, or ``{"failed": ...}`` with the exit status and the
    end of what it printed."""
    import subprocess

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"failed": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-400:]}"}


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Writes bench/results/<name>.json (via a .tmp file, so a killed run leaves no half file)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path
