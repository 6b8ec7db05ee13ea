"""spindle.torch inside code that builds torch's own loaders: the subclass, install(), SPINDLE_TORCH=1,
torch's lazy sampler draws, and the collate paths."""

import collections
import dataclasses
import multiprocessing
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader as TorchLoader, Dataset, RandomSampler  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

import spindle.torch  # noqa: E402
from spindle.torch import DataLoader, _compat  # noqa: E402


class WhoLoads(Dataset):
    """Each sample says which process loaded it."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"index": i, "worker": multiprocessing.current_process().name}


class Images(Dataset):
    """Fixed-shape float32 samples (the zero-copy array path)."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((3, 8, 8), float(i)), i


@pytest.fixture
def installed():
    spindle.torch.install()
    try:
        yield
    finally:
        spindle.torch.uninstall()


def indices_and_workers(loader):
    indices, workers = [], set()
    for batch in loader:
        indices += batch["index"].tolist()
        workers |= set(batch["worker"])
    return indices, workers


def test_a_spindle_loader_is_a_torch_dataloader_and_recreates_from_its_attributes():
    """Proves: isinstance passes, and re-creating the loader from its constructor's parameters read off
    its attributes (as Lightning's _update_dataloader does) gives a spindle loader with the new sampler."""
    loader = DataLoader(WhoLoads(), batch_size=4, shuffle=True, num_workers=2)
    assert isinstance(loader, TorchLoader)
    assert isinstance(loader.sampler, RandomSampler)
    import inspect

    params = inspect.signature(type(loader).__init__).parameters
    kwargs = {name: getattr(loader, name) for name in params
              if name not in ("self", "shuffle", "sampler", "batch_sampler", "peer_options") and hasattr(loader, name)}
    sampler = torch.utils.data.distributed.DistributedSampler(loader.dataset, num_replicas=2, rank=1, shuffle=False)
    again = type(loader)(sampler=sampler, **kwargs)
    assert type(again) is DataLoader and again.sampler is sampler
    indices, workers = indices_and_workers(again)
    assert indices == list(range(1, 24, 2)), "rank 1 of 2 gets every other sample"
    assert all(w.startswith("SpindleWorker-") for w in workers), workers


def test_install_serves_torchs_own_loaders_and_their_subclasses_and_uninstall_restores_torch(installed):
    """Proves: after install(), torch's DataLoader and a subclass with its own __iter__ (as accelerate's
    DataLoaderShard) load on spindle's workers with torch's batches; after uninstall() torch's workers load."""

    class Shard(TorchLoader):
        def __iter__(self):
            for batch in super().__iter__():
                yield batch

    def make(cls):
        return cls(WhoLoads(), batch_size=5, shuffle=True, num_workers=2,
                   generator=torch.Generator().manual_seed(3))

    expected = [i for b in TorchLoader(WhoLoads(), batch_size=5, shuffle=True, num_workers=0,
                                       generator=torch.Generator().manual_seed(3)) for i in b["index"].tolist()]
    for cls in (TorchLoader, Shard):
        indices, workers = indices_and_workers(make(cls))
        assert indices == expected, cls
        assert workers == {"SpindleWorker-1", "SpindleWorker-2"}, (cls, workers)
    spindle.torch.uninstall()
    assert not spindle.torch.installed()
    indices, workers = indices_and_workers(make(TorchLoader))
    assert indices == expected
    assert not any(w.startswith("SpindleWorker-") for w in workers), workers


def test_install_keeps_persistent_workers_across_epochs_as_torch_does(installed):
    """Proves: a persistent torch loader under install() keeps one set of spindle workers over epochs
    (torch's _reset of the iterator it keeps) and each epoch is torch's."""
    loader = TorchLoader(WhoLoads(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
                         generator=torch.Generator().manual_seed(5))
    reference = TorchLoader(WhoLoads(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
                            generator=torch.Generator().manual_seed(5))
    spindle.torch.uninstall()
    expected = [[i for b in reference for i in b["index"].tolist()] for _ in range(3)]
    spindle.torch.install()
    pids = None
    for epoch in range(3):
        assert [i for b in loader for i in b["index"].tolist()] == expected[epoch]
        now = loader._iterator._workers
        pids = pids or [w.pid for w in now]
        assert [w.pid for w in now] == pids, "the same workers every epoch"


def test_spindle_torch_env_routes_an_unedited_program_through_spindle(tmp_path):
    """Proves: SPINDLE_TORCH=1 makes a program that only uses torch's DataLoader load on spindle's workers."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing, torch
        from torch.utils.data import DataLoader, Dataset

        class D(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return multiprocessing.current_process().name

        if __name__ == "__main__":
            names = {n for batch in DataLoader(D(), batch_size=2, num_workers=2) for n in batch}
            print(sorted(names))
        """))
    for value, prefix in (("1", "SpindleWorker-"), ("0", "")):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "SPINDLE_TORCH": value})
        assert out.returncode == 0, out.stderr
        names = eval(out.stdout.strip().splitlines()[-1])
        assert len(names) == 2 and all(n.startswith("SpindleWorker-") == (value == "1") for n in names), names


@pytest.mark.parametrize("stop_after", [0, 1, 3])
def test_an_epoch_left_early_leaves_the_generator_where_torch_leaves_it(stop_after):
    """Proves: the sampler is drawn as torch draws it (prefetch_factor * num_workers batches up front,
    then one per batch), so after an epoch left early the next epoch's order is torch's."""
    def run(cls):
        generator = torch.Generator().manual_seed(11)
        loader = cls(WhoLoads(), batch_size=3, shuffle=True, num_workers=2, generator=generator)
        for k, _ in enumerate(loader):
            if k == stop_after:
                break
        return [i for b in loader for i in b["index"].tolist()], generator.get_state()

    ours, torchs = run(DataLoader), run(TorchLoader)
    assert ours[0] == torchs[0]
    assert torch.equal(ours[1], torchs[1]), "the generator must be where torch leaves it"


@pytest.mark.parametrize("given", [True, False], ids=["generator", "global"])
@pytest.mark.parametrize("n,batch_size", [(12, 4), (14, 4), (5, 8), (1, 1)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shuffled_batches_draw_as_torchs_batch_sampler_at_every_step(given, n, batch_size, drop_last):
    """Proves: spindle's iterator over BatchSampler(RandomSampler) (the permutation kept as a tensor) gives
    torch's batches and leaves the generator (the sampler's, or the global one it seeds from) in torch's
    state after every batch, at the end and after it."""
    from spindle.torch._batches import index_iter as _index_iter

    def steps(make_iter):
        torch.manual_seed(5)
        generator = torch.Generator().manual_seed(3) if given else None
        index = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(n), generator=generator),
                                              batch_size, drop_last)
        it = make_iter(index)
        out = []
        for _ in range(n // batch_size + 3):
            batch = next(it, None)
            state = (generator if given else torch.default_generator).get_state()
            out.append((batch, state))
        return out

    ours, torchs = steps(_index_iter), steps(iter)
    assert [b for b, _ in ours] == [b for b, _ in torchs]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(ours, torchs))


def test_a_framework_setting_the_shards_epoch_wins_over_spindles_count():
    """Proves: with shard=, sampler.set_epoch(e) called by a framework before iter() decides the epoch's
    order; without it the loader counts epochs itself."""
    def order(loader):
        return [i for b in loader for i in b["index"].tolist()]

    loader = DataLoader(WhoLoads(), batch_size=4, shuffle=True, num_workers=2, shard=(0, 2))
    sampler = torch.utils.data.distributed.DistributedSampler(WhoLoads(), num_replicas=2, rank=0, shuffle=True)
    first = order(loader)
    sampler.set_epoch(0)
    assert first == list(sampler)
    loader.sampler.set_epoch(7)
    sampler.set_epoch(7)
    assert order(loader) == list(sampler), "the framework's epoch wins"
    sampler.set_epoch(8)
    assert order(loader) == list(sampler), "and the count goes on from it"


def shm_mapping_holds(address):
    """Whether `address` lies in a mapping of one of spindle's shared-memory segments."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return len(rest) == 5 and "/spindle." in rest[4]
    return False


def test_an_explicit_default_collate_takes_the_zero_copy_path():
    """Proves: collate_fn=default_collate (torchvision's train.py passes it) gives torch's batches as views
    of spindle's shared memory, as collate_fn=None does."""
    for collate in (None, default_collate):
        loader = DataLoader(Images(), batch_size=4, num_workers=2, collate_fn=collate)
        for images, labels in loader:
            assert shm_mapping_holds(images.data_ptr()), f"collate_fn={collate}: the batch was copied"
            assert images.shape == (4, 3, 8, 8) and labels.dtype == torch.int64


def test_an_unservable_loader_falls_back_to_torch_with_one_warning(installed, tmp_path):
    """Proves: a loader spindle cannot serve (an IterDataPipe in a distributed job) runs on torch's
    workers with one warning naming why, and gives torch's batches."""
    import torch.distributed as dist
    from torch.utils.data.datapipes.iter import IterableWrapper

    spindle.torch._hook._warned_fallbacks.clear()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        pipe = IterableWrapper(range(8)).sharding_filter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = sorted(i for b in TorchLoader(pipe, batch_size=2, num_workers=2) for i in b.tolist())
            again = sorted(i for b in TorchLoader(pipe, batch_size=2, num_workers=2) for i in b.tolist())
        assert got == again == list(range(8))
        ours = [w for w in caught if "runs on torch's workers" in str(w.message)]
        assert len(ours) == 1, [str(w.message) for w in caught]
        assert "IterDataPipe" in str(ours[0].message)
    finally:
        dist.destroy_process_group()


@dataclasses.dataclass
class Custom:
    """A batch type of the user's own, as many programs return from collate_fn."""

    images: "torch.Tensor"
    parts: dict
    names: list


Pair = collections.namedtuple("Pair", ["half", "strided"])


def custom_collate(samples):
    images, labels = default_collate(samples)
    return Custom(images, {"labels": labels, "pair": Pair(images.to(torch.bfloat16), images[:, :, ::2, 1]),
                           "array": images.numpy() * 2, "small": torch.tensor([len(samples)])},
                  [f"s{int(i)}" for i in labels])


def test_any_collate_output_arrives_as_torchs_with_its_buffers_in_shared_memory():
    """Proves: a custom collate_fn's output (a dataclass holding dicts, a namedtuple, bfloat16 and strided
    tensors, a numpy array, strings) equals torch's, and its large tensors and arrays are views of the
    shared-memory slot, not copies."""
    ours = list(DataLoader(Images(), batch_size=4, num_workers=2, collate_fn=custom_collate))
    torchs = list(TorchLoader(Images(), batch_size=4, num_workers=2, collate_fn=custom_collate))
    assert len(ours) == len(torchs) == 4
    for a, b in zip(ours, torchs):
        assert type(a) is Custom and a.names == b.names
        assert torch.equal(a.images, b.images) and torch.equal(a.parts["labels"], b.parts["labels"])
        assert type(a.parts["pair"]) is Pair and a.parts["pair"].half.dtype == torch.bfloat16
        assert torch.equal(a.parts["pair"].half, b.parts["pair"].half)
        assert torch.equal(a.parts["pair"].strided, b.parts["pair"].strided)
        assert np.array_equal(a.parts["array"], b.parts["array"]) and a.parts["array"].dtype == np.float32
        assert torch.equal(a.parts["small"], b.parts["small"])
        for big in (a.images.data_ptr(), a.parts["pair"].half.data_ptr(), a.parts["array"].ctypes.data):
            assert shm_mapping_holds(big), "a large buffer was copied out of the slot"
        a.images += 1  # writable, as torch's batches are


def stacked_where(samples):
    images, labels = default_collate(samples)
    return {"images": images, "labels": labels, "stacked_in_slot": shm_mapping_holds(images.data_ptr())}


def test_default_collate_called_by_a_custom_collate_stacks_into_the_slot():
    """Proves: in spindle's workers, default_collate inside a custom collate_fn stacks the batch straight
    into the slot's shared memory (written once, not stacked privately and copied in), and the consumer
    gets torch's values."""
    ours = list(DataLoader(Images(), batch_size=4, num_workers=2, collate_fn=stacked_where))
    torchs = list(TorchLoader(Images(), batch_size=4, num_workers=2, collate_fn=stacked_where))
    assert [b["stacked_in_slot"] for b in ours] == [True] * 4
    for a, b in zip(ours, torchs):
        assert torch.equal(a["images"], b["images"]) and torch.equal(a["labels"], b["labels"])
        assert shm_mapping_holds(a["images"].data_ptr())


class SlowFirst(Dataset):
    """Sample 0 takes a second; the rest are instant."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        if i == 0:
            import time
            time.sleep(1.0)
        return i


@pytest.mark.skipif(not _compat.accepts(torch.utils.data.DataLoader, "in_order"),
                    reason=f"torch {torch.__version__} has no in_order (torch 2.6 adds it)")
@pytest.mark.parametrize("in_order", [True, False])
def test_out_of_order_delivery_assigns_batches_to_workers_as_torch_does(in_order):
    """Proves: with in_order=False a slow worker is skipped but keeps the batches already sent to it, so
    the delivery order is torch's (its TestOutOfOrderDataLoader); with in_order=True it is the index order."""
    def order(cls):
        return [int(x) for x in cls(SlowFirst(), num_workers=2, in_order=in_order)]

    ours, torchs = order(DataLoader), order(TorchLoader)
    assert sorted(ours) == list(range(10))
    assert ours == torchs
    assert (ours == list(range(10))) == in_order


class Wrapped(torch.utils.data.Sampler):
    """A batch sampler holding another (as accelerate's BatchSamplerShard and SkipBatchSampler do)."""

    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler

    def __iter__(self):
        return iter(self.batch_sampler)

    def __len__(self):
        return len(self.batch_sampler)


def test_a_loader_a_framework_rebuilds_from_a_spindle_loader_stays_on_spindles_workers():
    """Proves: without install(), a torch DataLoader built over a spindle loader's batch sampler (wrapped, as
    accelerate's prepare() and skip_first_batches build theirs) loads on spindle's workers, while a torch
    loader over the same dataset with samplers of its own still loads on torch's."""
    ours = DataLoader(WhoLoads(), batch_size=4, num_workers=2)
    rebuilt = TorchLoader(ours.dataset, batch_sampler=Wrapped(ours.batch_sampler), num_workers=2)
    indices, workers = indices_and_workers(rebuilt)
    assert indices == list(range(24))
    assert workers == {"SpindleWorker-1", "SpindleWorker-2"}, workers
    plain = TorchLoader(ours.dataset, batch_size=4, num_workers=2)
    indices, workers = indices_and_workers(plain)
    assert indices == list(range(24))
    assert not any(w.startswith("SpindleWorker-") for w in workers), workers
