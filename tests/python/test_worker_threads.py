"""Workers stay at one thread: pools are capped before user code, and growth is reported."""

import ctypes
import json
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import spindle
from toy_datasets import Images
from spindle._budget import caps as _caps


def _native_named_sleeper():
    """A thread named at the OS level, as native pools (Eigen, OpenMP) name theirs."""
    ctypes.CDLL(None).prctl(15, b"tf_XLAEigen", 0, 0, 0)  # PR_SET_NAME
    time.sleep(30)


class StartsAPool(Images):
    """Starts 3 threads named like TensorFlow's Eigen pool on first use in a worker."""

    started = False

    def __getitem__(self, i):
        if not StartsAPool.started:
            StartsAPool.started = True
            for _ in range(3):
                threading.Thread(target=_native_named_sleeper, daemon=True).start()
        time.sleep(0.002)
        return super().__getitem__(i)


class ReportsEnvironment(Images):
    def __getitem__(self, i):
        keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "JAX_PLATFORMS")
        flags = os.environ.get("XLA_FLAGS", "")
        ok = all(os.environ.get(k) == ("cpu" if k == "JAX_PLATFORMS" else "1") for k in keys)
        return np.array([ok, "xla_cpu_multi_thread_eigen=false" in flags, len(os.listdir("/proc/self/task")) == 1])


def test_a_worker_that_starts_a_pool_is_reported_once_by_thread_name(monkeypatch):
    """Threads started by dataset code in a worker produce one RuntimeWarning naming them (tf_XLAEigen x3)."""
    from spindle._budget import reserve

    # The lease of a consumer that loaded no other runtime (an earlier test of this process may have
    # loaded polars or pyarrow, whose threads a worker's lease then counts).
    monkeypatch.setattr(reserve, "worker_lease", lambda: 1)
    loader = spindle.DataLoader(StartsAPool(1500), batch_size=10, num_workers=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:
            pass
    leases = [w for w in caught if "over its lease" in str(w.message)]
    assert len(leases) == 1, [str(w.message) for w in caught]
    message = str(leases[0].message)
    # (a consumer that called torch.set_num_threads() leaves torch's own pool
    # thread in every fork, so the total may be one higher than 4)
    assert "tf_XLAEigen x3" in message and ("runs 4 threads" in message or "runs 5 threads" in message)


CHECK_WORKERS = """
import sys
sys.path.insert(0, {here!r})
import spindle
from test_worker_threads import ReportsEnvironment
for batch in spindle.DataLoader(ReportsEnvironment(20), batch_size=5, num_workers=2):
    assert batch.all(), batch
print("ok")
"""


def test_workers_start_with_pools_capped_and_one_thread():
    """Before user code, workers have OMP/MKL/OpenBLAS=1, JAX_PLATFORMS=cpu, single-threaded XLA, one thread.

    Run from a fresh interpreter: this test process has used torch's thread pool,
    and torch's fork handler then leaves a pool thread in every child."""
    done = subprocess.run([sys.executable, "-c", CHECK_WORKERS.format(here=os.path.dirname(__file__))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


class BlasHeavy:
    """Each sample multiplies two 256x256 float64 matrices (OpenBLAS runs it threaded when it may), then
    reports the threads of the process that loaded it: [sample value, threads]."""

    def __len__(self):
        return 320

    def __getitem__(self, i):
        m = np.full((256, 256), i % 7 + 1.0)
        product = m @ m
        return np.array([product[0, 0], len(os.listdir("/proc/self/task"))])


CHECK_BLAS_WORKERS = """
import json, os, sys
sys.path.insert(0, {here!r})
import numpy as np
a = np.random.default_rng(0).random((256, 256))
a @ a                                     # the consumer's OpenBLAS pool is up before any loader
report = dict(consumer_pool_up=len(os.listdir("/proc/self/task")) > 1)
me = os.getpid()
import threadpoolctl
import spindle, spindle.torch
from test_worker_threads import BlasHeavy
blas_threads = lambda: [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]
report["consumer_blas_before"] = blas_threads()
for name, loader in (("spindle", spindle.DataLoader(BlasHeavy(), batch_size=4, num_workers=16)),
                     ("torch", spindle.torch.DataLoader(BlasHeavy(), batch_size=4, num_workers=16))):
    it = iter(loader)
    worker_peak = tree_excess = 0
    reported = []
    for batch in it:
        workers = [spindle.count_process_threads(p) for p in it.worker_pids]
        worker_peak = max(worker_peak, *workers)
        tree = spindle.count_process_threads(me) + sum(workers)
        tree_excess = max(tree_excess, tree - (spindle.count_process_threads(me) + 16 + it.plan.arena_threads))
        reported += [int(t) for t in np.asarray(batch)[:, 1]]
    report[name] = dict(samples=len(reported), sample_threads_max=max(reported), worker_peak=worker_peak,
                        tree_excess=tree_excess)
    del it, loader
report["consumer_blas_after"] = blas_threads()
print(json.dumps(report))
"""


def test_workers_stay_at_one_thread_when_dataset_code_calls_blas_already_running_in_the_consumer():
    """Proves: with OpenBLAS's pool up in the consumer, 16 workers doing matmuls stay at 1 thread each."""
    done = subprocess.run([sys.executable, "-c", CHECK_BLAS_WORKERS.format(here=os.path.dirname(__file__))],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    if not r["consumer_pool_up"]:
        pytest.skip(f"numpy's BLAS runs no thread pool here (one CPU?): {r}")
    for name in ("spindle", "torch"):
        assert r[name]["samples"] == 320, r
        assert r[name]["sample_threads_max"] == 1, r  # each worker, right after its matmul
        assert r[name]["worker_peak"] == 1, r  # sampled by the consumer while iterating
        assert r[name]["tree_excess"] <= 0, r  # tree <= consumer + 16 + arena
    assert r["consumer_blas_after"] == r["consumer_blas_before"], r  # the consumer's BLAS is not left capped
    assert "over its lease" not in done.stderr, done.stderr[-3000:]


def test_a_thread_seen_at_one_look_only_is_not_warned_about():
    """Proves: a worker over its lease at one look and back within it at the next is not warned about
    (a short-lived helper thread); over at two looks in a row, it is."""
    names = _caps.thread_names(os.getpid())
    watchdog = _caps.ThreadWatchdog(lambda: [os.getpid()], lease=len(names) - _caps._housekeeping(names), period=0.0)
    stop = threading.Event()
    brief = threading.Thread(target=stop.wait)
    brief.start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        watchdog.poll()  # over: the extra thread
        stop.set()
        brief.join()
        deadline = time.monotonic() + 5  # a joined thread's task leaves /proc a moment later
        while len(_caps.thread_names(os.getpid())) > len(names) and time.monotonic() < deadline:
            time.sleep(0.01)
        watchdog.poll()  # within again
    assert not watchdog.warned
    stop.clear()
    stay = threading.Thread(target=stop.wait)
    stay.start()
    try:
        with pytest.warns(RuntimeWarning, match="over its lease"):
            watchdog.poll()
            watchdog.poll()
    finally:
        stop.set()
        stay.join()


def test_without_threadpoolctl_the_lease_warning_says_loaded_pools_were_not_capped(monkeypatch):
    """Proves: without threadpoolctl, the lease warning says loaded pools went uncapped and to install it."""
    monkeypatch.setattr(_caps, "threadpoolctl", None)
    watchdog = _caps.ThreadWatchdog(lambda: [os.getpid()], lease=0, period=0.0)  # any process is over lease 0
    with pytest.warns(RuntimeWarning, match="threadpoolctl is not installed.*pip install threadpoolctl"):
        watchdog.poll()
        watchdog.poll()  # over its lease at two looks in a row


def test_a_failing_worker_init_fn_reaches_the_consumer_as_its_exception():
    """An exception in worker_init_fn is raised in the consumer with its type, not as a bare exit code."""

    def init(worker_id):
        raise PermissionError(f"cannot open shard for worker {worker_id}")

    with pytest.raises(PermissionError, match="cannot open shard for worker 0") as info:
        list(spindle.DataLoader(Images(40), batch_size=4, num_workers=1, worker_init_fn=init))
    assert "worker_init_fn" in "".join(info.value.__notes__)


def test_the_consumers_blas_pool_is_not_restarted_without_room(monkeypatch):
    """Proves: after forking, the consumer's OpenBLAS count is put back only if the budget, less every
    lease but its pool's, has room for the threads that starts; else it stays at 1 with one warning
    naming the numbers."""
    import warnings

    from spindle import _core
    from spindle._budget import caps as _caps

    class Lib:
        def __init__(self):
            self.calls = []

        def set_num_threads(self, n):
            self.calls.append(n)

    roomy, tight, pool = Lib(), Lib(), object()
    asked = []
    monkeypatch.setattr(_core, "ledger_available", lambda lease: asked.append(lease))  # None: unlimited (root)
    _caps._restore_if_room(roomy, 8, pool)
    assert asked == [pool], "the room is asked for the pool's own lease"
    monkeypatch.setattr(_core, "ledger_available", lambda lease: 3)  # 3 tasks left: 7 threads do not fit
    monkeypatch.setattr(_caps, "_warned_kept_capped", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _caps._restore_if_room(tight, 8, pool)
    assert roomy.calls == [8] and tight.calls == []
    assert any("start 7 more with only 3 tasks of headroom" in str(w.message) for w in caught)
