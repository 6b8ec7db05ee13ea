"""The body of a worker process (runs in the forked child).

The runtime hands us a WorkerContext: we claim work items (a ring slot whose
header lists the sample indices), read the samples, have the transport write
the batch into the slot (arrays laid out by the runtime's SlotLayout, or a
pickle), and publish the slot. A Python exception fails only its batch: it
is pickled into the slot for the consumer to re-raise, and the worker goes on.
"""

from __future__ import annotations

import copy
import os
import pickle
import random
import signal
import sys
from typing import Any, Callable, Iterator, Optional

import numpy as np
# Every worker seeds numpy's global generator; numpy loads numpy.random on first
# use. Loaded here, once, every forked worker inherits it instead of each
# importing it before its first sample.
import numpy.random  # noqa: F401

from .._budget.caps import cap_worker_pools
from .._core import MIN_SLOT_BYTES
from .failures import pack_exception
from .layout import BatchReader


def seed_worker(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)


# The logical worker this process is running now (LogicalWorkers): front ends whose per-worker
# state lives in module globals of their own (spindle.grain's slices) key it by this.
_current_logical = 0


_serves_many = False  # this process serves more than one logical worker


def current_logical_worker() -> int:
    """In a worker: the logical worker whose item this process is producing now."""
    return _current_logical


_pristine: dict[int, Any] = {}  # per object a front end copies per logical worker: it as forked


def copy_per_logical_worker(obj: Any) -> Any:
    """In a worker: `obj` itself when this process runs one logical worker, else a copy of `obj` as it
    was forked, one per logical worker (for a per-worker object a front end mutates: grain slices its
    pipeline in place)."""
    if not _serves_many:
        return obj
    if id(obj) not in _pristine:
        _pristine[id(obj)] = copy.deepcopy(obj)
    return copy.deepcopy(_pristine[id(obj)])


class LogicalWorkers:
    """A process's logical workers (``LoaderOptions.logical_workers``): when the budget started
    fewer processes than the data's workers, process p serves logical workers p, p + P, ...
    Each keeps its own random, numpy and torch generator states and torch's ``get_worker_info()``;
    :meth:`switch` swaps them when the process turns to another logical worker's item, so each
    logical worker draws exactly what it would in a process of its own.

    With `dataset` and `pristine` (its attributes before any setup, :func:`attributes_of`), the
    dataset's attributes are per logical worker too: a ``worker_init_fn`` that sets
    ``get_worker_info().dataset.start`` (torch's documented way to split a stream) sets it for its
    own logical worker. Attributes are swapped, not deep-copied: an object an attribute holds
    and that setup mutates in place is still shared."""

    def __init__(self, ctx: Any, dataset: Any = None, pristine: Optional[dict[str, Any]] = None) -> None:
        global _current_logical
        self.count = ctx.logical_workers
        self.shared = self.count > ctx.num_workers  # more than one logical worker in this process
        self.current = _current_logical = ctx.worker_id
        self._saved: dict[int, tuple[Any, ...]] = {}
        self._dataset = dataset if pristine is not None else None
        self._pristine = pristine

    def of(self, item: Any) -> int:
        """The logical worker `item` is for (this process's own id when items are not addressed)."""
        return item.stream if item.stream >= 0 else self.current

    def switch(self, worker: int) -> bool:
        """Makes `worker` current: saves the generators of the one running, restores `worker`'s.
        True when `worker` runs here for the first time (the caller sets it up: seeds, init)."""
        global _current_logical
        if worker == self.current:
            return False
        self._saved[self.current] = (_global_states(), attributes_of(self._dataset))
        self.current = _current_logical = worker
        saved = self._saved.pop(worker, None)
        if saved is None:
            _set_attributes(self._dataset, self._pristine)
            return True
        _set_global_states(saved[0])
        _set_attributes(self._dataset, saved[1])
        return False


def attributes_of(obj: Any) -> Optional[dict[str, Any]]:
    """A shallow copy of `obj`'s instance attributes (None: no object, or none it can have)."""
    attributes = getattr(obj, "__dict__", None) if obj is not None else None
    return dict(attributes) if isinstance(attributes, dict) else None


def _set_attributes(obj: Any, attributes: Optional[dict[str, Any]]) -> None:
    if obj is not None and attributes is not None:
        current = obj.__dict__
        current.clear()
        current.update(attributes)


# Process-wide state a front end keeps per logical worker (spindle.torch: what get_worker_info()
# returns), as (get, set) pairs the front registers when its worker module is imported.
_per_logical_worker: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []


def keep_per_logical_worker(get: Callable[[], Any], put: Callable[[Any], None]) -> None:
    """Registers process-wide state that is saved and restored with each logical worker's generators."""
    if (get, put) not in _per_logical_worker:
        _per_logical_worker.append((get, put))


def _global_states() -> tuple[Any, ...]:
    torch = sys.modules.get("torch")
    return (random.getstate(), np.random.get_state(),
            torch.random.get_rng_state() if torch is not None and hasattr(torch, "random") else None,
            [get() for get, _ in _per_logical_worker])


def _set_global_states(states: tuple[Any, ...]) -> None:
    python, numpy, torch_state, kept = states
    random.setstate(python)
    np.random.set_state(numpy)
    if torch_state is not None:
        sys.modules["torch"].random.set_rng_state(torch_state)
    for (_, put), value in zip(_per_logical_worker, kept):
        put(value)


def read_stream_kept(ctx: Any, item: Any, stream: Any, first: Any, count: int, position: int) -> Any:
    """A stream's batch read as SlotWriter.read_stream returns it, every sample kept for write."""
    read, ended, error, _, _, rest = ctx.read_stream_rows(item, stream, first, count, position, None)
    return read, ended, error, (None if error is not None else (rest, list(range(position, position + read))))


def batch_decoder(reader: BatchReader) -> Callable[[Any], Any]:
    """Batch -> the user's batch: arrays through `reader`, byte strings unpickled."""
    def decode(lease: Any) -> Any:
        if lease.kind == "arrays":
            return reader.read(lease)
        return pickle.loads(lease.bytes())
    return decode


def _start_failure(exc: Exception, worker_id: int) -> bytes:
    """A worker's failed start (worker_init_fn, the dataset's setup), packed as the answer to each
    batch asked of it: the exception, noted as raised before any sample."""
    exc.add_note(f"Raised while starting spindle worker {worker_id} (worker_init_fn or the "
                 "dataset's setup), before any sample.")
    return pack_exception(exc, -1, worker_id, MIN_SLOT_BYTES)


def _as_multiprocessing_child(worker_id: int) -> None:
    """What multiprocessing says of this process is what it says in torch's workers (its
    children): ``current_process()`` is not "MainProcess" (code that runs only in the main
    process checks that name; logging's processName shows it) but "SpindleWorker-<n>", n =
    worker id + 1, and ``parent_process()`` is the consumer. Unlike torch's, the worker is not
    daemonic: dataset code may start processes of its own."""
    process = sys.modules.get("multiprocessing.process")
    if process is None:  # the consumer never imported multiprocessing: nothing can ask
        return
    current = process.current_process()
    parent = os.getppid()
    parent_name = current.name
    current._identity = (worker_id + 1,)  # type: ignore[attr-defined]
    current.name = f"SpindleWorker-{worker_id + 1}"
    try:
        sentinel = os.pidfd_open(parent)  # readable once the consumer ends: what is_alive() and join() wait on
    except OSError:
        return
    os.set_inheritable(sentinel, False)
    process._parent_process = process._ParentProcess(parent_name, parent, sentinel)  # type: ignore[attr-defined]


def _start(ctx: Any, setup: Callable[[int, int], Any]) -> Optional[bytes]:
    """Prepares a worker before any user code; the packed exception if `setup` raised.

    A failing setup (seeding, worker_init_fn, opening a stream) reaches the
    consumer as the exception itself, through each item this worker claims
    (see _answer_failed_start); as in torch, the error surfaces at ``next()``
    and the worker stays up, so the consumer never sees a bare exit code.
    """
    # Ctrl-C reaches the whole process group; the consumer handles it and
    # closes us, so a worker must not die with its own traceback.
    global _current_logical, _serves_many
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _current_logical = ctx.worker_id
    _serves_many = ctx.logical_workers > ctx.num_workers
    _as_multiprocessing_child(ctx.worker_id)
    cap_worker_pools()  # before any user code can start a pool
    try:
        setup(ctx.worker_id, ctx.logical_workers)  # this process's first logical worker is its own id
        return None
    except Exception as exc:
        return _start_failure(exc, ctx.worker_id)


def _answer_failed_start(ctx: Any, failure: bytes) -> int:
    """A worker whose setup failed answers every item it claims with that failure, until closed."""
    while (item := ctx.claim()) is not None:
        ctx.fail(item, failure)
    return 0


def run_worker(ctx: Any, dataset: Any, transport: Any, setup: Callable[[int, int], None],
               seed_batch: Optional[Callable[[list[int]], None]] = None) -> int:
    """Claims batches until the loader closes. `transport` (a front's: spindle.DataLoader's
    ArrayBatches, spindle.torch's CollatedBatches) writes each batch into its slot; `setup(worker_id,
    num_workers)` seeds the worker and runs the user's init function before
    any sample is read; `seed_batch(indices)`, if given, reseeds the random
    generators before each batch (spindle.DataLoader with a seed: BatchSeeds)."""
    if (failure := _start(ctx, setup)) is not None:
        return _answer_failed_start(ctx, failure)
    # A routed dataset (spindle.mix) hands its schedule to the C++ row reader once: the reads
    # then skip its own __getitem__, a Python call a sample (RoutedDataset).
    # Asked of the class: a wrapper forwarding attributes to a mix must still be read through itself.
    routed = getattr(type(dataset), "spindle_routed", None)
    if routed is not None:
        dataset = routed(dataset) or dataset
    worker_id = ctx.worker_id
    # The worker's crash record: the sample being loaded, read by the consumer
    # if this process dies.
    record = ctx.sample_record()
    read, write = transport.read, transport.write
    # Batches in turn (assign_in_turn) under a short budget: batch k is logical worker k mod L's,
    # with that worker's seeds and worker info, whichever process runs it.
    logical = LogicalWorkers(ctx)
    broken: dict[int, bytes] = {}  # logical workers whose setup failed: their packed error
    try:
        while (item := ctx.claim()) is not None:
            if logical.shared:
                worker_id = logical.of(item)
                if logical.switch(worker_id):
                    try:
                        setup(worker_id, logical.count)
                    except Exception as exc:
                        broken[worker_id] = _start_failure(exc, worker_id)
                if worker_id in broken:
                    ctx.fail(item, broken[worker_id])
                    continue
            try:
                if seed_batch is not None:
                    seed_batch(item.indices)
                left = read(ctx, item, dataset)  # None: written as read
            except Exception as exc:
                ctx.fail(item, pack_exception(exc, getattr(exc, "sample_index", int(record[0])), worker_id, MIN_SLOT_BYTES))
                continue
            try:
                if left is not None:
                    write(ctx, item, *left)
                    del left
                ctx.commit(item)
            except Exception as exc:  # errors from here on name their own sample
                ctx.fail(item, pack_exception(exc, getattr(exc, "sample_index", -1), worker_id, MIN_SLOT_BYTES))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


class _Stream:
    """One logical worker's stream in a stream worker: its iterator and where it is."""

    def __init__(self, it: Optional[Iterator[Any]] = None, broken: Optional[bytes] = None) -> None:
        self.it = it
        self.position = 0  # samples read from the stream
        self.ended = False
        self.broken = broken  # the packed error of a failed start or restart


def run_stream_worker(ctx: Any, dataset: Any, transport: Any, setup: Callable[[int, int], None],
                      batch_size: int, drop_last: bool,
                      restart: Optional[Callable[[bytes], None]] = None) -> int:
    """Round-robin mode: each claimed item asks for this worker's next batch of
    `batch_size` samples from its own `iter(dataset)` (which may shard itself by
    worker id); once the stream ends, every item is answered "exhausted".

    Under a short budget with logical workers, a process runs several logical workers' streams
    (WorkItem.stream says whose item it is), each with its own setup, iterator, generators and
    worker info (LogicalWorkers), in turn.

    An item with ``new_stream`` set (the consumer called ``Loader.reset_streams``)
    starts the stream again in this same process: ``restart(message)`` with the
    consumer's start message, then a new ``iter(dataset)``. Seeds and whatever
    `setup` (worker_init_fn) did are kept. If that fails, every item is answered
    with the error until the next new stream."""
    streams: dict[int, _Stream] = {}

    def open_stream(worker: int, count: int) -> None:
        setup(worker, count)
        streams[worker] = _Stream(iter(dataset))

    # The dataset's attributes as forked, before any logical worker's setup changed them.
    pristine = attributes_of(dataset) if ctx.logical_workers > ctx.num_workers else None
    if (failure := _start(ctx, open_stream)) is not None:
        return _answer_failed_start(ctx, failure)
    logical = LogicalWorkers(ctx, dataset, pristine)
    read_stream = transport.read_stream
    record = ctx.sample_record()
    try:
        while (item := ctx.claim()) is not None:
            worker_id = logical.of(item)
            if logical.switch(worker_id):
                try:
                    open_stream(worker_id, logical.count)
                except Exception as exc:
                    streams[worker_id] = _Stream(broken=_start_failure(exc, worker_id))
            stream = streams[worker_id]
            if item.new_stream:
                stream.position, stream.ended, stream.broken = 0, False, None
                try:
                    if restart is not None:
                        restart(item.message)
                    stream.it = iter(dataset)
                except Exception as exc:
                    exc.add_note(f"Raised while spindle worker {worker_id} started its stream again "
                                 "(a new epoch, or set_state).")
                    stream.broken = pack_exception(exc, -1, worker_id, MIN_SLOT_BYTES)
            if stream.broken is not None:
                ctx.fail(item, stream.broken)
                continue
            if stream.ended:
                ctx.exhausted(item)
                continue
            try:
                record[0] = stream.position
                try:
                    first = next(stream.it)
                except StopIteration:
                    stream.ended = True
                    ctx.exhausted(item)
                    continue
                stream.position += 1
                # The rest of the batch is read (and copied as read) in one call.
                count, stream.ended, error, left = read_stream(ctx, item, stream.it, first, batch_size,
                                                               stream.position - 1)
                del first
                stream.position += count - 1
                if error is not None:
                    raise error
                if drop_last and count < batch_size:
                    stream.ended = True
                    ctx.exhausted(item)
                    continue
                if left is not None:
                    transport.write(ctx, item, *left)
                    del left
                ctx.commit(item, count)
            except Exception as exc:
                index = getattr(exc, "sample_index", stream.position)
                ctx.fail(item, pack_exception(exc, index, worker_id, MIN_SLOT_BYTES))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0
