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
        "uid": os.getuid(),
    }


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Writes bench/results/<name>.json (via a .tmp file, so a killed run leaves no half file)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path
