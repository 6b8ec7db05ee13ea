"""spindle.DataLoader: order, values, structure and lifetime of batches."""

import gc
import logging
import os
import warnings

import numpy as np
import pytest

import spindle
from toy_datasets import Images, Nested, Pair


def labels(batch):
    return batch[:, 0, 0, 0].tolist()


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_sequential_batches_hold_every_sample_in_order(num_workers):
    """Without shuffle, batch k holds samples k*B..k*B+B-1 with their own values."""
    loader = spindle.DataLoader(Images(1000), batch_size=64, num_workers=num_workers)
    batches = list(loader)
    assert len(batches) == len(loader) == 16
    assert batches[-1].shape == (1000 - 15 * 64, 8, 8, 3)
    got = [v for b in batches for v in labels(b)]
    assert got == [i % 251 for i in range(1000)]
    assert all(b.dtype == np.uint8 for b in batches)


def test_drop_last_drops_the_short_batch():
    """drop_last=True yields only full batches, and len() agrees."""
    loader = spindle.DataLoader(Images(1000), batch_size=64, num_workers=2, drop_last=True)
    batches = list(loader)
    assert len(batches) == len(loader) == 15
    assert all(b.shape[0] == 64 for b in batches)


def test_shuffle_with_seed_is_a_reproducible_permutation_that_changes_per_epoch():
    """The same seed gives the same order; each epoch is a new permutation of all samples."""
    ds = Images(500, shape=(2,))
    ds.__getitem__ = None  # type: ignore[assignment]  # (instance attr unused by the protocol)

    class Index:
        def __len__(self):
            return 500

        def __getitem__(self, i):
            return np.int64(i)

    a = spindle.DataLoader(Index(), batch_size=50, shuffle=True, num_workers=2, seed=7)
    b = spindle.DataLoader(Index(), batch_size=50, shuffle=True, num_workers=0, seed=7)
    ea1 = np.concatenate(list(a))
    ea2 = np.concatenate(list(a))
    eb1 = np.concatenate(list(b))
    assert sorted(ea1.tolist()) == list(range(500))
    assert ea1.tolist() == eb1.tolist()          # workers do not change the order
    assert ea1.tolist() != ea2.tolist()          # a new permutation each epoch
    assert ea1.tolist() != list(range(500))


def test_nested_samples_batch_like_their_structure():
    """Dicts, tuples, lists, namedtuples and Python scalars batch leaf by leaf."""
    batches = list(spindle.DataLoader(Nested(), batch_size=10, num_workers=2))
    first = batches[0]
    assert set(first) == {"image", "meta", "pair"}
    assert first["image"].shape == (10, 3, 4) and first["image"].dtype == np.float32
    i, half, even, small = first["meta"]
    assert i.dtype == np.int64 and half.dtype == np.float64 and even.dtype == np.bool_
    assert small.dtype == np.int16
    assert isinstance(first["pair"], Pair) and isinstance(first["pair"].y, list)
    idx = np.concatenate([b["meta"][0] for b in batches])
    assert idx.tolist() == list(range(103))
    last = batches[-1]
    assert last["image"].shape == (3, 3, 4)
    np.testing.assert_array_equal(last["image"][:, 0, 0], [100, 101, 102])
    np.testing.assert_array_equal(last["pair"].x[:, 1], [-100, -101, -102])


def test_out_of_order_delivery_yields_every_batch_once():
    """in_order=False may reorder batches but loses and repeats none."""
    loader = spindle.DataLoader(Images(1000, shape=(1,)), batch_size=10, num_workers=3, in_order=False)
    got = sorted(v for b in loader for v in b[:, 0].tolist())
    assert got == sorted(i % 251 for i in range(1000))


def test_batches_are_writable_views_that_outlive_the_loader():
    """Batches can be written to, and stay valid after the loader and its iterator are gone."""
    loader = spindle.DataLoader(Images(256), batch_size=32, num_workers=2)
    it = iter(loader)
    first, second = next(it), next(it)
    first[0, 0, 0, 0] = 200
    del it, loader
    gc.collect()
    assert first[0, 0, 0, 0] == 200 and labels(first)[1:] == list(range(1, 32))
    assert labels(second) == list(range(32, 64))


def test_keeping_every_batch_copies_out_quietly_logs_once_and_never_corrupts(caplog):
    """Holding all batches exhausts the ring: later batches are copied out, with no warning (torch has
    none for list(loader)) and one INFO record on the "spindle" logger; none is overwritten."""
    loader = spindle.DataLoader(Images(3000), batch_size=16, num_workers=2)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO, logger="spindle"):
        warnings.simplefilter("always")
        kept = list(loader)
    assert [str(w.message) for w in caught if "shared memory" in str(w.message)] == []
    copied = [r for r in caplog.records if r.name == "spindle" and "copied out of shared memory" in r.getMessage()]
    assert len(copied) == 1 and copied[0].levelno == logging.INFO
    assert [v for b in kept for v in labels(b)] == [i % 251 for i in range(3000)]


def test_a_sample_with_another_shape_names_the_sample_and_both_shapes():
    """A sample whose shape differs from the first sample raises ValueError naming it."""

    class Ragged(Images):
        def __getitem__(self, i):
            return np.zeros((3,) if i != 37 else (4,), np.float32)

    with pytest.raises(ValueError, match=r"sample 37: field <sample> has shape \(4,\).*had shape \(3,\)") as e:
        list(spindle.DataLoader(Ragged(100), batch_size=8, num_workers=2))
    assert "sample index 37" in "".join(getattr(e.value, "__notes__", []))


def test_unsupported_leaf_types_are_refused_with_the_field_path():
    """A string field raises a TypeError-like error naming the field and what to do."""

    class Strings(Images):
        def __getitem__(self, i):
            return {"name": f"img{i}"}

    with pytest.raises(ValueError, match=r"field \['name'\] is a str"):
        list(spindle.DataLoader(Strings(10), batch_size=2, num_workers=0))


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size should be a positive integer value, but got batch_size=0"),
    ({"num_workers": -1}, "num_workers option should be non-negative"),
    ({"timeout": -1}, "timeout option should be non-negative"),
    ({"prefetch_factor": 0}, "prefetch_factor should be at least 1"),
])
def test_bad_arguments_raise_value_errors_naming_the_argument(kwargs, message):
    """Invalid arguments fail at construction with the argument's name (torch's words where torch has
    them: tests/python/test_argument_errors.py compares them with torch's)."""
    with pytest.raises(ValueError, match=message):
        spindle.DataLoader(Images(10), **kwargs)


def test_max_threads_below_the_worker_count_raises_the_budget_error():
    """A user cap smaller than num_workers fails before any worker starts."""
    loader = spindle.DataLoader(Images(10), batch_size=2, num_workers=4, max_threads=3)
    with pytest.raises(spindle.ThreadBudgetError, match="4 workers do not fit the thread budget of 3 tasks"):
        iter(loader)


def test_persistent_workers_serve_every_epoch_with_the_same_processes():
    """persistent_workers=True reuses the worker pids across epochs; each epoch is complete and reshuffled."""
    loader = spindle.DataLoader(Images(700, shape=(1,)), batch_size=32, shuffle=True, seed=3, num_workers=2,
                                persistent_workers=True)
    epochs, pids = [], set()
    for _ in range(3):
        it = iter(loader)
        epochs.append([v for b in it for v in b[:, 0].tolist()])
        pids.add(tuple(it.worker_pids))
    assert len(pids) == 1
    assert all(sorted(e) == sorted(i % 251 for i in range(700)) for e in epochs)
    assert epochs[0] != epochs[1]
    # Abandoning an epoch midway: the next epoch still starts clean and complete.
    it = iter(loader)
    next(it)
    again = [v for b in iter(loader) for v in b[:, 0].tolist()]
    assert sorted(again) == sorted(i % 251 for i in range(700))
    with pytest.raises(RuntimeError, match="belongs to an earlier epoch"):
        next(it)
    loader.close()
    assert not any(os.path.exists(f"/proc/{p}") for p in next(iter(pids)))


def test_a_sample_with_other_keys_names_the_sample_and_both_structures():
    """A dict sample whose keys differ from its batch's first raises ValueError naming both samples and structures."""

    class Keys(Images):
        def __getitem__(self, i):
            return {"x": np.zeros(2), "y": i} if i != 21 else {"x": np.zeros(2), "z": i}

    with pytest.raises(ValueError, match=r"sample 21 has structure \{'x': leaf, 'z': leaf\}, but sample 16 \(the "
                                         r"first of its batch\) had \{'x': leaf, 'y': leaf\}") as e:
        list(spindle.DataLoader(Keys(40), batch_size=8, num_workers=2))
    assert e.value.sample_index == 21


def test_dataset_code_never_runs_in_the_consumer():
    """Nothing is read in the consumer to plan the ring: a lazily opened handle is opened only by the workers."""

    class LazyHandle(Images):
        opened_by: set = set()

        def __getitem__(self, i):
            if getattr(self, "_opened_in", None) != os.getpid():
                self._opened_in = os.getpid()  # e.g. h5py.File(...) / lmdb.open(...) on first use
                if os.getpid() == consumer:
                    raise AssertionError("dataset opened its handle in the consumer process")
            return super().__getitem__(i)

    consumer = os.getpid()
    ds = LazyHandle(300)
    got = [v for b in spindle.DataLoader(ds, batch_size=30, num_workers=2, shuffle=True, seed=0)
           for v in labels(b)]
    assert sorted(got) == sorted(i % 251 for i in range(300))
    assert getattr(ds, "_opened_in", None) is None


def test_non_contiguous_samples_are_batched_correctly():
    """Samples that are strided views (not C-contiguous) take the general copy and keep their values."""

    class Strided(Images):
        def __init__(self):
            super().__init__(64)
            self.data = np.arange(64 * 6 * 4, dtype=np.float32).reshape(64, 6, 4)

        def __getitem__(self, i):
            return self.data[i].T if i % 2 else self.data[i, ::-1].T.copy()  # mixed: views and copies

    ds = Strided()
    batches = list(spindle.DataLoader(ds, batch_size=16, num_workers=2))
    got = np.concatenate(batches)
    want = np.stack([ds[i] for i in range(64)])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("make", [
    lambda i: (np.full((2, 3), i, np.uint8), i),
    lambda i: [np.float32(i), float(i), i % 2 == 0],
    lambda i: {"x": np.arange(4) + i, "y": i},
    lambda i: np.full((5,), i, np.int16),
    lambda i: {"nested": (np.zeros(2) + i, i)},
    lambda i: (np.full((2, 3), i, np.uint8)[:, ::2], i),  # non-contiguous rows
])
def test_batched_fields_equal_stacking_each_field(make):
    """Batching (fast or checked path) equals np.stack of each field, with Python scalars as int64/float64/bool."""
    from spindle._runtime.layout import BatchReader, collate_local, flatten
    samples = [make(i) for i in range(7)]
    batch = collate_local(samples, list(range(7)), BatchReader())
    _, got = flatten(batch, 0)
    per_sample = [flatten(s, i)[1] for i, s in enumerate(samples)]
    for f, (_, array) in enumerate(got):
        expected = np.stack([leaves[f][1] for leaves in per_sample])
        assert array.dtype == expected.dtype and np.array_equal(array, expected)


class _Made:
    """Map-style dataset over a sample-making function (module level: picklable by reference)."""

    def __init__(self, make, n=40):
        self.make, self.n = make, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(i)


class _Memmap(np.ndarray):
    """An ndarray subclass (as np.memmap or a user's array type is)."""


_SAMPLE_KINDS = [
    lambda i: (np.full((4, 4, 3), i, np.uint8), i),
    lambda i: {"x": np.arange(6, dtype=np.float32).reshape(2, 3) + i, "y": float(i), "z": i % 3 == 0},
    lambda i: [np.int64(i), np.float32(i) / 3, np.bool_(i % 2), np.uint16(i), np.complex64(i)],
    lambda i: Pair(np.full(3, -i, np.int32), [np.float64(i), (i, -i)]),
    lambda i: {"nested": {"deep": (np.zeros(2) + i, [i, 2 * i])}, "flag": np.array(i % 2 == 0)},
    lambda i: (np.arange(8, dtype=np.int16)[::2] + i, np.longlong(i)),           # non-contiguous; int64 alias
    lambda i: (np.full((2, 2), i, np.float64).view(_Memmap), -(2 ** 62) + i),    # subclass; big ints
    lambda i: (np.full(3, i, np.int64) if i % 5 else np.full(3, i, np.int64).astype(">i8").astype("<i8"),
               np.float64(i) if i % 2 else float(i)),                            # mixed leaf kinds, same dtype
    lambda i: np.array(i, np.float16),                                           # a bare 0-d array
    lambda i: {1: np.full(2, i, np.uint8), "b": (i,)},                           # non-str keys
    lambda i: {"x": (np.arange(6, dtype=np.int32).reshape(2, 3) + i)[:, ::-1] if i in (13, 22, 39) else
               np.ascontiguousarray((np.arange(6, dtype=np.int32).reshape(2, 3) + i)[:, ::-1]),
               "n": i, "f": i / 2, "b": i % 3 == 0, "s": np.float32(i), "z": np.array(i, np.int16),
               "p": Pair(np.full(2, i, np.uint8), [i])},  # copied as read, then one that is not: the rest rebuilt
]


@pytest.mark.parametrize("make", _SAMPLE_KINDS)
def test_worker_batches_equal_the_in_process_python_path(make):
    """Batches written by the workers' one-call path are the Python path's, value, dtype and container for container."""
    from spindle._runtime.layout import BatchReader, collate_local, flatten
    ds = _Made(make)
    got = list(spindle.DataLoader(ds, batch_size=8, num_workers=2))
    assert len(got) == 5
    for b, batch in enumerate(got):
        indices = list(range(8 * b, 8 * b + 8))
        want = collate_local([ds[i] for i in indices], indices, BatchReader())
        tree_got, leaves_got = flatten(batch, 0)
        tree_want, leaves_want = flatten(want, 0)
        assert tree_got == tree_want
        for (path, g), (_, w) in zip(leaves_got, leaves_want):
            assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), (b, path)


class _Tracked(np.ndarray):
    """An array whose live instances a dataset can count (ndarrays take weak references)."""


class _LiveCount:
    """Each sample carries how many of this worker's earlier samples were still alive when it was read;
    with `vary`, every batch of 32 has images of its own height."""

    def __init__(self, n, vary=False):
        self.n, self.vary, self.alive = n, vary, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import weakref
        self.alive = [r for r in self.alive if r() is not None]
        sample = np.full((64 + (i // 32 if self.vary else 0), 64), i, np.uint8).view(_Tracked)
        count = len(self.alive)
        self.alive.append(weakref.ref(sample))
        return sample, count


@pytest.mark.parametrize("vary", [False, True], ids=["one structure", "a structure per batch"])
def test_a_worker_lets_go_of_each_sample_once_it_is_in_the_slot(vary):
    """A worker does not hold a batch of samples: each is copied into the slot as it is read and let go once
    the next one is read, from the first batch on (before: a whole batch, 31 earlier samples alive at the
    last read); the values stay right."""
    images, alive = [], []
    for image, count in spindle.DataLoader(_LiveCount(256, vary), batch_size=32, num_workers=2):
        images.append(image[:, [0, -1], [0, -1]].copy())
        alive.append(int(count.max()))
    images = np.concatenate(images)
    assert (images[:, 0] == np.arange(256) % 256).all() and (images[:, 1] == np.arange(256)).all()
    # At most two earlier samples are alive when one is read: the previous one (let go once the next is
    # read) and the batch's first, which chose the layout.
    assert max(alive) <= 2, alive


def _python_path_is_refused(*args, **kwargs):
    raise AssertionError("the Python path (Columns) was taken")


@pytest.mark.parametrize("make", [_SAMPLE_KINDS[0], _SAMPLE_KINDS[1], _SAMPLE_KINDS[3], _SAMPLE_KINDS[4]])
def test_plain_samples_are_written_in_one_call_without_the_python_path(monkeypatch, make):
    """Samples of one structure (arrays, Python and numpy scalars, nested containers) never reach Columns, the per-sample Python path."""
    import spindle._runtime.layout
    monkeypatch.setattr(spindle._runtime.layout, "Columns", _python_path_is_refused)  # the forked workers inherit it
    assert len(list(spindle.DataLoader(_Made(make), batch_size=8, num_workers=2))) == 5


def test_a_sample_of_another_structure_after_matching_ones_is_named():
    """A sample differing from earlier ones of its batch (and from the previous batch) is named with both structures."""

    def make(i):
        return (np.zeros(2), i) if i != 21 else (np.zeros(2), i, i)

    with pytest.raises(ValueError, match=r"sample 21 has structure tuple\(leaf, leaf, leaf\), but sample 16") as e:
        list(spindle.DataLoader(_Made(make), batch_size=8, num_workers=1))
    assert "sample index 21" in "".join(getattr(e.value, "__notes__", []))
