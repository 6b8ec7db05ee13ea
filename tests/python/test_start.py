"""The one start path (spindle._runtime.start): what every front end starts its runtime Loader with."""

import dataclasses
import multiprocessing

import pytest

from spindle import _core
from spindle._budget import reserve
from spindle._runtime.start import StartSpec, start_method_of


def test_start_spec_defaults_are_the_cores_loader_options():
    """Proves: every StartSpec field that LoaderOptions has (but the policy, None until resolved) defaults to
    LoaderOptions()'s value (the C++ core owns the defaults), and a default spec's options() equal
    LoaderOptions() field by field, but for what this process measures and the core keeps free: the
    consumer's reserve and each worker's tasks (``_budget/reserve.py``)."""
    core = _core.LoaderOptions()
    shared = [f.name for f in dataclasses.fields(StartSpec) if hasattr(core, f.name) and f.name != "budget_policy"]
    assert len(shared) == 15, shared
    assert StartSpec().budget_policy is None
    for name in shared:
        assert getattr(StartSpec(), name) == getattr(core, name), name
    built = StartSpec(budget_policy="shrink").options()
    for name in shared + ["slot_bytes", "max_skip_ratio", "stats", "stall_warning", "budget_policy"]:
        assert getattr(built, name) == getattr(core, name), name
    assert built.reserve_tasks >= reserve.BURST_MIN, built.reserve_tasks
    assert built.worker_tasks == reserve.planned_worker_tasks() >= 1


def test_start_spec_resolves_the_policy_from_the_environment_when_unset(monkeypatch):
    """Proves: budget_policy=None reads $SPINDLE_BUDGET_POLICY when the options are built; a set one wins."""
    monkeypatch.setenv("SPINDLE_BUDGET_POLICY", "fail")
    assert StartSpec().options().budget_policy == "fail"
    assert StartSpec(budget_policy="wait").options().budget_policy == "wait"
    monkeypatch.setenv("SPINDLE_BUDGET_POLICY", "sometimes")
    with pytest.raises(ValueError, match="SPINDLE_BUDGET_POLICY"):
        StartSpec().options()


def test_start_method_comes_from_the_context_or_the_global_method():
    """Proves: the start method is the context's (an object or a name), else multiprocessing's global one,
    and a spec refuses a method it cannot run."""
    assert start_method_of(multiprocessing.get_context("spawn")) == "spawn"
    assert start_method_of("forkserver") == "forkserver"
    assert start_method_of(None) == (multiprocessing.get_start_method(allow_none=True) or "fork")
    assert StartSpec(start_method="spawn").spawns and not StartSpec().spawns
    with pytest.raises(ValueError, match="start_method"):
        StartSpec(start_method="thread")


def test_front_signatures_read_their_defaults_from_the_core():
    """Proves: the defaults of prefetch_factor, max_batch_bytes, bytes_per_sample, the skip ratio and the shard
    retries/timeout/cache limit in the Python signatures are the C++ option structs' (one owner)."""
    import inspect

    import spindle
    from spindle import pipeline as sp

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    loader, pipe, shard = _core.LoaderOptions(), _core.PipelineOptions(), _core.ShardOptions()
    for fn in (spindle.DataLoader, spindle.PipelineLoader):
        assert default(fn, "prefetch_factor") == loader.prefetch_factor
    assert default(spindle.DataLoader, "max_batch_bytes") == loader.max_batch_bytes
    assert default(sp.Pipeline.batch, "bytes_per_sample") == pipe.bytes_per_sample
    assert sp.Pipeline(("npy", "x")).bytes_per_sample == pipe.bytes_per_sample
    assert default(sp.Pipeline.on_error, "max_ratio") == pipe.max_skip_ratio
    assert sp.Pipeline(("npy", "x")).errors == ("raise", pipe.max_skip_ratio)
    assert (default(sp.webdataset, "retries"), default(sp.webdataset, "timeout"),
            default(sp.webdataset, "cache_limit_bytes")) == (shard.retries, shard.timeout, shard.cache_limit_bytes)


def test_the_core_resolves_the_budget_policy(monkeypatch):
    """Proves: the policy's names, its variable and its default are the core's (one owner): resolve_budget_policy
    takes a given name, else $SPINDLE_BUDGET_POLICY, else "shrink", and a bad name's error says where it came from."""
    assert _core.BUDGET_POLICIES == ("shrink", "wait", "fail")
    monkeypatch.delenv("SPINDLE_BUDGET_POLICY", raising=False)
    assert _core.resolve_budget_policy() == "shrink"
    assert _core.resolve_budget_policy("fail") == "fail"
    monkeypatch.setenv("SPINDLE_BUDGET_POLICY", "wait")
    assert _core.resolve_budget_policy() == "wait" and _core.resolve_budget_policy("shrink") == "shrink"
    with pytest.raises(ValueError, match="budget_policy should be one of 'shrink', 'wait', 'fail', but got 'never'"):
        _core.resolve_budget_policy("never")
    monkeypatch.setenv("SPINDLE_BUDGET_POLICY", "bogus")
    with pytest.raises(ValueError, match=r"\$SPINDLE_BUDGET_POLICY should be one of .* but got 'bogus'"):
        _core.resolve_budget_policy()
