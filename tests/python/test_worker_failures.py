"""What the consumer sees when a worker raises, dies, hangs, or the consumer itself dies."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import traceback

import pytest

import spindle
from toy_datasets import FailsAt, KillsItselfAt, SlowAt

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_worker_exception_is_reraised_with_its_type_traceback_and_sample_index():
    """ValueError in __getitem__ comes back as ValueError, noting worker, sample 57 and the worker traceback."""
    it = iter(spindle.DataLoader(FailsAt(57), batch_size=10, num_workers=2))
    for _ in range(5):
        next(it)
    with pytest.raises(ValueError, match="corrupt record 57") as info:
        next(it)
    notes = "".join(info.value.__notes__)
    assert "while loading sample index 57 (batch 5)" in notes
    assert "in __getitem__" in notes and "toy_datasets.py" in notes  # the worker's own frames
    assert info.value.sample_index == 57
    text = "".join(traceback.format_exception(info.value))
    assert "corrupt record 57" in text and "sample index 57" in text


def test_iteration_continues_after_a_failed_batch():
    """After the failing batch is raised, the remaining batches still arrive."""
    it = iter(spindle.DataLoader(FailsAt(57), batch_size=10, num_workers=2))
    got, failures = [], 0
    while True:
        try:
            batch = next(it)
        except ValueError:
            failures += 1
            continue
        except StopIteration:
            break
        got += batch[:, 0, 0, 0].tolist()
    assert failures == 1
    assert got == [i % 251 for i in range(200) if not 50 <= i < 60]


def test_an_unpicklable_worker_exception_still_reports_type_text_and_sample():
    """An exception that cannot cross processes becomes WorkerError with its type name and text."""

    class Local(Exception):  # defined in a function: not importable, so not unpicklable
        pass

    class Raises(FailsAt):
        def __getitem__(self, i):
            if i == 3:
                raise Local("local failure")
            return super().__getitem__(i)

    with pytest.raises(spindle.WorkerError, match=r"Local: local failure \(in spindle worker \d+ .*sample index 3"):
        list(spindle.DataLoader(Raises(-1, n=20), batch_size=4, num_workers=1))


def test_a_killed_worker_is_reported_within_a_second_with_pid_signal_and_batch():
    """SIGKILL of the worker loading sample 123 raises WorkerDiedError in < 1 s naming pid, signal and sample."""
    it = iter(spindle.DataLoader(KillsItselfAt(123), batch_size=10, num_workers=2, on_worker_death="raise"))
    pids = set(it.worker_pids)
    start = time.monotonic()
    with pytest.raises(spindle.WorkerDiedError) as info:
        for _ in it:
            pass
    assert time.monotonic() - start < 1.0
    msg = str(info.value)
    pid = int(msg.split("(pid ")[1].split(")")[0])
    assert pid in pids
    assert "killed by signal 9" in msg and "batch 12" in msg and "sample index 123" in msg
    with pytest.raises(spindle.WorkerDiedError):  # the iterator stays failed
        next(it)
    for p in pids:  # the other worker was stopped and reaped
        assert not os.path.exists(f"/proc/{p}")


def test_a_worker_killed_from_outside_is_reported_with_its_pid():
    """kill -9 of a busy worker from another process raises WorkerDiedError naming that pid."""
    # Sample 1, not 0: the consumer reads sample 0 itself to lay out the ring.
    it = iter(spindle.DataLoader(SlowAt(1, 30.0), batch_size=4, num_workers=1, on_worker_death="raise"))
    victim = it.worker_pids[0]
    time.sleep(0.2)
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(spindle.WorkerDiedError, match=rf"worker 0 \(pid {victim}\) was killed by signal 9.*"
                                                      r"batch 0 \[0, 1, 2, 3\] at sample index 1"):
        next(it)
    assert time.monotonic() - start < 1.0


def test_a_stuck_worker_trips_the_timeout_naming_worker_and_sample():
    """timeout=0.5 with a sample that sleeps 30 s raises LoaderTimeoutError naming the sample."""
    it = iter(spindle.DataLoader(SlowAt(13, 30.0), batch_size=4, num_workers=1, timeout=0.5))
    for _ in range(3):
        next(it)
    start = time.monotonic()
    with pytest.raises(spindle.LoaderTimeoutError, match=r"DataLoader timed out after 0.5 seconds.*batch 3 .*held by worker 0 .*"
                                                         r"at sample index 13"):
        next(it)
    assert 0.45 < time.monotonic() - start < 2.0


CONSUMER = textwrap.dedent(r"""
    import sys, time
    sys.path.insert(0, {here!r})
    import spindle
    from toy_datasets import SlowAt
    it = iter(spindle.DataLoader(SlowAt(1, 60.0), batch_size=2, num_workers=3))
    print(" ".join(map(str, it.worker_pids)), flush=True)
    time.sleep(60)
""")


def test_workers_exit_when_the_consumer_is_killed():
    """SIGKILL of the consumer leaves no worker process behind (busy or idle) and no shared memory."""
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER.format(here=HERE)], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.02)
    assert not any(_alive(p) for p in pids)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"spindle.{proc.pid}.")]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sys_exit_in_a_worker_exits_that_worker_with_its_code_without_finalizing_the_consumers_interpreter(tmp_path):
    """Proves: sys.exit(3) in dataset code ends that worker with exit code 3 (named by WorkerDiedError),
    and the forked worker does not finalize the interpreter it inherited: the consumer's atexit
    handlers run once, in the consumer, not in the worker (they used to run there through Py_Exit,
    and a Loader inherited from the consumer could crash in its destructor)."""
    marks = tmp_path / "atexit"
    script = textwrap.dedent(f"""
        import atexit, os, sys
        import numpy as np, spindle
        atexit.register(lambda: open({str(marks)!r}, "a").write(f"{{os.getpid()}}\\n"))
        kept = spindle.DataLoader(np.arange(8), batch_size=2, num_workers=1, persistent_workers=True)
        next(iter(kept))  # a live Loader in the consumer when the next workers fork
        class Exits:
            def __len__(self): return 8
            def __getitem__(self, i):
                if i == 5:
                    sys.exit(3)
                return np.int64(i)
        try:
            list(spindle.DataLoader(Exits(), batch_size=2, num_workers=2))
        except spindle.WorkerDiedError as e:
            print("died:", e)
        print("consumer", os.getpid())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "exited with code 3" in out.stdout, out.stdout
    consumer = out.stdout.split("consumer ")[-1].strip()
    assert marks.read_text().split() == [consumer], (marks.read_text(), out.stderr)
