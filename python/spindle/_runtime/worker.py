"""The body of a worker process (runs in the forked child).

The runtime hands us a WorkerContext: we claim work items (a ring slot whose
header lists the sample indices), read the samples, have the transport write
the batch into the slot (arrays laid out by the runtime's SlotLayout, or a
pickle), and publish the slot. A Python exception fails only its batch: it
is pickled into the slot for the consumer to re-raise, and the worker goes on.
"""

from __future__ import annotations

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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _as_multiprocessing_child(ctx.worker_id)
    cap_worker_pools()  # before any user code can start a pool
    try:
        setup(ctx.worker_id, ctx.num_workers)
        return None
    except Exception as exc:
        exc.add_note(f"Raised while starting spindle worker {ctx.worker_id} (worker_init_fn or the "
                     "dataset's setup), before any sample.")
        return pack_exception(exc, -1, ctx.worker_id, MIN_SLOT_BYTES)


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
    try:
        while (item := ctx.claim()) is not None:
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


def run_stream_worker(ctx: Any, dataset: Any, transport: Any, setup: Callable[[int, int], None],
                      batch_size: int, drop_last: bool,
                      restart: Optional[Callable[[bytes], None]] = None) -> int:
    """Round-robin mode: each claimed item asks for this worker's next batch of
    `batch_size` samples from its own `iter(dataset)` (which may shard itself by
    worker id); once the stream ends, every item is answered "exhausted".

    An item with ``new_stream`` set (the consumer called ``Loader.reset_streams``)
    starts the stream again in this same process: ``restart(message)`` with the
    consumer's start message, then a new ``iter(dataset)``. Seeds and whatever
    `setup` (worker_init_fn) did are kept. If that fails, every item is answered
    with the error until the next new stream."""
    streams: list[Iterator[Any]] = []
    if (failure := _start(ctx, lambda w, n: (setup(w, n), streams.append(iter(dataset))))) is not None:
        return _answer_failed_start(ctx, failure)
    stream = streams[0]
    read_stream = transport.read_stream
    worker_id = ctx.worker_id
    record = ctx.sample_record()
    position = 0  # samples this worker has read from its stream
    ended = False
    broken: Optional[bytes] = None  # the packed error of a failed restart
    try:
        while (item := ctx.claim()) is not None:
            if item.new_stream:
                position, ended, broken = 0, False, None
                try:
                    if restart is not None:
                        restart(item.message)
                    stream = iter(dataset)
                except Exception as exc:
                    exc.add_note(f"Raised while spindle worker {worker_id} started its stream again "
                                 "(a new epoch, or set_state).")
                    broken = pack_exception(exc, -1, worker_id, MIN_SLOT_BYTES)
            if broken is not None:
                ctx.fail(item, broken)
                continue
            if ended:
                ctx.exhausted(item)
                continue
            try:
                record[0] = position
                try:
                    first = next(stream)
                except StopIteration:
                    ended = True
                    ctx.exhausted(item)
                    continue
                position += 1
                # The rest of the batch is read (and copied as read) in one call.
                count, ended, error, left = read_stream(ctx, item, stream, first, batch_size, position - 1)
                del first
                position += count - 1
                if error is not None:
                    raise error
                if drop_last and count < batch_size:
                    ended = True
                    ctx.exhausted(item)
                    continue
                if left is not None:
                    transport.write(ctx, item, *left)
                    del left
                ctx.commit(item, count)
            except Exception as exc:
                index = getattr(exc, "sample_index", position)
                ctx.fail(item, pack_exception(exc, index, worker_id, MIN_SLOT_BYTES))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0
