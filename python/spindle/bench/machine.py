"""What every benchmark result records next to its numbers: the machine, the load, the versions.

Numbers are only comparable within one run (read the ratios between loaders
measured side by side), but the machine says how to read them: on 2 cores the
consumer and the workers share the CPUs, on 16 they do not, and a load average
above the core count means other work took part of every loader's time.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from .tree import load_average

# Import name -> its distribution names, for every peer the harness can run.
PEER_MODULES = {"spindle": ["spindle"], "numpy": ["numpy"], "torch": ["torch"], "torchdata": ["torchdata"],
                "grain": ["grain"], "jax": ["jax"], "tensorflow": ["tensorflow", "tensorflow-cpu"],
                "spdl": ["spdl"], "PIL": ["pillow"], "torchvision": ["torchvision"]}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_gib() -> float:
    """Physical memory in GiB."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0


def versions(python: str = sys.executable) -> dict[str, str]:
    """Version of every peer as `python` sees it (a subprocess, so nothing is imported here)."""
    code = ("import importlib.metadata as m, json\nout = {}\n"
            f"for mod, dists in {PEER_MODULES!r}.items():\n"
            "    out[mod] = None\n"
            "    for dist in dists:\n"
            "        try: out[mod] = m.version(dist); break\n"
            "        except Exception: pass\n"
            "print(json.dumps(out))")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        import json

        return json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def git_revision(repo: Path) -> str:
    """The repository's commit, with "+dirty" when the tree has uncommitted changes ("" outside a checkout)."""
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return (rev + ("+dirty" if dirty else "")) if rev else ""


def spindle_install(repo: Path | None = None) -> dict[str, Any]:
    """Where the imported spindle extension is, when it was built, and which sources of `repo` changed since.

    Benchmarks measure the installed package, which can lag the working tree
    (`make install-py` rebuilds it); the git revision alone would hide that.
    """
    try:
        import spindle._core as core
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}
    built = os.path.getmtime(core.__file__)
    out: dict[str, Any] = {"extension": os.path.basename(core.__file__), "built": datetime.datetime.fromtimestamp(
        built, datetime.timezone.utc).isoformat(timespec="seconds")}
    if repo is not None and (repo / "runtime").is_dir():
        out["sources_changed_since_build"] = sorted(
            str(f.relative_to(repo)) for top in ("runtime", "python") for f in (repo / top).rglob("*")
            if f.is_file() and "__pycache__" not in f.parts and f.stat().st_mtime > built)
    return out


def machine_info(repo: Path | None = None, peer_python: str | None = None) -> dict[str, Any]:
    """The machine, the interpreter(s), every peer's version and the load average at the start."""
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "mem_total_gib": mem_total_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_executable": os.path.basename(sys.executable),  # a name, not a machine's path
        "versions": versions(),
        "spindle_install": spindle_install(repo),
        "uid": os.getuid(),
        "load_average_at_start": load_average(),
    }
    if repo is not None:
        info["git"] = git_revision(repo)
    if peer_python:
        info["peer_python"] = peer_python
        info["peer_versions"] = versions(peer_python)
    return info
