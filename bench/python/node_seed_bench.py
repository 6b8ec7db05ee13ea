"""Issue 9's seed scenarios (a), (b) and (c) as uid 65534 under one fixed ``ulimit -u``.

(a) ``grain``: one consumer runs JAX (a jitted step before the loader and
    after every batch) and loads grain_bench.py's pipeline (8,192 records of
    64x64x3 uint8, Map + RandomMap + Batch(64), shuffled IndexSampler) with
    16 workers: grain's own ``grain.DataLoader`` / ``mp_prefetch`` ("before")
    against ``spindle.grain``'s, same arguments ("after"). One epoch.

(b) ``sweep``: a launcher starts 4 sweep members together; each imports
    JAX and torch (and grain for the grain peers), runs a jitted step
    3 times, waits on a barrier file, then loads N images of 64x64x3 uint8
    held in memory with 8 workers, batch 32, with the jitted step (a
    matmul over the batch) after every batch: ``torch``:
    ``torch.utils.data.DataLoader`` (flip per sample, fork context);
    ``spindle-torch``: ``spindle.torch.DataLoader``, same arguments;
    ``grain``: grain_bench.py's pipeline (Normalize + RandomFlip + Batch)
    in ``grain.DataLoader(worker_count=8)``; ``spindle-grain``: the same in
    ``spindle.grain.DataLoader`` (which never shrinks a grain pipeline's
    workers: "fail" when short), and ``spindle-grain-wait`` the same with
    ``SPINDLE_BUDGET_POLICY=wait``. numpy's OpenBLAS keeps its default pool.

(c) ``ranks``: a launcher starts 4 "ranks" together; each imports
    TensorFlow, runs a TF step once, waits on a barrier file, then loads
    N images of 64x64x3 uint8 held in memory, flipped left-right per sample,
    batch 32, with a TF step (mean of the batch) after every batch:
    ``tfdata``: ``from_tensor_slices().map(flip, num_parallel_calls=AUTOTUNE)
    .batch(32).prefetch(AUTOTUNE)``; ``spindle-tf``: the same TF consumer,
    ``spindle.DataLoader(num_workers=4)``; ``spindle-tf-blas1``: the same with
    ``OPENBLAS_NUM_THREADS=1``; ``spindle``: numpy only in the rank (no TF),
    ``spindle.DataLoader(num_workers=4)``.

Everything runs as uid 65534 (root is exempt from RLIMIT_NPROC) through
tests/unprivileged.run_limited: Debian's /usr/bin/python3, which the venv's
python links to, imports jax/grain/tensorflow from the venv's site-packages
(world-readable) and spindle from a staged copy. Reported per run: who
completed (every sample seen), the first line of each error (and the tail of
stderr for a process that died without a report), and peaks sampled from
/proc every ~5 ms by this (root) process: tasks of the uid, and per tree
(the consumer and its descendants in (a); each rank and its descendants in
(b) and (c)). Peaks between two samples are missed: lower bounds.

Run as root from the repository root with the venv's python:
``.venv/bin/python bench/python/node_seed_bench.py grain --headroom 64``
``.venv/bin/python bench/python/node_seed_bench.py sweep --headroom 92``
``.venv/bin/python bench/python/node_seed_bench.py ranks --headroom 120``
Results are merged into bench/results/node_budget.json (keys ``a_grain_jax``,
``b_sweep`` and ``c_ranks``, one entry per headroom; runs at the same headroom
accumulate).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import machine_info, write_results
from spindle.bench.tree import Poller  # the sampler thread: one owner

REPO = Path(__file__).resolve().parents[2]
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "tests"))  # tests/unprivileged.py
from unprivileged import NOBODY, run_limited, uid_tasks  # noqa: E402

# ---- (a): one consumer, JAX + a 16-worker grain or spindle.grain loader ------------------------

GRAIN_CONSUMER = r'''
import faulthandler, json, os, signal, sys, warnings
import grain_bench as gb  # numpy, grain, absl flags marked parsed; the pipeline's classes (grain's workers import them)

def main():
    peer, records, limit_s = PEER, RECORDS, LIMIT_S
    out = {"peer": peer}
    def on_alarm(*_):
        # A hang: where every thread is, then the report, without unwinding through the loader.
        out["error"] = f"TimeoutError: the epoch had not ended after {limit_s} s"
        out["samples"] = samples
        faulthandler.dump_traceback(all_threads=True)
        finish(out)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit_s)
    samples = 0
    try:
        import numpy as np
        import jax, jax.numpy as jnp
        @jax.jit
        def step(w, batch):
            return w - 1e-6 * jnp.mean(batch.reshape(batch.shape[0], -1) @ w)
        w = jnp.full((64 * 64 * 3, 16), 1e-3, jnp.float32)
        for _ in range(3):
            w = step(w, np.zeros((gb.BATCH_SIZE,) + gb.SHAPE, np.float32)); w.block_until_ready()
        out["consumer_threads_with_jax"] = len(os.listdir("/proc/self/task"))
        loader = gb.make_loader(peer, gb.InMemoryImages(records))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for batch in loader:
                w = step(w, batch); w.block_until_ready()
                samples += len(batch)
        out["warnings"] = [str(x.message)[:400] for x in caught if "spindle" in str(x.message)][:3]
    except BaseException as e:
        from machine import error_report
        out.update(error_report(e, 1200))
    signal.alarm(0)
    out["samples"] = samples
    finish(out)

def finish(out):
    print(json.dumps(out), flush=True)
    # No waiting on grain's atexit joins: this consumer's descendants (which hold its stdout) are
    # killed by pid, deepest first, and it exits.
    from machine import kill_descendants
    kill_descendants()
    os._exit(0 if "error" not in out else 1)

if __name__ == "__main__":
    main()
'''

# ---- (b): 4 sweep members started together, each JAX + a loader of 8 workers ------------------

MEMBER = r'''
import json, os, sys, time, warnings

def main():
    go, k, peer, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    WORKERS = 8
    out = {"peer": peer}
    samples = 0
    if peer.endswith("-wait"):  # a sweep's members take turns instead of failing (spindle.grain never shrinks)
        os.environ["SPINDLE_BUDGET_POLICY"] = "wait"
        peer = peer[:-len("-wait")]
    try:
        import numpy as np
        import jax, jax.numpy as jnp
        import torch
        @jax.jit
        def step(w, batch):
            return w - 1e-6 * jnp.mean(batch.reshape(batch.shape[0], -1).astype(jnp.float32) @ w)
        w = jnp.full((64 * 64 * 3, 16), 1e-3, jnp.float32)
        for _ in range(3):
            w = step(w, np.zeros((32, 64, 64, 3), np.uint8)); w.block_until_ready()
        if peer.endswith("grain"):
            import grain_bench as gb
            gb.NUM_WORKERS, gb.BATCH_SIZE = WORKERS, 32
            source = gb.InMemoryImages(n, seed=k)
        else:
            images = np.resize(np.frombuffer(np.random.default_rng(k).bytes(1_048_583), np.uint8), (n, 64, 64, 3))
            class Flipped(torch.utils.data.Dataset):
                def __len__(self): return n
                def __getitem__(self, i): return np.ascontiguousarray(images[i][:, ::-1])
        out["threads_before"] = len(os.listdir("/proc/self/task"))
        open(os.path.join(os.path.dirname(go), f"ready.{k}"), "w").close()
        while not os.path.exists(go):
            time.sleep(0.0005)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if peer == "torch":
                loader = torch.utils.data.DataLoader(Flipped(), batch_size=32, num_workers=WORKERS, timeout=60)
            elif peer == "spindle-torch":
                import spindle.torch
                loader = spindle.torch.DataLoader(Flipped(), batch_size=32, num_workers=WORKERS, timeout=60)
            else:
                loader = gb.make_loader({"grain": "grain-dl", "spindle-grain": "spindle-dl"}[peer], source)
            for batch in loader:
                batch = np.asarray(batch)
                w = step(w, batch); w.block_until_ready()
                samples += len(batch)
        out["warnings"] = [str(x.message)[:400] for x in caught if "spindle" in str(x.message)][:2]
        out["openblas_kept_at_1"] = any("kept numpy's OpenBLAS" in str(x.message) for x in caught)
        import threadpoolctl
        out["openblas_threads_after"] = [lib.num_threads for lib in threadpoolctl.ThreadpoolController().lib_controllers
                                         if lib.internal_api == "openblas"]
        import re
        shrunk = [m for m in (re.search(r"workers asked, (\d+) started", x) for x in out["warnings"]) if m]
        out["workers"] = int(shrunk[0].group(1)) if shrunk else WORKERS
    except BaseException as e:
        from machine import error_report
        out.update(error_report(e, 800))
    out["samples"] = samples
    print(json.dumps(out), flush=True)
    # No waiting on grain's or torch's atexit joins: this member's descendants (which hold its stdout)
    # are killed by pid, deepest first, and it exits.
    from machine import kill_descendants
    kill_descendants()
    os._exit(0 if "error" not in out else 1)

if __name__ == "__main__":  # grain's spawned workers import this file as __mp_main__
    main()
'''

# ---- (c): 4 ranks started together, each tf.data or spindle -----------------------------------

RANK = r'''
import json, os, sys, time
go, k, peer, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
out = {"peer": peer}
samples = 0
if peer.endswith("-blas1"):  # numpy's OpenBLAS without its pool: isolates the pool's restart after a fork
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
try:
    import numpy as np
    images = np.resize(np.frombuffer(np.random.default_rng(k).bytes(1_048_583), np.uint8), (n, 64, 64, 3))
    if peer.startswith(("tfdata", "spindle-tf")):
        import tensorflow as tf
        def step(batch):
            return float(tf.reduce_mean(tf.cast(tf.convert_to_tensor(batch), tf.float32)))
    else:
        def step(batch):
            return float(np.mean(batch, dtype=np.float32))
    step(images[:32])
    out["threads_before"] = len(os.listdir("/proc/self/task"))
    open(os.path.join(os.path.dirname(go), f"ready.{k}"), "w").close()
    while not os.path.exists(go):
        time.sleep(0.0005)
    if peer.startswith("tfdata"):
        ds = (tf.data.Dataset.from_tensor_slices(images)
              .map(tf.image.flip_left_right, num_parallel_calls=tf.data.AUTOTUNE)
              .batch(32).prefetch(tf.data.AUTOTUNE))
        for batch in ds:
            step(batch)
            samples += int(batch.shape[0])
    else:
        import spindle
        class Flipped:
            def __len__(self): return n
            def __getitem__(self, i): return np.ascontiguousarray(images[i][:, ::-1])
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            it = iter(spindle.DataLoader(Flipped(), batch_size=32, num_workers=4, timeout=60))
            for batch in it:
                step(batch)
                samples += len(batch)
        out["workers"] = it.plan.num_workers
        out["warnings"] = [str(x.message)[:400] for x in caught if "workers asked" in str(x.message)][:2]
        out["openblas_kept_at_1"] = any("kept numpy's OpenBLAS" in str(x.message) for x in caught)
    try:
        import threadpoolctl
        out["openblas_threads_after"] = [lib.num_threads for lib in threadpoolctl.ThreadpoolController().lib_controllers
                                         if lib.internal_api == "openblas"]
    except ImportError:
        pass
except BaseException as e:
    from machine import error_report
    out.update(error_report(e, 800))
out["samples"] = samples
print(json.dumps(out), flush=True)
'''

LAUNCHER = r'''
import json, os, shutil, subprocess, sys, tempfile, time
ERROR_WORDS = ("pthread_create", "Resource temporarily", "Check failed", "ERROR", "Error", "error", "terminate")
root = tempfile.mkdtemp(prefix="spindle-seedbench-")
child = os.path.join(root, "rank.py")
open(child, "w").write(CHILD)
go = os.path.join(root, "go")
env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1")
kids = [subprocess.Popen([sys.executable, child, go, str(k), PEER, str(SAMPLES)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(4)]
t0 = time.monotonic()
while (len([n for n in os.listdir(root) if n.startswith("ready.")]) < 4 and time.monotonic() - t0 < 120
       and all(k.poll() is None for k in kids)):
    time.sleep(0.01)
open(go, "w").close()
out = []
for k in kids:
    try:
        stdout, stderr = k.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        k.kill()
        stdout, stderr = k.communicate()
        stderr += "\nTIMEOUT (killed after 150 s)"
    try:
        rep = json.loads(stdout.strip().splitlines()[-1])
    except Exception:
        rep = {"peer": PEER, "error": "(no report)"}
    rep["rc"] = k.returncode
    lines = [l[:300] for l in stderr.strip().splitlines() if l.strip()]
    rep["stderr_errors"] = [l for l in lines if any(w in l for w in ERROR_WORDS) and "oneDNN" not in l][:4]
    rep["stderr_tail"] = lines[-4:]
    out.append(rep)
shutil.rmtree(root)
print(json.dumps(out))
'''


# ---- sampling /proc from outside (root, not counted) ------------------------------------------

def _uid_processes(uid: int) -> dict[int, tuple[int, int]]:
    """{pid: (ppid, threads)} of every process whose owner is `uid`."""
    procs: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        procs[int(entry)] = (int(fields[1]), int(fields[17]))
    return procs


class UidSampler(Poller):
    """Peak tasks of the uid, and peak threads of each tree under the run's top process.

    The top process is the uid's process whose parent is not the uid's (setpriv execs bash, which
    execs python: one pid). `depth` 0: one tree, the top and all its descendants (scenario a);
    depth 1: one tree per child of the top, the ranks (scenario c).
    """

    def __init__(self, uid: int, depth: int) -> None:
        self.uid, self.depth = uid, depth
        self.before = set(_uid_processes(uid))
        self.started = time.time() - 1
        self.seen: set[int] = set()
        self.peak_uid = 0
        self.tree_peaks: dict[int, int] = {}
        super().__init__(0.005, name="uid-sampler")

    def poll(self) -> None:
        procs = {p: v for p, v in _uid_processes(self.uid).items() if p not in self.before}
        self.seen.update(procs)
        self.peak_uid = max(self.peak_uid, sum(t for _, t in procs.values()))
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        tops = [p for p, (ppid, _) in procs.items() if ppid not in procs]
        roots = tops if self.depth == 0 else [c for t in tops for c in children.get(t, [])]
        for root in roots:
            total, stack = 0, [root]
            while stack:
                pid = stack.pop()
                total += procs[pid][1]
                stack.extend(children.get(pid, ()))
            self.tree_peaks[root] = max(self.tree_peaks.get(root, 0), total)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        # Processes this run started and left behind (grain's workers after os._exit, a killed
        # rank's children): killed by pid, only those first seen during this run.
        for pid in sorted(set(_uid_processes(self.uid)) & self.seen):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        # Until they are gone: run_limited sets the next run's limit from the uid's tasks then.
        t0 = time.monotonic()
        while set(_uid_processes(self.uid)) & self.seen and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        self.left_over = sorted(set(_uid_processes(self.uid)) - self.before)
        # grain's shared memory and multiprocessing's semaphores, left in /dev/shm by a tree killed
        # here (3,688 files, 264 MiB after this benchmark's first runs): only the uid's, made since
        # this run began. spindle's ledger table (spindle-ledger.<uid>) stays, as it is meant to.
        for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else ():
            path = os.path.join("/dev/shm", name)
            try:
                st = os.stat(path)
                if (name.startswith(("psm_", "sem.mp-")) and st.st_uid == self.uid
                        and st.st_mtime >= self.started):
                    os.unlink(path)
            except OSError:
                pass


def _site_packages() -> str:
    import numpy

    return str(Path(numpy.__file__).resolve().parents[1])


def _last_json(text: str) -> Any:
    for line in reversed(text.strip().splitlines()):
        if line.startswith(("{", "[")):
            return json.loads(line)
    return None


def _stderr_tail(text: str) -> list[str]:
    noise = ("WARNING: All log messages", "oneDNN custom operations")
    lines = [line[:300] for line in text.strip().splitlines() if line.strip() and not line.startswith(noise)]
    words = ("pthread_create", "Resource temporarily", "can't start new thread", "Error", "error")
    return [line for line in lines if any(w in line for w in words)][:4] + lines[-4:]


def _run(script: str, headroom: int, timeout: float, extra_path: tuple[str, ...]) -> subprocess.CompletedProcess:
    """run_limited, with a timeout reported as a failed run instead of raised."""
    try:
        # As NOBODY, the uid the samplers watch (a benchmark runs alone).
        return run_limited(script, headroom=headroom, timeout=timeout, extra_path=extra_path, uid=NOBODY)
    except subprocess.TimeoutExpired as exc:
        decode = (lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or ""))
        return subprocess.CompletedProcess(exc.cmd, None, decode(exc.stdout),
                                           decode(exc.stderr) + f"\nTIMEOUT: killed after {timeout:.0f} s")


def run_grain(peer: str, headroom: int, records: int, limit_s: int) -> dict[str, Any]:
    script = f"PEER = {peer!r}\nRECORDS = {records}\nLIMIT_S = {limit_s}\n" + GRAIN_CONSUMER
    base = uid_tasks(NOBODY)  # run_limited's limit is these + 1 + headroom
    with UidSampler(NOBODY, depth=0) as sampler:
        done = _run(script, headroom, limit_s + 60, (str(BENCH), _site_packages()))
    rep = _last_json(done.stdout) or {"peer": peer, "error": "(no report)"}
    rep.update(rc=done.returncode, headroom=headroom, limit_tasks=base + 1 + headroom,
               completed=done.returncode == 0 and rep.get("samples") == records,
               peak_uid_tasks=sampler.peak_uid, peak_tree_threads=max(sampler.tree_peaks.values(), default=0))
    if not rep["completed"]:
        rep["stderr_tail"] = _stderr_tail(done.stderr)
        rep["stderr_last_lines"] = done.stderr.strip().splitlines()[-40:]
    return rep


def run_ranks(peer: str, headroom: int, samples: int, child: str = RANK,
              extra_site: tuple[str, ...] = ()) -> dict[str, Any]:
    """4 processes of `child` (RANK: scenario c; MEMBER: scenario b) started together."""
    script = f"CHILD = {child!r}\nPEER = {peer!r}\nSAMPLES = {samples}\n" + LAUNCHER
    base = uid_tasks(NOBODY)
    with UidSampler(NOBODY, depth=1) as sampler:
        done = _run(script, headroom, 400, (str(BENCH), _site_packages(), *extra_site))
    ranks = _last_json(done.stdout) or [{"peer": peer, "error": "(launcher gave no report)",
                                          "stderr_tail": _stderr_tail(done.stderr)}]
    for r in ranks:
        r["completed"] = r.get("rc") == 0 and r.get("samples") == samples and "error" not in r
        if r["completed"]:
            r.pop("stderr_tail", None)
    return {"peer": peer, "headroom": headroom, "limit_tasks": base + 1 + headroom,
            "completed": sum(r["completed"] for r in ranks), "ranks": ranks,
            "peak_uid_tasks": sampler.peak_uid,
            "peak_threads_per_rank_tree": sorted(sampler.tree_peaks.values(), reverse=True)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=("grain", "sweep", "ranks"))
    ap.add_argument("--headroom", type=int, required=True,
                    help="tasks the run may add beyond its first interpreter (ulimit -u = the uid's tasks + 1 + this)")
    ap.add_argument("--peers", help="comma-separated; default: every peer of the scenario")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--records", type=int, default=8192, help="(a) records per epoch")
    ap.add_argument("--samples", type=int, default=2048, help="(b), (c) images per process")
    ap.add_argument("--extra-site", action="append", default=[],
                    help="a site-packages directory searched after the venv's (e.g. one with tensorflow for (c))")
    args = ap.parse_args()
    peers = (args.peers.split(",") if args.peers else
             ["grain-dl", "spindle-dl", "grain-mp", "spindle-mp"] if args.scenario == "grain"
             else ["torch", "spindle-torch", "grain", "spindle-grain"] if args.scenario == "sweep"
             else ["tfdata", "spindle-tf", "spindle-tf-blas1", "spindle"])
    runs = []
    for peer in peers:
        for r in range(args.runs):
            if args.scenario == "grain":
                res = run_grain(peer, args.headroom, args.records, limit_s=90)
                print(f"(a) {peer:10} headroom {args.headroom}: {'completed' if res['completed'] else 'FAILED'}, "
                      f"workers {res.get('workers')}, peak tree threads {res['peak_tree_threads']}, "
                      f"peak uid tasks {res['peak_uid_tasks']}", flush=True)
                for line in ([res["error"]] if res.get("error") else []) + res.get("stderr_tail", [])[-3:]:
                    print(f"    {line}", flush=True)
            else:
                sweep = args.scenario == "sweep"
                res = run_ranks(peer, args.headroom, args.samples, MEMBER if sweep else RANK, tuple(args.extra_site))
                print(f"({'b' if sweep else 'c'}) {peer:10} headroom {args.headroom}: {res['completed']}/4 completed, "
                      f"workers {[x.get('workers') for x in res['ranks']]}, peak threads per rank tree "
                      f"{res['peak_threads_per_rank_tree']}, peak uid tasks {res['peak_uid_tasks']}", flush=True)
                for x in res["ranks"]:
                    if not x["completed"]:
                        print(f"    rc {x.get('rc')}: {x.get('error')} | {' / '.join(x.get('stderr_errors', [])[:2])}", flush=True)
            runs.append(res)
    key = {"grain": "a_grain_jax", "sweep": "b_sweep", "ranks": "c_ranks"}[args.scenario]
    path = REPO / "bench" / "results" / "node_budget.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    # Runs at one headroom accumulate across invocations (a rerun adds runs; delete the entry to start over).
    entry = old.setdefault(key, {}).setdefault(f"headroom_{args.headroom}", {"headroom": args.headroom, "runs": []})
    entry["runs"] += runs
    entry["machine"] = machine_info()
    if args.extra_site:
        entry["extra_site"] = args.extra_site
    write_results("node_budget", old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
