"""The node budget ledger: loaders of several processes share one thread budget (issue #9)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import spindle
from spindle import _core

unprivileged = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                  reason="needs root to switch to an unprivileged uid")


class Numbers:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(4, i, np.int64)


@pytest.fixture
def ledger_path(tmp_path, monkeypatch):
    """A private lease table for this test (the default one is per uid, shared with everything)."""
    path = f"/dev/shm/spindle-ledger-pytest.{os.getpid()}.{time.monotonic_ns()}"
    monkeypatch.setenv("SPINDLE_LEDGER_PATH", path)
    yield path
    if os.path.lexists(path):
        os.unlink(path)


RACERS = r'''
import json, os, subprocess, sys, tempfile, time
root = tempfile.mkdtemp(prefix="spindle-racers-")  # ours: the script's own directory is root's
child = os.path.join(root, "racer.py")
open(child, "w").write(RACER)
go = os.path.join(root, "go")
env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
kids = [subprocess.Popen([sys.executable, child, go, str(k)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True) for k in range(4)]
# Barrier: every racer has imported numpy and spindle and waits for `go`.
while len([n for n in os.listdir(root) if n.startswith("ready.")]) < 4:
    time.sleep(0.01)
open(go, "w").close()
out = []
for k in kids:
    stdout, stderr = k.communicate(timeout=240)
    out.append({"rc": k.returncode, "stdout": stdout, "stderr": stderr})
import shutil
shutil.rmtree(root)
print(json.dumps(out))
'''

RACER = r'''
import json, os, sys, time, warnings
import numpy as np, spindle
go, k = sys.argv[1], int(sys.argv[2])
class Numbers:
    def __len__(self): return 512
    def __getitem__(self, i): return np.full(4, i, np.int64)
open(os.path.join(os.path.dirname(go), f"ready.{k}"), "w").close()
while not os.path.exists(go):
    time.sleep(0.0005)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    it = iter(spindle.DataLoader(Numbers(), batch_size=16, num_workers=8))
    # Second barrier: every loader lives (its workers forked) before any epoch runs,
    # so the 4 really hold their workers at the same time.
    root = os.path.dirname(go)
    open(os.path.join(root, f"started.{k}"), "w").close()
    t0 = time.monotonic()
    while len([n for n in os.listdir(root) if n.startswith("started.")]) < 4 and time.monotonic() - t0 < 60:
        time.sleep(0.001)
    seen = []
    peak = 0
    for batch in it:
        seen += batch[:, 0].tolist()
        peak = max(peak, spindle.count_process_threads(os.getpid()) +
                   sum(spindle.count_process_threads(p) for p in it.worker_pids))
print(json.dumps({"workers": it.plan.num_workers, "arena": it.plan.arena_threads,
                  "samples": len(seen), "distinct": len(set(seen)), "peak": peak,
                  "warnings": [str(w.message) for w in caught
                               if issubclass(w.category, spindle.ThreadBudgetWarning)]}))
'''


def run_racers(headroom, extra_env=None):
    """Runs 4 racers (as a throwaway unprivileged uid) released together; returns their results."""
    from unprivileged import run_limited
    launcher = f"RACER = {RACER!r}\n" + RACERS
    if extra_env:
        launcher = f"import os\nos.environ.update({extra_env!r})\n" + launcher
    done = run_limited(launcher, headroom=headroom, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@unprivileged
def test_four_racing_processes_of_eight_workers_share_28_tasks():
    """4 processes started at one moment, each asking 8 workers with 28 tasks of headroom in all
    (ulimit -u), all finish their epoch with every sample; the ledger shrinks the late ones, and
    the warnings name the numbers."""
    # +4: the racers' own interpreters (1 thread each, OpenBLAS capped to 1); the launcher is run_limited's +1.
    results = run_racers(headroom=28 + 4)
    for r in results:
        assert r["rc"] == 0, r["stderr"]
    reports = [json.loads(r["stdout"].strip().splitlines()[-1]) for r in results]
    for rep in reports:
        assert (rep["samples"], rep["distinct"]) == (512, 512), rep
    workers = [rep["workers"] for rep in reports]
    arenas = [rep["arena"] for rep in reports]
    assert sum(workers) + sum(arenas) <= 28, reports
    shrunk = [rep for rep in reports if rep["workers"] < 8]
    assert shrunk, reports
    for rep in shrunk:
        assert len(rep["warnings"]) == 1, rep
        assert f"8 workers asked, {rep['workers']} started" in rep["warnings"][0], rep
        assert "RLIMIT_NPROC soft=" in rep["warnings"][0] and "leased" in rep["warnings"][0]
    for rep in reports:
        if rep["workers"] == 8:
            assert rep["warnings"] == []


POLICIES = r'''
import json, threading, time, numpy as np, spindle
class Numbers:
    def __len__(self): return 64
    def __getitem__(self, i): return np.full(4, i, np.int64)
out = {}
# "fail": all 8 workers, the consumer's reserve only from what is left (shrinking, it would keep 8).
holder = spindle.DataLoader(Numbers(), batch_size=4, num_workers=8, persistent_workers=True, budget_policy="fail")
held = iter(holder)          # 8 workers alive: 2 of 10 tasks left
next(held)
def attempt(name, **kw):
    t0 = time.monotonic()
    try:
        it = iter(spindle.DataLoader(Numbers(), batch_size=4, num_workers=4, **kw))
        out[name] = {"workers": it.plan.num_workers, "samples": sum(len(b) for b in it)}
    except spindle.ThreadBudgetError as e:
        out[name] = {"error": str(e)}
    out[name]["seconds"] = time.monotonic() - t0
attempt("fail", budget_policy="fail")
attempt("wait_timeout", budget_policy="wait", timeout=1.0)
closer = threading.Timer(0.5, holder.close)
closer.start()
attempt("wait_ok", budget_policy="wait", timeout=30.0)
closer.join()
print(json.dumps(out))
'''


@unprivileged
def test_fail_and_wait_policies_as_documented():
    """With 2 of 10 tasks free: "fail" raises ThreadBudgetError at once with the numbers; "wait"
    raises it after the loader's timeout; "wait" proceeds with all 4 workers once the holder closes."""
    from unprivileged import run_limited
    done = run_limited(POLICIES, headroom=10, timeout=120)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert "4 workers do not fit the thread budget of 2 tasks" in r["fail"]["error"], r
    assert r["fail"]["seconds"] < 1.0, r
    assert "4 workers do not fit" in r["wait_timeout"]["error"] and "policy \"wait\"" in r["wait_timeout"]["error"]
    assert r["wait_timeout"]["seconds"] >= 1.0, r
    assert r["wait_ok"] == {"workers": 4, "samples": 64, "seconds": r["wait_ok"]["seconds"]}, r
    assert r["wait_ok"]["seconds"] >= 0.4, r


# (A) a consumer with numpy's OpenBLAS pool running (2 threads at 2 CPUs) enters spindle's fork
# block and forks, which stops the pool; while it is stopped, (B), another process of the uid,
# starts a loader asking for more workers than are free; then A leaves the block (the pool is
# restarted). The launcher is the script run_limited runs.
POOL_OWNER = r"""
import json, os, sys, time, warnings
import numpy as np, threadpoolctl
from spindle._budget import caps as _caps
from spindle._runtime import forking as _forking
root = sys.argv[1]
(blas,) = [lib for lib in threadpoolctl.ThreadpoolController().lib_controllers if lib.internal_api == "openblas"]
np.ones((256, 256)) @ np.ones((256, 256))
out = {"count_before": blas.get_num_threads(), "threads_before": len(os.listdir("/proc/self/task"))}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with _forking.forking():
        pid = os.fork()  # as a loader's worker would be; OpenBLAS's fork handler stops the pool here
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        out["threads_stopped"] = len(os.listdir("/proc/self/task"))
        open(os.path.join(root, "stopped"), "w").close()
        deadline = time.monotonic() + 30  # the other process writes "loaded" even when its loader fails
        while not os.path.exists(os.path.join(root, "loaded")) and time.monotonic() < deadline:
            time.sleep(0.001)
    np.ones((256, 256)) @ np.ones((256, 256))
out["count_after"] = blas.get_num_threads()
out["threads_after"] = len(os.listdir("/proc/self/task"))
out["warnings"] = [str(w.message) for w in caught]
print(json.dumps(out))
"""

LOADER_BESIDE = r"""
import json, os, sys, time, warnings
import numpy as np, spindle
root = sys.argv[1]
class Numbers:
    def __len__(self): return 64
    def __getitem__(self, i): return np.full(4, i, np.int64)
deadline = time.monotonic() + 30
while not os.path.exists(os.path.join(root, "stopped")) and time.monotonic() < deadline:
    time.sleep(0.001)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        it = iter(spindle.DataLoader(Numbers(), batch_size=4, num_workers=8))
    finally:  # a failed start must not leave the owner waiting in its window
        open(os.path.join(root, "loaded"), "w").close()
    samples = sum(len(b) for b in it)
print(json.dumps({"workers": it.plan.num_workers, "arena": it.plan.arena_threads, "samples": samples,
                  "warnings": [str(w.message) for w in caught]}))
"""

POOL_LAUNCHER = r"""
import json, os, subprocess, sys, tempfile
root = tempfile.mkdtemp(prefix="spindle-pool-")
for name, text in (("owner.py", POOL_OWNER), ("beside.py", LOADER_BESIDE)):
    open(os.path.join(root, name), "w").write(text)
owner = subprocess.Popen([sys.executable, os.path.join(root, "owner.py"), root], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items()
                                                                 if k != "OPENBLAS_NUM_THREADS"})
beside = subprocess.Popen([sys.executable, os.path.join(root, "beside.py"), root], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
out = []
for p in (owner, beside):
    try:
        stdout, stderr = p.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        stderr += "\n[launcher: killed after 45 s]"
    out.append({"rc": p.returncode, "stdout": stdout, "stderr": stderr})
print(json.dumps(out))
"""


@unprivileged
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="numpy's OpenBLAS runs no pool on 1 CPU")
def test_the_consumers_blas_pool_keeps_its_room_while_forks_stop_it():
    """Proves: the consumer's OpenBLAS pool thread, stopped by spindle's fork and restarted after it, is in
    a ledger lease meanwhile: another process's loader started in that window (asking 8 workers, 6 tasks
    free in /proc beside its consumer's reserve) is granted 5 and leaves the 6th to the pool, which
    restarts (2 threads, no warning)."""
    from unprivileged import run_limited
    launcher = f"POOL_OWNER = {POOL_OWNER!r}\nLOADER_BESIDE = {LOADER_BESIDE!r}\n" + POOL_LAUNCHER
    # The launcher's own thread is run_limited's +1; the owner runs 2 threads, the other process 1: 3,
    # and 5 more, so 6 are free once the owner's pool thread stops. numpy (with its OpenBLAS, pthreads)
    # and threadpoolctl are staged with spindle: the uid cannot be assumed to read this venv (a checkout
    # in a 0700 directory), and Debian's numpy runs the reference BLAS, with no pool. The other process's
    # start also keeps its consumer's reserve (BURST_MIN: it runs 1 thread) out of its workers' reach.
    from spindle._budget.reserve import BURST_MIN
    done = run_limited(launcher, headroom=3 + 5 + BURST_MIN, timeout=180,
                       packages=("spindle", "numpy", "threadpoolctl"))
    assert done.returncode == 0, done.stderr
    owner, beside = json.loads(done.stdout.strip().splitlines()[-1])
    assert owner["rc"] == 0 and beside["rc"] == 0, (owner["stderr"], beside["stderr"])
    o, b = json.loads(owner["stdout"].strip().splitlines()[-1]), json.loads(beside["stdout"].strip().splitlines()[-1])
    assert (o["count_before"], o["threads_before"], o["threads_stopped"]) == (2, 2, 1), o
    assert (b["workers"], b["arena"], b["samples"]) == (5, 0, 64), b
    assert any("8 workers asked, 5 started" in w for w in b["warnings"]), b
    assert (o["count_after"], o["threads_after"]) == (2, 2), o
    assert not any("kept numpy's OpenBLAS at 1 thread" in w for w in o["warnings"]), o


def test_a_forked_helper_holds_a_lease_until_reaped(ledger_path):
    """Proves: call_in_fork's helper process (grain's checkpoint state) holds a lease of one task, started once
    forked, and gives it back when reaped."""
    import threading

    from spindle._budget import caps
    from spindle._runtime import forking as _forking
    # Each OpenBLAS copy in this process with a pool (numpy's; OpenCV's wheel bundles another)
    # is stopped around the fork under a lease of its own.
    pools = sum(1 for lib in caps._consumer_openblas() if lib.get_num_threads() > 1)
    box = {}
    t = threading.Thread(target=lambda: box.update(value=_forking.call_in_fork(lambda: time.sleep(1.0) or 7)))
    t.start()
    seen = []  # this process's leases, polled while the helper runs
    deadline = time.monotonic() + 30
    while t.is_alive() and time.monotonic() < deadline:
        mine = [(e["tasks"], e["pending"]) for e in _core.ledger_leases() if e["pid"] == os.getpid()]
        if mine:
            seen.append(mine)
        time.sleep(0.01)
    t.join()
    assert box["value"] == 7
    # Around the fork itself more leases may show: the consumer's stopped OpenBLAS threads
    # (reserve_stopping), one per pool an earlier BLAS call in this process started. While the
    # helper runs (it sleeps 1 s), its own lease is the only one, started.
    assert [(1, 0)] in seen, seen
    assert all(len(m) <= 1 + pools for m in seen), (pools, seen)
    assert _core.ledger_leases() == []


@unprivileged
def test_a_forked_helper_without_room_waits_then_raises_the_budget_error():
    """Proves: with no task free, call_in_fork does not fork (no BlockingIOError from a failed fork): it waits
    for its lease, then raises ThreadBudgetError with the numbers."""
    from unprivileged import run_limited
    script = textwrap.dedent("""
        import json, time
        from spindle import ThreadBudgetError
        from spindle._runtime import forking as _forking
        _forking.HELPER_WAIT_S = 0.3
        t0 = time.monotonic()
        try:
            _forking.call_in_fork(lambda: 1)
            print(json.dumps({"error": None}))
        except BaseException as e:
            print(json.dumps({"error": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}))
    """)
    done = run_limited(script, headroom=0, timeout=60)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["error"] == "ThreadBudgetError", r
    assert "RLIMIT_NPROC soft=" in r["message"] and 'policy "wait"' in r["message"], r
    assert r["seconds"] >= 0.3, r


HOLDER = r'''
import sys, numpy as np, spindle
class Numbers:
    def __len__(self): return 64
    def __getitem__(self, i): return np.full(4, i, np.int64)
it = iter(spindle.DataLoader(Numbers(), batch_size=4, num_workers=3, persistent_workers=True))
next(it)
print("ready", flush=True)
sys.stdin.read()
'''


def test_leases_of_a_sigkilled_process_are_reclaimed_by_the_next_loader(ledger_path):
    """A process holding a lease is SIGKILLed; its record shows dead, and the next loader reclaims it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ))
    try:
        assert proc.stdout.readline().strip() == "ready"
        leases = _core.ledger_leases()
        assert [(e["pid"], e["alive"]) for e in leases] == [(proc.pid, True)], leases
        assert leases[0]["tasks"] >= 3 and leases[0]["pending"] == leases[0]["tasks"] - 3
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    time.sleep(0.2)  # its workers follow it (parent-death signal)
    assert [(e["pid"], e["alive"]) for e in _core.ledger_leases()] == [(proc.pid, False)]
    it = iter(spindle.DataLoader(Numbers(64), batch_size=4, num_workers=2))
    assert [e["pid"] for e in _core.ledger_leases()] == [os.getpid()]
    assert sum(len(b) for b in it) == 64
    assert _core.ledger_leases() == []


def test_train_and_eval_loaders_share_one_arena_and_close_returns_their_leases_at_once(ledger_path):
    """Proves: a train and an eval loader in one process each hold one lease; together they are granted at most
    cpus - 1 arena threads (the arena runs exactly their sum, the ledger holds exactly that pending); closing
    one gives its lease and its arena share back at once, while the other keeps loading."""
    cpus = len(os.sched_getaffinity(0))
    train = spindle.DataLoader(Numbers(64), batch_size=4, num_workers=2, persistent_workers=True)
    evaluation = spindle.DataLoader(Numbers(32), batch_size=4, num_workers=1, persistent_workers=True)
    t, e = iter(train), iter(evaluation)
    next(t), next(e)
    mine = lambda: sorted((x["tasks"], x["pending"]) for x in _core.ledger_leases() if x["pid"] == os.getpid())
    arena = t.plan.arena_threads + e.plan.arena_threads
    assert arena <= max(0, cpus - 1), (t.plan.arena_threads, e.plan.arena_threads)
    assert _core.arena_extra_threads() == arena
    assert mine() == sorted([(2 + t.plan.arena_threads, t.plan.arena_threads),
                             (1 + e.plan.arena_threads, e.plan.arena_threads)])
    evaluation.close()
    assert mine() == [(2 + t.plan.arena_threads, t.plan.arena_threads)]
    assert _core.arena_extra_threads() == t.plan.arena_threads
    assert 4 + sum(len(b) for b in t) == 64
    train.close()
    assert mine() == [] and _core.arena_extra_threads() == 0


def test_an_iterator_closed_early_returns_its_leases_at_once(ledger_path):
    """Proves: close() on an iterator in mid-epoch gives its loader's leases back before the object goes."""
    it = iter(spindle.DataLoader(Numbers(64), batch_size=4, num_workers=2))
    next(it)
    assert [x["pid"] for x in _core.ledger_leases()] == [os.getpid()]
    it.close()
    assert _core.ledger_leases() == [] and _core.arena_extra_threads() == 0
    del it


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "empty"])
def test_a_corrupt_table_is_rebuilt_by_the_next_loader(ledger_path, damage):
    """Random bytes, a truncation or an empty file in place of the table: the next loader rebuilds
    it (0600, the right size, its own lease in it) and loads its epoch."""
    it = iter(spindle.DataLoader(Numbers(32), batch_size=4, num_workers=1))
    size = os.path.getsize(ledger_path)
    sum(len(b) for b in it)
    with open(ledger_path, "r+b") as f:
        if damage == "random bytes":
            f.write(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
        else:
            f.truncate(10 if damage == "truncated" else 0)
    it = iter(spindle.DataLoader(Numbers(32), batch_size=4, num_workers=2))
    assert os.path.getsize(ledger_path) == size
    assert os.stat(ledger_path).st_mode & 0o7777 == 0o600
    assert [(e["pid"], e["alive"]) for e in _core.ledger_leases()] == [(os.getpid(), True)]
    assert sum(len(b) for b in it) == 32


def test_a_foreign_mode_table_is_ignored_with_one_warning(ledger_path):
    """A table with mode 0644 is not trusted: loaders still work (per-process budgeting) and
    ledger_status says why."""
    fd = os.open(ledger_path, os.O_CREAT | os.O_WRONLY, 0o644)
    os.fchmod(fd, 0o644)
    os.close(fd)
    it = iter(spindle.DataLoader(Numbers(16), batch_size=4, num_workers=1))
    assert sum(len(b) for b in it) == 16
    status = _core.ledger_status()
    assert not status["usable"] and "mode 644" in status["warning"], status


def test_ledger_off_uses_no_table(tmp_path, monkeypatch):
    """SPINDLE_LEDGER=off: no table is created; loaders budget per process."""
    path = tmp_path / "ledger"
    monkeypatch.setenv("SPINDLE_LEDGER_PATH", str(path))
    monkeypatch.setenv("SPINDLE_LEDGER", "off")
    it = iter(spindle.DataLoader(Numbers(16), batch_size=4, num_workers=1))
    assert sum(len(b) for b in it) == 16
    assert not path.exists()


def test_budget_policy_is_checked_and_read_from_the_environment(monkeypatch):
    """budget_policy must be shrink/wait/fail; None reads $SPINDLE_BUDGET_POLICY (the torch drop-in's only way)."""
    with pytest.raises(ValueError, match="budget_policy should be one of"):
        spindle.DataLoader(Numbers(4), num_workers=1, budget_policy="never")
    monkeypatch.setenv("SPINDLE_BUDGET_POLICY", "wait")
    assert spindle.DataLoader(Numbers(4), num_workers=1).budget_policy == "wait"
    monkeypatch.setenv("SPINDLE_BUDGET_POLICY", "bogus")
    with pytest.raises(ValueError, match="SPINDLE_BUDGET_POLICY"):
        spindle.DataLoader(Numbers(4), num_workers=1)


def test_doctor_lists_the_leases(ledger_path):
    """spindle doctor's report has a `leases` section with this process's live lease, printed after Use."""
    from spindle import doctor
    it = iter(spindle.DataLoader(Numbers(16), batch_size=4, num_workers=2))
    report = doctor.collect(os.getpid())
    entries = report["leases"]["entries"]
    assert [(e["pid"], e["alive"]) for e in entries] == [(os.getpid(), True)]
    text = doctor.format_text(report)
    assert text.index("Use") < text.index("Leases (node budget ledger") < text.index("Headroom")
    assert f"pid {os.getpid():>7}" in text
    sum(len(b) for b in it)
