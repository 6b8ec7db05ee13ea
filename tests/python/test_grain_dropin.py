"""spindle.grain against grain, run side by side on the same pipelines.

Run on the grain in .venv (0.2.18: spindle's dataset stage) and, by ``make test-grain-oldest``, on grain
0.2.12 (spindle's workers in grain's pool's place): a test of a feature the older grain lacks says so."""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

grain = pytest.importorskip("grain")
from absl import flags  # noqa: E402  (grain's multiprocessing reads absl flags)

import spindle.grain as sgrain  # noqa: E402
from spindle.grain import _compat  # noqa: E402

flags.FLAGS.mark_as_parsed()

# Before grain 0.2.17 spindle serves grain through grain's own pool contract (spindle.grain._pool), and
# grain's iterators start new workers at set_state, keep no workers across repeat() epochs, and have
# neither get_next_index nor the per-slice checkpoint of the dataset stage.
dataset_stage = pytest.mark.skipif(_compat.POOL, reason=f"grain {_compat.installed_version()} has no "
                                   "dataset stage (0.2.17): its iterators restart grain's pool instead")

SOURCE = [np.full((4,), i, np.int32) for i in range(101)]


class AddOne(grain.transforms.Map):
    def map(self, x):
        return x + 1


class Noise(grain.transforms.RandomMap):
    def random_map(self, x, rng):
        return x + rng.integers(0, 1000)


class Even(grain.transforms.Filter):
    def filter(self, x):
        return int(x[0]) % 2 == 0


def loader(cls, workers, batch=True):
    sampler = grain.samplers.IndexSampler(num_records=len(SOURCE), shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=3)
    ops = [AddOne(), Noise(), Even()] + ([grain.transforms.Batch(batch_size=4, drop_remainder=False)] if batch else [])
    return cls(data_source=SOURCE, sampler=sampler, operations=ops, worker_count=workers)


def equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("batch", [True, False], ids=["batched", "elements"])
def test_data_loader_gives_graings_elements_in_graings_order(batch):
    """Map, RandomMap (per-record rng), Filter and Batch over a shuffled IndexSampler with 3 workers:
    the same elements in the same order as grain.DataLoader(worker_count=3)."""
    equal(list(loader(sgrain.DataLoader, 3, batch)), list(loader(grain.DataLoader, 3, batch)))


def test_mp_prefetch_gives_graings_elements_in_graings_order():
    """spindle.grain.mp_prefetch(ds, options) equals ds.mp_prefetch(options) for a dataset-API pipeline."""
    ds = (grain.MapDataset.source(SOURCE).shuffle(seed=5).map(lambda x: x * 2).to_iter_dataset()
          .filter(lambda x: int(x[0]) % 3 != 0).batch(5))
    options = grain.multiprocessing.MultiprocessingOptions(num_workers=2)
    equal(list(sgrain.mp_prefetch(ds, options)), list(ds.mp_prefetch(options)))


THREADS = """
import grain, spindle, spindle.grain as sgrain
import numpy as np
source = [np.full((4,), i, np.int32) for i in range(101)]
it = iter(sgrain.mp_prefetch(grain.MapDataset.source(source).to_iter_dataset(),
                             grain.multiprocessing.MultiprocessingOptions(num_workers=4)))
next(it)
print([spindle.count_process_threads(p) for p in it.worker_pids], 1 + len(list(it)))
"""


def test_grain_workers_hold_one_thread_each():
    """The loader tree is the consumer's threads plus one thread per worker (grain's 16 read threads are off).

    From a fresh interpreter: this test process used torch's pool, and torch's
    fork handler then leaves a pool thread in every child."""
    done = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("]")[0] + "]" == "[1, 1, 1, 1]", done.stdout
    assert done.stdout.strip().endswith(" 101"), done.stdout


@pytest.mark.parametrize("taken", [0, 1, 5, 11])
def test_checkpoints_are_graings_and_resume_where_grain_resumes(taken):
    """After `taken` batches, get_state() equals grain's checkpoint; set_state() (from either loader's
    checkpoint) on a new iterator yields exactly the batches grain yields after the same point."""
    ours_it, theirs_it = iter(loader(sgrain.DataLoader, 3)), iter(loader(grain.DataLoader, 3))
    for _ in range(taken):
        np.testing.assert_array_equal(next(ours_it), next(theirs_it))
    ours_state, theirs_state = ours_it.get_state(), theirs_it.get_state()
    assert ours_state == theirs_state
    rest = list(theirs_it)
    for state in (ours_state, theirs_state):
        resumed = iter(loader(sgrain.DataLoader, 3))
        resumed.set_state(state)
        equal(list(resumed), rest)


def options(workers, buffer=1):
    return grain.multiprocessing.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer)


def test_random_map_draws_a_different_stream_in_each_worker():
    """random_map after mp_prefetch: each worker knows its index and count, so workers draw different
    numbers (grain: 100 distinct values out of 100), and the values are grain's."""
    ds = grain.MapDataset.source([0]).repeat(100).to_iter_dataset()
    ds = ds.random_map(lambda x, rng: x + rng.integers(2**62), seed=42)
    ours = list(sgrain.mp_prefetch(ds, options(5)))
    assert len(set(ours)) == 100
    assert ours == list(ds.mp_prefetch(options(5)))


def test_a_worker_calling_sys_exit_raises_runtime_error_naming_the_code():
    """sys.exit(123) in a transform raises RuntimeError with grain's 'terminated unexpectedly with exit
    code 123', not SystemExit."""
    ds = grain.MapDataset.range(20).to_iter_dataset().map(lambda x: sys.exit(123))
    with pytest.raises(RuntimeError, match="was terminated unexpectedly with exit code 123"):
        list(sgrain.mp_prefetch(ds, options(1)))


@pytest.mark.parametrize("where", ["before", "after"])
def test_dataset_options_cross_mp_prefetch_both_ways(where):
    """DatasetOptions set before mp_prefetch reach the filter after it, and options set after it reach
    the filter inside the workers: filter_raise_threshold_ratio raises either way, as in grain."""
    ds = grain.MapDataset.source([1, 2, 3]).repeat(1000)
    limit = grain.experimental.DatasetOptions(filter_raise_threshold_ratio=0.1)
    if where == "before":
        ds = grain.experimental.WithOptionsIterDataset(ds.to_iter_dataset(), limit)
        ds = sgrain.mp_prefetch(ds, options(1)).filter(lambda x: x > 2)
    else:
        ds = sgrain.mp_prefetch(ds.filter(lambda x: x > 2).to_iter_dataset(), options(1))
        ds = grain.experimental.WithOptionsIterDataset(ds, limit)
    with pytest.raises(ValueError, match="filter_raise_threshold_ratio"):
        list(ds)


class Ones(grain.IterDataset):
    """An IterDataset source (no slicing possible)."""

    def __iter__(self):
        return OnesIterator()


class OnesIterator(grain.DatasetIterator):
    def __next__(self):
        return 1

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


def test_one_worker_reads_a_source_that_cannot_be_sliced():
    """One worker runs the whole pipeline unsliced, so an IterDataset source works; with two, slicing
    fails with grain's error."""
    it = iter(sgrain.mp_prefetch(Ones().map(lambda x: x + 1), options(1)))
    assert next(it) == 2
    del it  # its workers end with it (grain 0.2.12's iterators have no close())
    with pytest.raises(ValueError, match="Cannot slice `IterDataset` source"):
        list(sgrain.mp_prefetch(Ones().map(lambda x: x + 1), options(2)))


@dataset_stage
def test_next_index_and_element_spec_are_graings():
    """get_next_index/set_next_index (one worker, as in grain) and get_element_spec work through
    mp_prefetch, and get_state after set_next_index is the state reached by reading."""
    ds = grain.MapDataset.range(20).to_iter_dataset()
    it = iter(sgrain.mp_prefetch(ds, options(1)))
    next(it)
    state1, index1 = it.get_state(), grain.experimental.get_next_index(it)
    assert index1 == 1 and [next(it), next(it)] == [1, 2]
    grain.experimental.set_next_index(it, 7)
    assert next(it) == 7 and grain.experimental.get_next_index(it) == 8
    grain.experimental.set_next_index(it, index1)
    assert it.get_state() == state1
    spec = grain.experimental.get_element_spec(sgrain.mp_prefetch(ds, options(2)))
    assert (spec.dtype, spec.shape) == (np.int64, ())
    with pytest.raises(NotImplementedError):
        grain.experimental.get_next_index(iter(sgrain.mp_prefetch(ds, options(2))))


def test_replacing_grain_data_loader_with_ours_does_not_recurse(monkeypatch):
    """The usual monkeypatch grain.DataLoader = spindle.grain.DataLoader works: ours still builds
    grain's pipeline and gives grain's elements."""
    expected = list(loader(grain.DataLoader, 2))
    monkeypatch.setattr(grain, "DataLoader", sgrain.DataLoader)
    equal(list(loader(grain.DataLoader, 2)), expected)


def test_batches_of_arrays_arrive_zero_copy_and_other_elements_pickled():
    """A batched element (dict of arrays) arrives as views of shared memory, equal to grain's;
    an element with a Python scalar keeps its exact types (pickled)."""
    import spindle.grain as sg
    src = [{"x": np.full((3,), i, np.float32), "y": np.int64(i)} for i in range(40)]
    sampler = grain.samplers.IndexSampler(num_records=40, shard_options=grain.sharding.NoSharding(),
                                          shuffle=False, num_epochs=1, seed=0)
    ops = [grain.transforms.Batch(batch_size=8, drop_remainder=False)]
    got = list(sg.DataLoader(data_source=src, sampler=sampler, operations=ops, worker_count=2))
    want = list(grain.DataLoader(data_source=src, sampler=sampler, operations=ops, worker_count=2))
    assert len(got) == len(want) == 6  # each worker batches its own slice, as grain's do
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g["x"], w["x"])
        np.testing.assert_array_equal(g["y"], w["y"])
        assert g["x"].base is not None and not g["x"].flags.owndata  # a view of the slot, not a copy
    scalars = [{"x": np.zeros(2, np.float32), "n": i} for i in range(6)]
    sampler = grain.samplers.IndexSampler(num_records=6, shard_options=grain.sharding.NoSharding(),
                                          shuffle=False, num_epochs=1, seed=0)
    out = list(sg.DataLoader(data_source=scalars, sampler=sampler, worker_count=2))
    assert [type(e["n"]) for e in out] == [int] * 6 and [e["n"] for e in out] == list(range(6))


def _record_init(path, worker_id, num_workers):
    with open(path, "a") as f:
        f.write(f"{worker_id} {os.getpid()}\n")


@dataset_stage
def test_set_state_restarts_the_workers_in_place():
    """set_state() and set_next_index() after mp_prefetch keep the workers (grain keeps its own):
    the same processes, worker_init_fn once per worker, and the elements that follow the restored
    state are those first read after it."""
    import tempfile
    from functools import partial
    with tempfile.NamedTemporaryFile("r") as inits:
        ds = grain.MapDataset.range(30).to_iter_dataset().map(lambda x: (x, os.getpid()))
        it = iter(sgrain.mp_prefetch(ds, options(2, buffer=2), worker_init_fn=partial(_record_init, inits.name)))
        first = [next(it) for _ in range(5)]
        pids = set(it.worker_pids)
        assert {p for _, p in first} == pids and len(pids) == 2
        state = it.get_state()
        after = [next(it) for _ in range(7)]
        it.set_state(state)
        again = [next(it) for _ in range(7)]
        assert again == after
        assert [x for x, _ in first + after + list(it)] == list(range(30))
        it.set_state(state)  # again, after the end of the elements
        assert next(it)[0] == 5
        it.close()
        assert len(inits.read().splitlines()) == 2
        one = iter(sgrain.mp_prefetch(grain.MapDataset.range(10).to_iter_dataset(), options(1)))
        assert next(one) == 0
        pid = one.worker_pids
        grain.experimental.set_next_index(one, 6)
        assert [next(one), next(one)] == [6, 7] and one.worker_pids == pid


@dataset_stage
def test_repeat_after_mp_prefetch_keeps_the_workers_across_epochs():
    """repeat() over mp_prefetch: every epoch's elements are grain's, read by the same processes
    (worker_init_fn ran once per worker), and the workers end with the iterator."""
    import tempfile
    import time
    from functools import partial
    from grain._src.python.dataset.transformations import repeat
    with tempfile.NamedTemporaryFile("r") as inits:
        ds = grain.MapDataset.range(20).to_iter_dataset().map(lambda x: (x, os.getpid()))
        ds = sgrain.mp_prefetch(ds, options(3), worker_init_fn=partial(_record_init, inits.name))
        it = iter(repeat.RepeatIterDataset(ds, num_epochs=3))
        got = list(it)
        assert [x for x, _ in got] == list(range(20)) * 3
        assert len({p for _, p in got}) == 3
        assert len(inits.read().splitlines()) == 3
        del it
        gc.collect()
        deadline = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{p}") for _, p in got) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(os.path.exists(f"/proc/{p}") for _, p in got)


@dataset_stage
def test_a_state_a_worker_cannot_restore_raises_at_next_naming_the_worker():
    """set_state() with a state worker 1's iterator rejects: next() raises that worker's exception
    (its type, a note naming the worker), each time that worker's turn comes, until a good state."""
    it = iter(sgrain.mp_prefetch(grain.MapDataset.range(10).to_iter_dataset(), options(2)))
    assert [next(it), next(it)] == [0, 1]
    good = it.get_state()
    bad = it.get_state()
    bad["iterators_in_use_states"][1] = {"bogus": 1}
    it.set_state(bad)
    assert next(it) == 2
    for _ in range(2):
        with pytest.raises(KeyError) as raised:
            next(it)
        assert any("spindle worker 1 started its stream again" in n for n in raised.value.__notes__)
        assert next(it) in (4, 6)
    it.set_state(good)
    assert list(it) == list(range(2, 10))


def test_set_state_after_a_worker_died_starts_new_workers_from_the_state():
    """A worker killed mid-iteration raises (grain's RuntimeError family); set_state() then starts new
    workers from the state, and the elements after it are the ones that follow the state."""
    import signal
    it = iter(sgrain.mp_prefetch(grain.MapDataset.range(20).to_iter_dataset(), options(2),
                                 on_worker_death="raise"))
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
    state = it.get_state()
    old = it.worker_pids
    os.kill(old[1], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="killed by signal 9"):
        for _ in range(20):
            next(it)
    it.set_state(state)
    assert list(it) == list(range(4, 20))
    assert not set(it.worker_pids) & set(old)


# --- the grain it finds: spindle.grain._compat ----------------------------------------------

def test_only_the_compat_module_names_grains_src():
    """Proves: no module of the package but spindle.grain._compat imports from grain._src or reaches
    into the private attributes of grain's loader and datasets."""
    import pathlib
    import re

    package = pathlib.Path(__import__("spindle").__file__).parent
    names = ("grain._src", "_multiprocessing_options", "_set_slice_iter_dataset", "_MpContextIterDataset",
             "_read_options", "_worker_count")
    # The runtime table's thread cap of grain's read pool (limits.py, the runtime table) is a runtime
    # knob, not the drop-in's: it names grain's options module, and nothing else of grain._src.
    knob = "grain._src.python.options"
    found = [f"{path.relative_to(package).as_posix()}: {name}" for path in sorted(package.rglob("*.py"))
             if path.relative_to(package).as_posix() != "grain/_compat.py"
             for name in names if re.search(re.escape(name), path.read_text().replace(knob, ""))]
    assert found == []


def test_a_grain_outside_the_served_range_is_named():
    """Proves: a grain before 0.2.12 or after 0.2.18 is a reason to run on grain's own workers, named; a
    release in between is served the way its names allow (the pool's before 0.2.17, else the stage's)."""
    newer, older = (_compat.incompatibility(v) for v in ("0.2.19", "0.2.11"))
    assert "grain 0.2.19 is newer than the newest release spindle.grain was checked on (0.2.18)" in newer
    assert "grain 0.2.11 is older than the oldest release spindle.grain serves (0.2.12)" in older
    assert _compat.uses_pool("0.2.12") and _compat.uses_pool("0.2.16") and not _compat.uses_pool("0.2.17")
    # The names of the way the installed grain is served are there; those of the other way are not.
    served, other = ("0.2.12", "0.2.18") if _compat.POOL else ("0.2.18", "0.2.12")
    assert _compat.incompatibility(served) is None
    assert f"grain {other} has no grain._src" in _compat.incompatibility(other)


def test_a_missing_grain_name_is_named_and_this_grain_is_served():
    """Proves: the installed grain passes; a needed name that is gone is the reason, with the lookup's error."""
    assert _compat.FALLBACK is None
    assert _compat.incompatibility("0.0.1") is None  # grain without its metadata: its names decide
    needed = _compat._needed_pool() if _compat.POOL else _compat._needed()
    name = next(iter(needed))
    gone = dict(needed, **{name: lambda: grain._no_such_name})
    reason = _compat.incompatibility(_compat.installed_version(), gone)
    assert reason.startswith(f"grain {_compat.installed_version()} has no {name} as spindle.grain knows it "
                             "(AttributeError:")


def test_an_unserved_grain_runs_on_grains_own_workers_with_one_warning(tmp_path):
    """Proves: with a grain spindle.grain does not serve (its version set to 0.2.11 before spindle.grain is
    imported), spindle.grain.DataLoader and mp_prefetch give grain's own elements, through grain's workers,
    with one PeerVersionWarning naming the version; with grain's mp_prefetch monkeypatched to spindle's,
    the fallback runs grain's own method (no recursion)."""
    script = tmp_path / "old_grain.py"
    script.write_text(
        "import warnings\n"
        "import numpy as np\n"
        "import grain\n"
        "grain.__version__ = '0.2.11'\n"
        "from absl import flags\n"
        "flags.FLAGS.mark_as_parsed()\n"
        "import spindle.grain as sgrain\n"
        "from spindle.errors import PeerVersionWarning\n"
        "if __name__ == '__main__':\n"
        "    source = [np.full((2,), i, np.int32) for i in range(20)]\n"
        "    sampler = grain.samplers.IndexSampler(20, shard_options=grain.sharding.NoSharding(), shuffle=True,\n"
        "                                          num_epochs=1, seed=3)\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        ours = [int(x[0]) for x in sgrain.DataLoader(data_source=source, sampler=sampler, worker_count=2)]\n"
        "        ds = grain.MapDataset.source(source).to_iter_dataset()\n"
        "        staged = [int(x[0]) for x in sgrain.mp_prefetch(ds, grain.multiprocessing.MultiprocessingOptions(2))]\n"
        "    theirs = [int(x[0]) for x in grain.DataLoader(data_source=source, sampler=sampler, worker_count=2)]\n"
        "    plain = [int(x[0]) for x in ds.mp_prefetch(grain.multiprocessing.MultiprocessingOptions(2))]\n"
        "    warned = [str(w.message) for w in caught if issubclass(w.category, PeerVersionWarning)]\n"
        "    # the usual monkeypatch of grain's method: spindle.grain runs grain's own, not itself again\n"
        "    grain.IterDataset.mp_prefetch = lambda d, o=None, worker_init_fn=None: sgrain.mp_prefetch(d, o)\n"
        "    patched = [int(x[0]) for x in ds.mp_prefetch(grain.multiprocessing.MultiprocessingOptions(2))]\n"
        "    print(ours == theirs, staged == plain == patched, len(warned))\n"
        "    print(warned[0])\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "True True 1"
    assert lines[1] == ("spindle.grain: DataLoader and mp_prefetch run on grain's own workers: grain 0.2.11 "
                        "is older than the oldest release spindle.grain serves (0.2.12)")


class DiesOnceAt(grain.transforms.Map):
    """The first worker to map element `at` dies by SIGKILL (a marker file says it happened)."""

    def __init__(self, at, marks):
        self.at, self.marks = at, marks

    def map(self, x):
        import signal
        mark = os.path.join(self.marks, str(x))
        if x in self.at and not os.path.exists(mark):
            open(mark, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return x


def test_a_lost_worker_is_replaced_from_the_slices_states_with_graings_elements(tmp_path, caplog):
    """Proves: workers killed at three elements (3 workers, grain's DataLoader order as reference):
    the elements are grain's, each once, in grain's order; one WARNING per loss; the same iterator's
    checkpoint after the losses resumes where grain resumes."""
    import logging
    ds = grain.MapDataset.range(60).to_iter_dataset()
    expected = list(ds.mp_prefetch(grain.multiprocessing.MultiprocessingOptions(num_workers=3)))
    killing = ds.map(DiesOnceAt({7, 25, 41}, str(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="spindle"):
        it = iter(sgrain.mp_prefetch(killing, options(3)))
        got = [next(it) for _ in range(50)]
        state = it.get_state()
        got += list(it)
    assert got == expected
    losses = [r.getMessage() for r in caplog.records if "start again from each slice's state" in r.getMessage()]
    assert len(losses) == 3 and all("killed by signal 9" in m for m in losses), losses
    resumed = iter(sgrain.mp_prefetch(killing, options(3)))
    resumed.set_state(state)
    assert list(resumed) == expected[50:]


def test_a_grain_element_that_kills_every_worker_is_named_at_its_second_loss():
    """Proves: an element whose map kills its worker each time: restarted once from the states, then
    WorkerDiedError says it was lost at the same elements, and nothing more is restarted."""
    import signal
    ds = grain.MapDataset.range(30).to_iter_dataset().map(
        lambda x: os.kill(os.getpid(), signal.SIGKILL) if x == 13 else x)
    with pytest.raises(RuntimeError, match=r"killed by signal 9.*at the same elements as an earlier loss"):
        list(sgrain.mp_prefetch(ds, options(2)))


class Slow(grain.transforms.Map):
    """Each element waits 4 ms first (a remote read): one process cannot keep up."""

    def map(self, x):
        import time
        time.sleep(0.004)
        return x


@dataset_stage
def test_auto_workers_grow_from_one_process_with_a_fixed_runs_elements(caplog):
    """Proves: num_workers="auto" runs auto_workers() workers' slices (random_map's per-worker draws
    included) on processes that start at the idle cores and grow while the loop waits: the elements are those of
    the same count of fixed workers, in their order; each change is one INFO line; a checkpoint taken after
    the growth resumes on the fixed run's elements; a DataLoader's worker_count="auto" is the same."""
    import logging
    n = sgrain.auto_workers()
    ds = (grain.MapDataset.range(480).to_iter_dataset().map(Slow())
          .random_map(lambda x, rng: x * 1000 + int(rng.integers(1000)), seed=9))
    expected = list(sgrain.mp_prefetch(ds, options(n)))
    with caplog.at_level(logging.INFO, logger="spindle"):
        it = iter(sgrain.mp_prefetch(ds, options("auto")))
        first = len(it.worker_pids)  # the cores idle now
        got = [next(it) for _ in range(300)]
        state = it.get_state()
        got += list(it)
    assert got == expected
    grew = [r.getMessage() for r in caplog.records if "start again on them from their states" in r.getMessage()]
    assert 1 <= first <= len(os.sched_getaffinity(0)) < n
    assert grew and grew[0].startswith(f"spindle: {first} -> ") and f"(at most {n})" in grew[0], grew
    resumed = iter(sgrain.mp_prefetch(ds, options("auto")))
    resumed.set_state(state)
    assert list(resumed) == expected[300:]
    equal(list(loader(sgrain.DataLoader, "auto")), list(loader(sgrain.DataLoader, n)))


@dataset_stage
def test_auto_workers_start_a_data_loaders_next_epoch_on_the_processes_its_last_ended_on(caplog):
    """Proves: a DataLoader's worker_count="auto" starts its next iteration on the processes the last
    one ended on (no growth needed again), with grain's elements both times."""
    import logging
    n = sgrain.auto_workers()
    source = [np.full((4,), i, np.int32) for i in range(400)]

    def make(workers):
        sampler = grain.samplers.IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(),
                                              shuffle=False, num_epochs=1, seed=3)
        return sgrain.DataLoader(data_source=source, sampler=sampler, operations=[Slow()], worker_count=workers)

    expected = list(make(n))
    dl = make("auto")
    equal(list(dl), expected)
    ended = dl.stats()["processes"]
    assert ended > len(os.sched_getaffinity(0)), dl.stats()
    with caplog.at_level(logging.INFO, logger="spindle"):
        equal(list(dl), expected)
    assert not [r.getMessage() for r in caplog.records if "worker processes" in r.getMessage()]
    assert dl.stats()["processes"] == ended


class Slower(grain.transforms.Map):
    """Each element waits 0.8 s (a batch of remote records): the first element comes long after the
    controller's first window."""

    def map(self, x):
        import time
        time.sleep(0.8)
        return x, os.getpid()


@dataset_stage
def test_auto_workers_take_advice_before_a_slow_first_element():
    """Proves: advice that comes while no element is ready is taken then (the runtime's next() stops
    waiting with ProcessesAdvised), not after the element in flight: the first element already comes
    from a process started on the advice, and the elements are a fixed run's."""
    n = sgrain.auto_workers()
    ds = grain.MapDataset.range(2 * n).to_iter_dataset().map(Slower())
    it = iter(sgrain.mp_prefetch(ds, options("auto")))
    first = set(it.worker_pids)  # the cores idle now, fewer than the workers
    got = [next(it)]
    assert got[0][1] not in first and first.isdisjoint(it.worker_pids) and len(first) < len(it.worker_pids) <= n
    got += list(it)
    assert [x for x, _ in got] == list(range(2 * n))  # worker w's slice is w, w + n: in turn, the range


@pytest.mark.skipif(not _compat.POOL, reason="grain 0.2.17 and newer run spindle's own stage, which takes auto")
def test_auto_workers_are_refused_where_grain_fixes_the_processes():
    """Proves: on a grain spindle serves inside grain's own iterators (before 0.2.17: make
    test-grain-oldest), "auto" is a ValueError naming the grain and what to give."""
    with pytest.raises(ValueError, match=r"worker_count='auto' needs grain 0.2.17 or newer.*give a number"):
        loader(sgrain.DataLoader, "auto")
    with pytest.raises(ValueError, match=r"num_workers='auto' needs grain 0.2.17"):
        sgrain.mp_prefetch(grain.MapDataset.range(4).to_iter_dataset(), options("auto"))


CONSUMER_THREADS = """
import os, threading
import numpy as np
import grain
from absl import flags
flags.FLAGS.mark_as_parsed()
import spindle.grain as sgrain
def tasks():
    return len(os.listdir("/proc/self/task"))
if __name__ == "__main__":
    source = [np.full((4,), i, np.int32) for i in range(200)]
    sampler = grain.samplers.IndexSampler(num_records=200, shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=3)
    before = tasks()
    seen = []
    for i, x in enumerate(sgrain.DataLoader(data_source=source, sampler=sampler, worker_count=4,
                                            worker_buffer_size=4)):
        seen.append(tasks())
    staged = sgrain.mp_prefetch(grain.MapDataset.source(source).to_iter_dataset(),
                                grain.multiprocessing.MultiprocessingOptions(num_workers=4, per_worker_buffer_size=4))
    for x in staged:
        seen.append(tasks())
    print(before, max(seen), len(seen))
"""


def test_the_consumer_runs_no_thread_for_the_workers():
    """Proves: while spindle.grain's DataLoader and mp_prefetch deliver (4 workers, 4 elements each in
    flight), the consumer runs the threads it ran before and no more (grain's pool adds a reader thread,
    a thread pool as large as the buffer and a queue feeder per worker)."""
    done = subprocess.run([sys.executable, "-c", CONSUMER_THREADS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    before, most, count = map(int, done.stdout.split())
    assert count == 400 and most == before, done.stdout
