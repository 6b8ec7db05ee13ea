"""4 processes start a loader at the same moment on one node: with and without the budget ledger.

Each of 4 independent Python processes (as uid 65534, under one fixed
``ulimit -u``) builds a spindle.DataLoader asking for 8 workers over 512
samples, all released by one barrier (a file they poll for), and runs one
epoch. Optionally each process first imports JAX and runs a jit (its XLA
pools then exist when the loader starts, as in a sweep of JAX jobs).

"before": SPINDLE_LEDGER=off, every loader sizes itself from /proc alone.
"after": the ledger (default). Reported per run: for each process its exit
status, workers started, samples seen, the first line of its error; and the
peak tasks of uid 65534 sampled from /proc every ~2 ms by this process
(what the kernel compares with the limit).

Run as root from the repository root, with spindle importable (PYTHONPATH):
``python bench/python/node_budget_bench.py [--jax] [--runs N]``.
Writes bench/results/node_budget.json (merging the --jax and plain results).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from machine import machine_info, write_results

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # tests/unprivileged.py
from unprivileged import NOBODY, run_limited, uid_tasks  # noqa: E402

LOADER_TASKS = 28  # headroom for the 4 loaders together, beyond the interpreters (and JAX)

RACER = r'''
import json, os, sys, time, traceback
go, k, use_jax = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
import numpy as np
if use_jax:
    import jax, jax.numpy as jnp
    x = jnp.ones((256, 256))
    jax.jit(lambda a: jnp.sin(a) @ a)(x).block_until_ready()
import spindle
class Numbers:
    def __len__(self): return 512
    def __getitem__(self, i): return np.full(4, i, np.int64)
base = spindle.count_process_threads(os.getpid())
open(os.path.join(os.path.dirname(go), f"ready.{k}"), "w").close()
while not os.path.exists(go):
    time.sleep(0.0005)
out = {"base_threads": base}
try:
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            it = iter(spindle.DataLoader(Numbers(), batch_size=16, num_workers=8, timeout=60))
        finally:
            # Second barrier: all 4 loaders live at once before any epoch runs.
            root = os.path.dirname(go)
            open(os.path.join(root, f"started.{k}"), "w").close()
            t0 = time.monotonic()
            while len([n for n in os.listdir(root) if n.startswith("started.")]) < 4 and time.monotonic() - t0 < 60:
                time.sleep(0.001)
        seen = []
        for batch in it:
            seen += batch[:, 0].tolist()
    out.update(workers=it.plan.num_workers, samples=len(set(seen)),
               warning=next((str(w.message) for w in caught if "workers asked" in str(w.message)), None))
except BaseException as e:
    out.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
print(json.dumps(out), flush=True)
'''

LAUNCHER = r'''
import json, os, shutil, subprocess, sys, tempfile, time
root = tempfile.mkdtemp(prefix="spindle-nodebench-")
child = os.path.join(root, "racer.py")
open(child, "w").write(RACER)
go = os.path.join(root, "go")
env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
kids = [subprocess.Popen([sys.executable, child, go, str(k), USE_JAX], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True) for k in range(4)]
t0 = time.monotonic()
while len([n for n in os.listdir(root) if n.startswith("ready.")]) < 4 and time.monotonic() - t0 < 120:
    time.sleep(0.01)
print("GO", flush=True)
open(go, "w").close()
out = []
for k in kids:
    try:
        stdout, stderr = k.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        k.kill()
        stdout, stderr = k.communicate()
        stderr += "\nTIMEOUT"
    lines = stdout.strip().splitlines()
    try:
        rep = json.loads(lines[-1])
    except Exception:
        rep = {"error": (stderr.strip().splitlines() or ["(no output)"])[-1][:300]}
    rep["rc"] = k.returncode
    out.append(rep)
shutil.rmtree(root)
print(json.dumps(out))
'''


def one_run(use_jax: bool, ledger: bool, headroom: int, extra_path: tuple[str, ...]) -> dict:
    script = (f"import os\nos.environ.update({({} if ledger else {'SPINDLE_LEDGER': 'off'})!r})\n"
              f"RACER = {RACER!r}\nUSE_JAX = {'1' if use_jax else '0'!r}\n" + LAUNCHER)
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], uid_tasks(NOBODY))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    base = uid_tasks(NOBODY)
    try:
        done = run_limited(script, headroom=headroom, timeout=400, extra_path=extra_path, uid=NOBODY)
    finally:
        stop.set()
        sampler.join()
    try:
        procs = json.loads(done.stdout.strip().splitlines()[-1])
    except Exception:
        procs = [{"error": done.stderr.strip()[-300:]}]
    return {
        "ledger": ledger, "jax": use_jax, "limit": base + 1 + headroom,
        "completed": sum(1 for p in procs if p.get("rc") == 0 and p.get("samples") == 512),
        "workers": [p.get("workers") for p in procs],
        "peak_uid_tasks": peak[0] - base,
        "processes": procs,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jax", action="store_true", help="each process imports JAX and runs a jit first")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    extra: tuple[str, ...] = ()
    jax_threads = 0
    if args.jax:
        import jax

        extra = (str(Path(jax.__file__).resolve().parents[1]),)
        jax_threads = 15  # beyond the main thread, measured here after the jit (base_threads = 16 at 2 CPUs)
    # launcher (run_limited's +1) + 4 interpreters (+ their JAX threads) + the loaders' share.
    headroom = 4 * (1 + jax_threads) + LOADER_TASKS
    runs = []
    for ledger in (False, True):
        for r in range(args.runs):
            res = one_run(args.jax, ledger, headroom, extra)
            runs.append(res)
            print(f"ledger={'on ' if ledger else 'off'} jax={args.jax} run {r}: completed {res['completed']}/4, "
                  f"workers {res['workers']}, peak tasks {res['peak_uid_tasks']} of {headroom + 1}", flush=True)
            for p in res["processes"]:
                if p.get("error"):
                    print(f"    error: {p['error'][:160]}", flush=True)
    key = "jax" if args.jax else "plain"
    path = REPO / "bench" / "results" / "node_budget.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old[key] = {"headroom": headroom, "loader_tasks": LOADER_TASKS, "runs": runs}
    old["machine"] = machine_info()
    write_results("node_budget", old)


if __name__ == "__main__":
    main()
