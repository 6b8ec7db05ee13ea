"""spindle.torch.StatefulDataLoader: torchdata's StatefulDataLoader on spindle's workers (see the class)."""

from __future__ import annotations

import json
from typing import Any, Optional

import torch
from torch.utils.data import IterableDataset

from .._state.checkpoint import (EpochCell, Position, Progress, Reseeded, bytes_to_json, check_state, dataset_key,
                                 json_to_bytes, mid_epoch_out_of_order, new_state, shard_field)
from .._state.elastic import load_position, rank_part, resplits_json
from . import _compat
from ._batches import Batches
from .dataloader import DataLoader

__all__ = ["StatefulDataLoader"]

_FORMAT = "spindle.torch.StatefulDataLoader"


def _peer_class() -> Any:
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader as peer
    except ImportError as exc:
        raise ImportError("spindle.torch.StatefulDataLoader is the drop-in for torchdata's StatefulDataLoader and "
                          "builds its samplers with torchdata's class: pip install 'spindle[torch]'") from exc
    return peer


_PEER = _peer_class()


class StatefulDataLoader(DataLoader, _PEER):  # type: ignore[misc,valid-type]
    """``torchdata.stateful_dataloader.StatefulDataLoader`` with spindle's workers.

        from spindle.torch import StatefulDataLoader   # was: from torchdata.stateful_dataloader import ...

    Same arguments (torch's plus ``snapshot_every_n_steps``), validated and turned
    into samplers by torchdata's own class (so ``shuffle=True`` uses torchdata's
    RandomSampler with its draws); ``state_dict()`` / ``load_state_dict()`` with
    torchdata's semantics: a state taken before ``iter()`` or mid-epoch resumes
    after the last batch handed out, one taken after an epoch ended starts the
    next, and ``load_state_dict({})`` is a no-op. Beyond torchdata:

    - the state is small and JSON-able (``json.dumps`` takes it), versioned, and
      holds no worker snapshot: it is the epoch, the batches handed out, the base
      seed and the states of the torch generators the sampler draws from, taken
      at the start of the epoch. Resuming replays the epoch's sampler draws and
      skips the batches already handed out;
    - a map-style dataset may resume with another ``num_workers`` (torchdata
      refuses);
    - random draws in ``dataset[i]`` (``random``, numpy's global generator,
      torch's CPU generator) are seeded per sample from (seed, epoch, index), so
      they are the uninterrupted run's after resuming, whatever the worker count
      (torchdata's workers restart their per-worker streams). This is the one
      difference from torchdata's batches: augmentations are not torch's
      per-worker streams.

    An IterableDataset resumes by reading its epoch again with the same seeds and
    dropping the batches already handed out (the same num_workers is needed: its
    batch order depends on it). With ``num_workers=0`` the loop is torchdata's
    own, and so is the state (with its tensors encoded for JSON).
    """

    _peer = _PEER

    def __init__(self, *args: Any, snapshot_every_n_steps: Optional[int] = 1, **kwargs: Any) -> None:

        # The state is computed in the consumer at any step: snapshot_every_n_steps is taken
        # (and validated by torchdata) but changes nothing.
        super().__init__(*args, snapshot_every_n_steps=snapshot_every_n_steps, **kwargs)
        self._position: Optional[Position] = None
        self._epoch_start: dict[str, Any] = {}  # this epoch's base seed and generator states
        self._resume: Optional[dict[str, Any]] = None  # a loaded state, applied at the next iter()
        self._root_seed: Optional[int] = None  # the per-sample seeds' root: the first epoch's base seed
        self._epoch_cell = EpochCell()
        self._skip = 0  # batches the next epoch's iterator starts after (resuming)
        self._resplits: tuple = ()  # the resumed epoch's earlier re-splits (an elastic resume)

    # --- the state ---------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands (JSON-able, versioned); the class text says what resumes where."""
        loader = self._torch
        if _own_loop(loader):
            return new_state(_FORMAT, torchdata=_to_json(_PEER.state_dict(self)))
        if self._resume is not None:
            return self._resume
        position = self._position
        generators = self._generator_states(include_default=False)
        if position is None or position.finished:  # at the start of the next epoch
            # whose draws are those of persistent workers' later epochs if the workers are up
            reuses = self.persistent_workers and self._runtime is not None
            return new_state(_FORMAT, epoch=self._epochs_begun, batches=0, finished=position is not None,
                             root_seed=self._root_seed, generators=generators, restarted=not reuses,
                             base_seed=self._base_seed if reuses else None, resplits=[], **self._shard_setting(),
                             **self._settings())
        if not _compat.in_order(loader):
            raise mid_epoch_out_of_order()
        return new_state(_FORMAT, epoch=position.epoch, batches=position.yielded, finished=False,
                         root_seed=self._root_seed, resplits=resplits_json(position.resplits), **self._epoch_start,
                         **self._shard_setting(), **self._settings())

    def load_state_dict(self, state: Any) -> None:
        """Makes the next ``iter()`` resume where the loader that saved `state` stood ({} does nothing).

        With ``shard=``, `state` may come from another world size or rank (elastic resume,
        docs/distributed.md): one rank's state when the ranks advanced in lock step, else the list
        of every old rank's state; the rest of the epoch is re-split over this loader's world."""
        if state == {}:
            return
        states = list(state) if isinstance(state, (list, tuple)) else [state]
        loader = self._torch
        if _own_loop(loader):
            check_state(state, _FORMAT, {})
            if "torchdata" not in state:
                raise ValueError("spindle: this state was saved with num_workers > 0; a loader with num_workers=0 "
                                 "runs torchdata's own loop and reads only its states. Resume with num_workers >= 1.")
            _PEER.load_state_dict(self, _from_json(state["torchdata"]))
            return
        if any(isinstance(s, dict) and "torchdata" in s for s in states):
            raise ValueError("spindle: this state was saved with num_workers=0 (torchdata's own loop); resume it "
                             "with num_workers=0")
        if self._shard is None:
            for one in states:
                check_state(one, _FORMAT, {**self._settings(), **self._shard_setting()})
            if len(states) != 1:
                raise ValueError(f"spindle: load_state_dict got {len(states)} states; a loader without shard= "
                                 "resumes from one")
            resplits, skip = (), int(states[0]["batches"])
        else:
            settings = self._settings()
            if any(isinstance(s, dict) and "shard_seed" not in s for s in states):
                # version 1 did not record the sampler's seed: not checked for such a state
                settings = {k: v for k, v in settings.items() if k not in ("shard_seed", "shuffle", "shard_drop_last")}
            _, resplits, skip = load_position(state, _FORMAT, settings, self._shard, loader.sampler.drop_last,
                                              loader.batch_size, self._global_order)
        # The seeds and generator states: this rank's own state if given, else the first one.
        mine = [s for s in states if s.get("shard") == self._shard_setting()["shard"]]
        state = {**(mine or states)[0], "batches": skip, "resplits": resplits_json(resplits),
                 **self._shard_setting()}
        self.close()  # persistent workers of an earlier position
        self._resume = json.loads(json.dumps(state))
        self._root_seed = state["root_seed"]
        self._position = None
        self._epochs_begun = int(state["epoch"])
        self._set_generators(state["generators"])

    def _settings(self) -> dict[str, Any]:
        loader = self._torch
        iterable = isinstance(loader.dataset, IterableDataset)
        settings: dict[str, Any] = dict(batch_size=loader.batch_size, drop_last=loader.drop_last,
                                        sampler=type(loader.sampler).__name__, **dataset_key(loader.dataset))
        if iterable:  # a stream's batch order depends on the worker count
            settings["num_workers"] = loader.num_workers
        else:
            settings["samples"] = len(loader.dataset)
        if self._shard is not None:  # the DistributedSampler's order
            settings.update(shard_seed=loader.sampler.seed, shuffle=loader.sampler.shuffle,
                            shard_drop_last=loader.sampler.drop_last)
        return settings

    def _shard_setting(self) -> dict[str, Any]:
        return shard_field(self._shard)

    def _global_order(self, epoch: int) -> Any:
        """Epoch `epoch`'s order of all samples as the shard's DistributedSampler draws it, before its cut."""
        return _compat.distributed_order(self._torch.sampler, epoch)

    def _owned_generators(self) -> dict[str, torch.Generator]:
        """The generators that only this loader draws from: `generator=`, and the sampler's own."""
        loader, found = self._torch, {}
        if loader.generator is not None:
            found["loader"] = loader.generator
        sampler_generator = getattr(loader.sampler, "generator", None)
        if isinstance(sampler_generator, torch.Generator) and sampler_generator is not loader.generator:
            found["sampler"] = sampler_generator
        return found

    def _generator_states(self, include_default: bool) -> dict[str, str]:
        states = {name: bytes_to_json(g.get_state().numpy().tobytes()) for name, g in self._owned_generators().items()}
        # A sampler without a generator of its own (torch's RandomSampler, SubsetRandomSampler,
        # WeightedRandomSampler with generator=None) draws from torch's global generator, and so
        # do a stream's seeds without generator=.
        uses_default = (getattr(self._torch.sampler, "generator", False) is None
                        or isinstance(self._torch.dataset, IterableDataset))
        if include_default and uses_default and self._torch.generator is None:
            states["default"] = bytes_to_json(torch.default_generator.get_state().numpy().tobytes())
        return states

    def _set_generators(self, states: dict[str, str]) -> None:
        owned = self._owned_generators()
        for name, text in states.items():
            if name in owned:
                owned[name].set_state(_byte_tensor(text))

    # --- hooks of spindle.torch.DataLoader ------------------------------
    def __iter__(self) -> Any:
        if _own_loop(self._torch):
            _compat.warn_fallback()
            return _PEER.__iter__(self)
        resume = self._resume
        self._epoch_cell.set(self._epochs_begun)  # read by persistent workers' per-sample seeds
        default_now = None
        # Replay the epoch's draws from its start: the generators of its own were set by
        # load_state_dict; torch's global one (in a mid-epoch state, when the sampler draws
        # from it) is set for the replay and then put back.
        default = None if resume is None else resume["generators"].get("default")
        if default is not None:
            default_now = torch.default_generator.get_state()
            torch.default_generator.set_state(_byte_tensor(default))
        self._epoch_start = {"generators": self._generator_states(include_default=True)}
        if isinstance(self._torch.dataset, IterableDataset):
            self._epoch_start["base_seed"] = None
            if resume is not None:
                self._skip = int(resume["batches"])
                self._resume = None
        try:
            it = self._spindle_epoch()
        finally:
            if default_now is not None:
                torch.default_generator.set_state(default_now)
        return it

    def _draws_lazily(self) -> bool:
        return False  # an epoch's draws are replayed in one go (resuming skips a prefix of them)

    def _draws_as_persistent(self, reuse: bool) -> bool:
        # A replayed epoch draws as the epoch it replays did: a persistent loader's later epochs
        # (torchdata's _reset alone) iterate the sampler once and draw no base seed.
        restarted = reuse is False if self._resume is None else self._resume.get("restarted", True)
        self._epoch_start["restarted"] = restarted
        return not restarted

    def _first_epoch_sampler(self, sampler_iter: Any) -> Any:
        # torchdata's multi-process iterator calls iter(index sampler) in __init__ (before drawing the
        # base seed) and again in _reset(); its RandomSampler draws a permutation at each iter().
        return iter(_compat.index_sampler(self._torch))

    def _resume_batches(self, batches: Any, base_seed: int) -> tuple[Any, int]:
        resume, self._resume = self._resume, None
        if self._root_seed is None:
            self._root_seed = base_seed
        if resume is None:
            self._epoch_start["base_seed"] = base_seed
            return batches, base_seed
        if resume.get("base_seed") is not None:
            base_seed = self._base_seed = int(resume["base_seed"])  # the replayed epoch's (later reuses too)
        self._epoch_start["base_seed"] = base_seed
        self._skip = int(resume["batches"])
        self._resplits = _resplits_of(resume)
        if self._resplits:  # an elastic resume: this rank's part of what remained of the epoch
            loader = self._torch
            part = rank_part(self._global_order(self._epochs_begun - 1), self._resplits, self._shard,
                             loader.sampler.drop_last)
            batches = Batches.of_order(part, loader.batch_size, loader.drop_last)
        return batches.skip(self._skip), base_seed

    def _worker_dataset(self, dataset: Any, spawns: bool) -> Any:
        epoch = self._epochs_begun - 1
        if spawns or not self.persistent_workers:
            return Reseeded(dataset, self._root_seed, epoch, torch_cpu=True)
        self._epoch_cell.set(epoch)
        return Reseeded(dataset, self._root_seed, self._epoch_cell, torch_cpu=True)

    def _wrap(self, it: Any) -> Any:
        skip, self._skip = self._skip, 0
        if isinstance(self._torch.dataset, IterableDataset):
            # A stream cannot seek: its epoch is read again with the same seeds and the
            # batches already handed out are dropped.
            for _ in range(skip):
                if next(it, None) is None:
                    break
        resplits, self._resplits = self._resplits, ()
        self._position = position = Position(self._epochs_begun - 1, skip, resplits)
        return Progress(it, position)


def _own_loop(loader: Any) -> bool:
    """torchdata's own loop and states: without workers, or on a torch spindle.torch was not checked on."""
    return loader.num_workers == 0 or _compat.FALLBACK is not None


def _resplits_of(state: dict[str, Any]) -> tuple:
    from .._state.elastic import Resplit

    return tuple(Resplit(int(r["world_size"]), tuple(int(c) for c in r["consumed"])) for r in state.get("resplits") or ())


def _byte_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(json_to_bytes(text)), dtype=torch.uint8)


def _to_json(value: Any) -> Any:
    """torchdata's state with its tensors as {"__tensor__": base64, "dtype": ...} (JSON-able)."""
    if isinstance(value, torch.Tensor):
        array = value.cpu().contiguous().numpy()
        return {"__tensor__": bytes_to_json(array.tobytes()), "dtype": str(array.dtype), "shape": list(array.shape)}
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    import numpy as np

    if isinstance(value, dict):
        if "__tensor__" in value:
            array = np.frombuffer(json_to_bytes(value["__tensor__"]), dtype=value["dtype"]).reshape(value["shape"])
            return torch.from_numpy(array.copy())
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value
