"""spindle doctor: its report agrees with /proc on a process started with known threads."""

import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import textwrap
import time

import pytest

CPUS = len(os.sched_getaffinity(0))

# A child with known threads: 3 named probe_0..2 at the OS level (prctl
# PR_SET_NAME, as native pools name theirs), 2 plain Python threads, and
# numpy's OpenBLAS pool (CPUS - 1 threads, its default).
CHILD = textwrap.dedent("""
    import ctypes, sys, threading, time
    import numpy as np
    np.ones((300, 300)) @ np.ones((300, 300))
    def named(i):
        ctypes.CDLL(None).prctl(15, f"probe_{i}".encode(), 0, 0, 0)
        time.sleep(60)
    for i in range(3):
        threading.Thread(target=named, args=(i,), daemon=True).start()
    for _ in range(2):
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def child():
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # the named threads have set their names
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spindle", "doctor", *args], capture_output=True, text=True,
                          timeout=60)


def test_doctor_json_agrees_with_proc(child):
    """Proves: --json --pid groups the child's threads by runtime and name prefix, with counts that add up to
    /proc/<pid>/task, and reports the limits the kernel applies."""
    out = doctor("--json", "--pid", str(child))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    (proc,) = report["processes"]
    assert proc["pid"] == child
    assert proc["threads"] == len(os.listdir(f"/proc/{child}/task")) == 1 + 3 + 2 + (CPUS - 1)
    groups = {g["runtime"]: g for g in proc["groups"]}
    # Started by threading, so CPython's thread_run is their outermost frame; named at the OS level, so their
    # names show the prefix.
    assert groups["Python threads"]["names"] == {"probe": 3, "python": 2}
    assert groups["Python threads"]["attributed_by"] == ["stack"]
    assert groups["main thread"]["count"] == 1
    if CPUS > 1:
        assert groups["OpenBLAS"]["count"] == CPUS - 1
        assert "OPENBLAS_NUM_THREADS" in groups["OpenBLAS"]["advice"]
    assert sum(g["count"] for g in proc["groups"]) == proc["threads"]
    assert "OpenBLAS" in proc["runtimes_loaded"]

    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    limits = report["limits"]
    assert limits["nproc_soft"] == (None if soft == resource.RLIM_INFINITY else soft)
    assert limits["nproc_hard"] == (None if hard == resource.RLIM_INFINITY else hard)
    with open("/proc/sys/kernel/threads-max") as f:
        assert limits["threads_max"] == int(f.read())
    assert report["use"]["uid"] == os.getuid()
    assert report["use"]["uid_tasks"] >= proc["threads"]
    room = report["headroom"]
    assert room["min"] == min(v for k, v in room.items() if k in ("nproc", "cgroup", "threads_max", "pid_max")
                              and v is not None)


def test_doctor_text_is_readable(child):
    """Proves: the plain-text report shows the limits, the headroom, the child's pools and advice per pool."""
    out = doctor("--pid", str(child))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for expected in ("ulimit -u (RLIMIT_NPROC)", "kernel.threads-max", "Headroom", "<- binding",
                     "Python threads   probe x3, python x2", "Python threads", "Advice"):
        assert expected in text, text
    if CPUS > 1:
        assert "OpenBLAS: set OPENBLAS_NUM_THREADS=n" in text


def test_doctor_names_a_missing_pid():
    """Proves: a PID that does not exist is an error naming it, exit status 1."""
    out = doctor("--pid", "999999999")
    assert out.returncode == 1
    assert "no process 999999999" in out.stderr


def test_console_script_is_declared():
    """Proves: pyproject declares the `spindle` console script on spindle.cli:main."""
    import tomllib
    from pathlib import Path

    with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["scripts"] == {"spindle": "spindle.cli:main"}


@pytest.mark.skipif(CPUS < 2, reason="with one CPU the thread looked at is never on a CPU at that instant")
def test_a_thread_busy_when_first_looked_at_is_attributed_once_it_waits():
    """Proves: a pool thread still spinning after its work (OpenBLAS and libgomp do, for a while) is
    looked at again until it waits, and then attributed, instead of being left "unattributed" (which
    made limit_threads report a running OpenBLAS pool as capped on a loaded machine)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import hashlib, json, os, threading, time
        from spindle._budget.threads import process_threads
        data = b"x" * (64 << 20)  # sha256 of it: ~40 ms on a CPU, with the GIL released
        started, done = threading.Event(), threading.Event()
        def spin():
            started.set()
            hashlib.sha256(data).digest()
            done.wait()
        t = threading.Thread(target=spin)
        t.start(); started.wait(); time.sleep(0.005)
        print(json.dumps([[x.runtime, x.how] for x in process_threads(os.getpid())]))
        done.set(); t.join()
    """)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [["main thread", "main"], ["Python threads", "stack"]]


# A loader tree with known threads: the consumer (main, 3 threads named probe_0..2, numpy's OpenBLAS
# pool) and 2 forked workers of a persistent spindle.DataLoader, one thread each.
TREE = textwrap.dedent("""
    import ctypes, json, os, threading, time
    import numpy as np, spindle
    np.ones((300, 300)) @ np.ones((300, 300))
    class Numbers:
        def __len__(self): return 64
        def __getitem__(self, i): return np.full(4, i, np.int64)
    it = iter(spindle.DataLoader(Numbers(), batch_size=4, num_workers=2, persistent_workers=True))
    next(it)
    def named(i):
        ctypes.CDLL(None).prctl(15, f"probe_{i}".encode(), 0, 0, 0)
        time.sleep(600)
    for i in range(3):
        threading.Thread(target=named, args=(i,), daemon=True).start()
    time.sleep(0.2)
    print(json.dumps({"workers": it.worker_pids, "arena": it.plan.arena_threads}), flush=True)
    time.sleep(600)  # killed by the test; doctor reads every process of the uid, slow on a loaded machine
""")


@contextlib.contextmanager
def loader_tree():
    """TREE running, with a ledger of its own and no *_NUM_THREADS from this environment: (its process,
    what it printed, the environment to run the doctor in). Killed and its ledger removed after."""
    ledger = f"/dev/shm/spindle-ledger-doctor.{os.getpid()}.{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["SPINDLE_LEDGER_PATH"] = ledger
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, env=env)
    try:
        yield proc, json.loads(proc.stdout.readline()), env
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        if os.path.lexists(ledger):
            os.unlink(ledger)


def test_doctor_json_agrees_with_proc_on_a_loader_tree(tmp_path):
    """Proves: on a spindle loader tree, `spindle doctor --json` (all processes of the uid) lists the consumer
    and each worker with the thread counts of /proc, groups the consumer's threads by runtime (Python threads
    by name prefix, OpenBLAS), marks the workers as spindle workers of that consumer, and shows the
    consumer's live lease: 2 workers started, its arena threads pending."""
    with loader_tree() as (proc, tree, env):
        out = subprocess.run([sys.executable, "-m", "spindle", "doctor", "--json"], capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        by_pid = {p["pid"]: p for p in report["processes"]}
        consumer = by_pid[proc.pid]
        assert consumer["threads"] == len(os.listdir(f"/proc/{proc.pid}/task")) == 1 + 3 + (CPUS - 1)
        assert not consumer["spindle_worker"] and "spindle" in consumer["runtimes_loaded"]
        groups = {g["runtime"]: g for g in consumer["groups"]}
        assert groups["Python threads"]["names"] == {"probe": 3}
        assert groups["main thread"]["count"] == 1
        if CPUS > 1:
            assert groups["OpenBLAS"]["count"] == CPUS - 1, "restarted after the forks"
        assert sum(g["count"] for g in consumer["groups"]) == consumer["threads"]
        for w in tree["workers"]:
            worker = by_pid[w]
            assert (worker["ppid"], worker["spindle_worker"]) == (proc.pid, True), worker
            assert worker["threads"] == len(os.listdir(f"/proc/{w}/task")) == 1, worker
        leases = [e for e in report["leases"]["entries"] if e["pid"] == proc.pid]
        assert [(e["alive"], e["tasks"], e["pending"]) for e in leases] == [(True, 2 + tree["arena"], tree["arena"])]


def test_doctor_pid_lists_the_consumer_and_its_workers(tmp_path):
    """Proves: `spindle doctor --pid <consumer> --json` lists the consumer and each of its spindle workers
    (marked as such, with /proc's thread counts and their private memory), and no other process of the uid."""
    with loader_tree() as (proc, tree, env):
        out = subprocess.run([sys.executable, "-m", "spindle", "doctor", "--json", "--pid", str(proc.pid)],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        by_pid = {p["pid"]: p for p in json.loads(out.stdout)["processes"]}
        assert set(by_pid) == {proc.pid, *tree["workers"]}, sorted(by_pid)
        assert not by_pid[proc.pid]["spindle_worker"]
        for w in tree["workers"]:
            assert (by_pid[w]["ppid"], by_pid[w]["spindle_worker"], by_pid[w]["threads"]) == (proc.pid, True, 1)
            assert 0 < by_pid[w]["uss_bytes"] < 1 << 30, "a worker's private memory"
        assert by_pid[proc.pid]["uss_bytes"] is None, "read for workers only"
        text = subprocess.run([sys.executable, "-m", "spindle", "doctor", "--pid", str(proc.pid)],
                              capture_output=True, text=True, timeout=120, env=env).stdout
        assert len(re.findall(r"\[spindle worker, \d+\.\d MiB private\]", text)) == len(tree["workers"]), text
