"""Runs the grid: loaders x worker counts x rounds, each measurement a fresh process tree.

The parent (this process) starts ``python -m spindle.bench.child`` per measurement and
samples the child's tree from outside with :class:`~spindle.bench.tree.TreeSampler`;
the child times its epoch and counts its samples. Loaders alternate within a round
(the order rotates by one each round), so a drift of the machine spreads over all of
them. With ``ulimit_headroom`` the child runs as uid 65534 under ``ulimit -u`` = the
uid's tasks + 1 + headroom (root is exempt from RLIMIT_NPROC, so only another uid shows
what a limit does).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from . import tree

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
UID_LOCK = "/tmp/spindle-uid65534.lock"

# Loader -> the modules it needs (checked in the interpreter that will run it).
LOADER_MODULES = {
    "spindle": ("spindle",),
    "spindle-torch": ("spindle", "torch"),
    "spindle-grain": ("spindle", "grain"),
    "spindle-grain+jax": ("spindle", "grain", "jax"),
    "spindle-native-processes": ("spindle",),
    "spindle-native-threads": ("spindle",),
    "torch": ("torch",),
    # jpeg-native's torch row: torch has no image ops of its own (torchvision's decode is not
    # installed with it), so its DataLoader runs the PIL dataset, and the row says so.
    "torch+PIL": ("torch", "PIL"),
    "torchdata": ("torch", "torchdata.stateful_dataloader"),
    "grain": ("grain",),
    "grain+jax": ("grain", "jax"),
    "tf.data": ("tensorflow",),
    "spdl": ("spdl.pipeline",),
}
PYTHON_LOADERS = ("spindle", "spindle-torch", "spindle-grain", "spindle-grain+jax", "torch", "torchdata", "grain",
                  "grain+jax", "tf.data", "spdl")
NATIVE_LOADERS = ("spindle-native-processes", "spindle-native-threads", "tf.data", "torch+PIL")
WORKLOAD_LOADERS = {"arrays": PYTHON_LOADERS, "jpeg-pil": PYTHON_LOADERS, "jpeg-native": NATIVE_LOADERS,
                    "dataset": PYTHON_LOADERS}


def is_spindle(loader: str) -> bool:
    return loader.startswith("spindle")


@dataclass
class Settings:
    """Everything a measurement depends on (recorded in the JSON)."""

    workloads: tuple[str, ...]
    loaders: tuple[str, ...]
    workers: tuple[int, ...]
    rounds: int
    samples: int          # arrays workload
    images: int           # jpeg workloads
    root: str             # the image folder
    dataset: Optional[str]
    batch_arrays: int = 256
    batch_images: int = 64
    size: int = 224
    alarm_s: int = 240      # the child gives up (reports a hang) after this
    kill_after_s: int = 270  # the parent kills the tree after this
    python: str = sys.executable
    peer_python: Optional[str] = None
    ulimit_headroom: Optional[int] = None
    elsewhere: dict[str, str] = field(default_factory=dict)  # loader -> the interpreter it was found in


def python_for(loader: str, s: Settings) -> str:
    """The interpreter a loader runs in: this one; ``--peer-python`` for a peer that does not
    import here but does there; as uid 65534, Debian's python3 (the uid cannot read a per-user
    interpreter)."""
    if s.ulimit_headroom is not None:
        return SYSTEM_PYTHON
    return s.elsewhere.get(loader, s.python)


def find_loaders(s: Settings, staging: "Staging") -> dict[str, str]:
    """Checks every loader of `s` in the interpreter it would run in (then in ``--peer-python``);
    records where each was found in ``s.elsewhere``; returns {loader: why it is skipped}."""
    skipped = {}
    used = [x for x in s.loaders if any(x in WORKLOAD_LOADERS[w] for w in s.workloads)]
    for name in used:
        why = check_importable(python_for(name, s), LOADER_MODULES[name], _child_env(name, s, staging))
        if why and s.peer_python and s.ulimit_headroom is None and not is_spindle(name):
            s.elsewhere[name] = s.peer_python
            there = check_importable(s.peer_python, LOADER_MODULES[name], _child_env(name, s, staging))
            if there is None:
                continue
            del s.elsewhere[name]
            why = f"{why}; {there}"
        if why:
            skipped[name] = why
    return skipped


class Staging:
    """A world-readable copy of the installed spindle package, put first on PYTHONPATH for
    children that are not our interpreter (another venv, or uid 65534): nothing else of this
    venv leaks into a peer's interpreter, except with `site` (uid runs need torch/grain from it)."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="spindle-bench-")
        self.root = Path(self._tmp.name)
        os.chmod(self.root, 0o755)
        import spindle

        shutil.copytree(Path(spindle.__file__).parent, self.root / "pkg" / "spindle",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for d, dirs, files in os.walk(self.root):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)

    def env(self, site: bool) -> dict[str, str]:
        paths = [str(self.root / "pkg")]
        if site:
            import numpy

            paths.append(str(Path(numpy.__file__).resolve().parents[1]))  # this venv's site-packages
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.root), "LANG": "C.UTF-8",
               "PYTHONPATH": os.pathsep.join(paths), "PYTHONDONTWRITEBYTECODE": "1"}
        for keep in ("OPENBLAS_CORETYPE", "SPINDLE_BUDGET_POLICY"):
            if keep in os.environ:
                env[keep] = os.environ[keep]
        return env

    def close(self) -> None:
        self._tmp.cleanup()


def _child_env(loader: str, s: Settings, staging: Staging) -> dict[str, str]:
    if s.ulimit_headroom is not None:
        return staging.env(site=True)
    if python_for(loader, s) != s.python:
        return staging.env(site=False)
    return dict(os.environ)


def check_importable(python: str, modules: tuple[str, ...], env: dict[str, str]) -> Optional[str]:
    """None if `python` imports every module, else why not (the first failure's last line)."""
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    try:
        done = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{python} did not run: {type(e).__name__}: {e}"
    if done.returncode == 0:
        return None
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return f"not importable in {python}: {lines[-1] if lines else f'exit status {done.returncode}'}"


def last_json(text: str) -> Optional[dict[str, Any]]:
    """The last line of `text` that is a JSON object (a child's report), or None."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _kill_tree(root: int) -> None:
    """SIGKILL, by pid, the live processes under `root` (the child this harness started), then root."""
    for pid in reversed(list(tree.ProcessTree(root).stats())):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@contextmanager
def uid_lock() -> Iterator[None]:
    """Holds /tmp/spindle-uid65534.lock: runs of uid 65534 count that uid's tasks machine-wide,
    so two at once (two benchmarks, or a benchmark and a test) would disturb each other."""
    with open(UID_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_one(workload: str, loader: str, workers: int, s: Settings, staging: Staging) -> dict[str, Any]:
    """One epoch of `loader` in a fresh process tree, sampled from here. Returns the child's report
    with the tree's peaks, the interpreter, and the CPU time the rest of the machine took meanwhile."""
    shuffle = workload != "arrays"
    params = {"workload": workload, "loader": loader, "workers": workers, "samples": s.samples, "root": s.root,
              "dataset": s.dataset, "batch": s.batch_arrays if workload in ("arrays", "dataset") else s.batch_images,
              "size": s.size, "shuffle": shuffle, "alarm_s": s.alarm_s, "loader_timeout": max(1, s.alarm_s - 30)}
    python = python_for(loader, s)
    env = _child_env(loader, s, staging)
    cmd = [python, "-m", "spindle.bench.child", json.dumps(params)]
    cwd = None
    uid = None
    if s.ulimit_headroom is not None:
        uid = NOBODY
        base_tasks = tree.uid_tasks(NOBODY)
        limit = base_tasks + 1 + s.ulimit_headroom
        cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "bash", "-c",
               f"ulimit -u {limit} && exec \"$@\"", "bash", *cmd]
        cwd = str(staging.root)
    _reaped_children_cpu()  # from here on, RUSAGE_CHILDREN grows only by this child
    busy0, wall0, self0 = tree.busy_cpu_seconds(), time.perf_counter(), _self_cpu()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    killed = False
    with tree.TreeSampler(proc.pid, period_s=0.02, pss_every=3, uid=uid) as sampler:
        try:
            out, err = proc.communicate(timeout=s.kill_after_s)
        except subprocess.TimeoutExpired:
            killed = True
            _kill_tree(proc.pid)
            out, err = proc.communicate()
    wall = time.perf_counter() - wall0
    busy = tree.busy_cpu_seconds() - busy0
    _wait_gone(sampler.peaks.pids_seen, NOBODY if uid is not None else None,
               base_tasks if uid is not None else 0)
    own = _reaped_children_cpu()  # the child's whole life, with the workers it reaped
    harness_cpu = _self_cpu() - self0  # this process meanwhile: mostly the sampler
    report = last_json(out) or {"outcome": "killed" if killed else "no report",
                                 "error": (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    if killed:
        report["outcome"] = "hang"
        report.setdefault("error", f"killed after {s.kill_after_s} s")
    p = sampler.peaks
    report.update(workload=workload, loader=loader, workers=workers, python=python, returncode=proc.returncode,
                  peak_threads=max(p.threads, report.get("tree_threads_at_first_batch", 0)),
                  peak_processes=max(p.processes, report.get("tree_processes_at_first_batch", 0)),
                  peak_pss_mib=round(p.pss_kib / 1024, 1), sampler_polls=p.polls, wall_s=round(wall, 2),
                  machine_busy_cpu_s=round(busy, 2), child_cpu_s=round(own, 2), harness_cpu_s=round(harness_cpu, 2),
                  foreign_cpu_share=round(max(0.0, busy - own - harness_cpu)
                                          / (wall * len(os.sched_getaffinity(0))), 3),
                  stderr_tail=err[-1500:] if report.get("outcome") != "completed" else "")
    if uid is not None:
        report.update(ulimit_u=limit, uid_tasks_peak=p.uid_tasks, headroom=s.ulimit_headroom)
    expected = _expected(workload, s)
    if report.get("outcome") == "completed" and expected is not None:
        n, label_sum = expected
        if report.get("samples") != n or (label_sum is not None and report.get("label_sum") not in (None, label_sum)):
            report["outcome"] = "wrong data"
            report["error"] = (f"{report.get('samples')} samples with label sum {report.get('label_sum')}, "
                               f"expected {n} with {label_sum}")
    return report


def _wait_gone(pids: set[int], uid: Optional[int], base_tasks: int, limit_s: float = 15.0) -> None:
    """Waits until the processes of the last tree have exited (and, as uid 65534, until that uid is back
    to its tasks before the run), so killed workers still dying do not count against the next loader."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
        if not alive and (uid is None or tree.uid_tasks(uid) <= base_tasks):
            return
        time.sleep(0.05)


_last_children_cpu = [0.0]


def _self_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _reaped_children_cpu() -> float:
    """CPU seconds of the children reaped since the last call (RUSAGE_CHILDREN grows as each one is waited for)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = r.ru_utime + r.ru_stime
    delta, _last_children_cpu[0] = total - _last_children_cpu[0], total
    return delta


_expected_cache: dict[str, Optional[tuple[int, Optional[int]]]] = {}


def _expected(workload: str, s: Settings) -> Optional[tuple[int, Optional[int]]]:
    """(samples, label sum) one epoch must deliver; the label sum is None where it is not known cheaply."""
    if workload not in _expected_cache:
        if workload == "arrays":
            _expected_cache[workload] = (s.samples, s.samples * (s.samples - 1) // 2)
        elif workload in ("jpeg-pil", "jpeg-native"):
            from .workloads import folder_samples

            files = folder_samples(s.root)
            _expected_cache[workload] = (len(files), sum(k for _, k in files))
        else:
            from .workloads import user_dataset

            _expected_cache[workload] = (len(user_dataset(s.dataset or "")), None)
    return _expected_cache[workload]
