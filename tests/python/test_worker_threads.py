"""Workers stay at one thread: pools are capped before user code, and growth is reported."""

import ctypes
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import spindle
from datasets import Images


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


def test_a_worker_that_starts_a_pool_is_reported_once_by_thread_name():
    """Threads started by dataset code in a worker produce one RuntimeWarning naming them (tf_XLAEigen x3)."""
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


def test_a_failing_worker_init_fn_reaches_the_consumer_as_its_exception():
    """An exception in worker_init_fn is raised in the consumer with its type, not as a bare exit code."""

    def init(worker_id):
        raise PermissionError(f"cannot open shard for worker {worker_id}")

    with pytest.raises(PermissionError, match="cannot open shard for worker 0") as info:
        list(spindle.DataLoader(Images(40), batch_size=4, num_workers=1, worker_init_fn=init))
    assert "worker_init_fn" in "".join(info.value.__notes__)
