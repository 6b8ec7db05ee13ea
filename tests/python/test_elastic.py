"""Elastic resume: a sharded epoch continued on another world size, every sample of it once.

The grid is pure index arithmetic over the functions the loaders call (spindle._state.elastic);
a few real loader runs (spindle.DataLoader, the native PipelineLoader, the torch drop-in's
StatefulDataLoader) check that the loaders yield what the arithmetic says."""

from __future__ import annotations

import collections
import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spindle
import spindle.pipeline as sp
from spindle._state.elastic import Resume, rank_part, read_resume, resolve
from spindle._state.sharding import Shard, shard_order
from toy_datasets import save_index_images

BATCH = 3


def old_parts(order, world, shard_drop, drop_last, resplits=()):
    """Each rank's part (cut for the loader's drop_last), as the loader cuts it."""
    parts = [rank_part(order, resplits, Shard(r, world), shard_drop) for r in range(world)]
    return [p[:len(p) - len(p) % BATCH] if drop_last else p for p in parts]


def new_rest(order, resume, world, shard_drop, drop_last):
    """What each new rank yields after resuming: its part from the re-split, less the batches to skip."""
    rest = []
    for r in range(world):
        resplits, skip = resolve(lambda epoch: order, resume, Shard(r, world), shard_drop, BATCH)
        part = rank_part(order, resplits, Shard(r, world), shard_drop)
        part = part[:len(part) - len(part) % BATCH] if drop_last else part
        rest.append(part[skip * BATCH:])
    return rest


def check_epoch(order, consumed, rest, new_world, shard_drop, drop_last, old_world):
    """consumed + remaining covers the epoch: each sample once, but for the documented pad or drop."""
    seen = collections.Counter(np.concatenate(consumed + rest).tolist())
    n = len(order)
    missing = n - len(seen)
    twice = sum(c - 1 for c in seen.values())
    if shard_drop:
        assert twice == 0
    else:
        # the old run's padding (consumed) and the re-split's padding, each under one world size
        assert twice <= (old_world - 1) + (new_world - 1)
    allowed = (new_world - 1 if shard_drop else 0) + (new_world * (BATCH - 1) if drop_last else 0)
    if not drop_last and not shard_drop:
        assert missing == 0
    assert missing <= allowed
    if not drop_last:  # the ranks stay in step: as many samples each
        assert len({len(p) for p in rest}) <= 1


@pytest.mark.parametrize("shuffle,shard_drop,drop_last", list(itertools.product([False, True], repeat=3)))
def test_lock_step_resume_from_one_state_covers_the_epoch_for_every_world_size(shuffle, shard_drop, drop_last):
    """Proves: old world W in 1..8, new W' in 1..8, k batches in 0..the epoch's end, from ONE rank's state:
    consumed + remaining = the epoch, each sample once (or the documented pad/drop); W' == W is today's resume."""
    n = 37
    order = np.random.default_rng(5).permutation(n) if shuffle else np.arange(n)
    for old, new in itertools.product(range(1, 9), range(1, 9)):
        parts = old_parts(order, old, shard_drop, drop_last)
        batches = -(-len(parts[0]) // BATCH)
        for k in range(batches + 1):
            consumed = [p[:k * BATCH] for p in parts]
            rest = new_rest(order, Resume(0, (), old, {}, k), new, shard_drop, drop_last)
            check_epoch(order, consumed, rest, new, shard_drop, drop_last, old)
            if new == old:
                assert all(np.array_equal(r, p[k * BATCH:]) for r, p in zip(rest, parts))
            if k == 0:  # nothing consumed: a fresh epoch at the new world size
                assert all(np.array_equal(r, p) for r, p in zip(rest, old_parts(order, new, shard_drop, drop_last)))


@settings(max_examples=60, deadline=None, derandomize=True)  # the same examples in every run (CI)
@given(n=st.integers(1, 60), shuffle=st.booleans(), shard_drop=st.booleans(), drop_last=st.booleans(),
       worlds=st.lists(st.integers(1, 8), min_size=2, max_size=4), data=st.data())
def test_resume_from_every_ranks_state_covers_the_epoch_through_several_resizes(n, shuffle, shard_drop, drop_last,
                                                                                  worlds, data):
    """Proves: ranks that did not advance in lock step (each its own batch count), resumed from the LIST of
    their states, then resized again and again within the epoch: each sample once (or the pad/drop); at the
    same world size each rank goes on from its own state."""
    order = np.random.default_rng(n).permutation(n) if shuffle else np.arange(n)
    consumed, resplits, done = [], (), [0] * worlds[0]
    for old, new in zip(worlds, worlds[1:]):
        parts = old_parts(order, old, shard_drop, drop_last, resplits)
        counts = [d + data.draw(st.integers(0, -(-len(p) // BATCH) - d)) for p, d in zip(parts, done)]
        consumed += [p[d * BATCH:k * BATCH] for p, d, k in zip(parts, done, counts)]
        states = [{"epoch": 0, "batches": k, "shard": [r, old],
                   "resplits": [{"world_size": s.world_size, "consumed": list(s.consumed)} for s in resplits]}
                  for r, k in enumerate(counts)]
        resume = read_resume(states[::-1], "test")  # any order of the list
        rest = new_rest(order, resume, new, shard_drop, drop_last)
        resplits, _ = resolve(lambda epoch: order, resume, Shard(0, new), shard_drop, BATCH)
        if new == old:  # each rank goes on from its own state, as today
            assert all(np.array_equal(r, p[k * BATCH:]) for r, p, k in zip(rest, parts, counts))
            done = counts
        else:
            done = [0] * new
    seen = collections.Counter(np.concatenate(consumed + rest).tolist())
    if shard_drop:
        assert max(seen.values(), default=1) == 1
    if not shard_drop and not drop_last:
        assert set(seen) == set(range(n))
    pads = sum(c - 1 for c in seen.values())
    assert pads <= sum(w - 1 for w in worlds)  # each world's padding, applied once to what remained


def test_state_lists_that_do_not_fit_are_refused_naming_the_ranks():
    """Proves: a list with a rank missing or twice, mixed epochs or world sizes is refused, naming the values."""
    state = lambda r, w, e=0: {"epoch": e, "batches": 1, "shard": [r, w]}  # noqa: E731
    with pytest.raises(ValueError, match=r"ranks \[2\] missing"):
        read_resume([state(0, 3), state(1, 3)], "x")
    with pytest.raises(ValueError, match=r"ranks \[1\] twice"):
        read_resume([state(0, 2), state(1, 2), state(1, 2)], "x")
    with pytest.raises(ValueError, match=r"different world sizes \[2, 3\]"):
        read_resume([state(0, 2), state(1, 3)], "x")
    with pytest.raises(ValueError, match=r"differ in epoch \(rank 0: 0, rank 1: 4\)"):
        read_resume([state(0, 2), state(1, 2, 4)], "x")


class Ids:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.array([i])


def ids(batches):
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


def test_dataloader_resumes_on_another_world_size_from_rank_0s_state_and_from_every_ranks():
    """Proves: spindle.DataLoader, 4 ranks stopped mid-epoch, resumed on 3 and on 2 ranks from rank 0's state
    (JSON round trip) and from all 4 states: the old ranks' batches and the new ones' hold each sample once;
    the next epoch is a fresh run at the new world size."""
    def make(rank, world, workers=0):
        return spindle.DataLoader(Ids(50), batch_size=BATCH, shuffle=True, seed=3, num_workers=workers,
                                  shard=(rank, world))

    old = [make(r, 4) for r in range(4)]
    its = [iter(loader) for loader in old]
    before = [ids([next(it) for _ in range(k)]) for it, k in zip(its, (2, 2, 2, 2))]
    states = [json.loads(json.dumps(loader.state_dict())) for loader in old]
    for world in (3, 2):
        new = [make(r, world, workers=2 if r == 0 else 0) for r in range(world)]
        for loader in new:
            loader.load_state_dict(states[0])
        after = [ids(loader) for loader in new]
        seen = sum(before + after, [])
        assert set(seen) == set(range(50)) and len(seen) == 50 + (-(50 - 24) % world)  # the rest once, + the pad
        order = np.random.default_rng([3, 0]).permutation(50)
        assert after == [r.tolist() for r in new_rest(order, Resume(0, (), 4, {}, 2), world, False, False)]
    # not in lock step: rank 3 got one batch further
    before[3] += ids([next(its[3])])
    states = [loader.state_dict() for loader in old]
    new = [make(r, 2) for r in range(2)]
    for loader in new:
        loader.load_state_dict(states)
    seen = sum(before + [ids(loader) for loader in new], [])
    assert set(seen) == set(range(50)) and len(seen) == 50 + (-(50 - 27) % 2)  # 27 consumed, the rest once + pad
    fresh = make(1, 2)
    fresh.load_state_dict({**states[0], "epoch": 1, "batches": 0})
    assert ids(new[1]) == ids(fresh)  # the epoch after: as a fresh run at world size 2


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    """41 images 2x2x3 whose pixels (column 1) encode the index."""
    return save_index_images(tmp_path_factory.mktemp("npy") / "images.npy", 41, (2, 2, 3))


def test_native_loader_resumes_on_another_world_size(npy):
    """Proves: the native PipelineLoader, 4 ranks padded (41 samples) stopped after 2 batches, resumed on 3
    ranks from rank 0's state: each sample once but for the documented pad, as the arithmetic says."""
    pipe = sp.arrays(npy).batch(BATCH)
    sample_ids = lambda batches: [int(v) for b in batches for v in b["image"][:, 0, 1, 0]]  # noqa: E731
    old = [spindle.PipelineLoader(pipe, num_workers=1, shuffle=True, seed=8, shard=(r, 4)) for r in range(4)]
    its = [iter(loader) for loader in old]
    before = [sample_ids([next(it), next(it)]) for it in its]
    state = json.loads(json.dumps(old[0].state_dict()))
    del its
    after = []
    for r in range(3):
        loader = spindle.PipelineLoader(pipe, num_workers=2, shuffle=True, seed=8, shard=(r, 3))
        loader.load_state_dict(state)
        after.append(sample_ids(loader))
    seen = collections.Counter(sum(before + after, []))
    assert set(seen) == set(range(41))
    order = np.random.default_rng([8, 0]).permutation(41)
    assert after == [r.tolist() for r in new_rest(order, Resume(0, (), 4, {}, 2), 3, False, False)]


def test_webdataset_refuses_a_mid_epoch_state_of_another_world_size(tmp_path):
    """Proves: a WebDataset stream's mid-epoch state at another world size is refused, saying why and what to do."""
    import io
    import tarfile

    paths = []
    for shard in range(2):
        path = tmp_path / f"s{shard}.tar"
        with tarfile.open(path, "w") as tar:
            for name, data in ((f"k{shard}.cls", b"0"),):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    pipe = sp.webdataset(paths).decode().center_crop(8).batch(1)
    loader = spindle.PipelineLoader(pipe, num_workers=1, shard=(0, 1))
    state = {**loader.state_dict(), "batches": 1, "shard": [0, 2]}
    with pytest.raises(ValueError, match="saved mid-epoch by rank 0 of 2 .* Resume this epoch with world size 2"):
        loader.load_state_dict(state)
    loader.load_state_dict({**state, "batches": 0})  # at an epoch's start: any world size


def test_old_format_state_still_loads_at_the_same_world_size():
    """Proves: a version-1 state (before elastic resume: no resplits) resumes as it did."""
    loader = spindle.DataLoader(Ids(20), batch_size=BATCH, shuffle=True, seed=1, shard=(1, 2))
    whole = ids(loader)
    old_state = {"format": "spindle.DataLoader", "version": 1, "epoch": 0, "batches": 2, "seed": 1, "samples": 20,
                 "batch_size": BATCH, "shuffle": True, "drop_last": False, "shard": [1, 2], "shard_drop_last": False}
    resumed = spindle.DataLoader(Ids(20), batch_size=BATCH, shuffle=True, seed=1, shard=(1, 2))
    resumed.load_state_dict(old_state)
    assert ids(resumed) == whole[2 * BATCH:]


def test_stateful_loader_resumes_on_another_world_size_and_keeps_torchdatas_semantics_at_the_same():
    """Proves: spindle.torch.StatefulDataLoader(shard=): 4 ranks -> 3 from rank 0's state, and 4 ranks out of
    step -> 2 from every rank's state, cover the epoch once (DistributedSampler's order, + the pad); at the
    same world size its state resumes as before."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    from spindle.torch import StatefulDataLoader

    class TorchIds(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return torch.tensor([i])

    make = lambda r, w: StatefulDataLoader(TorchIds(), batch_size=BATCH, shuffle=True, num_workers=1,  # noqa: E731
                                           shard=(r, w), shard_seed=9)
    old = [make(r, 4) for r in range(4)]
    its = [iter(loader) for loader in old]
    before = [ids([next(it) for _ in range(2)]) for it in its]
    state = json.loads(json.dumps(old[0].state_dict()))  # in lock step, 2 batches each
    extra = ids([next(its[1])])  # then rank 1 one batch further: out of step
    states = [json.loads(json.dumps(loader.state_dict())) for loader in old]
    rest0 = ids(its[0])
    after = []
    for r in range(3):
        loader = make(r, 3)
        loader.load_state_dict(state)
        after.append(ids(loader))
    seen = sum(before + after, [])
    assert set(seen) == set(range(40)) and len(seen) == 40 + (-(40 - 24) % 3)  # the rest once, + the pad
    assert len({len(a) for a in after}) == 1  # in step
    same = make(0, 4)
    same.load_state_dict(state)
    assert ids(same) == rest0  # the same world size: today's resume
    after = []
    for r in range(2):
        loader = make(r, 2)
        loader.load_state_dict(states)
        after.append(ids(loader))
    seen = sum(before + after, []) + extra
    assert set(seen) == set(range(40)) and len(seen) == 40 + (-(40 - 27) % 2)
