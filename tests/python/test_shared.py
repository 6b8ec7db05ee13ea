"""spindle.shared (SharedList, SharedDict) and the loaders' share="auto": the dataset's plain-value
attributes stored once in shared memory, read by forked and spawned workers; per-worker USS in stats().
"""

import gc
import logging
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import spindle
from spindle import SharedDict, SharedList
from spindle._runtime import sharing
from spindle._runtime.sharing import MemoryWatch, share_for_workers

plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=4),
    max_leaves=12)
keys = st.text() | st.integers() | st.binary() | st.none() | st.tuples(st.integers(), st.text())


def _spindle_names(pid: int) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"spindle.{pid}.")]


@pytest.mark.parametrize("make", [spindle.shared, SharedList.inherited], ids=["segment", "inherited"])
@settings(max_examples=60, deadline=None)
@given(original=st.lists(plain, max_size=20) | st.tuples(plain, plain, plain), data=st.data())
def test_shared_list_reads_as_the_original(make, original, data):
    """Proves: indexing (negative too), slicing, len, iteration, `in`, index/count and equality of a
    SharedList give what the original list or tuple gives, down to the types of nested values, stored in
    a segment or read in place (inherited)."""
    s = make(original)
    assert isinstance(s, SharedList)
    assert len(s) == len(original)
    assert repr(list(s)) == repr(list(original))  # repr tells 1 from True, a tuple from a list
    for i in range(-len(original), len(original)):
        assert repr(s[i]) == repr(original[i])
    cut = slice(data.draw(st.integers(-25, 25) | st.none()), data.draw(st.integers(-25, 25) | st.none()),
                data.draw(st.sampled_from([None, 1, 2, -1, -3])))
    assert repr(s[cut]) == repr(original[cut])
    assert s == original and not (s != original)
    for x in original[:3]:
        assert x in s and s.index(x) == original.index(x) and s.count(x) == original.count(x)
    with pytest.raises(IndexError):
        s[len(original)]


def test_an_inherited_list_copies_items_out_without_touching_the_originals():
    """Proves: reading an inherited SharedList returns equal new objects (nested lists, dicts, tuples,
    floats, bytes, non-ASCII str) and leaves every original's reference count as it was; it refuses
    a list that holds something not plain, and pickles (for a spawned process) as its items."""
    items = [f"/data/img_{i:06d}.jpg" + "é" * (i % 2) for i in range(1000)]
    items += [b"x" * 100, 2.5, 1 << 80, [1, "two", (3.0, None)], {"box": [1, 2, 3, 4], "id": 7, "ok": True}]
    before = [sys.getrefcount(x) for x in items]
    view = SharedList.inherited(items)
    got = [view[i] for i in range(len(items))] + view[990:995]
    assert got[:len(items)] == items and got[len(items):] == items[990:995]
    big = items.index(1 << 80)
    assert got[big] is items[big], "an int past 64 bits is the one exception: shared as itself"
    assert all(a is not b for a, b in zip(got, items) if b is not items[big])
    after = [sys.getrefcount(x) for x in items]
    assert after[:big] + after[big + 1:] == before[:big] + before[big + 1:], "a read wrote a reference count"
    assert view == items and len(view) == len(items) and view.nbytes == 0
    again = pickle.loads(pickle.dumps(view))
    assert isinstance(again, SharedList) and again == items
    with pytest.raises(TypeError, match="read-only"):
        view.append(1)
    with pytest.raises(TypeError, match="plain"):
        SharedList.inherited(items + [object()])


def _uss_after_reading_all(items) -> int:
    """A forked child's private memory after it reads every item (frozen as spindle's workers are)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            gc.freeze()
            total = sum(len(x) for x in items)
            os.write(w, f"{spindle._core.process_memory(os.getpid()).uss} {total}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        uss, total = (int(x) for x in f.read().split())
    os.waitpid(pid, 0)
    assert total == sum(len(x) for x in items)
    return uss


def test_a_forked_process_reads_an_inherited_list_without_copying_its_pages():
    """Proves: a child that reads all of a 1M-path list copies its pages (the reference counts), while one
    that reads it through SharedList.inherited keeps them shared: its private memory stays a small part."""
    paths = [f"/datasets/imagenet/train/n{i % 1000:08d}/img_{i:09d}.JPEG" for i in range(1_000_000)]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        copied = _uss_after_reading_all(paths)
        in_place = _uss_after_reading_all(SharedList.inherited(paths))
    assert copied > 80 << 20, f"reading the list should copy ~100 MiB of pages, the child has {copied >> 20} MiB"
    assert in_place < copied / 4, f"{in_place >> 20} MiB private reading in place, {copied >> 20} MiB copying"


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(keys, plain, max_size=20), keys)
def test_shared_dict_reads_as_the_original(original, probe):
    """Proves: d[k], get, `in`, len, iteration order, keys/values/items and equality of a SharedDict
    are the original dict's, also for a key that is missing."""
    d = spindle.shared(original)
    assert isinstance(d, SharedDict)
    assert len(d) == len(original)
    assert list(d) == list(original)
    assert repr(list(d.items())) == repr(list(original.items()))
    assert repr(list(d.values())) == repr(list(original.values()))
    assert d == original and original == d
    for k, v in original.items():
        assert k in d and repr(d[k]) == repr(v) and repr(d.get(k)) == repr(v)
    assert (probe in d) == (probe in original)
    assert repr(d.get(probe, "missing")) == repr(original.get(probe, "missing"))
    if probe not in original:
        with pytest.raises(KeyError):
            d[probe]


def test_shared_dict_finds_keys_equal_as_dict_keys():
    """Proves: 1, 1.0 and True are one key in a SharedDict as in a dict; an unhashable key raises TypeError."""
    d = spindle.shared({1: "one", (2, "b"): "pair", 2.5: "half"})
    assert d[1.0] == d[True] == "one" and d[(2, "b")] == "pair" and d[2.5] == "half"
    assert "1" not in d
    with pytest.raises(TypeError):
        d[[1]]


def test_shared_containers_are_read_only():
    """Proves: every mutation of a SharedList or SharedDict raises TypeError saying it is read-only."""
    s = spindle.shared(["a", "b"])
    d = spindle.shared({"a": 1})
    for mutate in (lambda: s.__setitem__(0, "x"), lambda: s.append("c"), lambda: s.__delitem__(0),
                   lambda: s.sort(), lambda: s.extend([1]), lambda: d.__setitem__("b", 2), lambda: d.update(b=2),
                   lambda: d.pop("a"), lambda: d.__delitem__("a"), lambda: d.clear()):
        with pytest.raises(TypeError, match="read-only"):
            mutate()
    with pytest.raises(TypeError, match="read-only"):
        s += ["c"]
    assert list(s) == ["a", "b"] and dict(d) == {"a": 1}


def test_shared_refuses_what_is_not_plain_naming_the_item():
    """Proves: an item that is not a plain value (an object, a dict subclass) is refused with a TypeError
    naming its position and type, and a non-container with one naming its type."""
    from collections import OrderedDict

    with pytest.raises(TypeError, match=r"item 2 holds a .*object"):
        spindle.shared([1, "a", object()])
    with pytest.raises(TypeError, match=r"item 0 holds a collections.OrderedDict"):
        spindle.shared([OrderedDict(a=1)])
    with pytest.raises(TypeError, match="not set"):
        spindle.shared({1, 2})


def test_pickled_container_is_a_handle_not_the_data():
    """Proves: a pickled SharedList is a few hundred bytes however large it is, and unpickles (here, by
    reopening its segment) to equal values."""
    original = [f"/data/train/{i:07d}.jpg" for i in range(200_000)]
    s = spindle.shared(original)
    data = pickle.dumps(s)
    assert len(data) < 500
    again = pickle.loads(data)
    assert again[123_456] == original[123_456] and len(again) == len(original)


def test_segment_is_released_with_the_last_reference_and_never_named():
    """Proves: a shared container's segment has no name in /dev/shm while it lives, and its descriptor is
    closed when the last reference goes."""
    s = spindle.shared(list(range(1000)))
    fd = s._store.fd()
    assert _spindle_names(os.getpid()) == []
    os.fstat(fd)
    del s
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)


def test_no_shared_memory_left_by_a_killed_owner():
    """Proves: a process SIGKILLed while holding a shared container leaves nothing in /dev/shm."""
    code = ("import os, signal, spindle; x = spindle.shared(list(range(200000))); "
            "print(os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _spindle_names(int(proc.stdout.split()[0])) == []


class Paths:
    """A map dataset holding a list of paths, as image datasets do; item i is the number in path i."""

    def __init__(self, n: int) -> None:
        self.paths = [f"/data/{i}.jpg" for i in range(n)]
        self.meta = {"root": "/data"}

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        shared = isinstance(self.paths, SharedList)
        return np.array([int(self.paths[i][6:-4]), shared], dtype=np.int64)


def test_auto_sharing_converts_large_attributes_and_leaves_the_dataset_alone(caplog):
    """Proves: share_for_workers gives a copy whose large list is a SharedList (small ones kept), logs one
    INFO line naming the attribute, goes into Subset/ConcatDataset-style wrappers, and changes nothing
    of the user's objects; share="off" gives the dataset itself."""
    ds = Paths(150_000)
    with caplog.at_level(logging.INFO, logger="spindle"):
        seen = share_for_workers(ds)
    assert isinstance(seen.paths, SharedList) and seen.paths == ds.paths
    assert type(ds.paths) is list and seen.meta is ds.meta and seen is not ds
    lines = [r.getMessage() for r in caplog.records if "dataset.paths" in r.getMessage()]
    assert len(lines) == 1 and "150,000 items" in lines[0]
    assert share_for_workers(ds, "off") is ds

    class Subset:
        def __init__(self, dataset, indices):
            self.dataset, self.indices = dataset, indices

        def __getitem__(self, i):
            return self.dataset[self.indices[i]]

    class Concat:
        def __init__(self, datasets):
            self.datasets = datasets

        def __getitem__(self, i):
            return self.datasets[0][i]

    wrapped = Concat([Subset(ds, list(range(10))), Paths(10)])
    seen = share_for_workers(wrapped)
    assert isinstance(seen.datasets[0].dataset.paths, SharedList)
    assert seen.datasets[1] is wrapped.datasets[1]  # nothing large: the object itself
    assert type(wrapped.datasets[0].dataset.paths) is list and wrapped.datasets[0].dataset is ds
    with pytest.raises(ValueError, match="share"):
        share_for_workers(ds, "yes")


def test_forked_workers_read_the_shared_attribute_and_report_their_uss():
    """Proves: spindle.DataLoader's forked workers read the auto-shared list (the worker sees a SharedList,
    items right) and stats() shows each running worker's USS and PSS."""
    ds = Paths(120_000)
    loader = spindle.DataLoader(ds, batch_size=1000, num_workers=2, shuffle=True, seed=0)
    it = iter(loader)
    got = [next(it)]
    # A worker reports its pid once it runs; on a busy machine the second may still be starting when the
    # first batch arrives (its memory is then None), so take batches until both have started.
    while not all(w["pid"] for w in loader.stats()["workers"]):
        got.append(next(it))
    workers = loader.stats()["workers"]
    assert len(workers) == 2 and all(w["uss_bytes"] > 0 and w["pss_bytes"] > 0 for w in workers)
    got += list(it)
    values = np.concatenate([b[:, 0] for b in got])
    assert sorted(values.tolist()) == list(range(120_000)) and all(b[:, 1].all() for b in got)
    assert type(ds.paths) is list
    off = spindle.DataLoader(ds, batch_size=60_000, num_workers=1, share="off")
    assert not any(b[:, 1].any() for b in off)


def _child_sum(items, out):
    out.put((type(items).__name__, sum(len(p) for p in items), items[-1]))


def test_spawned_process_maps_the_container_it_is_handed():
    """Proves: a multiprocessing 'spawn' child handed a SharedList (its descriptor, in the spawning context)
    reads the same items."""
    original = [f"/data/{i}.jpg" for i in range(50_000)]
    s = spindle.shared(original)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_child_sum, args=(s, out))
    child.start()
    try:
        assert out.get(timeout=60) == ("SharedList", sum(map(len, original)), original[-1])
    finally:
        child.join(30)
    assert child.exitcode == 0


def test_spawned_torch_workers_read_the_auto_shared_attribute():
    """Proves: spindle.torch.DataLoader with multiprocessing_context='spawn' hands its workers the shared
    list (they see a SharedList and read the right items)."""
    pytest.importorskip("torch")
    from spindle.torch import DataLoader

    ds = Paths(110_000)
    loader = DataLoader(ds, batch_size=55_000, num_workers=2, multiprocessing_context="spawn")
    got = list(loader)
    assert sorted(np.concatenate([b[:, 0].numpy() for b in got]).tolist()) == list(range(110_000))
    assert all(b[:, 1].all() for b in got)


def test_memory_watch_warns_once_when_a_worker_grows(monkeypatch):
    """Proves: the memory watch warns (once) when a watched process's private memory grows past the
    threshold within the epoch, naming the unshared attribute and the fix."""
    monkeypatch.setattr(sharing, "WORKER_GROWTH_WARN_BYTES", 16 << 20)
    monkeypatch.setattr(sharing, "_warned", False)
    monkeypatch.setattr(sharing, "_unshared", ["dataset.paths (list of 3,000,000 items; share=\"off\")"])
    code = "import sys; sys.stdin.readline(); b = b\"x\" * (64 << 20); print('grown', flush=True); sys.stdin.readline()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        watch = MemoryWatch(lambda: [proc.pid], period=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            watch.poll()  # the epoch's first look: no warning
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "grown"
        with pytest.warns(RuntimeWarning, match=r"grew its private memory.*dataset\.paths.*spindle\.shared"):
            watch.poll()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            watch.poll()  # once
    finally:
        proc.kill()
        proc.wait()


def test_process_memory_reads_smaps_rollup_in_bytes(tmp_path):
    """Proves: the procfs reader turns smaps_rollup's kB into bytes, USS as Private_Clean + Private_Dirty,
    and reads an emptied file (a process releasing its memory) as gone."""
    from spindle import _core

    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "smaps_rollup").write_text(
        "55d0c0000000-7ffc5a1f2000 ---p 00000000 00:00 0                          [rollup]\n"
        "Rss:              100 kB\nPss:               60 kB\nPss_Anon:          10 kB\nShared_Clean:      40 kB\n"
        "Private_Clean:      8 kB\nPrivate_Dirty:     30 kB\nSwap:               2 kB\nSwapPss:            2 kB\n")
    m = _core.process_memory(42, proc_root=str(tmp_path))
    assert (m.rss, m.pss, m.uss, m.swap) == (100 << 10, 60 << 10, 38 << 10, 2 << 10)
    (tmp_path / "42" / "smaps_rollup").write_text("")
    assert _core.process_memory(42, proc_root=str(tmp_path)) is None
    assert _core.process_memory(43, proc_root=str(tmp_path)) is None
