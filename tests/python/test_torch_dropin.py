"""spindle.torch.DataLoader against torch.utils.data.DataLoader, run side by side on the same inputs."""

import collections
import gc
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import (BatchSampler, DataLoader as TorchLoader, Dataset, SequentialSampler,  # noqa: E402
                              SubsetRandomSampler, WeightedRandomSampler, get_worker_info)

from spindle.torch import DataLoader  # noqa: E402

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
    dict(batch_size=7, num_workers=2, in_order=False),
    dict(batch_size=None, num_workers=2),
], ids=["sequential", "shuffle", "drop_last", "subset-sampler", "weighted-sampler", "batch-sampler-list",
        "batch-sampler", "out-of-order", "no-batching"])
def test_same_batches_as_torch_for_the_same_arguments(kwargs):
    """Order, values, dtypes and structure equal torch's for samplers, generators and batching options."""
    expected, got = both(Mixed(), **kwargs)
    if kwargs.get("in_order") is False:  # only the set of batches is defined
        key = lambda b: b["pair"][0].tolist()  # noqa: E731
        expected, got = sorted(expected, key=key), sorted(got, key=key)
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        same(a, b, f"batch {k}")


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
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        same(a, b, f"batch {k}")


@pytest.mark.parametrize("context", ["spawn", "forkserver", "fork"])
def test_multiprocessing_contexts_give_torchs_batches(context):
    """'spawn' and 'forkserver' start workers as new interpreters (nothing forked), 'fork' forks; all give
    torch's batches, for map-style and iterable datasets."""
    for dataset, kwargs in ((Mixed(), dict(batch_size=8, shuffle=True, seed=3)), (Shards(), dict(batch_size=3))):
        expected, got = both(dataset, num_workers=2, multiprocessing_context=context, **kwargs)
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            same(a, b)


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
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            same(a, b)


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
