"""spindle.torch.DataLoader against torch.utils.data.DataLoader, run side by side on the same inputs."""

import collections
import gc
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import (BatchSampler, DataLoader as TorchLoader, Dataset, SequentialSampler,  # noqa: E402
                              SubsetRandomSampler, WeightedRandomSampler, get_worker_info)

from spindle.torch import DataLoader, _compat  # noqa: E402

# in_order= is torch 2.6's: on an older torch both loaders refuse it (test_torch_compat checks ours).
needs_in_order = pytest.mark.skipif(not _compat.accepts(TorchLoader, "in_order"),
                                    reason=f"torch {torch.__version__} has no in_order (torch 2.6 adds it)")

Point = collections.namedtuple("Point", ["xy", "label"])


class Mixed(Dataset):
    """Tensors, numpy arrays, numbers, a tuple and a namedtuple per sample."""

    def __len__(self):
        return 97

    def __getitem__(self, i):
        return {"image": torch.arange(12, dtype=torch.float32).reshape(3, 4) + i,
                "mask": np.full((2,), i % 3 == 0),
                "pair": (i, float(i) / 4),
                "point": Point(np.array([i, -i], np.int32), np.int16(i))}


class Texts(Dataset):
    """Strings and variable-length tensors: no fixed layout, so batches are pickled."""

    def __len__(self):
        return 41

    def __getitem__(self, i):
        return {"name": f"sample-{i}", "value": torch.tensor([i] * (1 + i % 3))[:1]}


class WhoLoads(Dataset):
    """Reports the worker info and the per-worker random draws of the worker that loads each sample."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        info = get_worker_info()
        return {"index": i, "worker": info.id, "workers": info.num_workers, "seed": info.seed}


def same(a, b, path="batch"):
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for k, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{k}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def same_batches(got, expected):
    """Asserts spindle's batches equal torch's: as many, each the same type, dtype, shape and values."""
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        same(a, b, f"batch {k}")


def both(dataset, **kwargs):
    """Batches of torch's loader and of spindle's for the same arguments (generators re-made per loader)."""
    seed = kwargs.pop("seed", None)
    out = []
    for cls in (TorchLoader, DataLoader):
        args = dict(kwargs)
        if seed is not None:
            args["generator"] = torch.Generator().manual_seed(seed)
        torch.manual_seed(1234)  # samplers without a generator draw from the global one
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.append(list(cls(dataset, **args)))
    return out


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=8, num_workers=2),
    dict(batch_size=8, shuffle=True, num_workers=2, seed=1),
    dict(batch_size=10, shuffle=True, drop_last=True, num_workers=3, seed=2),
    dict(batch_size=5, sampler=SubsetRandomSampler(range(0, 97, 2)), num_workers=2, seed=3),
    dict(batch_size=4, sampler=WeightedRandomSampler([1.0] * 97, 50), num_workers=2, seed=4),
    dict(batch_sampler=[[3, 1, 4], [1, 5], [9, 2, 6, 5, 3]], num_workers=2),
    dict(batch_sampler=BatchSampler(SequentialSampler(range(97)), 13, False), num_workers=2),
    pytest.param(dict(batch_size=7, num_workers=2, in_order=False), marks=needs_in_order),
    dict(batch_size=None, num_workers=2),
    dict(batch_size=8, drop_last=True, num_workers=2),
    dict(batch_size=9, shuffle=True, num_workers=2),
], ids=["sequential", "shuffle", "drop_last", "subset-sampler", "weighted-sampler", "batch-sampler-list",
        "batch-sampler", "out-of-order", "no-batching", "sequential-drop_last", "shuffle-global-generator"])
def test_same_batches_as_torch_for_the_same_arguments(kwargs):
    """Order, values, dtypes and structure equal torch's for samplers, generators and batching options."""
    expected, got = both(Mixed(), **kwargs)
    if kwargs.get("in_order") is False:  # only the set of batches is defined
        key = lambda b: b["pair"][0].tolist()  # noqa: E731
        expected, got = sorted(expected, key=key), sorted(got, key=key)
    same_batches(got, expected)


def test_strings_and_custom_collate_match_torch():
    """Strings (default collate keeps them as lists) and a collate_fn run in the workers give torch's batches."""
    expected, got = both(Texts(), batch_size=6, shuffle=True, num_workers=2, seed=5)
    for a, b in zip(got, expected):
        same(a, b)

    def collate(samples):
        return torch.stack([s["value"] for s in samples]).sum(), [s["name"] for s in samples]

    expected, got = both(Texts(), batch_size=6, num_workers=2, collate_fn=collate)
    for a, b in zip(got, expected):
        same(a, b)


def test_worker_info_and_seeds_follow_torch():
    """get_worker_info() works in workers, and worker seeds are torch's base seed + worker id."""
    expected, got = both(WhoLoads(), batch_size=4, num_workers=3, seed=11)
    seeds = lambda batches: {(int(w), int(s)) for b in batches for w, s in zip(b["worker"], b["seed"])}  # noqa: E731
    assert seeds(got) <= seeds(expected) | {(w, s) for w, s in seeds(expected)}
    assert {s - w for w, s in seeds(got)} == {s - w for w, s in seeds(expected)}  # same base seed
    assert all(int(n) == 3 for b in got for n in b["workers"])
    assert sorted(v for b in got for v in b["index"].tolist()) == list(range(64))


def test_len_and_attributes_are_torchs():
    """len() and the public attributes read like torch's loader."""
    ours = DataLoader(Mixed(), batch_size=10, drop_last=True, num_workers=2)
    theirs = TorchLoader(Mixed(), batch_size=10, drop_last=True, num_workers=2)
    assert len(ours) == len(theirs) == 9
    assert (ours.batch_size, ours.drop_last, ours.num_workers, ours.prefetch_factor) == (10, True, 2, 2)
    assert type(ours.sampler) is type(theirs.sampler)


@pytest.mark.parametrize("kwargs", [
    dict(num_workers=-1), dict(timeout=-1), dict(prefetch_factor=2), dict(persistent_workers=True),
    dict(sampler=SequentialSampler(range(3)), shuffle=True), dict(batch_sampler=[[0]], batch_size=2),
    dict(batch_size=None, drop_last=True),
], ids=["workers", "timeout", "prefetch", "persistent", "sampler-shuffle", "batch-sampler", "drop-last"])
def test_bad_arguments_raise_what_torch_raises(kwargs):
    """Invalid arguments raise torch's exception type with torch's message."""
    with pytest.raises(Exception) as theirs:
        TorchLoader(Mixed(), **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        DataLoader(Mixed(), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_worker_exceptions_keep_their_type_and_name_the_sample():
    """A KeyError in a worker comes back as KeyError noting the worker and sample index."""

    class Missing(Mixed):
        def __getitem__(self, i):
            if i == 30:
                raise KeyError("record 30")
            return super().__getitem__(i)

    with pytest.raises(KeyError) as info:
        list(DataLoader(Missing(), batch_size=8, num_workers=2))
    assert "sample index 30" in "".join(info.value.__notes__)


def test_persistent_workers_give_torchs_epochs():
    """With persistent workers, successive epochs match torch's successive epochs for one generator."""
    loaders = [cls(Mixed(), batch_size=9, shuffle=True, num_workers=2, persistent_workers=True,
                   generator=torch.Generator().manual_seed(7)) for cls in (TorchLoader, DataLoader)]
    for _ in range(2):
        expected, got = (list(iter(loader)) for loader in loaders)
        for a, b in zip(got, expected):
            same(a, b)
    loaders[1].close()


def test_batches_are_writable_tensors_that_outlive_the_loader():
    """Tensors are zero-copy views that can be written and stay valid after the loader is gone."""
    loader = DataLoader(Mixed(), batch_size=8, num_workers=2)
    first = next(iter(loader))
    del loader
    gc.collect()
    first["image"][0, 0, 0] = -1.0
    assert first["image"][0, 0, 0].item() == -1.0 and first["image"][1, 0, 0].item() == 1.0


def test_pin_memory_without_cuda_warns_like_torch():
    """pin_memory=True on a machine without CUDA warns that pinned memory won't be used."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.warns(UserWarning, match="pin_memory"):
        batch = next(iter(DataLoader(Mixed(), batch_size=4, num_workers=1, pin_memory=True)))
    assert not batch["image"].is_pinned()


class Shards(torch.utils.data.IterableDataset):
    """Shards itself by worker: worker w yields w + 1 runs of values (uneven streams)."""

    def __iter__(self):
        info = get_worker_info()
        wid, n = (info.id, info.num_workers) if info is not None else (0, 1)
        for k in range(7 * (wid + 1)):
            yield {"value": torch.tensor([wid * 1000 + k]), "worker": wid}


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=3, num_workers=3),
    dict(batch_size=3, num_workers=3, drop_last=True),
    dict(batch_size=None, num_workers=2),
    dict(batch_size=4, num_workers=2, collate_fn=lambda s: [x["value"].item() for x in s]),
], ids=["batched", "drop_last", "no-batching", "custom-collate"])
def test_iterable_datasets_give_torchs_batches_in_torchs_order(kwargs):
    """IterableDataset shards by get_worker_info(); batches arrive round-robin from live workers, like torch."""
    expected, got = both(Shards(), **kwargs)
    same_batches(got, expected)


@pytest.mark.parametrize("context", ["spawn", "forkserver", "fork"])
def test_multiprocessing_contexts_give_torchs_batches(context):
    """'spawn' and 'forkserver' start workers as new interpreters (nothing forked), 'fork' forks; all give
    torch's batches, for map-style and iterable datasets."""
    for dataset, kwargs in ((Mixed(), dict(batch_size=8, shuffle=True, seed=3)), (Shards(), dict(batch_size=3))):
        expected, got = both(dataset, num_workers=2, multiprocessing_context=context, **kwargs)
        same_batches(got, expected)


class ThreadCount(Dataset):
    """Each sample is the number of threads of the process that loads it."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        import os
        return len(os.listdir("/proc/self/task"))


def test_spawned_workers_run_one_thread_even_after_importing_numpy_and_torch():
    """With 'spawn', pools are capped before the new interpreter imports numpy/torch: one thread per worker."""
    counts = torch.cat(list(DataLoader(ThreadCount(), batch_size=4, num_workers=2, multiprocessing_context="spawn")))
    assert counts.tolist() == [1] * 16


def test_persistent_workers_with_an_iterable_dataset_match_torchs_epochs():
    """persistent_workers=True with an IterableDataset: two epochs equal torch's two epochs."""
    loaders = [cls(Shards(), batch_size=3, num_workers=2, persistent_workers=True,
                   generator=torch.Generator().manual_seed(9)) for cls in (TorchLoader, DataLoader)]
    for _ in range(2):
        expected, got = (list(iter(loader)) for loader in loaders)
        same_batches(got, expected)


class Augmented(Dataset):
    """Random augmentation drawn from the worker's random, numpy and torch streams."""

    def __len__(self):
        return 60

    def __getitem__(self, i):
        import random
        return {"i": i, "py": random.random(), "np": np.random.rand(2), "torch": torch.rand(2)}


def test_random_augmentations_in_workers_equal_torchs():
    """Batches go to workers as torch sends them (batch k to worker k mod N) and workers are seeded like
    torch's, so values drawn from random/numpy/torch in the workers equal torch's."""
    expected, got = both(Augmented(), batch_size=4, shuffle=True, num_workers=3, seed=21)
    for a, b in zip(got, expected):
        same(a, b)


class BarrierSeeds(Dataset):
    """Each sample waits until every worker holds one (a barrier across workers), then reports its
    worker's torch seed: a dataset that cannot load in a process of its own."""

    def __init__(self, workers):
        import multiprocessing
        self.barrier = multiprocessing.get_context("fork").Barrier(workers)
        self.workers = workers

    def __len__(self):
        return self.workers

    def __getitem__(self, i):
        self.barrier.wait(timeout=60)
        return torch.initial_seed()


def test_datasets_that_wait_for_every_worker_load_like_torch():
    """Dataset code runs only in the workers (nothing is read ahead alone), so samples that wait for
    each other load, and each worker's seed is torch's for the same generator."""
    seeds = []
    for cls in (TorchLoader, DataLoader):
        loader = cls(BarrierSeeds(3), batch_size=1, num_workers=3, timeout=90,
                     generator=torch.Generator().manual_seed(42))
        seeds.append({int(b) for b in loader})
    assert len(seeds[1]) == 3 and seeds[1] == seeds[0]


def failing_init(worker_id):
    raise RuntimeError("Error in worker_init_fn")


@pytest.mark.parametrize("cls", [TorchLoader, DataLoader], ids=["torch", "spindle"])
def test_a_failing_worker_init_fn_raises_at_next_not_at_iter(cls):
    """As in torch, iter() starts the workers without raising; the worker_init_fn error surfaces at next()."""
    it = iter(cls(Mixed(), batch_size=4, num_workers=2, worker_init_fn=failing_init))
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        next(it)


class Unreliable(Dataset):
    """__getitem__ is missing: every batch fails with NotImplementedError."""

    def __len__(self):
        return 41


def test_every_failing_batch_raises_and_the_epoch_goes_on_like_torch():
    """torch's test_error_workers: each batch raises the worker's exception at next(), and the iterator
    continues to the end (ceil(41 / 2) errors, then StopIteration)."""
    for cls in (TorchLoader, DataLoader):
        it, errors = iter(cls(Unreliable(), batch_size=2, shuffle=True, num_workers=4)), 0
        while True:
            try:
                next(it)
            except NotImplementedError:
                errors += 1
            except StopIteration:
                break
        assert errors == 21


class Bulk(Dataset):
    """Reads many records per call: the sampler yields lists of indices."""

    def __len__(self):
        return 35

    def __getitem__(self, indices):
        assert isinstance(indices, list)
        return torch.as_tensor(indices)


class ListSampler(torch.utils.data.Sampler):
    def __iter__(self):
        return iter([list(range(i, min(i + 4, 35))) for i in range(0, 35, 4)])

    def __len__(self):
        return 9


@pytest.mark.parametrize("persistent", [False, True])
def test_bulk_loading_with_a_sampler_of_lists_gives_torchs_batches(persistent):
    """batch_size=None with a sampler yielding lists hands each list to __getitem__, as torch does (two
    epochs when workers persist)."""
    loaders = [cls(Bulk(), batch_size=None, sampler=ListSampler(), num_workers=2, persistent_workers=persistent)
               for cls in (TorchLoader, DataLoader)]
    for _ in range(2 if persistent else 1):
        expected, got = (list(loader) for loader in loaders)
        assert len(got) == len(expected) == 9
        same_batches(got, expected)
    loaders[1].close()


class ByName(Dataset):
    """A dataset keyed by strings, read through a sampler of names."""

    def __len__(self):
        return 23

    def __getitem__(self, name):
        assert isinstance(name, str)
        return torch.tensor([int(name[1:])]), name


class NameSampler(torch.utils.data.Sampler):
    def __iter__(self):
        return iter([f"k{i}" for i in range(23)][::-1])

    def __len__(self):
        return 23


@pytest.mark.parametrize("drop_last", [False, True])
def test_torchs_batch_sampler_over_keys_that_are_not_integers_gives_torchs_batches(drop_last):
    """torch's own BatchSampler is read a sampler at a time (not a batch at a time in Python): its
    keys may be any objects (here strings), and drop_last cuts the same tail."""
    expected, got = ([b for b in cls(ByName(), batch_size=5, sampler=NameSampler(), drop_last=drop_last,
                                     num_workers=2)] for cls in (TorchLoader, DataLoader))
    assert len(got) == len(expected) == (4 if drop_last else 5)
    same_batches(got, expected)


class Slow(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        import time
        time.sleep(3)
        return i


def test_timeout_says_what_torch_says():
    """A batch slower than `timeout` raises RuntimeError with torch's 'DataLoader timed out after N seconds'."""
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after \d+ seconds"):
        next(iter(DataLoader(Slow(), batch_size=2, num_workers=2, timeout=1)))


@pytest.mark.parametrize("attr", ["batch_size", "sampler", "batch_sampler", "drop_last", "dataset",
                                  "persistent_workers"])
def test_assigning_fixed_attributes_after_construction_raises_like_torch(attr):
    """Setting batch_size, sampler, batch_sampler, drop_last, dataset or persistent_workers on a built
    loader raises torch's ValueError; other attributes are torch's to set."""
    with pytest.raises(ValueError) as theirs:
        setattr(TorchLoader(Mixed()), attr, {})
    with pytest.raises(ValueError) as ours:
        setattr(DataLoader(Mixed()), attr, {})
    assert str(ours.value) == str(theirs.value)
    loader = DataLoader(Mixed(), num_workers=1)
    loader.num_workers = 2
    assert loader.num_workers == 2 and len(list(loader)) == 97


def test_the_class_is_generic_like_torchs():
    """DataLoader[list[torch.Tensor]] is valid in annotations, as torch's class is Generic."""
    alias = DataLoader[list[torch.Tensor]]
    assert alias.__origin__ is DataLoader


class Counting(torch.utils.data.IterableDataset):
    """Not sharded by worker: each worker yields all 20 samples, more than len()."""

    def __iter__(self):
        return iter(range(20))

    def __len__(self):
        return 20


def test_an_iterable_dataset_yielding_past_its_len_warns_like_torch():
    """After len(loader) was read, every batch past that length warns as torch does; none before."""
    loader = DataLoader(Counting(), num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sum(1 for _ in loader) == 40  # len() not read yet: no warning
    assert len(loader) == 20
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            next(it)
    for _ in range(3):
        with pytest.warns(UserWarning, match=r"but [0-9]+ samples have been fetched\. For multiprocessing"):
            next(it)


START_METHOD = """
import multiprocessing, sys
import torch
from spindle.torch import DataLoader

MARK = "as imported"


class WhereLoaded(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return MARK


if __name__ == "__main__":
    multiprocessing.set_start_method(sys.argv[1])
    MARK = "set in the parent"  # forked workers see this; new interpreters re-import the module
    print(sorted({s for b in DataLoader(WhereLoaded(), batch_size=2, num_workers=2) for s in b}))
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_the_global_start_method_is_honoured(method, tmp_path):
    """With multiprocessing_context=None, multiprocessing.set_start_method('spawn'|'forkserver') starts
    workers as new interpreters, as torch does; 'fork' forks."""
    script = tmp_path / "start_method.py"
    script.write_text(START_METHOD)
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = "set in the parent" if method == "fork" else "as imported"
    assert done.stdout.strip() == repr([expected]), done.stdout


class StuckFirst(Dataset):
    """Sample 0 takes 3 seconds; the others are instant."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        import time
        if i == 0:
            time.sleep(3)
        return i


@needs_in_order
@pytest.mark.parametrize("cls", [TorchLoader, DataLoader], ids=["torch", "spindle"])
def test_out_of_order_loading_stops_feeding_a_stuck_worker(cls):
    """in_order=False: while one worker is stuck, the others get the following batches; at most
    prefetch_factor batches (those the stuck worker already holds) arrive after the stuck one."""
    delivered = [int(b) for b in cls(StuckFirst(), batch_size=1, num_workers=2, prefetch_factor=2, in_order=False)]
    assert sorted(delivered) == list(range(12))
    assert delivered.index(0) >= len(delivered) - 2, delivered


@needs_in_order
def test_out_of_order_iterable_datasets_give_torchs_batches():
    """in_order=False over an IterableDataset that shards by worker: the same batches as torch's."""
    expected, got = both(Shards(), batch_size=3, num_workers=3, in_order=False)
    key = lambda b: b["value"].tolist()  # noqa: E731
    expected, got = sorted(expected, key=key), sorted(got, key=key)
    same_batches(got, expected)


def test_workers_exit_when_the_iterator_is_dropped_early():
    """torch's test_partial_workers: breaking out after a few batches and dropping the iterator ends
    every worker process."""
    import os
    import time
    it = iter(DataLoader(Mixed(), batch_size=2, num_workers=4))
    pids = it.worker_pids
    for i, _ in enumerate(it):
        if i == 10:
            break
    del it
    gc.collect()
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)


@pytest.mark.parametrize("persistent", [False, True])
def test_shuffling_datapipes_are_seeded_and_sharded_like_torch(persistent):
    """An IterDataPipe with shuffle and sharding_filter: each worker shuffles with torch's shared seed
    and keeps its shard, so every epoch (seeded through torch.manual_seed) equals torch's."""
    import torch.utils.data.datapipes as dp

    def epochs(cls):
        pipe = dp.iter.IterableWrapper(range(100)).shuffle(buffer_size=20).sharding_filter()
        loader = cls(pipe, num_workers=2, shuffle=True, persistent_workers=persistent)
        out = []
        for seed in (123, 123, 321):
            torch.manual_seed(seed)
            out.append([int(x) for x in loader])
        return out

    expected, got = epochs(TorchLoader), epochs(DataLoader)
    assert got == expected
    assert sorted(got[0]) == list(range(100)) and got[0] == got[1] != got[2]


def test_nested_tensors_get_torchs_collate_error_and_work_with_a_custom_collate():
    """Samples the zero-copy path cannot lay out (nested tensors) go to torch's collate: torch's error
    under default collate, and the samples themselves under a custom one."""
    data = [torch.nested.nested_tensor([torch.full((5,), float(i))]) for i in range(6)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype-API warning for nested tensors
        with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
            next(iter(DataLoader(data, batch_size=1, num_workers=2)))
        got = list(DataLoader(data, batch_size=1, num_workers=2, collate_fn=lambda b: [x.clone() for x in b]))
    for i, batch in enumerate(got):
        assert torch.equal(batch[0].to_padded_tensor(0.0), data[i].to_padded_tensor(0.0))


@pytest.mark.parametrize("persistent", [False, True])
def test_the_iterators_workers_report_how_they_ended_like_processes(persistent):
    """The iterator's _workers (what torch's test_partial_workers reads) are Process-like: alive while
    loading, and once the iterator is dropped not alive with exitcode 0 (recorded by the runtime when
    it reaped them); a worker killed by a signal reports minus the signal number."""
    import os
    import signal
    it = iter(DataLoader(Mixed(), batch_size=2, num_workers=3, persistent_workers=persistent))
    workers = it._workers
    assert [w.pid for w in workers] == it.worker_pids
    next(it)
    assert all(w.is_alive() and w.exitcode is None for w in workers)
    del it
    gc.collect()
    for w in workers:
        w.join(30)
        assert not w.is_alive() and w.exitcode == 0
        w.terminate()  # a worker already reaped: nothing to signal
    it = iter(DataLoader(Mixed(), batch_size=2, num_workers=2))
    victim = it._workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="is killed by signal: Killed"):
        list(it)
    assert victim.exitcode == -signal.SIGKILL and not victim.is_alive()
    assert it._workers[0].exitcode == 0


class CountsItsEpochs(torch.utils.data.IterableDataset):
    """Each worker yields its share of 0..11 tagged with how many epochs this process's copy of the
    dataset has iterated: state kept inside the worker."""

    def __init__(self):
        self.epochs = 0

    def __iter__(self):
        info = get_worker_info()
        self.epochs += 1
        for i in range(info.id, 12, info.num_workers):
            yield torch.tensor([info.id, self.epochs, i])


def _note_init(path, worker_id):
    import os
    with open(path, "a") as f:
        f.write(f"{worker_id} {os.getpid()}\n")


@pytest.mark.parametrize("persistent", [False, True])
def test_persistent_stream_workers_keep_their_process_and_state_across_epochs(persistent, tmp_path):
    """An IterableDataset with persistent_workers=True: each epoch calls iter(dataset) again in the same
    worker processes (worker_init_fn once per worker, state kept in the worker carries over), so three
    epochs give torch's batches; without persistent workers every epoch starts afresh, as in torch."""
    from functools import partial
    ours_log, theirs_log = tmp_path / "ours", tmp_path / "theirs"

    def epochs(cls, log):
        loader = cls(CountsItsEpochs(), batch_size=2, num_workers=2, persistent_workers=persistent,
                     worker_init_fn=partial(_note_init, str(log)))
        out, pids = [], []
        for _ in range(3):
            it = iter(loader)
            out.append([b.tolist() for b in it])
            pids.append(getattr(it, "worker_pids", None))
        return out, pids

    ours, pids = epochs(DataLoader, ours_log)
    theirs, _ = epochs(TorchLoader, theirs_log)
    assert ours == theirs
    assert [row[1] for epoch in ours for batch in epoch for row in batch][-1] == (3 if persistent else 1)
    assert len(ours_log.read_text().splitlines()) == len(theirs_log.read_text().splitlines())
    if persistent:
        assert pids[0] == pids[1] == pids[2]


class LateDifference(Dataset):
    """Plain samples of one structure, but one sample's label is a float: torch's collate makes that batch float."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return np.full((2, 3), i, np.uint8), (float(i) if i == 21 else i)


def test_a_sample_that_differs_after_matching_ones_gets_torchs_collate():
    """A batch whose later sample leaves the one-call array path is collated as torch collates it, before and after."""
    expected, got = both(LateDifference(), batch_size=8, num_workers=2)
    assert len(got) == 5
    for k, (a, b) in enumerate(zip(got, expected)):
        same(a, b, f"batch {k}")
    assert got[2][1].dtype == torch.float32 and got[3][1].dtype == torch.int64


class _TrackedImage(np.ndarray):
    """An array whose live instances a stream can count (ndarrays take weak references)."""


class _CountingStream(torch.utils.data.IterableDataset):
    """Yields (image, how many of this worker's earlier images were alive then); every 5th batch of 8
    (from sample 21 on) an image turns non-contiguous mid-batch, leaving the one-call path."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        import weakref
        info = torch.utils.data.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        alive = []
        for i in range(w, self.n, k):
            alive = [r for r in alive if r() is not None]
            image = np.full((6, 4), i, np.int32)
            image = (image.T.copy().T if i % 40 == 21 else image).view(_TrackedImage)
            alive.append(weakref.ref(image))
            yield image, len(alive) - 1


def test_stream_workers_copy_each_sample_as_they_read_it_and_give_torchs_batches():
    """An IterableDataset's workers copy each sample into the slot as it comes from the stream and let it
    go (at most two earlier ones alive, torch holds a whole batch); a sample that leaves the array path
    mid-batch (non-contiguous) gets the batch collated as before; the images are torch's, batch for batch."""
    expected, got = both(_CountingStream(203), batch_size=8, num_workers=2)
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        same(a[0], b[0], f"batch {k}")
    plain = [b for b in got if not any(int(i) % 40 == 21 for i in b[0][:, 0, 0])]
    assert len(plain) >= 20 and max(int(b[1].max()) for b in plain) <= 2
    assert max(int(b[1].max()) for b in expected) >= 7  # torch's worker holds its batch
