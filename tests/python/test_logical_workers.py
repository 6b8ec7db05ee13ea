"""Logical workers: a thread budget changes how many processes run, never the data.

Each program below runs twice: here (root, no budget: every worker asked is a process) and as
a throwaway unprivileged uid under a ``ulimit -u`` that fits only a few processes. Both runs must give the same
elements in the same order; the limited one must say "N logical workers on P processes".
"""

import json
import os
import shutil

import pytest

from unprivileged import import_closure, run_limited

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root to switch to an unprivileged uid")

# Tasks the limited run may add besides its interpreter: kReserve (2) plus about 3 workers.
HEADROOM = 5

GRAIN = r'''
import json, warnings
import numpy as np
import grain
from absl import flags
flags.FLAGS.mark_as_parsed()
import spindle.grain as sgrain

SOURCE = [np.full((4,), i, np.int32) for i in range(203)]

class AddOne(grain.transforms.Map):
    def map(self, x):
        return x + 1

class Noise(grain.transforms.RandomMap):
    def random_map(self, x, rng):
        return x + rng.integers(0, 1000)

def loader():
    sampler = grain.samplers.IndexSampler(num_records=len(SOURCE), shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=3)
    return sgrain.DataLoader(data_source=SOURCE, sampler=sampler, operations=[AddOne(), Noise()],
                             worker_count=16)

def run(state=None, taken=0):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(loader())
        if state is not None:
            it.set_state(state)
        head = [next(it).tolist() for _ in range(taken)]
        middle = it.get_state() if taken else None
        rest = [x.tolist() for x in it]
    notes = [str(w.message) for w in caught if "logical workers" in str(w.message)]
    return {"head": head, "state": middle.decode() if isinstance(middle, bytes) else middle, "rest": rest,
            "notes": notes}

if __name__ == "__main__":
    import sys
    state = STATE
    print(json.dumps(run(state.encode() if state is not None else None)))
'''

TORCH = r'''
import json, random, warnings
import numpy as np
import torch
import spindle.torch as storch
from torch.utils.data import IterableDataset, get_worker_info

class Split(IterableDataset):
    """Elements i with i % num_workers == id, each with draws from the worker's own generators."""
    def __iter__(self):
        info = get_worker_info()
        for i in range(info.id, 150, info.num_workers):
            yield torch.tensor([i, info.id, info.num_workers, random.random(), np.random.rand(), float(torch.rand(1))],
                               dtype=torch.float64)

class Draws:
    """A map dataset whose samples draw from the worker's generators (batch k: worker k mod N)."""
    def __len__(self):
        return 96
    def __getitem__(self, i):
        info = get_worker_info()
        return torch.tensor([i, info.id, random.random(), np.random.rand(), float(torch.rand(1))], dtype=torch.float64)

class Range(IterableDataset):
    """torch's documented split: worker_init_fn narrows the worker's copy of the dataset."""
    def __init__(self):
        self.start, self.end = 0, 100
    def __iter__(self):
        return iter(range(self.start, self.end))

def narrow(worker_id):
    info = get_worker_info()
    per = -(-100 // info.num_workers)
    info.dataset.start = info.id * per
    info.dataset.end = min(info.dataset.start + per, 100)

def epoch(dataset, **kw):
    loader = storch.DataLoader(dataset, num_workers=8, batch_size=4, generator=torch.Generator().manual_seed(7),
                               **kw)
    return [b.tolist() for b in loader]

def run():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream = epoch(Split())
        mapped = epoch(Draws(), shuffle=True)
        loader = storch.DataLoader(Range(), num_workers=8, batch_size=4, worker_init_fn=narrow,
                                   persistent_workers=True)
        narrowed = [[b.tolist() for b in loader] for _ in range(2)]  # the second epoch restarts the streams
    notes = [str(w.message) for w in caught if "logical workers" in str(w.message)]
    assert len(notes) in (0, 3), notes  # every loader shrunk, or none
    return {"stream": stream, "mapped": mapped, "narrowed": narrowed, "notes": notes}

if __name__ == "__main__":
    print(json.dumps(run()))
'''


def in_process(program: str, **kw):
    """The program run here, every worker a process of its own."""
    scope = {"__name__": "reference", "STATE": None}
    exec(compile(program, "<program>", "exec"), scope)
    return scope["run"](**kw)


def limited(program: str, extra: str, state=None):
    text = program.replace("STATE", repr(state))
    # Staged copies: the venv's own folder need not be readable by the unprivileged uid.
    done = run_limited(text, headroom=HEADROOM, timeout=240, packages=import_closure("spindle", extra))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def processes_in(notes: list[str], asked: int) -> int:
    assert len(notes) >= 1, "no budget warning: the limited run was not short"
    words = notes[0].split(" logical workers on ")
    assert words[0].endswith(str(asked)), notes[0]
    return int(words[1].split()[0])


def test_grain_worker_count_16_gives_the_same_elements_on_a_few_processes():
    """spindle.grain.DataLoader(worker_count=16) with a RandomMapTransform, as an unprivileged uid whose ulimit -u fits
    only a few workers, completes with exactly the elements, in exactly the order, of 16 processes; the warning
    says "16 logical workers on P processes"."""
    pytest.importorskip("grain")
    reference = in_process(GRAIN)
    assert reference["notes"] == []
    run = limited(GRAIN, "grain")
    assert 1 <= processes_in(run["notes"], 16) < 16
    assert len(run["rest"]) == 203
    assert run["rest"] == reference["rest"]


def test_grain_checkpoint_at_16_processes_resumes_exactly_on_3():
    """A grain checkpoint taken with 16 worker processes resumes under a budget of a few processes with
    exactly the elements that 16 processes give after it (the state is per logical worker)."""
    pytest.importorskip("grain")
    reference = in_process(GRAIN, taken=37)
    run = limited(GRAIN, "grain", state=reference["state"])
    assert 1 <= processes_in(run["notes"], 16) < 16
    assert run["rest"] == reference["rest"]
    assert len(run["rest"]) == 203 - 37


def test_torch_datasets_split_by_worker_info_give_the_same_batches_on_a_few_processes():
    """spindle.torch with num_workers=8 on a few processes: an IterableDataset split by get_worker_info() and a
    shuffled map dataset drawing from random/numpy/torch, and torch's documented worker_init_fn split (over two
    persistent epochs) give exactly the batches of 8 processes (each logical worker keeps its worker_info,
    generators and dataset attributes)."""
    pytest.importorskip("torch")
    reference = in_process(TORCH)
    assert reference["notes"] == []
    run = limited(TORCH, "torch")
    assert 1 <= processes_in(run["notes"], 8) < 8
    assert len(run["stream"]) == len(reference["stream"]) == 40  # 19 or 18 elements a stream, batches of 4
    assert run["stream"] == reference["stream"]
    assert run["mapped"] == reference["mapped"]
    assert run["narrowed"] == reference["narrowed"]
    assert sorted(sum(run["narrowed"][1], [])) == list(range(100))
