"""Typed failures end to end: the fields the runtime sets on spindle's exceptions (no message parsing)."""

import io
import os
import signal
import tarfile

import numpy as np
import pytest

import spindle
from spindle import _core
from spindle import errors
from spindle import pipeline as sp
from toy_datasets import ExitsAt, KillsItselfAt, SegfaultsAt, add_broken_images

PIL = pytest.importorskip("PIL.Image")


def death(dataset) -> tuple[errors.WorkerDiedError, set[int]]:
    it = iter(spindle.DataLoader(dataset, batch_size=10, num_workers=2, on_worker_death="raise"))
    pids = set(it.worker_pids)
    with pytest.raises(spindle.WorkerDiedError) as info:
        for _ in it:
            pass
    return info.value, pids


def expect_who_and_where(died: errors.WorkerDiedError, pids: set[int]) -> None:
    assert died.pid in pids
    assert died.worker in (0, 1)
    assert died.sample == 123
    assert died.batch == 12


def test_sigkilled_worker_sets_signal_pid_worker_sample_and_batch():
    """Proves: a worker killed by SIGKILL raises WorkerDiedError with .signal 9, no .exitcode, and its pid/worker/sample/batch."""
    died, pids = death(KillsItselfAt(123))
    assert died.signal == signal.SIGKILL and died.exitcode is None
    expect_who_and_where(died, pids)
    assert "killed by signal 9" in str(died)


def test_segfaulting_worker_sets_signal_11():
    """Proves: a worker that segfaults raises WorkerDiedError with .signal 11 and no .exitcode."""
    died, pids = death(SegfaultsAt(123))
    assert died.signal == signal.SIGSEGV and died.exitcode is None
    expect_who_and_where(died, pids)


def test_exiting_worker_sets_exitcode_3():
    """Proves: a worker that calls exit(3) raises WorkerDiedError with .exitcode 3 and no .signal."""
    died, pids = death(ExitsAt(123))
    assert died.exitcode == 3 and died.signal is None
    expect_who_and_where(died, pids)
    assert "exited with code 3" in str(died)


def test_internal_error_is_an_assertion_error_and_a_spindle_error():
    """Proves: InternalError (spindle's own bugs) has AssertionError as its Python base, as spdl registers it."""
    assert issubclass(spindle.errors.InternalError, AssertionError)
    assert issubclass(spindle.errors.InternalError, spindle.SpindleError)
    assert "InternalError" in errors.__all__


def test_every_name_spindle_exports_resolves():
    """Proves: each name of ``spindle.__all__`` is an attribute of spindle (the error classes included:
    ProcessesAdvised was listed and missing)."""
    missing = [name for name in spindle.__all__ if not hasattr(spindle, name)]
    assert not missing, missing


def test_error_classes_keep_their_bases_and_pickle_their_fields():
    """Proves: the typed classes keep their bases, and a pickled exception keeps its fields."""
    import pickle
    assert issubclass(errors.DecodeError, ValueError) and issubclass(errors.DataError, ValueError)
    assert issubclass(errors.SkipRatioError, errors.DataError)
    back = pickle.loads(pickle.dumps(errors.DecodeError("bad", path="a.jpg", key="k")))
    assert (str(back), back.path, back.key) == ("bad", "a.jpg", "k")
    died = pickle.loads(pickle.dumps(errors.WorkerDiedError("gone", pid=5, signal=9, sample=3)))
    assert (died.pid, died.signal, died.exitcode, died.sample) == (5, 9, None, 3)


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """37 small JPEGs in 3 classes plus 4 files that are not images (41 samples)."""
    root = tmp_path_factory.mktemp("broken")
    rng = np.random.default_rng(0)
    for c, name in enumerate(["cat", "dog", "zebra"]):
        (root / name).mkdir()
        for k in range(12 + (c == 2)):
            img = rng.integers(0, 256, (80, 96, 3), dtype=np.uint8)
            PIL.fromarray(img).save(root / name / f"img{k:02d}.jpg", quality=90)
    add_broken_images(root)
    return root


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_skip_ratio_is_enforced_by_the_runtime_with_its_counts(broken, mode):
    """Proves: max_ratio is enforced in C++ (processes and threads): SkipRatioError with .skipped/.samples/.max_ratio."""
    strict = sp.image_folder(broken).decode().center_crop(64).batch(41).on_error("skip", max_ratio=0.01)
    with pytest.raises(errors.SkipRatioError, match=r"4 of 41 samples could not be read") as info:
        with pytest.warns(RuntimeWarning):
            for _ in spindle.PipelineLoader(strict, num_workers=1, mode=mode):
                pass
    assert (info.value.skipped, info.value.samples, info.value.max_ratio) == (4, 41, 0.01)
    assert isinstance(info.value, spindle.SpindleError)


def pipeline_runtime(native, order, batch_size: int, threads: bool):
    """One worker running `native` over `order` (the binding of make_pipeline_loader)."""
    options = _core.LoaderOptions()
    options.num_workers = 1
    options.batch_capacity = batch_size
    return _core.pipeline_loader(native, options, order=order, threads=threads, seed=0, epoch=0)


@pytest.mark.parametrize("threads", [False, True])
def test_skip_counts_ride_in_the_batch_not_its_structure(broken, threads):
    """Proves: each batch's skip count is its own field (Batch.skipped), read without parsing the structure bytes."""
    native = _core.Pipeline(sp.image_folder(broken).decode().center_crop(64).batch(8)
                            .on_error("skip", max_ratio=0.5).options())
    order = np.arange(len(native), dtype=np.int64)
    runtime = pipeline_runtime(native, order, batch_size=8, threads=threads)
    try:
        skipped = 0
        while (lease := runtime.next()) is not None:
            skipped += lease.skipped
            del lease
        assert skipped == 4
    finally:
        runtime.close()


def failures(pipe, threads: bool) -> list:
    native = _core.Pipeline(pipe.options())
    order = np.arange(len(native), dtype=np.int64)
    runtime = pipeline_runtime(native, order, batch_size=1, threads=threads)
    found = []
    try:
        while True:
            try:
                if runtime.next() is None:
                    return found
            except errors.BatchFailedError as failed:
                found.append(failed)
    finally:
        runtime.close()


@pytest.mark.parametrize("threads", [False, True])
def test_a_decode_failure_names_its_kind_and_path(broken, threads):
    """Proves: a bad image's failed batch carries .kind 'decode' and .path (the file) from the slot's failure record."""
    found = failures(sp.image_folder(broken).decode().center_crop(64).batch(1), threads)
    by_path = {os.path.basename(f.path): f for f in found}
    assert set(by_path) == {"truncated.jpg", "empty.jpg", "notes.jpg", "garbage.jpg"}
    for f in found:
        assert f.kind == "decode" and f.key is None and os.path.exists(f.path)


def test_a_webdataset_decode_failure_names_shard_and_key(broken, tmp_path):
    """Proves: a bad member of a WebDataset shard fails with .path the shard and .key the sample's key."""
    shard = tmp_path / "shard-000.tar"
    good = (broken / "cat" / "img00.jpg").read_bytes()
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, data in (("s0", good), ("s1", b"not a jpeg at all"), ("s2", good)):
            for ext, payload in (("jpg", data), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    pipe = sp.webdataset([str(shard)]).decode().center_crop(32).batch(1)
    native = _core.Pipeline(pipe.options())
    runtime = pipeline_runtime(native, np.arange(0, dtype=np.int64), batch_size=1, threads=True)
    try:
        with pytest.raises(errors.BatchFailedError) as info:
            while runtime.next() is not None:
                pass
    finally:
        runtime.close()
    assert (info.value.kind, info.value.path, info.value.key) == ("decode", str(shard), "s1")


def test_decode_and_data_errors_carry_path_and_key():
    """Proves: DecodeError and DataError take path and key (None when unknown), keeping their message."""
    e = errors.DecodeError("spindle: cannot decode x", path="/d/x.jpg", key="0007")
    assert (str(e), e.path, e.key) == ("spindle: cannot decode x", "/d/x.jpg", "0007")
    assert errors.DataError("bad").path is None and errors.DataError("bad").key is None


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_the_native_loader_raises_decode_error_with_its_path(broken, mode):
    """Proves: spindle.PipelineLoader raises DecodeError with .path (the bad file) and .key None, from the failure record."""
    pipe = sp.image_folder(broken).decode().center_crop(64).batch(1)
    it, found = iter(spindle.PipelineLoader(pipe, num_workers=1, mode=mode)), {}
    while True:
        try:
            next(it)
        except StopIteration:
            break
        except spindle.DecodeError as e:
            found[os.path.basename(e.path)] = e
    assert set(found) == {"truncated.jpg", "empty.jpg", "notes.jpg", "garbage.jpg"}
    assert all(e.key is None and e.path in str(e) for e in found.values())
