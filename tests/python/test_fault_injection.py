"""Faults injected from outside: workers killed or stopped at random moments,
descriptors and the process limit exhausted. Every fault must end in an error
that names what broke, and leave no process, zombie or /dev/shm name behind."""

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import spindle
from toy_datasets import Images

HERE = os.path.dirname(os.path.abspath(__file__))


class Busy(Images):
    """Samples of 256 KiB that take ~1 ms each: workers are caught claiming, reading, writing or idle."""

    def __init__(self, n):
        super().__init__(n, shape=(256, 256, 4))

    def __getitem__(self, i):
        deadline = time.perf_counter() + 0.001
        while time.perf_counter() < deadline:
            pass
        return super().__getitem__(i)


def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_two_hundred_random_worker_kills_each_raise_a_named_error_within_a_second():
    """kill -9 of a random worker at a random moment, 200 times: WorkerDiedError within 1 s naming the
    pid, signal 9 and the work item (or idle); afterwards no worker, zombie or segment is left."""
    rng = np.random.default_rng(7)
    all_pids, reported = [], 0
    for trial in range(200):
        it = iter(spindle.DataLoader(Busy(64), batch_size=4, num_workers=2, prefetch_factor=2,
                                     on_worker_death="raise"))
        pids = list(it.worker_pids)
        all_pids += pids
        victim = int(rng.choice(pids))
        killed_at = []

        def kill():
            killed_at.append(time.monotonic())
            os.kill(victim, signal.SIGKILL)

        timer = threading.Timer(float(rng.uniform(0, 0.03)), kill)
        timer.start()
        try:
            for _ in it:
                pass
            timer.join()
            if not killed_at:
                continue
            # The epoch ended before the kill landed, or the kill hit a worker that had
            # already been told to stop: the next use must still report it, not hang.
        except spindle.WorkerDiedError as e:
            timer.join()
            waited = time.monotonic() - killed_at[0]
            message = str(e)
            assert waited < 1.0, (trial, waited)
            assert f"(pid {victim}) was killed by signal 9" in message, message
            assert re.search(r"while producing batch \d+ \[.*\]|while idle", message), message
            reported += 1
        finally:
            timer.cancel()
            it.close()
    assert reported >= 150, f"only {reported} of 200 kills reached the consumer during an epoch"
    assert not [p for p in all_pids if state(p) is not None], "a worker or zombie is left"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"spindle.{os.getpid()}.")]


class Slow(Images):
    def __getitem__(self, i):
        time.sleep(0.05)
        return super().__getitem__(i)


def test_a_stopped_worker_is_named_by_the_timeout_and_close_returns_promptly():
    """SIGSTOP of a worker holding a batch: LoaderTimeoutError names its pid and 'stopped'; close() < 1.5 s."""
    it = iter(spindle.DataLoader(Slow(100), batch_size=4, num_workers=1, timeout=1))
    victim = it.worker_pids[0]
    time.sleep(0.1)  # inside batch 0
    os.kill(victim, signal.SIGSTOP)
    try:
        with pytest.raises(spindle.LoaderTimeoutError, match=rf"held by worker 0 \(pid {victim}, stopped"):
            for _ in it:
                pass
        start = time.monotonic()
        it.close()
        assert time.monotonic() - start < 1.5
        assert state(victim) is None
    finally:
        if state(victim) is not None:
            os.kill(victim, signal.SIGKILL)


def test_too_few_file_descriptors_give_a_clear_error():
    """With RLIMIT_NOFILE used up, creating a loader fails with an error naming the cause, no crash."""
    code = textwrap.dedent("""
        import os, resource, spindle
        from toy_datasets import Images
        list(spindle.DataLoader(Images(10), batch_size=2, num_workers=2))  # every import done
        keep = []
        try:
            while True:
                keep.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        try:
            list(spindle.DataLoader(Images(10), batch_size=2, num_workers=2))
            print("NO ERROR")
        except Exception as e:
            print("ERROR", type(e).__name__, str(e).splitlines()[0])
    """)
    done = subprocess.run([sys.executable, "-c", f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, "
                           f"(64, 64)); exec({code!r})"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=HERE))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ERROR SharedMemoryError"), done.stdout + done.stderr
    assert "Too many open files" in done.stdout


HOG_THEN_EPOCH = r'''
import os, sys, time, spindle, numpy as np
class Images:
    def __len__(self): return 256
    def __getitem__(self, i): return np.full((8,), i % 251, np.uint8)
loader = spindle.DataLoader(Images(), batch_size=16, num_workers=4)
print("epoch 1", sum(len(b) for b in loader), flush=True)
# Another process of the same user takes what is left of ulimit -u.
r, w = os.pipe()
hog = os.fork()
if hog == 0:
    kids = []
    while True:
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.read(r, 1)
            os._exit(0)
        kids.append(pid)
    for k in kids:  # they exit when the consumer writes to the pipe
        os.waitpid(k, 0)
    os._exit(0)
time.sleep(1.0)
try:
    print("epoch 2", sum(len(b) for b in loader), flush=True)
except spindle.ThreadBudgetError as e:
    print("BUDGET", str(e).replace("\n", " "), flush=True)
except OSError as e:
    print("OSERROR", str(e).splitlines()[0], flush=True)
os.write(w, b"x" * 4096)
os.waitpid(hog, 0)
print("epoch 3", sum(len(b) for b in loader), flush=True)
'''


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged uid")
def test_another_process_exhausting_ulimit_u_between_epochs_gives_a_clear_error():
    """As an unprivileged uid: a second process takes every task left under ulimit -u; the next epoch raises
    ThreadBudgetError naming the limit (no abort, no hang), and loading works again once it is gone."""
    from unprivileged import run_limited
    done = run_limited(HOG_THEN_EPOCH, headroom=12, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "epoch 1 256", done.stdout
    assert lines[1].startswith("BUDGET") and "ulimit -u" in lines[1], done.stdout
    assert lines[2] == "epoch 3 256", done.stdout
