"""spindle.mix: deterministic weighted mixing of map-style sources."""

from __future__ import annotations

import collections
import importlib.util
import json
import pickle
import sys

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


class Traced:
    """Source `tag` of `n` elements: element k is (int64 [tag * 1_000_000 + k, how it was called], k) with how 1
    if no Mix.__getitem__ is among its callers (a loader's routed read), else 0; element `bad` raises."""

    def __init__(self, tag, n, bad=-1):
        self.tag, self.n, self.bad = tag, n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, k):
        if k == self.bad:
            raise ValueError(f"corrupt record {k} in source {self.tag}")
        frame, routed = sys._getframe(1), 1
        while frame is not None:
            routed = 0 if frame.f_code is spindle.Mix.__getitem__.__code__ else routed
            frame = frame.f_back
        return np.array([self.tag * 1_000_000 + k, routed]), k


def traced(bad=-1):
    return spindle.mix([Traced(0, 300), Traced(1, 200, bad), Traced(2, 120)], WEIGHTS, seed=6, shuffle=True)


def loaders():
    """(name, make(dataset, workers)) of the loaders that read a mix through its RoutedDataset: the array path
    (read_rows) and, with a collate_fn, the kept-samples path (read_samples)."""
    made = [("spindle.DataLoader", lambda d, w: spindle.DataLoader(d, batch_size=32, num_workers=w))]
    if importlib.util.find_spec("torch") is not None:
        import spindle.torch as st

        made += [("spindle.torch.DataLoader", lambda d, w: st.DataLoader(d, batch_size=32, num_workers=w)),
                 ("spindle.torch.DataLoader collate_fn", lambda d, w: st.DataLoader(
                     d, batch_size=32, num_workers=w, collate_fn=lambda s: {"kept": [(a.tolist(), k) for a, k in s]}))]
    return made


def rows(batches):
    """(value, how it was called, label) of every element of `batches`."""
    got = []
    for b in batches:
        pairs = b["kept"] if isinstance(b, dict) else zip(np.asarray(b[0]).tolist(), np.asarray(b[1]).tolist())
        got += [(int(v), int(how), int(k)) for (v, how), k in pairs]
    return got


class Doubled(spindle.Mix):
    """A mix reading its elements otherwise: each value doubled."""

    def __getitem__(self, i):
        value, k = super().__getitem__(i)
        return value * [2, 1], k


@pytest.mark.parametrize("workers", [1, 2])
def test_loaders_read_a_mix_through_its_routed_schedule_exactly_as_its_getitem(workers):
    """Proves: spindle.DataLoader and spindle.torch.DataLoader (array path and collate_fn path), with 1 and 2
    workers, give exactly the elements Mix.__getitem__ gives, in its order, and read them without calling
    Mix.__getitem__ (the RoutedDataset's C++ read); a subclass with its own __getitem__ is read through it."""
    mixed = traced()
    expected = [(int(a[0]), k) for a, k in (mixed[i] for i in range(len(mixed)))]
    assert all(int(mixed[i][0][1]) == 0 for i in range(len(mixed)))  # a direct call is seen as one
    for name, make in loaders():
        got = rows(make(mixed, workers))
        assert [(v, k) for v, _, k in got] == expected, name
        assert {how for _, how, _ in got} == {1}, name

    doubled = Doubled([Traced(0, 300), Traced(1, 200), Traced(2, 120)], WEIGHTS, seed=6, shuffle=True)
    assert doubled.spindle_routed() is None
    again = pickle.loads(pickle.dumps(doubled))  # spawned workers get the subclass, not a plain Mix
    assert type(again) is Doubled and int(again[5][0][0]) == 2 * int(mixed[5][0][0])
    got = rows(spindle.DataLoader(doubled, batch_size=32, num_workers=workers))
    assert [(v, k) for v, _, k in got] == [(2 * v, k) for v, k in expected] and {h for _, h, _ in got} == {0}


def test_an_error_in_a_source_names_the_mix_index_the_source_and_its_index():
    """Proves: an exception from a source's __getitem__ keeps its type and text and carries a note naming the
    mix's index, the source and the source's index, the same from Mix.__getitem__ and from the workers' routed
    read in spindle.DataLoader and spindle.torch.DataLoader, whose note also names the mix's index."""
    mixed = traced(bad=57)
    i = next(i for i in range(len(mixed)) if mixed.locate(i) == (1, 57))
    where = f"spindle.mix: element {i} is element 57 of datasets[1] (Traced)"
    with pytest.raises(ValueError, match="corrupt record 57 in source 1") as direct:
        mixed[i]
    assert where in direct.value.__notes__
    for name, make in loaders():
        with pytest.raises(ValueError, match="corrupt record 57 in source 1") as info:
            list(make(mixed, 2))
        notes = "\n".join(info.value.__notes__)
        assert where in notes and f"while loading sample index {i} " in notes, name


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


def test_routed_dataset_refuses_a_schedule_it_cannot_read_naming_what_is_wrong():
    """Proves: the C++ reader of a mix's schedule refuses arrays of another type or dimension, arrays of different
    lengths and an element whose source has no getter, each naming the problem, instead of reading past them."""
    from spindle import _core

    getters, names = [[10, 11].__getitem__, [20].__getitem__], ["datasets[0] (list)", "datasets[1] (list)"]
    sources, indices = np.array([0, 1, 0], np.uint8), np.array([0, 0, 1], np.int32)
    routed = _core.RoutedDataset(sources, indices, getters, names, "about")
    assert [routed[i] for i in range(3)] == [10, 20, 11] and routed.locate(-1) == (0, 1)
    with pytest.raises(ValueError, match=r"sources should be a contiguous 1-D uint8 or uint32 array, but got "
                                         r"format 'f'"):
        _core.RoutedDataset(sources.astype(np.float32), indices, getters, names, "about")
    with pytest.raises(ValueError, match=r"indices should be a contiguous 1-D int32 or int64 array.* 2 dimension"):
        _core.RoutedDataset(sources, indices.reshape(3, 1), getters, names, "about")
    with pytest.raises(ValueError, match=r"has 3 sources but 2 indices"):
        _core.RoutedDataset(sources, indices[:2], getters, names, "about")
    with pytest.raises(ValueError, match=r"element 1 has source 1, but there are 1 sources"):
        _core.RoutedDataset(sources, indices, getters[:1], names[:1], "about")
    with pytest.raises(IndexError, match=r"index 3 is out of range for a mix of 3 elements \(about\)"):
        routed[3]
