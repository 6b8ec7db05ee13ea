"""EpochPlan: the one owner of a map-style loader's epoch orders, entropy, length per rank and
checkpointed position (spindle.DataLoader and spindle.PipelineLoader both walk their epochs with it).

Pure index arithmetic: no worker is started."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import spindle
import spindle.pipeline  # noqa: F401  (spindle.pipeline.arrays)
from spindle._state.epoch_plan import EpochPlan
from spindle._state.sharding import Shard


def plan(n=10, batch=3, *, shuffle=True, seed=7, shard=None, shard_drop_last=False, drop_last=False):
    return EpochPlan(range(n), batch, shuffle=shuffle, seed=seed, shard=shard, shard_drop_last=shard_drop_last,
                     drop_last=drop_last)


def settings(p):
    return lambda: dict(seed=p.entropy, samples=len(p.samples))


@pytest.mark.parametrize("n,world,shard_drop,drop_last", list(itertools.product(
    (0, 1, 7, 10, 11), (1, 2, 3), (False, True), (False, True))))
def test_len_is_the_number_of_batches_each_rank_order_is_cut_into(n, world, shard_drop, drop_last):
    """Proves: len(plan) is the batch count of every rank's order, and with drop_last each order is whole batches."""
    for rank in range(world):
        p = plan(n, 3, shard=Shard(rank, world), shard_drop_last=shard_drop, drop_last=drop_last)
        order, _ = p.order(0)
        assert len(p) == -(-len(order) // 3)
        if drop_last:
            assert len(order) % 3 == 0


def test_rank_orders_are_cut_from_one_global_order_drawn_from_seed_and_epoch():
    """Proves: every rank draws the same global order for (seed, epoch), keeps every world-th sample of it,
    a new epoch draws a new order, and the ranks' parts cover the epoch."""
    world = 3
    plans = [plan(12, 2, shard=Shard(r, world)) for r in range(world)]
    for epoch in (0, 1):
        glob = plans[0].global_order(epoch)
        assert sorted(glob.tolist()) == list(range(12))
        assert all(np.array_equal(p.global_order(epoch), glob) for p in plans)
        parts = [p.order(epoch)[0] for p in plans]
        assert all(np.array_equal(part, glob[r::world]) for r, part in enumerate(parts))
        assert all(part.dtype == np.int64 and part.flags.c_contiguous for part in parts)
    assert not np.array_equal(plans[0].global_order(0), plans[0].global_order(1))
    assert np.array_equal(plan(12, shuffle=False).global_order(5), np.arange(12))


def test_without_a_seed_the_entropy_is_fresh_unless_sharded():
    """Proves: seed=None draws new entropy per plan, but 0 when sharded (every rank must draw the same order)."""
    assert plan(seed=None).entropy != plan(seed=None).entropy
    assert plan(seed=None, shard=Shard(1, 2)).entropy == 0
    assert plan(seed=5).entropy == 5


def test_a_state_taken_mid_epoch_resumes_after_the_last_batch_handed_out():
    """Proves: a fresh plan loaded with a mid-epoch state begins the same epoch with the handed-out
    batches counted as skipped, and draws the same order."""
    saver = plan(seed=None)
    saver.begin()  # epoch 0, ended
    saver.position.finished = True
    position = saver.begin()  # epoch 1, two batches handed out
    position.yielded = 2
    state = saver.state("fmt", settings(saver)())
    assert (state["epoch"], state["batches"]) == (1, 2)

    resumed = plan(seed=None)
    resumed.load(state, "fmt", settings(resumed))
    assert resumed.entropy == saver.entropy  # no seed of its own: the state's
    again = resumed.begin()
    assert (again.epoch, again.yielded) == (1, 2)
    assert np.array_equal(resumed.order(1)[0], saver.order(1)[0])
    assert resumed.epoch == 2


def test_a_state_taken_between_epochs_points_at_the_next_one():
    """Proves: before any epoch and after one ended the state is the next epoch with no batch handed out,
    and a state loaded but not yet begun is given back as loaded."""
    p = plan()
    assert (p.state("fmt", {})["epoch"], p.state("fmt", {})["batches"]) == (0, 0)
    p.begin().finished = True
    assert (p.state("fmt", {})["epoch"], p.state("fmt", {})["batches"]) == (1, 0)

    q = plan()
    q.load({**p.state("fmt", settings(p)()), "epoch": 4, "batches": 1}, "fmt", settings(q))
    assert (q.state("fmt", {})["epoch"], q.state("fmt", {})["batches"]) == (4, 1)


def test_out_of_order_delivery_refuses_a_state_mid_epoch_only():
    """Proves: exact_mid_epoch=False raises mid-epoch, naming in_order, and not between epochs."""
    p = plan()
    p.state("fmt", {}, exact_mid_epoch=False)
    p.begin()
    with pytest.raises(ValueError, match="in_order=True"):
        p.state("fmt", {}, exact_mid_epoch=False)
    p.position.finished = True
    assert p.state("fmt", {}, exact_mid_epoch=False)["epoch"] == 1


def test_load_refuses_a_state_of_another_setting_naming_both_values():
    """Proves: a state whose settings differ is refused, showing the state's value and the loader's."""
    p = plan(seed=1)
    p.begin().yielded = 1
    state = p.state("fmt", settings(p)())
    q = plan(seed=2)
    with pytest.raises(ValueError, match="seed: state has 1, this loader 2"):
        q.load(state, "fmt", settings(q))


def test_the_fronts_states_keep_their_fields_in_their_order(tmp_path):
    """Proves: spindle.DataLoader's and PipelineLoader's mid-epoch states are the same JSON, field for field
    and in order, as before EpochPlan owned them (saved checkpoints and their bytes stay as they were)."""
    loader = spindle.DataLoader(list(range(10)), batch_size=3, shuffle=True, seed=3, shard=(1, 2))
    next(iter(loader))
    assert json.dumps(loader.state_dict()) == (
        '{"format": "spindle.DataLoader", "version": 2, "epoch": 0, "batches": 1, "resplits": [], "seed": 3, '
        '"samples": 10, "batch_size": 3, "shuffle": true, "drop_last": false, "shard_drop_last": false, '
        '"shard": [1, 2]}')
    npy = tmp_path / "a.npy"
    np.save(npy, np.zeros((11, 2, 2, 3), np.uint8))
    pipe = spindle.pipeline.arrays(npy).batch(3, drop_last=True)
    native = spindle.PipelineLoader(pipe, num_workers=1, shuffle=True, seed=3, shard=(1, 2))
    it = iter(native)
    next(it)
    assert json.dumps(native.state_dict()) == (
        '{"format": "spindle.Loader", "version": 2, "epoch": 0, "batches": 1, "resplits": [], "shard": [1, 2], '
        f'"seed": 3, "source": ["npy", {json.dumps(str(npy))}], "samples": 11, "batch_size": 3, '
        '"drop_last": true, "shuffle": true, "shard_drop_last": false}')
    it.close()
