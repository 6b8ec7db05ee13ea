"""spindle.mix: deterministic weighted mixing of map-style sources."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

import spindle


class Tagged:
    """Source `tag` of `n` elements: element k is the int tag * 1_000_000 + k."""

    def __init__(self, tag, n):
        self.tag, self.n = tag, n

    def __len__(self):
        return self.n

    def __getitem__(self, k):
        if not 0 <= k < self.n:
            raise IndexError(k)
        return np.array([self.tag * 1_000_000 + k])


def sources():
    return [Tagged(0, 6000), Tagged(1, 9000), Tagged(2, 2500)]


WEIGHTS = [0.5, 0.3, 0.2]


def values(batches):
    return [int(v) for b in batches for v in np.asarray(b).reshape(-1)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_mix_draws_in_the_weights_proportions_each_element_once_and_ends_when_a_source_runs_out(shuffle):
    """Proves: over 12k elements every prefix of 1000+ has each source's share within 1% of its weight, no
    element comes twice, each source's elements come in order (or its seeded permutation), and the length is
    where the first source runs out (within the source count of grain's min len_j / w_j)."""
    mixed = spindle.mix(sources(), WEIGHTS, seed=4, shuffle=shuffle)
    n = len(mixed)
    assert abs(n - min(6000 / 0.5, 9000 / 0.3, 2500 / 0.2)) <= 3 and n >= 10_000
    got = [int(mixed[i][0]) for i in range(n)]
    assert len(set(got)) == n
    per_source = collections.defaultdict(list)
    for v in got:
        per_source[v // 1_000_000].append(v % 1_000_000)
    for j, ks in per_source.items():
        if shuffle:
            assert ks == np.random.default_rng([4, 1, j]).permutation(sources()[j].n)[:len(ks)].tolist()
        else:
            assert ks == list(range(len(ks)))
    assert any(len(per_source[j]) == sources()[j].n for j in range(3))  # one source ran out
    tags = np.array([v // 1_000_000 for v in got])
    for end in range(1000, n + 1, 500):
        shares = np.bincount(tags[:end], minlength=3) / end
        assert np.abs(shares - WEIGHTS).max() < 0.01, (end, shares)
    assert spindle.mix(sources(), WEIGHTS, seed=4, shuffle=shuffle).locate(77) == mixed.locate(77)
    with pytest.raises(IndexError, match=f"index {n} is out of range for a mix of {n} elements"):
        mixed[n]


def test_mix_is_the_same_for_any_worker_count_in_every_loader():
    """Proves: the mix's batches are identical with 1, 2 and 3 workers in spindle.DataLoader (shuffled, seeded),
    and spindle.torch.DataLoader and torch's own DataLoader give the mix's elements in its order."""
    mixed = spindle.mix(sources(), WEIGHTS, seed=1)
    runs = [values(spindle.DataLoader(mixed, batch_size=64, shuffle=True, seed=5, num_workers=w)) for w in (1, 2, 3)]
    assert runs[0] == runs[1] == runs[2] and sorted(runs[0]) == sorted(int(mixed[i][0]) for i in range(len(mixed)))
    torch = pytest.importorskip("torch")
    import spindle.torch as st

    small = spindle.mix([Tagged(0, 300), Tagged(1, 200)], [2, 1], seed=2)
    expected = [int(small[i][0]) for i in range(len(small))]
    for w in (1, 2, 3):
        assert values(st.DataLoader(small, batch_size=16, num_workers=w)) == expected
    assert values(torch.utils.data.DataLoader(small, batch_size=16, num_workers=2)) == expected


def test_mix_resumes_exactly_through_the_loaders_state_and_refuses_another_mix():
    """Proves: a spindle.DataLoader and a StatefulDataLoader over a mix resume after k batches to exactly the
    rest; a mid-epoch state is refused by a loader over another mix (weights, seed, a source's length), naming
    both values; a state at an epoch's start carries the epoch over to a mix with new weights."""
    make = lambda m, w=2: spindle.DataLoader(m, batch_size=50, shuffle=True, seed=3, num_workers=w)  # noqa: E731
    mixed = spindle.mix(sources(), WEIGHTS, seed=1)
    whole = values(make(mixed))
    first = make(mixed)
    it = iter(first)
    head = values([next(it) for _ in range(7)])
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make(spindle.mix(sources(), WEIGHTS, seed=1), 3)
    resumed.load_state_dict(state)
    assert head + values(resumed) == whole
    with pytest.raises(ValueError, match=r"dataset: state has \{.*'weights': \[0.5, 0.3, 0.2\].*this loader "
                                         r"\{.*'weights': \[0.4, 0.4, 0.2\]"):
        make(spindle.mix(sources(), [0.4, 0.4, 0.2], seed=1)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"'seed': 1.*'seed': 2"):
        make(spindle.mix(sources(), WEIGHTS, seed=2)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"'mix_lengths': \[6000, 9000, 2500\].*'mix_lengths': \[6000, 9000, 2400\]"):
        make(spindle.mix([Tagged(0, 6000), Tagged(1, 9000), Tagged(2, 2400)], WEIGHTS, seed=1)).load_state_dict(state)
    finished = make(mixed)
    values(finished)
    reweighted = make(spindle.mix(sources(), [0.2, 0.3, 0.5], seed=1))
    reweighted.load_state_dict(finished.state_dict())  # epoch 1 over the new weights
    assert reweighted.state_dict()["epoch"] == 1

    pytest.importorskip("torchdata")
    from spindle.torch import StatefulDataLoader

    small = lambda: spindle.mix([Tagged(0, 300), Tagged(1, 200)], [2, 1], seed=2)  # noqa: E731
    loader = StatefulDataLoader(small(), batch_size=16, shuffle=True, num_workers=2)
    it = iter(loader)
    head = values([next(it) for _ in range(5)])
    state = json.loads(json.dumps(loader.state_dict()))
    rest = values(it)
    again = StatefulDataLoader(small(), batch_size=16, shuffle=True, num_workers=3)
    again.load_state_dict(state)
    assert values(again) == rest and sorted(head + rest) == sorted(int(small()[i][0]) for i in range(450))


@pytest.mark.parametrize("weights,message", [
    ([0.5, 0.5], r"3 datasets but 2 weights \(\[0.5, 0.5\]\)"),
    ([0.5, -0.1, 0.6], r"weights\[1\] = -0.1 is negative"),
    ([0, 0, 0], r"every weight is zero \(\[0, 0, 0\]\)"),
    ([0.5, float("nan"), 1], r"weights\[1\] = nan is not a finite number"),
    ([1, float("inf"), 1], r"weights\[1\] = inf is not a finite number"),
])
def test_mix_refuses_bad_weights_naming_the_value(weights, message):
    """Proves: negative, all-zero, NaN/inf or wrong-length weights are a ValueError naming the value."""
    with pytest.raises(ValueError, match=message):
        spindle.mix(sources(), weights)


def test_mix_refuses_an_empty_or_non_map_style_source():
    """Proves: an empty source, or one without len()/[i], is refused naming its position."""
    with pytest.raises(ValueError, match=r"datasets\[1\] \(Tagged\) is empty \(len 0\)"):
        spindle.mix([Tagged(0, 3), Tagged(1, 0)], [1, 1])
    with pytest.raises(TypeError, match=r"datasets\[0\] \(generator\) is not map-style"):
        spindle.mix([(i for i in range(3))], [1])
    zero_weight = spindle.mix([Tagged(0, 10), Tagged(1, 3)], [1, 0])  # weight 0: never drawn, no limit
    assert len(zero_weight) == 10 and {int(zero_weight[i][0]) // 1_000_000 for i in range(10)} == {0}


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None, derandomize=True)  # the same examples in every run (CI)
@given(lengths=st.lists(st.integers(1, 400), min_size=1, max_size=5), data=st.data(), seed=st.integers(0, 2**32),
       shuffle=st.booleans())
def test_mix_length_rule_and_discrepancy_hold_for_any_weights(lengths, data, seed, shuffle):
    """Proves: for random lengths and weights, no element comes twice, no source gives more than it has, one
    source is used up, the length is within the source count of grain's min len_j / p_j, and every prefix
    has each source's count within the source count + 1 of i * p_j."""
    weights = data.draw(st.lists(st.floats(0, 10), min_size=len(lengths), max_size=len(lengths)))
    if not any(weights):
        weights[0] = 1.0
    mixed = spindle.mix([Tagged(j, n) for j, n in enumerate(lengths)], weights, seed=seed, shuffle=shuffle)
    total = sum(weights)
    p = [w / total for w in weights]
    n = len(mixed)
    grain_rule = min(length / share for length, share in zip(lengths, p) if share > 0)
    assert abs(n - grain_rule) <= len(lengths)
    located = [mixed.locate(i) for i in range(n)]
    assert len(set(located)) == n
    counts = np.zeros(len(lengths), dtype=np.int64)
    for i, (j, k) in enumerate(located, 1):
        counts[j] += 1
        assert abs(counts[j] - i * p[j]) <= len(lengths) + 1
    assert all(counts <= lengths) and any(counts == lengths)
    assert all(counts[j] == 0 for j in range(len(lengths)) if p[j] == 0)
