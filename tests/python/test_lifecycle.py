"""The edges of a loader's life: Ctrl-C, close from another thread, start-up
without a probe (dataset code only in workers), timeouts at the first batch,
slots that grow, and the consumer dying at any moment."""

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import spindle
import spindle.torch
from toy_datasets import Images, SlowAt

HERE = os.path.dirname(os.path.abspath(__file__))
FRONTS = ["numpy", "torch"]


def make_loader(front, dataset, **kwargs):
    if front == "numpy":
        return spindle.DataLoader(dataset, **kwargs)
    return spindle.torch.DataLoader(dataset, **kwargs)


def run_child(code, **env):
    """Starts a Python child running `code` (with tests/python on sys.path and `env` added).

    The child handles SIGINT as an interactive Python does (KeyboardInterrupt), even when this
    run inherited it ignored (a background job of a non-interactive shell): Python leaves an
    ignored SIGINT ignored, and the Ctrl-C tests would then prove nothing."""
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def alive(pid):
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def tagged_processes(tag):
    """Pids of every live process whose environment carries SPINDLE_TEST_TAG=tag."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if f"SPINDLE_TEST_TAG={tag}".encode() in f.read().split(b"\0") and alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("front", FRONTS)
def test_ctrl_c_while_waiting_raises_keyboard_interrupt_promptly_and_stops_the_workers(front):
    """SIGINT during a next() that waits on a hung sample: KeyboardInterrupt within 0.5 s, no worker left."""
    child = run_child(f"""
        import os, sys, time
        import spindle, spindle.torch
        from toy_datasets import SlowAt
        Loader = spindle.DataLoader if {front!r} == "numpy" else spindle.torch.DataLoader
        it = iter(Loader(SlowAt(0, 1000.0), batch_size=2, num_workers=2))
        pids = list(it.worker_pids)
        print("READY", *pids, flush=True)
        try:
            next(it)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{{p}}") for p in pids):
            time.sleep(0.01)
        print("LEFT", *[p for p in pids if os.path.exists(f"/proc/{{p}}")], flush=True)
        print("SHM", *[n for n in os.listdir("/dev/shm") if n.startswith(f"spindle.{{os.getpid()}}.")], flush=True)
    """)
    try:
        ready = child.stdout.readline().split()
        assert ready and ready[0] == "READY", child.stderr.read()
        time.sleep(0.5)  # next() is waiting now
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        assert child.stdout.readline().strip() == "INTERRUPTED", child.stderr.read()
        assert time.monotonic() - sent < 0.5
        assert child.stdout.readline().split() == ["LEFT"], "workers still running after KeyboardInterrupt"
        assert child.stdout.readline().split() == ["SHM"]
        assert child.wait(10) == 0
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("front", FRONTS)
def test_close_from_another_thread_ends_a_waiting_next_with_stop_iteration(front):
    """it.close() from a second thread while next() waits: next() ends with StopIteration at once, no crash."""
    for _ in range(10):
        it = iter(make_loader(front, SlowAt(0, 1000.0), batch_size=2, num_workers=2))
        pids = list(it.worker_pids)
        closer = threading.Timer(0.2, it.close)
        closer.start()
        start = time.monotonic()
        with pytest.raises(StopIteration):
            next(it)
        assert time.monotonic() - start < 1.5
        closer.join()
        with pytest.raises(StopIteration):  # and stays closed
            next(it)
        assert not any(alive(p) for p in pids)


@pytest.mark.parametrize("front", FRONTS)
def test_close_from_another_thread_while_batches_flow_is_safe(front):
    """Closing from a second thread at random moments of a busy epoch never crashes or hangs."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        it = iter(make_loader(front, Images(4000), batch_size=8, num_workers=2))
        closer = threading.Timer(float(rng.uniform(0, 0.05)), it.close)
        closer.start()
        got = sum(1 for _ in it)
        closer.join()
        assert got <= 500
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.parametrize("front", FRONTS)
def test_a_hung_first_sample_obeys_the_timeout(front):
    """timeout=2 with sample 0 hanging: LoaderTimeoutError after ~2 s (no probe that waits forever)."""
    loader = make_loader(front, SlowAt(0, 1000.0), batch_size=2, num_workers=2, timeout=2)
    start = time.monotonic()
    with pytest.raises(spindle.LoaderTimeoutError, match=r"timed out after 2 seconds.*sample index 0"):
        next(iter(loader))
    assert 1.9 < time.monotonic() - start < 4


class BarrierDataset:
    """Each sample waits until every worker has reached it (torch's test_worker_seed pattern)."""

    def __init__(self, n, workers):
        import multiprocessing
        self.n = n
        self.barrier = multiprocessing.get_context("fork").Barrier(workers)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.barrier.wait(timeout=30)
        return np.int64(os.getpid())


@pytest.mark.parametrize("front", FRONTS)
def test_samples_that_wait_for_every_worker_complete(front):
    """A dataset whose samples meet at a barrier of num_workers parties finishes (nothing reads alone)."""
    batches = list(make_loader(front, BarrierDataset(8, 4), batch_size=1, num_workers=4, timeout=60))
    pids = {int(b[0]) for b in batches}
    assert len(batches) == 8 and len(pids) == 4 and os.getpid() not in pids


class PrintsOnRead(Images):
    def __getitem__(self, i):
        print(f"reading {i}", flush=True)  # noise on stdout must not break anything
        return super().__getitem__(i)


def test_spawned_workers_may_print_to_stdout():
    """Under multiprocessing_context='spawn' a dataset that prints still loads (no result travels on stdout)."""
    child = run_child("""
        import spindle.torch
        from test_lifecycle import PrintsOnRead
        if __name__ == "__main__":
            n = sum(len(b) for b in spindle.torch.DataLoader(PrintsOnRead(40), batch_size=4, num_workers=2,
                                                             multiprocessing_context="spawn"))
            print("TOTAL", n, flush=True)
    """)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert "TOTAL 40" in out and "reading 39" in out


def test_the_spawned_worker_module_runs_as_a_program():
    """`python -m spindle._runtime.spawned --help` prints its usage (no NameError)."""
    done = subprocess.run([sys.executable, "-m", "spindle._runtime.spawned", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--worker" in done.stdout


@pytest.mark.parametrize("front", FRONTS)
def test_a_nan_timeout_is_refused_and_inf_waits_forever(front):
    """timeout=NaN raises ValueError; timeout=inf loads every batch (no overflow)."""
    with pytest.raises(ValueError, match="timeout"):
        list(make_loader(front, Images(10), batch_size=2, num_workers=1, timeout=math.nan))
    assert len(list(make_loader(front, Images(10), batch_size=2, num_workers=1, timeout=math.inf))) == 5


class GrowingSamples:
    """Sample i is a 1-D uint8 array of 1000 * (i // 4 + 1) values; batch k of 4 has one shape."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"x": np.full(1000 * (i // 4 + 1) ** 3, i, np.uint8), "i": i}


@pytest.mark.parametrize("front", FRONTS)
def test_batches_of_other_shapes_grow_their_slots_and_stay_valid(front):
    """Batches of 4 KB up to 4 MB share one ring; every kept batch keeps its values."""
    kept = list(make_loader(front, GrowingSamples(), batch_size=4, num_workers=2))
    assert len(kept) == 10
    for k, batch in enumerate(kept):
        x = np.asarray(batch["x"])
        assert x.shape == (4, 1000 * (k + 1) ** 3)
        assert (x == np.arange(4 * k, 4 * k + 4)[:, None]).all()


def test_a_batch_larger_than_max_batch_bytes_names_the_limit():
    """A batch over max_batch_bytes fails with an error naming the sizes and the option."""
    loader = spindle.DataLoader(GrowingSamples(), batch_size=4, num_workers=1, max_batch_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"needs \d+ MiB but a ring slot holds at most 1 MiB.*max_batch_bytes"):
        list(loader)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a private tmpfs")
def test_a_full_dev_shm_gives_a_clear_error_with_the_size_needed():
    """With /dev/shm a 16 MiB tmpfs, a 40 MiB batch fails with SharedMemoryError naming sizes, never SIGBUS."""
    code = textwrap.dedent("""
        import numpy as np, spindle
        class Big:
            def __len__(self): return 8
            def __getitem__(self, i): return np.zeros(10 << 20, np.uint8)
        try:
            list(spindle.DataLoader(Big(), batch_size=4, num_workers=1))
        except spindle.SharedMemoryError as e:
            print("ERROR", str(e).splitlines()[0])
    """)
    env = dict(os.environ, PYTHONPATH=HERE)
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f"mount -t tmpfs -o size=16m tmpfs /dev/shm && exec {sys.executable} -c \"$0\"", code],
                          capture_output=True, text=True, timeout=120, env=env)
    if "mount" in done.stderr and done.returncode != 0 and "ERROR" not in done.stdout:
        pytest.skip(f"cannot mount a private tmpfs here: {done.stderr.strip()}")
    assert "ERROR spindle: cannot reserve 40 MiB of shared memory in /dev/shm" in done.stdout, done.stderr
    assert "MiB free" in done.stdout


@pytest.mark.parametrize("front", FRONTS)
def test_killing_the_consumer_at_any_moment_leaves_no_process(front):
    """SIGKILL of the consumer at random moments (start-up, first batch, mid-epoch): every descendant gone in 2 s."""
    rng = np.random.default_rng(1)
    for trial in range(8):
        tag = f"kill-{front}-{trial}-{os.getpid()}"
        child = run_child(f"""
            import spindle, spindle.torch
            from toy_datasets import SlowAt
            Loader = spindle.DataLoader if {front!r} == "numpy" else spindle.torch.DataLoader
            print("GO", flush=True)
            for _ in range(100):
                for batch in Loader(SlowAt(3, 0.05), batch_size=2, num_workers=3):
                    pass
        """, SPINDLE_TEST_TAG=tag)
        try:
            assert child.stdout.readline().strip() == "GO"
            time.sleep(float(rng.uniform(0, 0.4)))
        finally:
            child.kill()
            child.wait()
        deadline = time.monotonic() + 2
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tagged_processes(tag) == [], f"trial {trial}: processes outlived their consumer"
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"spindle.{child.pid}.")]


def test_ctrl_c_at_random_moments_leaves_a_clean_state():
    """SIGINT at random moments of repeated epochs: the consumer ends with KeyboardInterrupt, nothing left."""
    rng = np.random.default_rng(2)
    for trial in range(8):
        tag = f"int-{trial}-{os.getpid()}"
        child = run_child("""
            import spindle
            from toy_datasets import Images
            print("GO", flush=True)
            try:
                for _ in range(1000):
                    for batch in spindle.DataLoader(Images(2000), batch_size=16, num_workers=2):
                        pass
            except KeyboardInterrupt:
                print("INTERRUPTED", flush=True)
        """, SPINDLE_TEST_TAG=tag)
        try:
            assert child.stdout.readline().strip() == "GO"
            time.sleep(float(rng.uniform(0.05, 0.5)))
            child.send_signal(signal.SIGINT)
            out, err = child.communicate(timeout=10)
        finally:
            child.kill()
            child.wait()
        assert "INTERRUPTED" in out, err
        deadline = time.monotonic() + 2
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert tagged_processes(tag) == []


_DROPPED = {  # each makes `it`, the object dropped, and `pids`, its workers
    "numpy": "it = iter(spindle.DataLoader(Images(2000), batch_size=16, num_workers=2)); next(it); "
             "pids = it.worker_pids",
    "numpy persistent": "it = spindle.DataLoader(Images(2000), batch_size=16, num_workers=2, persistent_workers=True)"
                        "; epoch = iter(it); next(epoch); pids = epoch.worker_pids; del epoch",
    "torch": "it = iter(spindle.torch.DataLoader(Images(2000), batch_size=16, num_workers=2)); next(it); "
             "pids = it.worker_pids",
    "torch persistent": "it = spindle.torch.DataLoader(Images(2000), batch_size=16, num_workers=2, "
                        "persistent_workers=True); epoch = iter(it); next(epoch); pids = epoch.worker_pids; del epoch",
    "grain": "import grain, spindle.grain; "
             "it = iter(spindle.grain.mp_prefetch(grain.MapDataset.range(2000).to_iter_dataset(), "
             "grain.multiprocessing.MultiprocessingOptions(num_workers=2))); next(it); pids = it.worker_pids",
}


@pytest.mark.parametrize("front", list(_DROPPED))
def test_a_signal_while_a_loader_is_dropped_raises_where_it_was_dropped(front):
    """Proves: dropping a running iterator (or a loader with persistent workers) stops its workers
    without a Python finalizer, so a signal handled meanwhile (Ctrl-C; here SIGCHLD from the workers
    that stop) raises in the code that dropped it. From a __del__ it was printed as "Exception ignored"
    and lost: Ctrl-C at that moment did not stop the program."""
    child = run_child(f"""
        import os, signal
        import spindle, spindle.torch
        from toy_datasets import Images
        {_DROPPED[front]}
        class Signalled(Exception): pass
        def handler(signum, frame): raise Signalled
        signal.signal(signal.SIGCHLD, handler)
        try:
            del it  # its workers exit now, and each exit sends SIGCHLD
            for _ in range(1000): pass
            print("NOT RAISED", flush=True)
        except Signalled:
            print("RAISED", flush=True)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        print("LEFT", *[p for p in pids if os.path.exists(f"/proc/{{p}}")], flush=True)
    """)
    out, err = child.communicate(timeout=60)
    assert out.splitlines() == ["RAISED", "LEFT"], (out, err)
    assert "Exception ignored" not in err, err


@pytest.mark.parametrize("front", FRONTS)
def test_ctrl_c_during_the_interpreters_fork_callbacks_raises_and_leaves_no_worker(front):
    """Proves: a SIGINT that arrives while the workers are forked (here sent by an at-fork callback
    itself, as Ctrl-C can land in logging's) raises KeyboardInterrupt from iter() and leaves no
    worker. Handled inside the callback, it was printed as "Exception ignored" and lost."""
    tag = f"forkint-{front}-{os.getpid()}"
    child = run_child(f"""
        import os, signal
        import spindle, spindle.torch
        from toy_datasets import Images
        Loader = spindle.DataLoader if {front!r} == "numpy" else spindle.torch.DataLoader
        loader = Loader(Images(64), batch_size=8, num_workers=3)
        sent = []
        def interrupt():
            if not sent:
                sent.append(1)
                os.kill(os.getpid(), signal.SIGINT)
        os.register_at_fork(after_in_parent=interrupt)
        try:
            for batch in loader:
                pass
            print("NOT RAISED", flush=True)
        except KeyboardInterrupt:
            print("RAISED", flush=True)
    """, SPINDLE_TEST_TAG=tag)
    out, err = child.communicate(timeout=60)
    assert out.splitlines() == ["RAISED"], (out, err)
    assert "Exception ignored" not in err, err
    deadline = time.monotonic() + 2
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tagged_processes(tag) == []


@pytest.mark.parametrize("front", FRONTS)
def test_a_loader_started_in_a_thread_that_exits_keeps_its_workers(front):
    """iter() in a short-lived thread, iteration in this one: every batch arrives (the workers do not
    die with the thread that forked them)."""
    holder = []
    t = threading.Thread(target=lambda: holder.append(iter(make_loader(front, Images(400), batch_size=8,
                                                                        num_workers=2))))
    t.start()
    t.join()
    time.sleep(0.2)
    assert sum(len(b) for b in holder[0]) == 400
