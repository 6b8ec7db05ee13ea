"""Starting workers from a consumer that already runs other runtimes' threads."""

import os
import threading

import numpy as np
import pytest

import spindle
from toy_datasets import Images

torch = pytest.importorskip("torch")


def test_loaders_start_and_stop_repeatedly_while_torch_and_python_threads_run():
    """With torch intra-op threads busy and a Python thread churning locks, 20 loader
    lifecycles finish without a hang and leave no worker or thread behind."""
    torch.set_num_threads(2)
    stop = threading.Event()

    def busy():
        a = torch.randn(256, 256)
        while not stop.is_set():
            (a @ a).sum().item()                 # torch's pool is mid-flight at fork time
            np.linalg.norm(np.ones(1000))
            __import__("json").dumps({"x": 1})   # takes the import lock

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    try:
        before = spindle.count_process_threads(os.getpid())
        for epoch in range(20):
            loader = spindle.DataLoader(Images(600), batch_size=50, num_workers=4, shuffle=True, seed=epoch)
            total = sum(int(b.shape[0]) for b in loader)
            assert total == 600
        # A loader dropped mid-epoch stops its workers too.
        it = iter(spindle.DataLoader(Images(600), batch_size=50, num_workers=4))
        next(it)
        pids = it.worker_pids
        del it
        assert not any(os.path.exists(f"/proc/{p}") for p in pids)
        assert spindle.count_process_threads(os.getpid()) <= before + spindle.ThreadBudget().cpus
    finally:
        stop.set()
        t.join()


class _FinalizedWhere:
    """A cycle (it refers to itself) whose finalizer writes the pid of the process that ran it."""

    def __init__(self, out_fd: int) -> None:
        self.me = self
        self.out_fd = out_fd

    def __del__(self) -> None:
        os.write(self.out_fd, f"{os.getpid()}\n".encode())


class _CollectsGarbage:
    """Each sample read in a worker runs the collector, as any allocation-heavy sample may."""

    def __init__(self) -> None:
        self.consumer = os.getpid()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        import gc
        if os.getpid() != self.consumer:
            gc.collect()
        return np.full(4, i, np.int64)


@pytest.mark.parametrize("front", ["spindle", "torch"])
def test_garbage_the_consumer_left_is_not_finalized_inside_a_worker(front):
    """Proves: a cycle the consumer had not yet collected when the workers forked is not finalized
    by a worker's collector (its finalizer could wait on a lock or thread of the consumer forever),
    only by the consumer's."""
    import gc
    import spindle.torch
    read_fd, write_fd = os.pipe()
    gc.disable()  # keep the cycle uncollected until the fork, as a busy consumer may
    try:
        _FinalizedWhere(write_fd)
        make = spindle.DataLoader if front == "spindle" else spindle.torch.DataLoader
        loader = make(_CollectsGarbage(), batch_size=2, num_workers=2)
        assert len(list(loader)) == 4
    finally:
        gc.enable()
    gc.collect()  # the consumer's collector: the finalizer runs here, once
    os.close(write_fd)
    with os.fdopen(read_fd) as got:
        assert got.read().split() == [str(os.getpid())]


@pytest.mark.parametrize("front", ["spindle", "torch"])
def test_starting_workers_leaves_the_consumers_garbage_to_its_young_collections(front):
    """Proves: forking workers does not move what the consumer has not collected yet into its oldest
    generation, where a dropped loader caught in a cycle would keep its workers (and arena threads and
    shared memory) until a full collection: the next young collection after the forks stops them."""
    import gc
    import spindle.torch
    make = spindle.DataLoader if front == "spindle" else spindle.torch.DataLoader
    gc.collect()
    gc.disable()  # keep the cycle uncollected until the next loader forks, as a busy consumer may
    try:
        dropped = iter(make(Images(64), batch_size=8, num_workers=1))
        next(dropped)
        pids = dropped.worker_pids
        cycle = [dropped]
        cycle.append(cycle)  # held only by itself, as a traceback holds a frame that holds the iterator
        del dropped, cycle
        assert sum(len(b) for b in make(Images(64), batch_size=8, num_workers=1)) == 64
        gc.collect(1)  # the two young generations only
        assert not any(os.path.exists(f"/proc/{p}") for p in pids)
    finally:
        gc.enable()


class _PutsToQueue:
    """Each sample read puts its index to a multiprocessing Queue the consumer made."""

    def __init__(self, queue) -> None:
        self.queue = queue

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        self.queue.put(i)
        return np.full(2, i, np.int64)


def _loader_class(front):
    import torch.utils.data
    import spindle.torch
    return {"spindle": spindle.DataLoader, "spindle.torch": spindle.torch.DataLoader,
            "torch": torch.utils.data.DataLoader}[front]


@pytest.mark.parametrize("front", ["spindle", "spindle.torch", "torch"])
def test_a_queue_the_consumer_has_used_carries_what_the_workers_put(front):
    """Proves: a multiprocessing Queue whose feeder thread already runs in the consumer carries what
    forked workers put, as under torch's DataLoader (multiprocessing's after-fork callbacks run in each
    worker: without them the worker's puts wait for a feeder thread that exists only in the consumer)."""
    import multiprocessing
    import queue as queues
    q = multiprocessing.Queue()
    q.put(-1)
    assert q.get(timeout=10) == -1  # the consumer's feeder thread runs
    assert sum(len(b) for b in _loader_class(front)(_PutsToQueue(q), batch_size=2, num_workers=2)) == 8
    got = []
    try:
        while len(got) < 8:
            got.append(q.get(timeout=10))
    except queues.Empty:
        pass
    assert sorted(got) == list(range(8))


class _Kept:
    """Something for the consumer's exit finalizer to be attached to."""


@pytest.mark.parametrize("front", ["spindle", "spindle.torch", "torch"])
def test_workers_run_their_own_exit_finalizers_and_never_the_consumers(front):
    """Proves: as in torch's forked workers, a multiprocessing exit finalizer a worker registered runs when
    it ends (a Queue's flushes what it put), and one the consumer registered before the fork never runs
    in a worker (it may remove the consumer's files)."""
    import multiprocessing.util
    read_fd, write_fd = os.pipe()
    kept = _Kept()
    consumers = multiprocessing.util.Finalize(kept, os.write, (write_fd, b"consumer\n"), exitpriority=0)
    try:
        def register(worker_id):
            multiprocessing.util.Finalize(None, os.write, (write_fd, f"worker {worker_id}\n".encode()), exitpriority=0)
        loader = _loader_class(front)(np.arange(8), batch_size=2, num_workers=2, worker_init_fn=register)
        assert sum(len(b) for b in loader) == 8
        del loader
    finally:
        consumers.cancel()
        os.close(write_fd)
    with os.fdopen(read_fd) as got:
        assert sorted(got.read().splitlines()) == ["worker 0", "worker 1"]


class _WhoAmI:
    """Each sample: is the worker the main process by multiprocessing's name, its parent's pid, is that parent alive."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> np.ndarray:
        import multiprocessing
        parent = multiprocessing.parent_process()
        return np.array([multiprocessing.current_process().name == "MainProcess",
                         -1 if parent is None else parent.pid, parent is not None and parent.is_alive()], np.int64)


@pytest.mark.parametrize("front", ["spindle", "spindle.torch", "torch"])
def test_multiprocessing_sees_a_worker_as_a_child_of_the_consumer(front):
    """Proves: as in torch's workers, multiprocessing.current_process() in a worker is not "MainProcess"
    (code meant for the main process only checks that name) and parent_process() is the live consumer."""
    rows = np.concatenate([np.asarray(b) for b in _loader_class(front)(_WhoAmI(), batch_size=1, num_workers=2)])
    assert rows.tolist() == [[0, os.getpid(), 1]] * 2


class SharedArrays:
    """Each sample is made in a multiprocessing SharedMemory block (as grain's batch operation makes
    its arrays), which registers the block with multiprocessing's resource tracker."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        from multiprocessing import shared_memory
        block = shared_memory.SharedMemory(create=True, size=64)
        try:
            return np.frombuffer(block.buf, np.uint8).copy() + i
        finally:
            block.close()
            block.unlink()


def test_a_consumer_thread_holding_the_resource_trackers_lock_does_not_hang_a_worker():
    """Proves: a consumer thread inside multiprocessing's resource tracker (its lock held, as while it
    unlinks a shared-memory array) when workers are forked: the workers, which register shared memory
    with the same tracker, finish the epoch (a child forked while another thread held the lock would
    wait on its copy forever; spindle's forks wait for the lock, and each child releases its copy)."""
    import time
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()
    lock = resource_tracker._resource_tracker._lock
    held = threading.Event()

    def hold():
        with lock:
            held.set()
            time.sleep(0.5)

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    loader = spindle.DataLoader(SharedArrays(), batch_size=2, num_workers=2, timeout=30)
    assert sum(int(b.shape[0]) for b in loader) == 8
