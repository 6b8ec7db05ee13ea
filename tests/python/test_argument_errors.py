"""Bad arguments to the drop-ins are refused at construction, with torch's (or grain's) exception
type and words where the peer has them, and never as a binding's signature dump."""

from __future__ import annotations

import numpy as np
import pytest

import spindle

torch = pytest.importorskip("torch")
import spindle.torch  # noqa: E402
from torch.utils.data import DataLoader as TorchDataLoader  # noqa: E402
from torch.utils.data import IterableDataset, SequentialSampler  # noqa: E402


class Squares:
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return np.int64(i * i)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))


def raised(make):
    """(type, message) of what `make()` raises (None if it raises nothing)."""
    try:
        make()
    except Exception as e:  # noqa: BLE001 - what is raised is what the test compares
        return type(e), str(e)
    return None


def leaks_binding(error):
    return error is not None and any(s in error[1] for s in ("incompatible", "spindle._core", "Invoked with"))


DS = Squares()
# Arguments spindle.DataLoader shares with torch's, refused as torch refuses them.
SHARED_CASES = [
    dict(num_workers=-1),
    dict(num_workers="2"),
    dict(timeout=-1),
    dict(timeout="5"),
    dict(batch_size=0),
    dict(batch_size="8"),
    dict(batch_size=2.5),
    dict(num_workers=2, prefetch_factor=-1),
    dict(persistent_workers=True),
]
# Arguments torch refuses in its constructor: those above, and the ones spindle.DataLoader does not take.
CONSTRUCTOR_CASES = SHARED_CASES + [
    dict(prefetch_factor=2),
    dict(sampler=SequentialSampler(DS), shuffle=True),
    dict(batch_sampler=[[0, 1]], batch_size=4),
    dict(batch_sampler=[[0, 1]], shuffle=True),
    dict(batch_sampler=[[0, 1]], drop_last=True),
    dict(batch_size=None, drop_last=True),
    dict(multiprocessing_context="nope", num_workers=2),
]


@pytest.mark.parametrize("kwargs", CONSTRUCTOR_CASES, ids=lambda k: ",".join(f"{a}={b!r}" for a, b in k.items()))
def test_torch_dropin_refuses_what_torch_refuses_with_torchs_type_and_words(kwargs):
    """Proves: for each argument torch's constructor refuses, spindle.torch.DataLoader raises the same type
    with the same message, at construction."""
    want = raised(lambda: TorchDataLoader(DS, **kwargs))
    assert want is not None
    assert raised(lambda: spindle.torch.DataLoader(DS, **kwargs)) == want


@pytest.mark.parametrize("kwargs", [dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0, 1]])])
def test_torch_dropin_refuses_samplers_for_an_iterable_dataset_as_torch(kwargs):
    """Proves: an IterableDataset with shuffle, a sampler or a batch sampler: torch's ValueError and words."""
    want = raised(lambda: TorchDataLoader(Stream(), **kwargs))
    assert want is not None and want[0] is ValueError
    assert raised(lambda: spindle.torch.DataLoader(Stream(), **kwargs)) == want


def test_a_fractional_worker_count_is_torchs_type_error_at_construction():
    """Proves: num_workers=2.5 is the TypeError torch raises once iterated ("'float' object cannot be
    interpreted as an integer"), raised at construction, with no binding signature dump; the same for
    prefetch_factor=2.5."""
    want = raised(lambda: iter(TorchDataLoader(DS, num_workers=2.5)))
    assert want == (TypeError, "'float' object cannot be interpreted as an integer")
    got = raised(lambda: spindle.torch.DataLoader(DS, num_workers=2.5))
    assert got == want
    assert raised(lambda: spindle.torch.DataLoader(DS, num_workers=2, prefetch_factor=2.5)) == want
    assert raised(lambda: spindle.DataLoader(DS, num_workers=2.5)) == want
    assert raised(lambda: spindle.DataLoader(DS, num_workers=2, prefetch_factor=2.5)) == want


@pytest.mark.parametrize("kwargs", SHARED_CASES, ids=lambda k: ",".join(f"{a}={b!r}" for a, b in k.items()))
def test_spindle_dataloader_refuses_torchs_arguments_as_torch(kwargs):
    """Proves: spindle.DataLoader refuses the arguments it shares with torch with torch's type and words."""
    want = raised(lambda: TorchDataLoader(DS, **kwargs))
    assert want is not None
    assert raised(lambda: spindle.DataLoader(DS, **kwargs)) == want


def test_spindle_dataloader_refuses_an_iterable_dataset_at_construction_naming_the_alternative():
    """Proves: an IterableDataset (torch's, or any object without len()/[]) is refused when the loader is
    built, not at the first next(), and the message names spindle.torch.DataLoader."""
    for stream in (Stream(), (i for i in range(4))):
        error = raised(lambda: spindle.DataLoader(stream, batch_size=2, num_workers=2))
        assert error is not None and error[0] is TypeError, error
        assert "map-style" in error[1] and "spindle.torch.DataLoader" in error[1], error


@pytest.mark.parametrize("kwargs", [dict(num_workers=2.5), dict(prefetch_factor=0), dict(max_batch_bytes=0),
                                    dict(num_workers=2, max_threads=-1)])
def test_no_argument_reaches_the_binding_as_a_signature_dump(kwargs):
    """Proves: bad values of spindle's own arguments raise TypeError/ValueError naming the argument,
    never pybind11's 'incompatible constructor arguments' text."""
    error = raised(lambda: spindle.DataLoader(DS, **kwargs))
    assert error is not None and error[0] in (TypeError, ValueError)
    assert not leaks_binding(error), error


def test_grain_dropins_refuse_a_fractional_worker_count_as_grain():
    """Proves: spindle.grain.mp_prefetch with num_workers=2.5 and spindle.grain.DataLoader(worker_count=2.5)
    raise, at construction, the TypeError grain's own ds.mp_prefetch raises at its first element, with
    no binding signature dump."""
    grain = pytest.importorskip("grain")
    import spindle.grain

    source = list(range(8))
    options = grain.multiprocessing.MultiprocessingOptions(num_workers=2.5)
    want = raised(lambda: next(iter(grain.MapDataset.source(source).to_iter_dataset().mp_prefetch(options))))
    assert want == (TypeError, "'float' object cannot be interpreted as an integer")
    assert raised(lambda: spindle.grain.mp_prefetch(grain.MapDataset.source(source).to_iter_dataset(),
                                                    options)) == want
    sampler = grain.samplers.IndexSampler(8, shard_options=grain.sharding.NoSharding(), num_epochs=1)
    assert raised(lambda: spindle.grain.DataLoader(data_source=source, sampler=sampler, worker_count=2.5)) == want
