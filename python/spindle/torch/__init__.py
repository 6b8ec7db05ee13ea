"""spindle.torch.DataLoader: torch.utils.data.DataLoader on spindle's workers.

Change one import line::

    from spindle.torch import DataLoader   # was: from torch.utils.data import DataLoader

or, for loaders built by code you do not own (a framework), ``spindle.torch.install()``
(or ``SPINDLE_TORCH=1`` in the environment): every torch DataLoader with workers then
runs on spindle's, through torch's multi-process iterator.

The class is a subclass of torch's: its constructor validates the arguments and builds
the samplers (same exception types and messages), and ``len()``, the generator's draws
and the batch order are torch's. What changes is where batches are made and how they
travel: spindle's forked (or spawned), single-threaded workers write them into shared
memory, and you get tensors that are views of it (writable, valid for as long as you keep
them). Two transports, chosen by the worker for each batch:

- **arrays** (torch's default_collate, samples of tensors, numpy arrays and numbers of
  one shape within the batch): each field is written straight into its block of a slot
  and arrives as ``torch.from_numpy`` of it, as ``default_collate`` would have built it
  (dicts, namedtuples; tuples become lists, like default_collate).
- **pickled in parts** (any other collate_fn, strings or other objects, ragged samples,
  ``batch_size=None``): the worker runs the collate function and pickles its output with
  protocol 5, every large array and CPU tensor an out-of-band buffer copied once into the
  slot; the consumer gets them back as views of it.

Dataset code runs only in the workers, as in torch: nothing is read up front to size the
ring (each batch carries its layout; slots grow to fit), so an error in ``dataset[i]`` or
``worker_init_fn`` surfaces at ``next()``.

Differences from torch are listed in docs/torch_dropin.md.

The package's rooms: ``dataloader`` (the class), ``_engine`` (an epoch on spindle's workers),
``_batches`` (the sampler replay: batches drawn as torch draws them), ``_hook`` (install()),
``_worker_setup`` (what a worker does before reading data), ``_shard`` (shard=), ``_transport``
(batches into slots and back), ``_workers`` (torch's view of the workers), ``stateful``
(StatefulDataLoader); ``_compat`` under all of them holds every private name of torch and
every torch behaviour spindle re-implements, with the releases each was checked on. On a torch
it was not checked on, every loader runs on torch's own workers, with one warning.
"""

from __future__ import annotations

from typing import Any

from .._extras import require_extra

require_extra("torch", ("torch",), "spindle.torch")

from .dataloader import DataLoader  # noqa: E402 - after the check that names the extra
from ._hook import install, installed, uninstall  # noqa: E402

__all__ = ["DataLoader", "StatefulDataLoader", "install", "uninstall", "installed"]


def __getattr__(name: str) -> Any:
    # StatefulDataLoader builds on DataLoader above: its module imports this one, and is
    # imported on first use, so the two do not import each other.
    if name == "StatefulDataLoader":
        from .stateful import StatefulDataLoader
        return StatefulDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
