"""Threads of a 16-worker loader tree, and whether it survives a tight ulimit -u.

Linux counts every thread of every process of a uid against RLIMIT_NPROC
(``ulimit -u``), so a loader's cost in tasks is the threads of the consumer
plus those of all its worker processes. spindle's promise: the tree never
holds more than the consumer's own threads + one per worker + the arena
threads its ThreadBudget granted (``it.plan.arena_threads``), and it fits
in the budget or says why before forking.

Two parts, each comparing spindle.DataLoader with torch.utils.data.DataLoader
on the same dataset (4096 samples of 32x32x3 uint8, batch 64, 16 workers,
one epoch, timeout=60 s for both):

(a) As root (RLIMIT_NPROC does not apply): the loader runs in a child
    process; this process samples the child and all its descendants from
    /proc every few milliseconds, and the child also counts its tree between
    batches. Reported: the consumer's threads before the loader, the peak
    threads of the tree, and spindle's bound.
(b) As uid 65534 under ``ulimit -u`` = the uid's tasks + 1 + 24
    (tests/unprivileged.run_limited): does the epoch complete, and if not,
    what error did the loader raise (a run still going after the time limit
    counts as a hang, i.e. a failure). A sampler here polls the tasks of uid
    65534, which is exactly what the kernel compares with the limit.

Run from the repository root as root: ``.venv/bin/python bench/python/thread_bench.py``.
Writes bench/results/threads.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import machine_info, write_results
from spindle.bench.harness import last_json

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # tests/unprivileged.py

from unprivileged import NOBODY, run_limited  # noqa: E402

from spindle.bench.tree import TreeSampler, uid_tasks  # noqa: E402 - the one code path for a tree

NUM_WORKERS = 16
NUM_SAMPLES = 4096
BATCH_SIZE = 64
HEADROOM = 24
LOADER_TIMEOUT_S = 60      # DataLoader(timeout=...) for both loaders
CHILD_ALARM_S = 100        # the child reports a hang and exits after this
RUN_TIMEOUT_S = 130        # last resort: the parent kills the child
SAMPLE_PERIOD_S = 0.003
LOADERS = ("spindle", "torch")


# One epoch with one loader, in its own process. Prints one JSON line.
LOADER_EPOCH = r'''
import json, os, resource, signal, sys, traceback
import numpy as np

P = json.loads(PARAMS_JSON)

from spindle.bench.tree import tree_threads

class SmallImages:
    def __len__(self): return P["samples"]
    def __getitem__(self, i): return np.full((32, 32, 3), i % 251, np.uint8)

me = os.getpid()
report = {"loader": P["loader"], "uid": os.getuid(),
          "rlimit_nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0]}

def emit():
    print(json.dumps(report), flush=True)

def stop_descendants():
    # Only processes this script started (its workers), by pid. torch's SIGCHLD
    # handler would raise about each of them, so it is reset first.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for pid in tree_threads(me):
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

def on_alarm(signum, frame):
    report.update(outcome="hang", error=f"no end of epoch after {P['alarm_s']} s; stack:\n"
                  + "".join(traceback.format_stack(frame)))
    emit()
    stop_descendants()
    os._exit(3)

signal.signal(signal.SIGALRM, on_alarm)
signal.alarm(P["alarm_s"])
try:
    if P["loader"] == "spindle":
        import spindle
        report["budget"] = str(spindle.ThreadBudget())
        make = lambda ds: spindle.DataLoader(ds, P["batch"], num_workers=P["workers"], timeout=P["timeout"])
    else:
        import torch.utils.data
        make = lambda ds: torch.utils.data.DataLoader(ds, P["batch"], num_workers=P["workers"],
                                                      timeout=P["timeout"])
    report["consumer_threads_before"] = len(os.listdir("/proc/self/task"))
    loader = make(SmallImages())
    it = iter(loader)
    samples, values_ok, peak, peak_procs, consumer_peak, worker_threads = 0, True, 0, 0, 0, set()
    if P["loader"] == "spindle":
        report["arena_threads"] = it.plan.arena_threads
        report["workers_started"] = len(it.worker_pids)
    else:
        report["workers_started"] = len(it._workers)
    for batch in it:
        tree = tree_threads(me)
        peak, peak_procs = max(peak, sum(tree.values())), max(peak_procs, len(tree))
        consumer_peak = max(consumer_peak, tree[me])
        worker_threads.update(n for pid, n in tree.items() if pid != me)
        first = np.asarray(batch)[:, 0, 0, 0]
        values_ok &= bool((first == (np.arange(samples, samples + len(first)) % 251)).all())
        samples += len(first)
    report.update(outcome="completed" if samples == P["samples"] and values_ok else "wrong data",
                  samples=samples, values_ok=values_ok, peak_tree_threads_in_loop=peak,
                  peak_tree_processes_in_loop=peak_procs, consumer_threads_peak_in_loop=consumer_peak,
                  worker_threads=sorted(worker_threads))
except BaseException as exc:
    report.update(outcome="failed", error=f"{type(exc).__name__}: {exc}",
                  traceback=traceback.format_exc()[-3000:])
    try:
        stop_descendants()
    except BaseException:
        pass
signal.alarm(0)
emit()
'''


def loader_epoch_script(loader: str) -> str:
    params = {"loader": loader, "workers": NUM_WORKERS, "samples": NUM_SAMPLES, "batch": BATCH_SIZE,
              "timeout": LOADER_TIMEOUT_S, "alarm_s": CHILD_ALARM_S}
    return LOADER_EPOCH.replace("PARAMS_JSON", repr(json.dumps(params)))


def run_as_root(loader: str) -> dict[str, Any]:
    """Part (a): one epoch in a child process, its tree sampled from here."""
    child = subprocess.Popen([sys.executable, "-c", loader_epoch_script(loader)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    with TreeSampler(child.pid, period_s=SAMPLE_PERIOD_S) as sampler:
        try:
            out, err = child.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
    report = last_json(out) or {"outcome": "no report", "error": err[-3000:]}
    p = sampler.peaks
    report.update(peak_tree_threads_sampled=p.threads, peak_tree_processes_sampled=p.processes,
                  sampler_polls=p.polls, returncode=child.returncode)
    if loader == "spindle" and "arena_threads" in report:
        report["spindle_bound"] = report["consumer_threads_before"] + NUM_WORKERS + report["arena_threads"]
    return report


def torch_site_packages() -> str:
    import torch

    return str(Path(torch.__file__).resolve().parents[1])


def run_under_ulimit(loader: str) -> dict[str, Any]:
    """Part (b): one epoch as uid 65534 with HEADROOM tasks of ulimit -u headroom."""
    base = uid_tasks(NOBODY)
    started = time.perf_counter()
    with TreeSampler(None, period_s=SAMPLE_PERIOD_S, uid=NOBODY) as sampler:
        try:
            done = run_limited(loader_epoch_script(loader), headroom=HEADROOM, timeout=RUN_TIMEOUT_S, uid=NOBODY,
                               extra_path=(torch_site_packages(),))
            out, err, rc = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            decode = (lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or ""))
            out, err, rc = decode(exc.stdout), decode(exc.stderr), None
    report = last_json(out) or {"outcome": "hang" if rc is None else "no report"}
    if "error" not in report and report.get("outcome") != "completed":
        report["error"] = err[-3000:]
    report.update(returncode=rc, seconds=round(time.perf_counter() - started, 1),
                  uid_tasks_before=base, ulimit_u=base + 1 + HEADROOM, uid_tasks_peak_sampled=sampler.peaks.uid_tasks,
                  stderr_tail=err[-1500:])
    return report


def short_error(report: dict[str, Any]) -> str:
    if report.get("outcome") == "completed":
        return ""
    text = (report.get("error") or "").strip().splitlines()
    return text[0][:160] if text else ""


def print_tables(root: dict[str, Any], limited: dict[str, Any]) -> None:
    print()
    print(f"(a) as root, {NUM_WORKERS} workers: threads of the whole loader tree")
    print(f"{'loader':8} {'consumer before':>15} {'consumer peak':>13} {'per worker':>10} {'processes':>9} "
          f"{'peak (sampled)':>14} {'peak (in loop)':>14} {'bound':>6}")
    for name, r in root.items():
        print(f"{name:8} {r.get('consumer_threads_before', '?'):>15} "
              f"{r.get('consumer_threads_peak_in_loop', '?'):>13} {str(r.get('worker_threads', '?')):>10} "
              f"{r['peak_tree_processes_sampled']:>9} {r['peak_tree_threads_sampled']:>14} "
              f"{r.get('peak_tree_threads_in_loop', '?'):>14} {r.get('spindle_bound', '-'):>6}")
    print()
    print(f"(b) as uid {NOBODY}, ulimit -u = its tasks + 1 + {HEADROOM}")
    print(f"{'loader':8} {'outcome':>10} {'ulimit -u':>9} {'peak uid tasks':>14} {'seconds':>7}  error")
    for name, r in limited.items():
        print(f"{name:8} {r['outcome']:>10} {r['ulimit_u']:>9} {r['uid_tasks_peak_sampled']:>14} "
              f"{r['seconds']:>7}  {short_error(r)}")


def main() -> int:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("thread_bench needs root and setpriv: part (b) switches to uid 65534 under ulimit -u",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    info = machine_info()
    print(f"thread bench: {NUM_WORKERS} workers, {NUM_SAMPLES} samples of 32x32x3 uint8, batch {BATCH_SIZE}; "
          f"{info['nproc']} cpus, python {info['python']}, torch {info['torch']}", flush=True)
    root: dict[str, Any] = {}
    for loader in LOADERS:
        root[loader] = run_as_root(loader)
        print(f"  (a) {loader}: {root[loader]['outcome']}", flush=True)
    limited: dict[str, Any] = {}
    for loader in LOADERS:
        limited[loader] = run_under_ulimit(loader)
        print(f"  (b) {loader}: {limited[loader]['outcome']} {short_error(limited[loader])}", flush=True)
    print_tables(root, limited)
    path = write_results("threads", {
        "benchmark": "threads",
        "workload": {"sample_shape": [32, 32, 3], "dtype": "uint8", "samples": NUM_SAMPLES,
                     "batch_size": BATCH_SIZE, "num_workers": NUM_WORKERS, "loader_timeout_s": LOADER_TIMEOUT_S,
                     "hang_after_s": CHILD_ALARM_S, "headroom": HEADROOM, "sample_period_s": SAMPLE_PERIOD_S},
        "machine": info,
        "as_root": root,
        "under_ulimit": limited,
        "wall_s": round(time.perf_counter() - t0, 1),
    })
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
