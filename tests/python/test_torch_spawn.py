"""spindle.torch.DataLoader under 'spawn' and 'forkserver', side by side with torch's DataLoader.

The worker payload is pickled in multiprocessing's spawning context, as torch's
worker Process arguments are, so synchronization primitives and shared ctypes
held by a dataset or a worker_init_fn reach the workers as they reach torch's.
Few workers and samples: every spawned worker is a new interpreter importing torch.
"""

import multiprocessing
import queue
import random
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader as TorchLoader, Dataset, get_worker_info  # noqa: E402

from spindle.torch import DataLoader  # noqa: E402
from toy_datasets import CountsUnderSemaphore  # noqa: E402

SAMPLES = 6
WORKERS = 2


class Shared(Dataset):
    """Holds a Value, an Array, a Semaphore, a Lock, a Queue and an Event of one context; each
    sample uses them all from the worker."""

    def __init__(self, context):
        self.count = context.Value("i", 0)  # with its own lock
        self.sums = context.Array("d", WORKERS)
        self.slots = context.Semaphore(1)
        self.lock = context.Lock()
        self.seen = context.Queue()
        self.started = context.Event()

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        with self.count.get_lock():
            self.count.value += 1
        with self.slots, self.lock:
            self.sums[get_worker_info().id] += i
        self.seen.put(("sample", i))
        return torch.tensor([i, int(self.started.is_set())])


def init_with_primitives(worker_id):
    """A worker_init_fn that uses the dataset's primitives before any sample."""
    dataset = get_worker_info().dataset
    with dataset.lock:
        dataset.count.value += 100
    dataset.seen.put(("init", worker_id))
    dataset.started.set()


def run(cls, method):
    """What a loader of `cls` gives over a fresh Shared dataset, and what the workers left in it."""
    dataset = Shared(multiprocessing.get_context(method))
    batches = [b.tolist() for b in cls(dataset, batch_size=2, num_workers=WORKERS, multiprocessing_context=method,
                                       worker_init_fn=init_with_primitives)]
    seen = sorted(dataset.seen.get(timeout=30) for _ in range(SAMPLES + WORKERS))
    with pytest.raises(queue.Empty):
        dataset.seen.get(timeout=0.2)
    return batches, dataset.count.value, list(dataset.sums), dataset.started.is_set(), seen


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_primitives_held_by_a_dataset_and_used_by_worker_init_fn_travel_as_to_torchs_workers(method):
    """Proves: under 'spawn'/'forkserver' a dataset holding mp.Value, Array, Semaphore, Lock, Queue and
    Event, with a worker_init_fn using them, loads as with torch: same batches, and the workers' writes
    (counter, array, event, queued items) reach the parent's objects as torch's do."""
    expected = run(TorchLoader, method)
    got = run(DataLoader, method)
    assert got == expected
    assert expected[1] == SAMPLES + 100 * WORKERS and expected[3] is True  # the workers really wrote


def test_the_global_spawn_start_method_carries_primitives_like_torch():
    """Proves: with multiprocessing_context=None the start method set globally decides, as in torch: a
    dataset made of the default context's primitives after set_start_method('spawn') loads (no
    'should only be shared between processes through inheritance')."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        results = []
        for cls in (TorchLoader, DataLoader):
            dataset = Shared(multiprocessing)
            batches = [b.tolist() for b in cls(dataset, batch_size=3, num_workers=WORKERS,
                                               worker_init_fn=init_with_primitives)]
            results.append((batches, dataset.count.value, list(dataset.sums)))
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert results[1] == results[0]


class Draws(Dataset):
    """Each sample: its worker's info, torch's initial seed, and one draw each of random, numpy and torch."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return {"index": i, "id": info.id, "num_workers": info.num_workers, "seed": info.seed,
                "initial_seed": torch.initial_seed(), "same_dataset": info.dataset.__class__.__name__,
                "random": random.random(), "numpy": float(np.random.rand()), "torch": float(torch.rand(()))}


def test_spawned_workers_have_torchs_worker_info_and_seeds():
    """Proves: under 'spawn', get_worker_info() (id, num_workers, seed, dataset) and the per-worker seeds of
    random, numpy and torch equal torch's for the same generator, batch by batch."""
    def draws(cls):
        loader = cls(Draws(), batch_size=2, num_workers=WORKERS, multiprocessing_context="spawn",
                     generator=torch.Generator().manual_seed(1234))
        return [{k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in loader]

    expected = draws(TorchLoader)
    assert draws(DataLoader) == expected
    assert {w for b in expected for w in b["id"]} == set(range(WORKERS))
    assert torch.utils.data.get_worker_info() is None  # none in the consumer, before or after


class Unpicklable(Dataset):
    def __init__(self):
        self.transform = lambda x: x

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.transform(i)


def test_an_unpicklable_dataset_under_spawn_warns_and_raises_like_torch():
    """Proves: a dataset that does not pickle (a lambda) under 'spawn' fails at iter() with torch's
    exception type and message, after torch's "Got pickle error" warning where this torch gives one
    (2.13 on; not 2.4 or 2.8); no worker starts."""
    outcomes = []
    for cls in (TorchLoader, DataLoader):
        with warnings.catch_warnings(record=True) as caught, pytest.raises(Exception) as raised:
            warnings.simplefilter("always")
            iter(cls(Unpicklable(), num_workers=WORKERS, multiprocessing_context="spawn"))
        words = [str(w.message) for w in caught if "pickle error" in str(w.message)]
        outcomes.append((type(raised.value), str(raised.value), words))
    assert outcomes[1] == outcomes[0]
    from spindle.torch import _compat

    assert bool(outcomes[0][2]) == (_compat.pickle_warning() is not None)
    if outcomes[0][2]:
        assert outcomes[0][2][0].startswith("Got pickle error when attempting to start a worker")


class EnvironmentAtStart(Dataset):
    """Each sample: what the worker's interpreter saw in its environment as it started (before
    its first line ran), recorded by the sitecustomize of the test."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        import sitecustomize
        return torch.tensor([int(sitecustomize.OMP_AT_START or -1)])


def test_a_spawned_worker_starts_with_one_thread_per_runtime_in_its_environment(tmp_path, monkeypatch):
    """Proves: a spawned worker's interpreter has OMP_NUM_THREADS=1 (and the other one-thread settings)
    from its first instruction, so a site hook that imports torch or numpy (a sitecustomize, a .pth
    file) loads their thread pools at one thread, not at the machine's size."""
    (tmp_path / "sitecustomize.py").write_text("import os\nOMP_AT_START = os.environ.get('OMP_NUM_THREADS')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the spawned interpreters' site imports it
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    got = [int(b) for b in DataLoader(EnvironmentAtStart(), batch_size=None, num_workers=1,
                                      multiprocessing_context="spawn")]
    assert got == [1, 1]


def test_a_spawned_workers_start_is_not_a_stall(tmp_path, monkeypatch):
    """Proves: the stall warning's clock starts once the workers have started: a spawned worker
    whose dataset module takes 1.5 s to import gives no StallWarning at a 0.3 s threshold (torch
    warns of nothing there either), and the batches arrive."""
    from spindle.errors import StallWarning
    (tmp_path / "slow_to_import.py").write_text(
        "import time\nimport torch\ntime.sleep(1.5)\n\n"
        "class Squares(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n        return 4\n\n"
        "    def __getitem__(self, i):\n        return i * i\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SPINDLE_STALL_WARNING", "0.3")
    import slow_to_import
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        batches = [b.tolist() for b in DataLoader(slow_to_import.Squares(), batch_size=2, num_workers=1,
                                                  multiprocessing_context="spawn")]
    assert batches == [[0, 1], [4, 9]]
    assert [str(w.message) for w in got if issubclass(w.category, StallWarning)] == []


def test_a_closed_spawned_worker_runs_its_exit_handlers_and_exits_with_0(tmp_path, monkeypatch):
    """Proves: a spawned worker that the consumer closes ends as multiprocessing ends its children:
    its atexit handlers run (multiprocessing's flushes the queues a dataset put to) and it exits
    with 0, as torch's test_iterable_style_dataset checks of torch's workers."""
    done = tmp_path / "atexit-ran"
    (tmp_path / "exits_cleanly.py").write_text(
        "import atexit\nimport torch\n\n"
        f"atexit.register(lambda: open({str(done)!r}, 'a').write('x'))\n\n"
        "class Numbers(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n        return 4\n\n"
        "    def __getitem__(self, i):\n        return i\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import exits_cleanly
    it = iter(DataLoader(exits_cleanly.Numbers(), batch_size=2, num_workers=1, multiprocessing_context="spawn"))
    assert [b.tolist() for b in it] == [[0, 1], [2, 3]]
    workers = it._workers
    del it
    for w in workers:
        w.join(10)
        assert w.exitcode == 0
    assert done.read_text() == "x"


class WhoAmI(Dataset):
    """Each sample: the worker's multiprocessing name is not "MainProcess", its parent's pid, that parent alive."""

    def __len__(self):
        return 2

    def __getitem__(self, i):
        parent = multiprocessing.parent_process()
        return torch.tensor([multiprocessing.current_process().name != "MainProcess",
                             -1 if parent is None else parent.pid, parent is not None and parent.is_alive()])


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_multiprocessing_sees_a_spawned_worker_as_a_child_of_the_consumer(method):
    """Proves: in a spawned worker, as in torch's, current_process() is not "MainProcess" and
    parent_process() is the live consumer."""
    import os
    expected = [[1, os.getpid(), 1]] * 2
    for cls in (TorchLoader, DataLoader):
        rows = torch.cat(list(cls(WhoAmI(), batch_size=1, num_workers=WORKERS, multiprocessing_context=method)))
        assert rows.tolist() == expected, cls


def test_the_global_forkserver_start_method_carries_a_value_and_a_semaphore_like_torch():
    """Proves: after set_start_method('forkserver') (Python 3.14's default), one dataset holding
    mp.Value(lock=True) and mp.Semaphore loads in torch's and spindle.torch's spawned workers, and in
    spindle.DataLoader's forked ones before them, with torch's batches and counts; no worker's end unlinks
    the consumer's semaphores (a later spawned worker would fail in SemLock._rebuild)."""
    from spindle import DataLoader as BaseLoader
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        dataset = CountsUnderSemaphore(SAMPLES)
        assert dataset.names_exist() == [True, True]
        got = []
        for cls in (BaseLoader, TorchLoader, DataLoader, TorchLoader):
            batches = [torch.as_tensor(b).tolist() for b in cls(dataset, batch_size=2, num_workers=WORKERS)]
            got.append((cls.__module__, batches, dataset.count.value, dataset.names_exist()))
    finally:
        multiprocessing.set_start_method(before, force=True)
    batches = [[0, 1], [2, 3], [4, 5]]
    assert got == [(cls.__module__, batches, SAMPLES * n, [True, True])
                   for n, cls in enumerate((BaseLoader, TorchLoader, DataLoader, TorchLoader), 1)]


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_a_dataset_made_in_the_for_statement_lives_while_its_workers_start(method):
    """Proves: `for b in DataLoader(Dataset(), num_workers=6, multiprocessing_context=method)`, nothing else
    holding the loader or the dataset, loads every sample as torch does: the iterator keeps the loader
    alive, so the dataset's named semaphores (mp.Value(lock=True), mp.Semaphore of that context) are not
    unlinked while spawned workers are still unpickling them (before: FileNotFoundError in SemLock._rebuild)."""
    context = multiprocessing.get_context(method)
    got = sorted(int(b) for b in DataLoader(CountsUnderSemaphore(12, context), batch_size=None, num_workers=6,
                                            multiprocessing_context=method))
    assert got == list(range(12))


def test_a_fork_semaphore_handed_to_spawned_workers_gets_pythons_error_not_a_dead_worker():
    """Proves: a dataset holding a semaphore of the 'fork' context, loaded with spawned workers, raises
    the RuntimeError Python 3.12's multiprocessing raises for it (torch's loader on 3.11 loses a
    worker to SIGSEGV instead), at iter(), with no worker started."""
    dataset = CountsUnderSemaphore(6, multiprocessing.get_context("fork"))
    with pytest.raises(RuntimeError, match="A SemLock created in a fork context is being shared with a process in "
                                           "a spawn context. This is not supported."):
        list(DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn"))
