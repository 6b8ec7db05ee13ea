"""spindle.DataLoader in a program that sets multiprocessing's start method globally.

Python 3.14 makes 'forkserver' the default on Linux: a dataset then holds named semaphores
(a Value's lock, a Semaphore) that the consumer unlinks only when it ends. spindle's own
workers are forked whatever the start method; their end must leave those names alone, so that
multiprocessing's own children (or torch's spawned workers) can still open them afterwards.
Base package only: this file runs in the 3.12/3.13 matrix too.
"""

import multiprocessing

import pytest

import spindle
from toy_datasets import CountsUnderSemaphore

SAMPLES = 6


def count_once(dataset):
    """A multiprocessing child's sample: opens the semaphores by name as it unpickles them."""
    dataset[0]


@pytest.fixture
def forkserver_default():
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def test_forked_workers_under_the_forkserver_default_share_a_value_and_a_semaphore(forkserver_default):
    """Proves: after set_start_method('forkserver'), a dataset holding mp.Value(lock=True) and mp.Semaphore
    loads in spindle.DataLoader's workers (every sample counted once in the consumer's Value, two epochs),
    and after their end a forkserver child of multiprocessing still opens both semaphores by name."""
    dataset = CountsUnderSemaphore(SAMPLES)
    assert all(name is not None for name in (dataset.count.get_lock()._semlock.name, dataset.slots._semlock.name))
    loader = spindle.DataLoader(dataset, batch_size=2, num_workers=2)
    for epoch in (1, 2):
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
        assert dataset.count.value == SAMPLES * epoch
    assert dataset.names_exist() == [True, True]
    child = multiprocessing.Process(target=count_once, args=(dataset,))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and dataset.count.value == 2 * SAMPLES + 1
