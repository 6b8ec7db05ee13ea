"""The extension's option structs and names: what the bindings convert and check."""

import math

import numpy as np
import pytest

from spindle import _core


def test_loader_options_convert_seconds_and_policy_names_and_show_every_field():
    """Proves: LoaderOptions takes timeout in seconds (inf: forever, 0) and budget_policy by name, and its repr names the fields."""
    o = _core.LoaderOptions()
    o.num_workers, o.batch_capacity, o.timeout, o.max_threads = 3, 8, 1.5, 4
    o.budget_policy, o.max_skip_ratio = "wait", 0.25
    assert (o.num_workers, o.batch_capacity, o.timeout, o.max_threads) == (3, 8, 1.5, 4)
    assert (o.budget_policy, o.max_skip_ratio) == ("wait", 0.25)
    o.timeout = math.inf
    assert o.timeout == 0.0  # forever
    o.max_threads = None
    assert o.max_threads is None
    shown = repr(o)
    for field in ("num_workers=3", "batch_capacity=8", "budget_policy='wait'", "max_skip_ratio=0.25", "max_threads=None"):
        assert field in shown


@pytest.mark.parametrize("timeout", [-1.0, math.nan])
def test_loader_options_refuse_a_negative_or_nan_timeout(timeout):
    """Proves: a timeout that is not a non-negative number of seconds is a ValueError when set."""
    with pytest.raises(ValueError, match="timeout must be a non-negative number of seconds"):
        _core.LoaderOptions().timeout = timeout


def test_loader_options_refuse_an_unknown_budget_policy():
    """Proves: budget_policy is checked by the runtime's own parser when set."""
    with pytest.raises(ValueError, match="budget_policy"):
        _core.LoaderOptions().budget_policy = "sometimes"


def test_loader_refuses_a_strided_order_before_starting_workers():
    """Proves: the order must be a contiguous 1-D int64 array (the one contiguity check), before anything forks."""
    with pytest.raises(ValueError, match="order must be a contiguous 1-D int64 array"):
        _core.Loader(_core.LoaderOptions(), order=np.arange(8, dtype=np.int64)[::2], worker_main=lambda ctx: 0)


def test_a_delivered_batch_is_bound_by_its_cpp_name():
    """Proves: the C++ Batch is _core.Batch in Python (one name for one thing)."""
    assert _core.Batch.__name__ == "Batch" and not hasattr(_core, "Lease")
