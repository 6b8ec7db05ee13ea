"""Rank sharding and checkpoint/exact resume: spindle.DataLoader, native pipelines, and the
torch drop-ins (spindle.torch.DataLoader's shard=, spindle.torch.StatefulDataLoader against
torchdata 0.11's StatefulDataLoader)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import spindle
from spindle import pipeline as sp
from spindle._state.sharding import Shard, resolve_shard, shard_order
from toy_datasets import save_index_images

torch = pytest.importorskip("torch")
from torch.utils.data import DistributedSampler  # noqa: E402
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402

import spindle.torch as st  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]


class Ids:
    """Sample i is {"id": i, "noise": draws from random, numpy's and torch's global generators}."""

    def __init__(self, n: int = 50) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        noise = np.array([random.random(), np.random.rand(), torch.rand(()).item()])
        return {"id": np.int64(i), "noise": noise}


class PlainIds(Ids):
    """Sample i is the tensor [i] (nothing random: batches must equal torchdata's exactly)."""

    def __getitem__(self, i: int):
        return torch.tensor([i])


def ids(batches):
    return [np.asarray(b["id"]).tolist() for b in batches]


def as_lists(batches):
    return [[np.asarray(v).tolist() for v in (b.values() if isinstance(b, dict) else [b])] for b in batches]


# --- sharding -------------------------------------------------------------
@pytest.mark.parametrize("n,world", [(10, 3), (12, 4), (3, 4), (7, 2), (1, 3)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shard_order_cuts_the_order_as_distributed_sampler_does(n, world, drop_last):
    """Proves: each rank's part (pad by repeating the start, or drop the tail) equals DistributedSampler's."""
    order = np.arange(n)
    for rank in range(world):
        ours = shard_order(order, Shard(rank, world), drop_last).tolist()
        theirs = list(DistributedSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=False,
                                         drop_last=drop_last))
        assert ours == theirs


def test_auto_shard_reads_the_launchers_environment(monkeypatch):
    """Proves: shard='auto' reads torchrun's, Slurm's and Open MPI's variables in that order, else one process."""
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert (resolve_shard("auto").rank, resolve_shard("auto").world_size) == (0, 1)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert (resolve_shard("auto").rank, resolve_shard("auto").world_size) == (1, 3)
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert resolve_shard("auto").source.startswith("$SLURM_PROCID")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (resolve_shard("auto").rank, resolve_shard("auto").world_size) == (0, 2)
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match=r"rank=5, world_size=2 \(from \$RANK/\$WORLD_SIZE"):
        resolve_shard("auto")
    with pytest.raises(ValueError, match="shard should be None, 'auto' or"):
        resolve_shard("all")


@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_draw_one_global_shuffle_and_load_disjoint_complete_parts(workers):
    """Proves: spindle.DataLoader with shard=(r, 3) over 3 ranks: same shuffle, parts disjoint, union complete."""
    parts = []
    for rank in range(3):
        loader = spindle.DataLoader(Ids(48), batch_size=5, shuffle=True, num_workers=workers, seed=7,
                                    shard=(rank, 3))
        got = [i for b in ids(loader) for i in b]
        assert len(got) == 16 and len(loader) == 4
        parts.append(got)
    assert sorted(sum(parts, [])) == list(range(48))
    whole = [i for b in ids(spindle.DataLoader(Ids(48), batch_size=48, shuffle=True, seed=7)) for i in b]
    assert [whole[k] for k in range(1, 48, 3)] == parts[1]  # every 3rd sample of the one global order


def needs_in_subprocesses(*modules: str) -> None:
    """Skips unless `modules` are installed, without importing them here: grain's import starts JAX's
    threads, and later tests of this pytest process fork (os.fork() beside JAX's threads may deadlock)."""
    import importlib.util

    for name in modules:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"could not import {name!r}: not installed")


def run_jax_processes(out, phase: str, count: int) -> None:
    """`count` JAX processes of tests/python/jax_job.py (jax.distributed.initialize on 127.0.0.1, CPU)."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = Path(__file__).with_name("jax_job.py")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["JAX_PLATFORMS"] = "cpu"
    procs = [subprocess.Popen([sys.executable, str(job), str(port), str(i), str(out), phase, str(count)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(count)]
    try:
        for p in procs:
            output = p.communicate(timeout=90)[0].decode(errors="replace")
            assert p.returncode == 0, output[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_jax_processes_shard_auto_by_process_index(tmp_path):
    """Proves: 2 JAX processes (jax.distributed.initialize on 127.0.0.1, CPU) with shard="auto" read
    jax.process_index()/process_count() and load disjoint parts whose union is the dataset."""
    pytest.importorskip("jax")
    run_jax_processes(tmp_path, "shard", 2)
    found = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert [f["shard"] for f in found] == [[i, 2, "jax.process_index()/process_count()"] for i in range(2)]
    assert sorted(found[0]["ids"] + found[1]["ids"]) == list(range(30))
    assert len(found[0]["ids"]) == len(found[1]["ids"]) == 15


@pytest.mark.timeout(240)
def test_jax_processes_load_grain_shards_by_process_index_and_resume_on_one_process(tmp_path):
    """Proves: 2 JAX processes with spindle.grain sharded by jax.process_index() (ShardByJaxProcess's shard)
    load disjoint batches whose union is the dataset; their grain checkpoints and
    spindle.DataLoader(shard="auto") states after 3 batches resume on 1 process with exactly the rest of
    the epoch: grain's per old shard, spindle.DataLoader's with one loader (elastic resume)."""
    needs_in_subprocesses("jax", "grain")
    run_jax_processes(tmp_path, "grain", 2)
    found = [json.loads((tmp_path / f"grain.{i}.json").read_text()) for i in range(2)]
    assert [f["process"] for f in found] == [[0, 2], [1, 2]]
    assert [f["shard"] for f in found] == [[0, 2], [1, 2]]
    parts = [sum(f["epoch"], []) for f in found]
    assert sorted(parts[0] + parts[1]) == list(range(50)) and len(parts[0]) == len(parts[1]) == 25
    for f in found:  # the checkpointed epoch is the same epoch
        assert f["head"] + f["rest"] == f["epoch"]

    run_jax_processes(tmp_path, "resume", 1)
    resumed = json.loads((tmp_path / "resume.json").read_text())
    assert resumed["process"] == [0, 1]
    assert resumed["grain"] == [f["rest"] for f in found]  # exactly the rest, per old shard
    assert resumed["elastic"]["shard"] == [0, 1]
    consumed = [i for f in found for i in f["elastic"]["head"]]
    assert [f["elastic"]["shard"] for f in found] == [[0, 2], [1, 2]]
    assert sorted(consumed + resumed["elastic"]["rest"]) == list(range(30))  # every sample once


def test_padding_gives_every_rank_as_many_samples_and_drop_cuts_the_tail():
    """Proves: 10 samples over 4 ranks: padded to 3 each (2 repeats), or 2 each with shard_drop_last."""
    padded = [ids(spindle.DataLoader(Ids(10), batch_size=10, shard=(r, 4))) for r in range(4)]
    assert [len(p[0]) for p in padded] == [3, 3, 3, 3]
    assert sorted(i for p in padded for i in p[0]) == sorted(list(range(10)) + [0, 1])
    dropped = [ids(spindle.DataLoader(Ids(10), batch_size=10, shard=(r, 4), shard_drop_last=True)) for r in range(4)]
    assert sorted(i for p in dropped for i in p[0]) == list(range(8))


def test_torch_dropin_shard_equals_distributed_sampler_and_default_is_torchs():
    """Proves: spindle.torch.DataLoader(shard=) yields what torch yields with DistributedSampler (set_epoch per
    epoch); a DistributedSampler passed as sampler keeps working; without shard= nothing is sharded."""
    data = PlainIds(30)
    for rank, workers in ((0, 2), (1, 0)):
        ours = st.DataLoader(data, batch_size=4, shuffle=True, num_workers=workers, shard=(rank, 2), shard_seed=3)
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=3)
        theirs = TorchDataLoader(data, batch_size=4, sampler=sampler, num_workers=0)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            assert as_lists(ours) == as_lists(theirs)
        passed = st.DataLoader(data, batch_size=4, sampler=sampler, num_workers=2)
        assert as_lists(passed) == as_lists(theirs)
    assert sum(len(b) for b in st.DataLoader(data, batch_size=4, num_workers=2)) == 30
    with pytest.raises(ValueError, match="cannot be combined with sampler="):
        st.DataLoader(data, sampler=sampler, shard=(0, 2))


# --- spindle.DataLoader: checkpoint and exact resume ---------------------
@pytest.mark.parametrize("before,after", [(1, 3), (3, 1), (0, 2), (2, 2)])
def test_dataloader_resumes_exactly_with_another_worker_count(before, after):
    """Proves: state after k batches (JSON round trip) -> a new loader with another num_workers yields exactly
    the rest of the uninterrupted run, random draws included, and the next epoch too."""
    def make(workers):
        return spindle.DataLoader(Ids(47), batch_size=4, shuffle=True, num_workers=workers, seed=11)

    reference = make(before)
    whole = [as_lists(reference), as_lists(reference)]
    first = make(before)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["format"] == "spindle.DataLoader" and state["version"] == 2 and state["batches"] == 5
    assert as_lists(head) == whole[0][:5]
    del it
    resumed = make(after)
    resumed.load_state_dict(state)
    assert as_lists(resumed) == whole[0][5:]
    assert as_lists(resumed) == whole[1]


def test_dataloader_without_a_seed_resumes_the_same_order():
    """Proves: seed=None draws its entropy once and keeps it in the state: a resumed loader without a seed
    (another worker count) yields the same samples in the same batches; one with another seed is refused."""
    first = spindle.DataLoader(Ids(30), batch_size=4, shuffle=True, num_workers=2)
    it = iter(first)
    [next(it) for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))
    rest = ids(it)
    resumed = spindle.DataLoader(Ids(30), batch_size=4, shuffle=True, num_workers=1)
    resumed.load_state_dict(state)  # a loader without a seed takes the state's entropy
    assert ids(resumed) == rest
    with pytest.raises(ValueError, match="seed: state has"):  # one with another seed is refused
        spindle.DataLoader(Ids(30), batch_size=4, shuffle=True, seed=1).load_state_dict(state)


def test_dataloader_state_at_epoch_end_starts_the_next_and_refuses_another_setting():
    """Proves: a state taken after an epoch resumes at the next one; a state from other settings is refused."""
    loader = spindle.DataLoader(Ids(20), batch_size=3, shuffle=True, num_workers=2, seed=1)
    as_lists(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["batches"]) == (1, 0)
    second = as_lists(loader)
    other = spindle.DataLoader(Ids(20), batch_size=3, shuffle=True, num_workers=1, seed=1)
    other.load_state_dict(state)
    assert as_lists(other) == second
    with pytest.raises(ValueError, match="batch_size: state has 3, this loader 4"):
        spindle.DataLoader(Ids(20), batch_size=4, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="not a spindle.DataLoader state"):
        loader.load_state_dict({"format": "x"})


def test_persistent_workers_resume_and_draw_per_epoch():
    """Proves: with persistent workers, per-sample draws change with the epoch and resume exactly."""
    def make(workers):
        return spindle.DataLoader(Ids(24), batch_size=4, num_workers=workers, seed=2, persistent_workers=True)
    a = make(2)
    e0, e1 = as_lists(a), as_lists(a)
    assert e0 != e1  # ids alike, noise differs by epoch
    b = make(3)
    b.load_state_dict(json.loads(json.dumps({**a.state_dict(), "epoch": 1})))
    assert as_lists(b) == e1


# --- native pipelines -----------------------------------------------------
@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    """40 images 6x8x3 whose pixels encode the index and are not left-right symmetric (a flip shows)."""
    return save_index_images(tmp_path_factory.mktemp("npy") / "images.npy", 40, (6, 8, 3))


def native(batches):
    return [(b["image"].copy(), b["label"].copy()) for b in batches]


@pytest.mark.parametrize("before,after", [(1, 3), (3, 1)])
def test_native_loader_resumes_exactly_with_another_worker_count(npy, before, after):
    """Proves: a native pipeline's state after k batches resumes with another num_workers (and mode) to the
    uninterrupted run's remaining batches, augmentations included."""
    pipe = sp.arrays(npy).random_flip().batch(3)
    whole = native(spindle.PipelineLoader(pipe, num_workers=before, shuffle=True, seed=4))
    first = spindle.PipelineLoader(pipe, num_workers=before, shuffle=True, seed=4)
    it = iter(first)
    for _ in range(6):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    del it
    for mode in ("processes", "threads"):
        resumed = spindle.PipelineLoader(pipe, num_workers=after, shuffle=True, seed=4, mode=mode)
        resumed.load_state_dict(state)
        rest = native(resumed)
        assert len(rest) == len(whole) - 6
        for (image, _), (ref, _) in zip(rest, whole[6:]):
            np.testing.assert_array_equal(image, ref)


def test_native_loader_shards_by_rank(npy):
    """Proves: native pipelines shard like DistributedSampler: one global shuffle, disjoint complete parts."""
    pipe = sp.arrays(npy).batch(4)
    parts = [np.concatenate([b["image"][:, 0, 1, 0] for b in spindle.PipelineLoader(pipe, num_workers=2, shuffle=True,
                                                                            shard=(r, 4))]).tolist()
             for r in range(4)]
    assert [len(p) for p in parts] == [10] * 4
    assert sorted(sum(parts, [])) == list(range(40))
    assert len(spindle.PipelineLoader(pipe, shard=(0, 4))) == 3


@pytest.fixture(scope="module")
def wds_shards(tmp_path_factory):
    """4 WebDataset shards of 5 PNGs (16x16, every pixel = the sample id 0..19) with their cls."""
    import io
    import tarfile

    PIL = pytest.importorskip("PIL.Image")
    root = tmp_path_factory.mktemp("wds")
    shards = []
    for shard in range(4):
        path = root / f"shard-{shard}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(5):
                sample = shard * 5 + k
                png = io.BytesIO()
                PIL.fromarray(np.full((16, 16, 3), sample, np.uint8)).save(png, format="PNG")
                for name, data in ((f"s{sample:03d}.png", png.getvalue()), (f"s{sample:03d}.cls", b"0")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards.append(str(path))
    return shards


def test_webdataset_shards_by_rank_and_resumes_with_the_same_workers(wds_shards):
    """Proves: a WebDataset splits by shard file across ranks (disjoint, complete); a rank's stream resumes
    after k batches to the uninterrupted run's rest; another num_workers is refused (its order differs)."""
    pipe = sp.webdataset(wds_shards).decode().center_crop(8).batch(2)
    sample_ids = lambda batches: [int(v) for b in batches for v in b["image"][:, 0, 0, 0]]  # noqa: E731
    parts = [sample_ids(spindle.PipelineLoader(pipe, num_workers=2, shard=(r, 2))) for r in range(2)]
    assert sorted(parts[0]) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]
    assert sorted(parts[0] + parts[1]) == list(range(20))
    first = spindle.PipelineLoader(pipe, num_workers=2, shard=(1, 2))
    it = iter(first)
    head = sample_ids([next(it), next(it)])
    state = json.loads(json.dumps(first.state_dict()))
    rest = sample_ids(it)
    assert head + rest == parts[1]
    resumed = spindle.PipelineLoader(pipe, num_workers=2, shard=(1, 2))
    resumed.load_state_dict(state)
    assert sample_ids(resumed) == rest
    with pytest.raises(ValueError, match="num_workers: state has 2, this loader 3"):
        spindle.PipelineLoader(pipe, num_workers=3, shard=(1, 2)).load_state_dict(state)
    with pytest.raises(ValueError, match="4 shard files cannot be split across 5 ranks"):
        spindle.PipelineLoader(pipe, shard=(0, 5))


# --- spindle.torch.StatefulDataLoader against torchdata 0.11 ----------------
StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


def td_and_ours(**kwargs):
    torch.manual_seed(123)
    theirs = StatefulDataLoader(**kwargs)
    torch.manual_seed(123)
    ours = st.StatefulDataLoader(**kwargs)
    return theirs, ours


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("k", [0, 1, 4, 8])
def test_stateful_loader_resumes_where_torchdata_resumes(shuffle, k):
    """Proves: uninterrupted batches equal torchdata's; after k batches, state -> JSON -> a new loader yields
    what a resumed torchdata loader yields (mid-epoch, at the epoch's end, into the next epoch)."""
    kwargs = dict(dataset=PlainIds(30), batch_size=4, shuffle=shuffle, num_workers=2)
    theirs, ours = td_and_ours(**kwargs)
    results = {}
    for name, loader, fresh in (("torchdata", theirs, StatefulDataLoader), ("spindle", ours, st.StatefulDataLoader)):
        it = iter(loader)
        head = [next(it) for _ in range(k)]
        state = loader.state_dict()
        if name == "spindle":
            state = json.loads(json.dumps(state))
        rest = list(it)
        nxt = list(loader)
        torch.manual_seed(999)  # a new process: other global draws
        resumed = fresh(**kwargs)
        resumed.load_state_dict(state)
        results[name] = (as_lists(head), as_lists(rest), as_lists(nxt), as_lists(resumed), as_lists(resumed))
    td, sp_ = results["torchdata"], results["spindle"]
    assert sp_[:3] == td[:3]
    assert td[3] == td[1] and sp_[3] == sp_[1]   # both resume after the k batches handed out
    assert sp_[4] == td[4] == td[2]               # and the epoch after it is the uninterrupted one


def test_stateful_loader_with_persistent_workers_draws_as_torchdata_over_epochs():
    """Proves: with persistent_workers=True, three shuffled epochs equal torchdata's; a state taken mid-way
    through the second, or after the first, resumes to torchdata's batches."""
    kwargs = dict(dataset=PlainIds(18), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
    theirs, ours = td_and_ours(**kwargs)
    assert [as_lists(ours) for _ in range(3)] == [as_lists(theirs) for _ in range(3)]
    out = []
    for cls in (StatefulDataLoader, st.StatefulDataLoader):
        torch.manual_seed(4)
        loader = cls(**kwargs)
        as_lists(loader)
        it = iter(loader)
        next(it)
        state = json.loads(json.dumps(loader.state_dict())) if cls is st.StatefulDataLoader else loader.state_dict()
        rest = as_lists(it)
        del it
        again = cls(**kwargs)
        again.load_state_dict(state)
        out.append((rest, as_lists(again)))
    assert out[0] == out[1] and out[0][0] == out[0][1]
    ends = []
    for cls in (StatefulDataLoader, st.StatefulDataLoader):  # a state after an epoch: the next one
        torch.manual_seed(4)
        loader = cls(**kwargs)
        as_lists(loader)
        state = loader.state_dict()
        following = as_lists(loader)
        again = cls(**kwargs)
        again.load_state_dict(json.loads(json.dumps(state)) if cls is st.StatefulDataLoader else state)
        ends.append((following, as_lists(again), as_lists(again)))
    assert ends[0] == ends[1] and ends[0][0] == ends[0][1]


def test_batch_seeds_are_the_documented_function_of_seed_epoch_and_indices():
    """Proves: a batch's draws are those of random/numpy seeded once with batch_seed(seed, epoch, its
    indices), its samples drawing in order; the same with 0, 1 and 3 workers."""
    from spindle._state.checkpoint import batch_seed

    for workers in (0, 1, 3):
        loader = spindle.DataLoader(Ids(10), batch_size=5, num_workers=workers, seed=9)
        as_lists(loader)
        batch = as_lists(loader)[1]  # epoch 1, second batch: samples 5..9
        s = batch_seed(9, 1, list(range(5, 10)))
        random.seed(s)
        np.random.seed(s & 0xFFFFFFFF)
        expected = []
        for _ in range(5):
            expected.append([random.random(), np.random.rand()])
        assert [row[:2] for row in batch[1]] == expected, workers


def test_stateful_loader_in_process_is_torchdatas_loop_with_a_json_state():
    """Proves: with num_workers=0 the loop and its resume are torchdata's, and the state goes through JSON."""
    kwargs = dict(dataset=PlainIds(20), batch_size=3, shuffle=True, num_workers=0)
    theirs, ours = td_and_ours(**kwargs)
    results = []
    for loader, cls in ((theirs, StatefulDataLoader), (ours, st.StatefulDataLoader)):
        it = iter(loader)
        head = [next(it) for _ in range(2)]
        state = loader.state_dict()
        if cls is st.StatefulDataLoader:
            state = json.loads(json.dumps(state))
        resumed = cls(**kwargs)
        resumed.load_state_dict(state)
        results.append((as_lists(head), as_lists(it), as_lists(resumed)))
    assert results[0] == results[1] and results[0][1] == results[0][2]
    with pytest.raises(ValueError, match="saved with num_workers=0"):
        st.StatefulDataLoader(PlainIds(20), batch_size=3, num_workers=2).load_state_dict(state)


def test_stateful_loader_end_of_epoch_state_and_empty_state_behave_as_torchdatas():
    """Proves: a state after the epoch ended starts the next epoch; load_state_dict({}) changes nothing."""
    kwargs = dict(dataset=PlainIds(12), batch_size=5, shuffle=True, num_workers=2)
    out = {}
    for cls in (StatefulDataLoader, st.StatefulDataLoader):
        torch.manual_seed(5)
        loader = cls(**kwargs)
        list(loader)
        state = loader.state_dict()
        second = as_lists(loader)
        torch.manual_seed(6)
        again = cls(**kwargs)
        again.load_state_dict(state)
        fresh = cls(**kwargs)
        fresh.load_state_dict({})
        out[cls] = (second, as_lists(again), len(as_lists(fresh)))
    assert out[st.StatefulDataLoader] == out[StatefulDataLoader]
    assert out[StatefulDataLoader][0] == out[StatefulDataLoader][1]


@pytest.mark.parametrize("before,after", [(1, 3), (3, 1)])
def test_stateful_loader_resumes_with_another_worker_count_and_the_same_random_draws(before, after):
    """Proves: spindle's StatefulDataLoader resumes 1->3 and 3->1 workers (torchdata refuses) and the
    samples' random draws (random, numpy, torch) are those of the uninterrupted run."""
    def make(workers):
        return st.StatefulDataLoader(Ids(37), batch_size=4, shuffle=True, num_workers=workers,
                                     generator=torch.Generator().manual_seed(8))
    reference = make(before)
    whole = as_lists(reference)
    first = make(before)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert len(json.dumps(state)) < 8192
    del it
    resumed = make(after)
    resumed.load_state_dict(state)
    assert as_lists(resumed) == whole[3:]


def test_stateful_loader_resumes_with_spawned_workers():
    """Proves: with multiprocessing_context='spawn' the resumed batches (random draws included) are the
    uninterrupted run's."""
    def make(workers):
        return st.StatefulDataLoader(Ids(20), batch_size=4, shuffle=True, num_workers=workers,
                                     multiprocessing_context="spawn", generator=torch.Generator().manual_seed(3))
    whole = as_lists(make(2))
    first = make(2)
    it = iter(first)
    next(it)
    state = json.loads(json.dumps(first.state_dict()))
    del it
    resumed = make(1)
    resumed.load_state_dict(state)
    assert as_lists(resumed) == whole[1:]


def test_stateful_loader_resumes_an_iterable_dataset_with_the_same_workers():
    """Proves: an IterableDataset resumes (same num_workers) to the uninterrupted run's remaining batches."""
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            for i in range(info.id, 26, info.num_workers):
                yield torch.tensor([i, int(torch.randint(0, 1000, ()))])

    def make():
        return st.StatefulDataLoader(Stream(), batch_size=3, num_workers=2)
    torch.manual_seed(1)
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    rest = as_lists(it)
    torch.manual_seed(2)
    resumed = make()
    resumed.load_state_dict(state)
    assert as_lists(resumed) == rest and len(head) == 3
    other = st.StatefulDataLoader(Stream(), batch_size=3, num_workers=3)
    with pytest.raises(ValueError, match="num_workers: state has 2, this loader 3"):
        other.load_state_dict(state)
