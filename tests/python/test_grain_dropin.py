"""spindle.grain against grain, run side by side on the same pipelines."""

import subprocess
import sys

import numpy as np
import pytest

grain = pytest.importorskip("grain")
from absl import flags  # noqa: E402  (grain's multiprocessing reads absl flags)

import spindle.grain as sgrain  # noqa: E402

flags.FLAGS.mark_as_parsed()

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
