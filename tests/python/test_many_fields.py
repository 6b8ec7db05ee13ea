"""Samples with more fields than a slot's descriptor holds batch as torch batches them.

A slot's descriptor holds spindle._core.SlotLayout.MAX_FIELDS fields (the runtime's limit,
asked for, not repeated here); a batch beyond it travels pickled, with the same result.
"""

from __future__ import annotations

import numpy as np
import pytest

import spindle
from spindle._core import SlotLayout

torch = pytest.importorskip("torch")
import spindle.torch  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402


class ManyFields:
    """A dict of `fields` numpy scalars and small arrays per sample, values encoding (index, field)."""

    def __init__(self, fields: int, n: int = 24) -> None:
        self.fields, self.n = fields, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        out = {}
        for f in range(self.fields):
            kind = f % 4
            if kind == 0:
                out[f"f{f}"] = np.float32(i + f / 1000)
            elif kind == 1:
                out[f"f{f}"] = np.int64(i * 1000 + f)
            elif kind == 2:
                out[f"f{f}"] = np.full(3, i - f, np.int16)
            else:
                out[f"f{f}"] = bool((i + f) % 2)
        return out


def assert_same(got, want, where="batch"):
    """Equal structure, types, dtypes and values (tensors, arrays, containers, scalars, strings)."""
    if isinstance(want, torch.Tensor):
        got_t = torch.from_numpy(got) if isinstance(got, np.ndarray) else got
        assert isinstance(got_t, torch.Tensor), f"{where}: {type(got)} is not a tensor"
        assert got_t.dtype == want.dtype and got_t.shape == want.shape, f"{where}: {got_t.dtype}{tuple(got_t.shape)}"
        assert torch.equal(got_t, want), where
    elif isinstance(want, dict):
        assert type(got) is type(want) and list(got) == list(want), f"{where}: keys differ"
        for k in want:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {type(got)} of {len(got)}"
        for k, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{k}]")
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} != {want!r}"


def torch_batches(dataset, batch_size):
    return list(torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=0))


def test_the_descriptor_limit_is_the_runtimes_and_the_cases_go_past_it():
    """Proves: the limit is read from the core, and 40 and 500 fields both exceed it (the pickled path runs)."""
    assert 0 < SlotLayout.MAX_FIELDS < 40
    with pytest.raises(ValueError, match="at most"):
        SlotLayout([("<f4", [])] * (SlotLayout.MAX_FIELDS + 1), 4)


@pytest.mark.parametrize("fields", [40, 500])
def test_spindle_dataloader_batches_any_number_of_fields_as_default_collate(fields):
    """Proves: spindle.DataLoader over samples of 40 and 500 fields gives, per batch, numpy arrays equal
    (values, dtypes, shapes) to torch's default_collate of the same samples, in workers and in process."""
    ds = ManyFields(fields)
    want = torch_batches(ds, 8)
    for workers in (0, 2):
        got = list(spindle.DataLoader(ds, batch_size=8, num_workers=workers))
        assert len(got) == len(want)
        for b, (g, w) in enumerate(zip(got, want)):
            assert all(isinstance(v, np.ndarray) for v in g.values())
            assert_same(g, w, f"workers={workers} batch {b}")


@pytest.mark.parametrize("fields", [40, 500])
def test_torch_dropin_batches_any_number_of_fields_as_torch(fields):
    """Proves: spindle.torch.DataLoader over samples of 40 and 500 fields yields torch's own batches."""
    ds = ManyFields(fields)
    want = torch_batches(ds, 8)
    got = list(spindle.torch.DataLoader(ds, batch_size=8, num_workers=2))
    assert len(got) == len(want)
    for b, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {b}")


def _hf_dataset():
    """A Hugging Face datasets.Dataset built here from a dict (no hub): a list column of 50 ints (57
    fields in all as default_collate sees a sample), floats, labels and a string column."""
    hf = pytest.importorskip("datasets")
    if not hasattr(hf, "Dataset"):
        pytest.skip("`datasets` is not Hugging Face's here")
    n = 40
    return hf.Dataset.from_dict({
        "input_ids": [[i * 100 + t for t in range(50)] for i in range(n)],
        "attention": [[1] * 4 for _ in range(n)],
        "score": [i / 7 for i in range(n)],
        "label": [i % 3 for i in range(n)],
        "text": [f"sample {i}" for i in range(n)],
    })


@pytest.mark.parametrize("fmt", [None, "numpy", "torch"])
def test_hugging_face_dataset_gives_torchs_batches(fmt):
    """Proves: a datasets.Dataset with no format, set_format("numpy") and set_format("torch") gives, through
    spindle.torch.DataLoader with workers, exactly torch's DataLoader batches (structure, dtypes, values)."""
    ds = _hf_dataset()
    if fmt is not None:
        ds.set_format(fmt)
    want = list(torch.utils.data.DataLoader(ds, batch_size=8, num_workers=0))
    with_workers = spindle.torch.DataLoader(ds, batch_size=8, num_workers=2)
    got = list(with_workers)
    assert len(got) == len(want) == 5
    for b, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"format={fmt} batch {b}")


def test_hugging_face_numeric_columns_through_spindle_dataloader():
    """Proves: spindle.DataLoader over a datasets.Dataset's numeric columns (no format: lists of ints) gives
    numpy arrays equal to torch's default_collate of the same rows."""
    ds = _hf_dataset().remove_columns(["text"])
    want = [default_collate([ds[i] for i in range(s, s + 8)]) for s in range(0, len(ds), 8)]
    got = list(spindle.DataLoader(ds, batch_size=8, num_workers=2))
    assert len(got) == len(want)
    for b, (g, w) in enumerate(zip(got, want)):
        assert_same(g, w, f"batch {b}")


def test_a_hugging_face_dataset_in_numpy_format_gives_no_thread_warning():
    """Proves: reading a datasets.Dataset in numpy format, whose Arrow CPU pool starts (at most) its one
    thread in a worker (capped there by pyarrow.set_cpu_count(1)), gives no thread warning, with the
    watchdog made to look while the workers run."""
    import os
    import warnings

    ds = _hf_dataset()
    ds.set_format("numpy")
    it = iter(spindle.torch.DataLoader(ds, batch_size=4, num_workers=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        next(it)
        counts = [len(os.listdir(f"/proc/{pid}/task")) for pid in it.worker_pids]
        assert max(counts) <= 2, counts  # the worker's own thread and Arrow's one at most
        it._watchdog._next = 0  # look now
        rest = list(it)
    assert len(rest) == 9


def _watchdog_on(code):
    """Runs `code` in a new interpreter until it prints "up", then lets a ThreadWatchdog (leases as a
    worker's) look at that process once: (whether it warned, the warnings' texts). The process is
    killed after."""
    import subprocess
    import sys
    import warnings

    from spindle._budget.caps import ThreadWatchdog

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        dog = ThreadWatchdog(lambda: [proc.pid], period=0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            dog.poll()
            dog.poll()  # a worker is warned about when two looks in a row see it over its lease
        return dog.warned, [str(w.message) for w in seen]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_the_watchdog_allows_arrows_two_pool_threads_and_no_more():
    """Proves: with pyarrow loaded, a worker of 3 threads (its own and the one thread of each of Arrow's CPU and
    IO pools, the runtime table's worker_threads) is not warned about, one of 4 is, naming its thread count."""
    pytest.importorskip("pyarrow")
    from spindle._budget.reserve import worker_lease

    # 3 with pyarrow alone; more when an earlier test of this process loaded another runtime (polars)
    lease = worker_lease()
    assert lease >= 3
    for threads, warns in ((lease, False), (lease + 1, True)):
        warned, texts = _watchdog_on(
            "import threading, time\n"
            f"for _ in range({threads - 1}): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('up', flush=True); time.sleep(60)\n")
        assert warned == warns and len(texts) == warns, texts
        assert not warns or f"runs {threads} threads" in texts[0], texts


def test_the_watchdog_does_not_count_arrows_one_allocator_thread():
    """Proves: a worker's one jemalloc background thread (Arrow's allocator, started where Arrow
    allocates; no user cap stops it) is not counted against its lease; a second one is."""
    from spindle._budget.reserve import worker_lease

    lease = worker_lease()  # the worker's own thread, and Arrow's pool threads if pyarrow is loaded
    for allocator_threads, warns in ((1, False), (2, True)):
        warned, texts = _watchdog_on(  # a full lease, then the allocator's threads
            "import ctypes, threading, time\n"
            "def named():\n"
            "    ctypes.CDLL(None).prctl(15, b'jemalloc_bg_thd')  # PR_SET_NAME\n"
            "    time.sleep(60)\n"
            f"for _ in range({lease - 1}): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            f"for _ in range({allocator_threads}): threading.Thread(target=named, daemon=True).start()\n"
            "time.sleep(0.2); print('up', flush=True); time.sleep(60)\n")
        assert warned == warns and len(texts) == warns, texts
        assert not warns or "jemalloc_bg_thd x2" in texts[0], texts
