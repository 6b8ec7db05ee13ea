"""
spindle's C++ runtime (private; use the spindle package).
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
import typing_extensions
__all__: list[str] = ['ArraySource', 'AttachedWorker', 'BUDGET_POLICIES', 'Batch', 'CloseOnDrop', 'ImageFolder', 'LedgerLease', 'Loader', 'LoaderOptions', 'LoaderStats', 'MIN_SLOT_BYTES', 'MemoryRollup', 'OnError', 'PartsWriter', 'Pipeline', 'PipelineOptions', 'ProcessStat', 'ProcessStatus', 'REPLACE_EACH_WORKER', 'RoutedDataset', 'SampleRows', 'SegmentView', 'ShardOptions', 'SharedSegment', 'SlotLayout', 'Stage', 'ThreadBudget', 'ThreadPlan', 'WebDataset', 'WebDatasetShardIterator', 'WorkItem', 'WorkerContext', 'WorkerExit', 'adjust_brightness', 'adjust_contrast', 'adjust_hue', 'adjust_saturation', 'arena_extra_threads', 'arm_parent_death', 'auto_workers', 'center_crop_box', 'cgroup_pids_levels', 'clock_ticks_per_second', 'color_jitter', 'color_jitter_draw', 'count_process_threads', 'decode_image', 'expand_shard_urls', 'gather_rows', 'hflip', 'image_info', 'inherited_item', 'lease_tasks', 'ledger_available', 'ledger_leases', 'ledger_status', 'normalize', 'open_process_fd', 'pipeline_loader', 'plain_values', 'process_cmdline', 'process_ids', 'process_limits', 'process_maps', 'process_memory', 'process_stat', 'process_status', 'process_threads', 'random_grayscale', 'random_resized_crop_box', 'read_process_memory', 'replacement_limit', 'reserve_stopping', 'resize', 'resolve_budget_policy', 'rgb_to_grayscale', 'sysctl_int', 'thread_stack_pointer']
class ThreadPlan:
    """
    What a loader may start: worker processes and extra arena threads.
    """
    @property
    def arena_threads(self) -> int:
        """
        Extra TBB threads the consumer may run (0: only the calling thread).
        """
    @property
    def budget(self) -> int | None:
        """
        The budget the plan was cut from (None: unlimited).
        """
    @property
    def num_workers(self) -> int:
        """
        Worker processes, one thread each.
        """
class ThreadBudget:
    """
    How many tasks (threads or processes) a loader may add, from RLIMIT_NPROC, the tasks this uid already runs, the cgroup's pids.max and an optional cap. Limits that do not apply read as None.
    """
    def __init__(self, *, max_threads: typing.SupportsInt | typing.SupportsIndex | None = None, proc_root: str = '/proc', cgroup_root: str = '/sys/fs/cgroup', uid: typing.SupportsInt | typing.SupportsIndex | None = None, nproc_limit: typing.SupportsInt | typing.SupportsIndex | None = None, nproc_exempt: bool | None = None, cpus: typing.SupportsInt | typing.SupportsIndex | None = None) -> None:
        ...
    def __repr__(self) -> str:
        ...
    def plan(self, num_workers: typing.SupportsInt | typing.SupportsIndex, pending: typing.SupportsInt | typing.SupportsIndex = 0, arena_held: typing.SupportsInt | typing.SupportsIndex = 0) -> ThreadPlan:
        """
        Plan for num_workers workers out of the budget less `pending` tasks leased elsewhere and not started yet, with arena threads within cpus - 1 less `arena_held` (those the process's live loaders hold); raises ThreadBudgetError, with the numbers, if they do not fit.
        """
    @property
    def budget(self) -> int | None:
        """
        min(nproc_headroom, cgroup_headroom, user_cap).
        """
    @property
    def cgroup_current(self) -> int:
        """
        pids.current of the binding cgroup level.
        """
    @property
    def cgroup_headroom(self) -> int | None:
        """
        Smallest pids.max - pids.current over our cgroup and its ancestors.
        """
    @property
    def cgroup_limit(self) -> int | None:
        """
        pids.max of the binding cgroup level.
        """
    @property
    def cpus(self) -> int:
        """
        CPUs this process may run on (affinity, cgroup cpu.max).
        """
    @property
    def nproc_exempt(self) -> bool:
        """
        True for root, which the kernel exempts from RLIMIT_NPROC.
        """
    @property
    def nproc_headroom(self) -> int | None:
        """
        nproc_limit - uid_tasks.
        """
    @property
    def nproc_limit(self) -> int | None:
        """
        RLIMIT_NPROC soft limit (ulimit -u).
        """
    @property
    def uid_tasks(self) -> int:
        """
        Threads of all processes of this real uid, from /proc.
        """
    @property
    def user_cap(self) -> int | None:
        """
        The max_threads cap.
        """
class LedgerLease:
    """
    A share of the node's thread budget (the budget ledger); given back by release() or when garbage-collected. A forked child's copy gives nothing back.
    """
    def release(self) -> None:
        """
        Gives the share back now.
        """
    def started(self, n: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        n of the leased tasks now exist (so /proc counts them).
        """
    @property
    def held(self) -> bool:
        ...
    @property
    def id(self) -> int:
        ...
class SlotLayout:
    """
    How a batch of fields (dtype, per-sample shape) is laid out in a ring slot: one C-contiguous block [capacity, *shape] per field, 64-byte aligned.
    """
    MAX_DIMS: typing.ClassVar[int] = 8
    MAX_FIELDS: typing.ClassVar[int] = 32
    MAX_STRUCTURE_BYTES: typing.ClassVar[int] = 4096
    @staticmethod
    def dtype_itemsize(dtype: str) -> int:
        ...
    def __init__(self, fields: collections.abc.Sequence[tuple[str, collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]]], capacity: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def bytes(self) -> int:
        ...
    @property
    def capacity(self) -> int:
        ...
    @property
    def offsets(self) -> list[int]:
        ...
class SampleRows:
    """
    One batch structure compiled for WorkerContext.read_rows/put_samples: the walk over a sample (containers, then leaves as fields in order), the slot layout and the structure bytes.
    """
    def __init__(self, walk: list, layout: SlotLayout, structure: bytes, scalar_types: list) -> None:
        ...
    def takes(self, sample: typing.Any) -> bool:
        """
        True if `sample` matches this structure exactly (read_rows would copy it as it is).
        """
class WorkItem:
    @property
    def batch_id(self) -> int:
        ...
    @property
    def count(self) -> int:
        ...
    @property
    def indices(self) -> list[int]:
        """
        The sample indices of this batch, in order.
        """
    @property
    def message(self) -> bytes:
        """
        With new_stream: the consumer's start message for this worker (b'' if none), copied out of the slot.
        """
    @property
    def new_stream(self) -> bool:
        """
        Round-robin: the first item of a new epoch of this worker's stream (Loader.reset_streams): start the stream again before producing it.
        """
    @property
    def slot(self) -> int:
        ...
    @property
    def stream(self) -> int:
        """
        The logical worker this item is for (round-robin or assign_in_turn); -1 for a batch any worker may take.
        """
class RoutedDataset:
    """
    A map-style dataset whose element i is getters[sources[i]](indices[i]): spindle.mix's schedule as the workers' row readers read it, without a Python call of the mix's own per sample. The arrays are viewed (buffer protocol), not copied.
    """
    def __getitem__(self, i: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
        """
        Element i (negative: from the end); an exception from the source carries a note naming i, the source and its index; IndexError if i is out of range.
        """
    def __init__(self, sources: typing_extensions.Buffer, indices: typing_extensions.Buffer, getters: list, names: collections.abc.Sequence[str], about: str) -> None:
        """
        sources: each element's source (1-D uint8 or uint32); indices: its index there (1-D int32 or int64); getters[j]: source j's bound __getitem__; names[j]: how errors name source j; about: what an IndexError adds after the length.
        """
    def __len__(self) -> int:
        ...
    def describe(self, i: typing.SupportsInt | typing.SupportsIndex) -> str:
        """
        The note an exception from element i's source gets: where in the mix element i is.
        """
    def locate(self, i: typing.SupportsInt | typing.SupportsIndex) -> tuple[int, int]:
        """
        (source, index in that source) of element i.
        """
class WorkerExit:
    """
    How a worker process ended.
    """
    def describe(self) -> str:
        ...
    @property
    def code(self) -> int:
        """
        The signal number if signaled, else the exit status (-1: unknown).
        """
    @property
    def pid(self) -> int:
        ...
    @property
    def signaled(self) -> bool:
        """
        True: killed by signal `code`; else exited with `code`.
        """
    @property
    def worker_id(self) -> int:
        ...
class PartsWriter:
    """
    Writes one item's payload of parts (WorkerContext.begin_parts).
    """
    def add(self, data: typing_extensions.Buffer) -> None:
        """
        The next part: in place if `data` lies in what allocate() handed out, else copied into the slot.
        """
    def allocate(self, bytes: typing.SupportsInt | typing.SupportsIndex) -> numpy.ndarray:
        """
        `bytes` of the slot after those handed out so far (64-byte aligned, the slot grown to hold them), as a uint8 array to fill; a part only once add()ed.
        """
    def finish(self) -> None:
        """
        Writes the parts' trailer and the slot's descriptor; commit next.
        """
    def gather(self, pieces: collections.abc.Sequence[typing_extensions.Buffer]) -> numpy.ndarray:
        """
        allocate() for the pieces back to back, copied in: a batch's samples stacked, as a uint8 array.
        """
class WorkerContext:
    def begin_arrays(self, item: WorkItem, layout: SlotLayout, structure: bytes) -> list:
        """
        Lays out the item's slot for `layout` (growing it if needed) and returns one full-capacity array per field, viewing the slot: write rows 0..count-1, then commit.
        """
    def begin_parts(self, item: WorkItem) -> PartsWriter:
        """
        Starts the item's payload of parts (a pickle stream and its out-of-band buffers, payload_parts.hpp): allocate() room to stack tensors into, add() each part, finish(), then commit.
        """
    def claim(self) -> WorkItem | None:
        ...
    @typing.overload
    def commit(self, item: WorkItem) -> None:
        ...
    @typing.overload
    def commit(self, item: WorkItem, count: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def exhausted(self, item: WorkItem) -> None:
        ...
    def fail(self, item: WorkItem, report: bytes) -> None:
        ...
    def put_bytes(self, item: WorkItem, data: typing_extensions.Buffer) -> None:
        """
        Stores one byte string (e.g. a pickled batch) as the item's payload.
        """
    def put_samples(self, item: WorkItem, rows: SampleRows, samples: list) -> bool:
        """
        Writes `samples` as the item's array batch if every one matches `rows` exactly (its containers; C-contiguous arrays of each field's dtype and shape; a Python bool/int/float or numpy scalar for a 0-d field); False, writing nothing, if any does not (the caller's general path then names it).
        """
    def read_rows(self, item: WorkItem, dataset: typing.Any, rows: SampleRows, first: typing.Any = None) -> typing.Any:
        """
        dataset[i] for each of the item's indices (the crash record naming each; `first`, if given, is sample 0, already read), copying every sample into the slot as it is read while they all match `rows` exactly (as put_samples takes them). None if the whole batch was written (commit it); else (written, kinds, rest): samples 0..written-1 are in the slot with `rows`' layout (kinds: a byte per field of each, what its leaf was: 0 array, 1 int, 2 float, 3 bool, 4 numpy scalar) and `rest` holds the others, from the first that does not match. An exception from dataset[i] propagates as it is.
        """
    def read_sample(self, item: WorkItem, dataset: typing.Any) -> typing.Any:
        """
        dataset[i] for the item's first index, stored in the crash record before it is read.
        """
    def read_samples(self, item: WorkItem, dataset: typing.Any, first: typing.Any = None) -> tuple[list, list[int]]:
        """
        ([dataset[i] for i in item.indices], item.indices), each index stored in the crash record before it is read; `first`, if given, is sample 0, already read (read_sample). An exception from dataset[i] propagates as it is (the record still names i).
        """
    def read_stream_rows(self, item: WorkItem, stream: typing.Any, first: typing.Any, count: typing.SupportsInt | typing.SupportsIndex, position: typing.SupportsInt | typing.SupportsIndex, rows: SampleRows) -> tuple:
        """
        A stream's batch: `first` (already read, at stream position `position`) and up to count - 1 more samples from next(stream) (the crash record naming each position), copied into the slot as read while they match `rows` exactly (None: kept, none copied). Returns (read, ended, error, written, kinds, rest): samples read; whether the stream ended; the exception the stream raised (None), which ends the read; then as read_rows: samples 0..written-1 in the slot, the kind of each of their leaves, and the samples kept from the first that did not match.
        """
    def sample_record(self) -> numpy.ndarray:
        """
        This worker's crash record (one int64: the sample being produced), as an array a loop can update with a plain store; the consumer reports it if the worker dies.
        """
    def set_sample(self, index: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def logical_workers(self) -> int:
        """
        The workers the data is defined by (>= num_workers); this process serves those l with l % num_workers == worker_id.
        """
    @property
    def num_workers(self) -> int:
        ...
    @property
    def worker_id(self) -> int:
        ...
class AttachedWorker:
    """
    A spawned worker's mapping of the loader segment and its WorkerContext.
    """
    def __init__(self, segment_fd: typing.SupportsInt | typing.SupportsIndex, worker_id: typing.SupportsInt | typing.SupportsIndex, parent: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def context(self) -> WorkerContext:
        ...
class LoaderStats:
    """
    What a Loader has done (loader_stats.hpp); to_dict() is what the fronts' stats() return.
    """
    def __init__(self) -> None:
        ...
    def merge(self, other: LoaderStats) -> None:
        """
        Adds `other`'s counts (an earlier epoch's loader); keeps this one's ring and worker state.
        """
    def to_dict(self) -> dict:
        ...
    def wait_quantile_ms(self, q: typing.SupportsFloat | typing.SupportsIndex) -> float:
        ...
    @property
    def batches(self) -> int:
        ...
    @property
    def samples(self) -> int:
        ...
    @property
    def skipped(self) -> int:
        ...
    @property
    def wait_max_ms(self) -> float:
        ...
    @property
    def wait_p50_ms(self) -> float:
        ...
    @property
    def wait_p95_ms(self) -> float:
        ...
    @property
    def wait_s(self) -> float:
        ...
class LoaderOptions:
    """
    How a Loader runs (loader.hpp): workers, slots, ordering, waiting and the thread budget. Set the fields, then pass it to Loader.
    """
    def __init__(self) -> None:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def adaptive(self) -> bool:
        """
        num_workers is the most processes (0: the core's choice); processes are added and retired as the consumer waits or the workers idle (planned batches any worker takes). Streams with logical workers: the change is advised (Loader.advised_processes).
        """
    @adaptive.setter
    def adaptive(self, arg0: bool) -> None:
        ...
    @property
    def assign_in_turn(self) -> bool:
        """
        Planned batches: batch k always goes to worker k mod N (as torch assigns them).
        """
    @assign_in_turn.setter
    def assign_in_turn(self, arg0: bool) -> None:
        ...
    @property
    def batch_capacity(self) -> int:
        """
        Max samples per batch.
        """
    @batch_capacity.setter
    def batch_capacity(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def budget_policy(self) -> str:
        """
        When fewer tasks are free than num_workers: 'shrink', 'wait' or 'fail'.
        """
    @budget_policy.setter
    def budget_policy(self, arg1: str) -> None:
        ...
    @property
    def fed(self) -> bool:
        """
        Planned batches fed as the consumer draws them (Loader.feed, Loader.end_feed), as torch's iterator draws its sampler.
        """
    @fed.setter
    def fed(self, arg0: bool) -> None:
        ...
    @property
    def first_worker(self) -> int:
        """
        Round-robin: the worker asked for batch 0.
        """
    @first_worker.setter
    def first_worker(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def in_order(self) -> bool:
        """
        Deliver by batch id; False: as they finish.
        """
    @in_order.setter
    def in_order(self, arg0: bool) -> None:
        ...
    @property
    def logical_workers(self) -> bool:
        """
        Round-robin and assign_in_turn: the data stays num_workers' as asked when the budget starts fewer processes; logical worker l runs on process l mod P (WorkItem.stream).
        """
    @logical_workers.setter
    def logical_workers(self, arg0: bool) -> None:
        ...
    @property
    def max_batch_bytes(self) -> int:
        """
        The largest batch a slot may hold.
        """
    @max_batch_bytes.setter
    def max_batch_bytes(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_replacements(self) -> int:
        """
        Lost workers started again per epoch, their batches posted again (0: a death closes the loader with WorkerDiedError; REPLACE_EACH_WORKER: replacement_limit(the workers asked); planned batches only).
        """
    @max_replacements.setter
    def max_replacements(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def max_skip_ratio(self) -> float | None:
        """
        next() raises SkipRatioError once skipped samples exceed this share (None: no check).
        """
    @max_skip_ratio.setter
    def max_skip_ratio(self, arg0: typing.SupportsFloat | typing.SupportsIndex | None) -> None:
        ...
    @property
    def max_threads(self) -> int | None:
        """
        User cap on tasks the loader adds (None: none).
        """
    @max_threads.setter
    def max_threads(self, arg0: typing.SupportsInt | typing.SupportsIndex | None) -> None:
        ...
    @property
    def num_workers(self) -> int:
        ...
    @num_workers.setter
    def num_workers(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def prefetch_factor(self) -> int:
        """
        Batches in flight per worker.
        """
    @prefetch_factor.setter
    def prefetch_factor(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def processes(self) -> int:
        """
        With logical_workers: the most processes to run the num_workers logical workers on (0: num_workers). Adaptive where any worker takes any batch: the processes to start with (0: the cores idle now).
        """
    @processes.setter
    def processes(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def reserve_tasks(self) -> int:
        """
        Tasks of the user's budget kept free for the consumer's own threads: held back from the start's grant, and kept free while batches flow (processes retire).
        """
    @reserve_tasks.setter
    def reserve_tasks(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def round_robin(self) -> bool:
        """
        Streams: batch k is asked of worker k mod N until every worker's stream ends.
        """
    @round_robin.setter
    def round_robin(self, arg0: bool) -> None:
        ...
    @property
    def slot_bytes(self) -> int:
        """
        Payload bytes reserved per slot up front (0: the minimum); slots grow up to max_batch_bytes.
        """
    @slot_bytes.setter
    def slot_bytes(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def stall_warning(self) -> float:
        """
        Seconds one next() may wait before a StallWarning names what the workers do (0: never).
        """
    @stall_warning.setter
    def stall_warning(self, arg1: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def stats(self) -> bool:
        """
        Keep statistics (Loader.stats()); off: nothing is measured (SPINDLE_STATS=0 for every loader).
        """
    @stats.setter
    def stats(self, arg0: bool) -> None:
        ...
    @property
    def timeout(self) -> float:
        """
        Max wait for one batch, in seconds (0 or inf: forever).
        """
    @timeout.setter
    def timeout(self, arg1: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def worker_tasks(self) -> int:
        """
        Tasks one worker process runs (its thread and its runtimes'): the start grants processes at this rate under "shrink".
        """
    @worker_tasks.setter
    def worker_tasks(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class Batch:
    """
    A delivered batch: its bytes stay valid, and its ring slot reserved, while this object or any buffer made from it lives.
    """
    def arrays(self) -> list:
        """
        The batch's fields as numpy arrays of `count` rows viewing the slot (they keep it reserved).
        """
    def bytes(self) -> numpy.ndarray:
        """
        The payload in use as a uint8 array viewing the slot (a 'bytes' batch: its byte string).
        """
    def parts(self) -> list:
        """
        A 'bytes' batch written as parts (WorkerContext.begin_parts): one uint8 array per part, viewing the slot (they keep it reserved).
        """
    @property
    def batch_id(self) -> int:
        ...
    @property
    def copied_out(self) -> bool:
        ...
    @property
    def count(self) -> int:
        ...
    @property
    def indices(self) -> list[int]:
        ...
    @property
    def kind(self) -> str:
        """
        'arrays' (fields laid out by a SlotLayout), 'bytes' (one byte string) or 'raw'.
        """
    @property
    def skipped(self) -> int:
        """
        Samples of this batch the worker could not read and replaced (on_error='skip').
        """
    @property
    def stream(self) -> int:
        """
        Round-robin streams: the logical worker whose stream this batch is from (-1: planned).
        """
    @property
    def stream_position(self) -> int:
        """
        Round-robin streams: where that stream stands after this batch (opaque; 0: the start). A native pipeline starts its streams there again (pipeline_loader's stream_starts).
        """
    @property
    def structure(self) -> bytes:
        """
        The structure bytes the worker sent with an 'arrays' batch.
        """
class Loader:
    def __init__(self, options: LoaderOptions, *, order: typing_extensions.Buffer, drop_last: bool = False, starts: typing.Any = None, worker_main: collections.abc.Callable | None = None, spawn_argv: collections.abc.Sequence[str] | None = None, spawn_fds: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = [], spawn_env: collections.abc.Sequence[str] = []) -> None:
        """
        Starts the workers: forked, each running worker_main(ctx), or spawned from spawn_argv (handed spawn_fds, with the NAME=value entries of spawn_env in their environment; worker_main unused), over `order` cut into batches of options.batch_capacity (or where `starts` says).
        """
    def close(self, grace: typing.SupportsFloat | typing.SupportsIndex = 1.0) -> None:
        """
        Stops the workers (busy ones get `grace` seconds before SIGKILL); safe from any thread (a next() waiting elsewhere returns None).
        """
    def end_feed(self) -> None:
        """
        Fed loaders: no more batches this epoch; next() returns None once those fed are delivered.
        """
    def feed(self, *, order: typing_extensions.Buffer, starts: typing.Any = None) -> None:
        """
        Fed loaders: more batches of this epoch, after those fed so far (`order` cut where `starts` says, or into batches of batch_capacity).
        """
    def next(self) -> typing.Any:
        ...
    def reset(self, *, order: typing_extensions.Buffer, drop_last: bool = False, starts: typing.Any = None) -> None:
        ...
    def reset_stats(self) -> None:
        ...
    def reset_streams(self, *, first_worker: typing.SupportsInt | typing.SupportsIndex = 0, messages: collections.abc.Sequence[bytes] | None = None) -> None:
        """
        Round-robin loaders: a new epoch of every worker's stream on the same workers; the first item each worker claims has new_stream set and carries messages[w].
        """
    def stats(self) -> LoaderStats:
        """
        Counts since the loader started or reset_stats(), and the ring's and workers' state now (safe from any thread).
        """
    @property
    def advised_processes(self) -> int:
        """
        Adaptive streams: the processes the controller wants the streams started again on (0: none yet); the loader goes on as it is.
        """
    @property
    def budget_note(self) -> str:
        """
        One line with the numbers when the loader runs with fewer workers than asked, else ''.
        """
    @property
    def closed(self) -> bool:
        ...
    @property
    def copied_out(self) -> int:
        ...
    @property
    def num_batches(self) -> int:
        ...
    @property
    def num_logical_workers(self) -> int:
        """
        Streams / batch turns the data is defined by (requested_workers with logical_workers, else plan.num_workers); reset_streams counts these.
        """
    @property
    def num_slots(self) -> int:
        ...
    @property
    def plan(self) -> ThreadPlan:
        ...
    @property
    def processes(self) -> int:
        """
        Worker processes running now (adaptive: between 1 and plan.num_workers).
        """
    @property
    def replaced(self) -> int:
        """
        Workers started again in place of lost ones since the loader started.
        """
    @property
    def requested_workers(self) -> int:
        """
        Workers asked for (plan.num_workers may be fewer under budget_policy="shrink").
        """
    @property
    def worker_exits(self) -> list[WorkerExit | None]:
        """
        How each worker ended (a WorkerExit), or None while it has not been reaped; kept after close().
        """
    @property
    def worker_pids(self) -> list[int]:
        ...
class CloseOnDrop:
    """
    Closes `loader` when this object goes (no Python __del__: a signal handled in a finalizer would be lost). Held by what owns a Loader that views may share.
    """
    def __init__(self, loader: typing.Any) -> None:
        ...
class ImageFolder:
    """
    Images in the ImageNet layout root/<class>/<file>, ordered and labelled by torchvision.datasets.ImageFolder's rule (its IMG_EXTENSIONS: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case).
    """
    def __init__(self, root: str) -> None:
        ...
    def __len__(self) -> int:
        ...
    def label(self, index: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        The class index of sample `index`.
        """
    def path(self, index: typing.SupportsInt | typing.SupportsIndex) -> str:
        """
        The file of sample `index`.
        """
    def read(self, index: typing.SupportsInt | typing.SupportsIndex) -> tuple[bytes, int, str]:
        """
        (encoded bytes, label, origin) of sample `index`.
        """
    @property
    def classes(self) -> list[str]:
        """
        Class names; a sample's label is an index into them.
        """
    @property
    def root(self) -> str:
        ...
class ArraySource:
    """
    Rows of a C-order array in a .npy file, memory-mapped read-only (sample i = row i).
    """
    @staticmethod
    def from_npy(path: str) -> ArraySource:
        """
        Maps `path`; refuses Fortran-order, object and structured arrays with DataError.
        """
    def __len__(self) -> int:
        ...
    def array(self) -> numpy.ndarray:
        """
        All rows as one read-only numpy view of the mapping (no copy).
        """
    def row(self, index: typing.SupportsInt | typing.SupportsIndex) -> numpy.ndarray:
        """
        Row `index` as a read-only numpy view of the mapping (no copy).
        """
    @property
    def dtype(self) -> str:
        """
        numpy's type string, e.g. '<f4'.
        """
    @property
    def row_shape(self) -> list[int]:
        ...
    @property
    def shape(self) -> list[int]:
        ...
class WebDatasetShardIterator:
    """
    One pass over one WebDataset shard.
    """
    def __iter__(self) -> WebDatasetShardIterator:
        ...
    def __next__(self) -> dict:
        ...
class ShardOptions:
    """
    Where WebDataset shards live and how they are fetched (shard_stream.hpp): retries, timeouts (seconds), the local cache of remote shards.
    """
    cache_dir: str
    def __init__(self) -> None:
        ...
    @property
    def backoff(self) -> float:
        ...
    @backoff.setter
    def backoff(self, arg1: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def cache_limit_bytes(self) -> int:
        ...
    @cache_limit_bytes.setter
    def cache_limit_bytes(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def read_ahead_bytes(self) -> int:
        ...
    @read_ahead_bytes.setter
    def read_ahead_bytes(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def retries(self) -> int:
        ...
    @retries.setter
    def retries(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def timeout(self) -> float:
        ...
    @timeout.setter
    def timeout(self, arg1: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
class WebDataset:
    """
    WebDataset tar shards (paths or URLs, brace notation expanded): members grouped into samples by key, read streaming.
    """
    @staticmethod
    def label_of(sample: dict) -> int:
        """
        The label from 'cls' (decimal text) or 'json' ({"label": n}), else -1.
        """
    def __init__(self, shards: collections.abc.Sequence[str], options: ShardOptions = ...) -> None:
        ...
    def iter_shard(self, shard: typing.SupportsInt | typing.SupportsIndex) -> WebDatasetShardIterator:
        """
        The samples of shard `shard` in order, as dicts {'__key__', '__url__', extension: bytes}.
        """
    def shards_of_worker(self, worker: typing.SupportsInt | typing.SupportsIndex, num_workers: typing.SupportsInt | typing.SupportsIndex) -> list[int]:
        """
        Shard numbers of `worker` of `num_workers` (worker, worker + num_workers, ...).
        """
    @property
    def num_shards(self) -> int:
        ...
    @property
    def options(self) -> ShardOptions:
        ...
    @property
    def shards(self) -> list[str]:
        ...
class Stage:
    """
    One per-sample stage of a native pipeline (see stage.hpp); built by the static methods.
    """
    @staticmethod
    def center_crop(size: tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex]) -> Stage:
        ...
    @staticmethod
    def color_jitter(brightness: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], contrast: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], saturation: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], hue: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]) -> Stage:
        ...
    @staticmethod
    def decode() -> Stage:
        ...
    @staticmethod
    def normalize(mean: typing.Annotated[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], "FixedSize(3)"], std: typing.Annotated[collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], "FixedSize(3)"], chw: bool) -> Stage:
        ...
    @staticmethod
    def random_flip(p: typing.SupportsFloat | typing.SupportsIndex) -> Stage:
        ...
    @staticmethod
    def random_grayscale(p: typing.SupportsFloat | typing.SupportsIndex) -> Stage:
        ...
    @staticmethod
    def random_resized_crop(size: tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex], scale: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex], ratio: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex]) -> Stage:
        ...
    @staticmethod
    def resize(size: tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex]) -> Stage:
        ...
    @staticmethod
    def resize_shorter(shorter: typing.SupportsInt | typing.SupportsIndex) -> Stage:
        ...
    @property
    def name(self) -> str:
        ...
class OnError:
    """
    Members:
    
      RAISE
    
      SKIP
    """
    RAISE: typing.ClassVar[OnError]
    SKIP: typing.ClassVar[OnError]
    __members__: typing.ClassVar[dict[str, OnError]]
    @typing.overload
    def __eq__(self, other: OnError) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: OnError) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class PipelineOptions:
    """
    What a native pipeline reads and does (see pipeline.hpp).
    """
    image_folder: str
    npy: str
    on_error: OnError
    webdataset_options: ShardOptions
    def __init__(self) -> None:
        ...
    @property
    def bytes_per_sample(self) -> int:
        ...
    @bytes_per_sample.setter
    def bytes_per_sample(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def keep(self) -> list[str]:
        ...
    @keep.setter
    def keep(self, arg0: collections.abc.Sequence[str]) -> None:
        ...
    @property
    def max_skip_ratio(self) -> float:
        ...
    @max_skip_ratio.setter
    def max_skip_ratio(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def stages(self) -> list[Stage]:
        ...
    @stages.setter
    def stages(self, arg0: collections.abc.Sequence[Stage]) -> None:
        ...
    @property
    def webdataset(self) -> list[str]:
        ...
    @webdataset.setter
    def webdataset(self, arg0: collections.abc.Sequence[str]) -> None:
        ...
class Pipeline:
    def __init__(self, options: PipelineOptions) -> None:
        ...
    def __len__(self) -> int:
        ...
    def fields(self) -> list:
        """
        (dtype string, per-sample shape) of the batch's fields: image, label, then byte fields ('|u1', ()).
        """
    @property
    def field_names(self) -> list[str]:
        """
        The batch's field names: 'image', 'label', then the byte fields.
        """
    @property
    def streaming(self) -> bool:
        ...
class ProcessStat:
    """
    The fields of /proc/<pid>/stat the package uses.
    """
    def __repr__(self) -> str:
        ...
    @property
    def comm(self) -> str:
        """
        Its name (field 2), without the parentheses.
        """
    @property
    def num_threads(self) -> int:
        """
        Its threads (field 20).
        """
    @property
    def pid(self) -> int:
        """
        The process id (field 1).
        """
    @property
    def ppid(self) -> int:
        """
        The parent's pid (field 4).
        """
    @property
    def start_time(self) -> int:
        """
        Clock ticks after boot when it started (field 22); tells a reused pid apart.
        """
    @property
    def state(self) -> str:
        """
        The state letter (field 3): R, S, D, T, t, Z, X, ...
        """
    @property
    def stime(self) -> int:
        """
        Clock ticks of CPU time in the kernel (field 15).
        """
    @property
    def utime(self) -> int:
        """
        Clock ticks of CPU time in user mode (field 14).
        """
class ProcessStatus:
    """
    The fields of /proc/<pid>/status the package uses.
    """
    def __repr__(self) -> str:
        ...
    @property
    def name(self) -> str:
        """
        Name:
        """
    @property
    def ppid(self) -> int:
        """
        PPid:
        """
    @property
    def real_uid(self) -> int:
        """
        The first of Uid: (the real uid).
        """
    @property
    def threads(self) -> int:
        """
        Threads:
        """
class MemoryRollup:
    """
    A process's memory from /proc/<pid>/smaps_rollup, in bytes.
    """
    def __repr__(self) -> str:
        ...
    @property
    def pss(self) -> int:
        """
        Resident pages, each shared one split among its mappers.
        """
    @property
    def rss(self) -> int:
        """
        Resident pages, shared ones counted whole.
        """
    @property
    def swap(self) -> int:
        """
        Swapped-out pages.
        """
    @property
    def uss(self) -> int:
        """
        Private pages (Private_Clean + Private_Dirty): what this process alone pays.
        """
class SharedSegment:
    """
    A shared memory segment without a name (unlinked at creation: nothing is left in /dev/shm whatever ends the process), written once, then sealed read-only. Forked processes inherit its mapping; others map it from its descriptor (SegmentView).
    """
    def __init__(self, bytes: typing.SupportsInt | typing.SupportsIndex, what: str) -> None:
        """
        A segment of `bytes`, backed now; SharedMemoryError (naming `what`) if /dev/shm is too full.
        """
    def seal(self) -> None:
        """
        Makes the mapping read-only here and in every process forked later. Buffers taken before stay writable in name only: a write through them faults.
        """
    @property
    def fd(self) -> int:
        """
        Its descriptor (close-on-exec), to hand to a process that is not a fork.
        """
    @property
    def sealed(self) -> bool:
        ...
    @property
    def size(self) -> int:
        ...
class SegmentView:
    """
    A read-only mapping of a whole segment, from a descriptor of it (kept duplicated: the caller may close theirs).
    """
    def __init__(self, fd: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def fd(self) -> int:
        ...
    @property
    def size(self) -> int:
        ...
def adjust_brightness(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], factor: typing.SupportsFloat | typing.SupportsIndex) -> numpy.ndarray:
    """
    torchvision adjust_brightness (tensor formula) of an (H, W, 3) copy.
    """
def adjust_contrast(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], factor: typing.SupportsFloat | typing.SupportsIndex) -> numpy.ndarray:
    """
    torchvision adjust_contrast (tensor formula) of an (H, W, 3) copy.
    """
def adjust_hue(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], factor: typing.SupportsFloat | typing.SupportsIndex) -> numpy.ndarray:
    """
    torchvision adjust_hue (tensor formula) of an (H, W, 3) copy.
    """
def adjust_saturation(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], factor: typing.SupportsFloat | typing.SupportsIndex) -> numpy.ndarray:
    """
    torchvision adjust_saturation (tensor formula) of an (H, W, 3) copy.
    """
def arena_extra_threads() -> int:
    """
    Extra threads the process's TBB arena may run: the sum granted to the live loaders, at most cpus - 1.
    """
def arm_parent_death(parent: typing.SupportsInt | typing.SupportsIndex, signal: typing.SupportsInt | typing.SupportsIndex) -> bool:
    """
    In a child of parent: asks for signal when the parent dies (PR_SET_PDEATHSIG), then checks it had not died already. False if it had (exit then). OSError if prctl refuses the signal.
    """
def auto_workers() -> int:
    """
    The core's count for num_workers="auto" on this process's usable cpus: the most processes of an adaptive loader, and the logical workers of adaptive streams (spindle.grain, a PipelineLoader's WebDataset stream).
    """
def center_crop_box(height: typing.SupportsInt | typing.SupportsIndex, width: typing.SupportsInt | typing.SupportsIndex, size: tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex]) -> tuple[int, int, int, int]:
    """
    CenterCrop's box (top, left, h, w); it leaves an image smaller than the crop, as torchvision's pad-then-crop does.
    """
def cgroup_pids_levels(pid: typing.SupportsInt | typing.SupportsIndex | None = None, *, proc_root: str = '/proc', cgroup_root: str = '/sys/fs/cgroup') -> list:
    """
    pids.max and pids.current of every level from the cgroup of pid (None: this process) up to the root (v2, or the v1 pids hierarchy, which wins), as dicts with path, max (None: no limit) and current; levels without both files are left out. ThreadBudget binds to the tightest of them.
    """
def clock_ticks_per_second() -> int:
    """
    Clock ticks per second: the unit of ProcessStat.utime, stime and start_time.
    """
def color_jitter(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], seed: typing.SupportsInt | typing.SupportsIndex, epoch: typing.SupportsInt | typing.SupportsIndex, index: typing.SupportsInt | typing.SupportsIndex, brightness: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = 0.0, contrast: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = 0.0, saturation: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = 0.0, hue: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = 0.0) -> numpy.ndarray:
    """
    ColorJitter of an (H, W, 3) copy, its draw from (seed, epoch, index).
    """
def color_jitter_draw(seed: typing.SupportsInt | typing.SupportsIndex, epoch: typing.SupportsInt | typing.SupportsIndex, index: typing.SupportsInt | typing.SupportsIndex, brightness: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = 0.0, contrast: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = 0.0, saturation: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = 0.0, hue: typing.SupportsFloat | typing.SupportsIndex | tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = 0.0) -> tuple[tuple[int, int, int, int], float | None, float | None, float | None, float | None]:
    """
    ColorJitter.get_params from (seed, epoch, index): (order, brightness, contrast, saturation, hue).
    """
def count_process_threads(pid: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Threads of process pid (entries of /proc/<pid>/task); 0 if it does not exist.
    """
def decode_image(data: typing_extensions.Buffer, crop: tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex] | None = None, size: tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex] | None = None) -> numpy.ndarray:
    """
    Decodes a JPEG, PNG, WebP, TIFF, BMP or binary PPM/PGM (crop (top, left, h, w), zero-padded where it leaves the image, then resize to (h, w)) to an (H, W, 3) uint8 array.
    """
def expand_shard_urls(spec: str) -> list[str]:
    """
    webdataset's shard notation expanded: braces ('{000..099}', '{a,b}') and '::' lists.
    """
def gather_rows(dst: typing_extensions.Buffer, rows: list, row_bytes: typing.SupportsInt | typing.SupportsIndex) -> bool:
    """
    Copies C-contiguous buffers of row_bytes each into consecutive rows of dst with streaming stores; False (nothing copied) if a row is not such a buffer.
    """
def hflip(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8]) -> numpy.ndarray:
    """
    A left-right mirrored copy of an (H, W, C) uint8 array.
    """
def image_info(data: typing_extensions.Buffer) -> tuple[int, int, int, str]:
    """
    (height, width, channels, format) from the headers only.
    """
def inherited_item(items: typing.Any, i: typing.SupportsInt | typing.SupportsIndex) -> typing.Any:
    """
    items[i] for a list or tuple a forked process inherited: a plain value is copied out through borrowed pointers, writing nothing of the original (whose pages then stay shared with the process it came from); anything else is items[i] itself.
    """
def lease_tasks(tasks: typing.SupportsInt | typing.SupportsIndex, budget_policy: str = 'wait', timeout: typing.SupportsFloat | typing.SupportsIndex = 10.0) -> LedgerLease:
    """
    A lease of `tasks` tasks (a helper process spindle forks) from the node's budget, under `budget_policy` ("shrink" is not meaningful here and acts as "fail" once nothing is free); raises ThreadBudgetError with the numbers when they do not fit. Mark them started() once they exist.
    """
def ledger_available(excluding: LedgerLease) -> int | None:
    """
    Tasks free now for the threads `excluding` holds: the live budget less every other live lease's pending tasks (None: unlimited).
    """
def ledger_leases() -> list[dict]:
    """
    The node budget ledger's leases as found (pid, start_time, lease_id, tasks, pending, alive), or this process's own if the shared table is not used.
    """
def ledger_status() -> dict:
    """
    Where the node budget ledger is and whether it is used (with the reason if not).
    """
def normalize(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], mean: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], std: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex], chw: bool = False) -> numpy.typing.NDArray[numpy.float32]:
    """
    (x / 255 - mean) / std as float32, (H, W, C) or with chw (C, H, W).
    """
def open_process_fd(pid: typing.SupportsInt | typing.SupportsIndex, fd: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> int:
    """
    Process pid's descriptor fd opened anew, read-only (/proc/<pid>/fd/<fd>); the new descriptor is the caller's to close. OSError (errno set) if the process or descriptor is gone or another uid's.
    """
def pipeline_loader(pipeline: Pipeline, options: LoaderOptions, *, order: typing_extensions.Buffer, drop_last: bool = False, threads: bool = False, seed: typing.SupportsInt | typing.SupportsIndex, epoch: typing.SupportsInt | typing.SupportsIndex, stream_starts: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex] = []) -> Loader:
    """
    A runtime Loader whose workers (forked processes, or arena threads with threads=True) run the pipeline over `order` in batches of options.batch_capacity (make_pipeline_loader: the pipeline sets round_robin, logical_workers, slot_bytes and max_skip_ratio). A stream's `stream_starts`: each logical worker's Batch.stream_position of its last batch delivered (empty: from the start).
    """
def plain_values(items: typing.Any) -> bool:
    """
    Whether every item of the list or tuple is a plain value (exact str, bytes, int, float, bool, None, or lists, tuples and dicts of them), which inherited_item copies without writing the original.
    """
def process_cmdline(pid: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> list[str] | None:
    """
    /proc/<pid>/cmdline as its arguments (empty for a kernel thread); None if the process is gone.
    """
def process_ids(*, proc_root: str = '/proc') -> list[int]:
    """
    The pids listed in /proc (every process, kernel threads included), ascending.
    """
def process_limits(pid: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> typing.Any:
    """
    /proc/<pid>/limits as {name: (soft, hard)}, e.g. "Max processes"; None for unlimited. None if the process is gone.
    """
def process_maps(pid: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> typing.Any:
    """
    /proc/<pid>/maps as (start, end, perms, path) tuples, path "" for anonymous memory; None if the process is gone. OSError without ptrace access.
    """
def process_memory(pid: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> MemoryRollup | None:
    """
    /proc/<pid>/smaps_rollup parsed (rss, pss, uss, swap in bytes); None if the process is gone or has released its memory. OSError if it cannot be read.
    """
def process_stat(pid: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> ProcessStat | None:
    """
    /proc/<pid>/stat parsed (comm may hold spaces and ')'); None if the process is gone. OSError if it cannot be read.
    """
def process_status(pid: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> ProcessStatus | None:
    """
    /proc/<pid>/status parsed; None if the process is gone. OSError if it cannot be read.
    """
def process_threads(pid: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> list[tuple[int, str]] | None:
    """
    (tid, name) of every thread of process pid, ascending by tid, the name from its comm; None if the process is gone. Threads that exit while it looks are left out.
    """
def random_grayscale(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], p: typing.SupportsFloat | typing.SupportsIndex, seed: typing.SupportsInt | typing.SupportsIndex, epoch: typing.SupportsInt | typing.SupportsIndex, index: typing.SupportsInt | typing.SupportsIndex) -> tuple[numpy.ndarray, bool]:
    """
    RandomGrayscale(p) of an (H, W, 3) copy, its draw from (seed, epoch, index): (image, whether it was applied).
    """
def random_resized_crop_box(height: typing.SupportsInt | typing.SupportsIndex, width: typing.SupportsInt | typing.SupportsIndex, seed: typing.SupportsInt | typing.SupportsIndex, epoch: typing.SupportsInt | typing.SupportsIndex, index: typing.SupportsInt | typing.SupportsIndex, scale: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = (0.08, 1.0), ratio: tuple[typing.SupportsFloat | typing.SupportsIndex, typing.SupportsFloat | typing.SupportsIndex] = (0.75, 1.3333333333333333)) -> tuple[int, int, int, int]:
    """
    torchvision RandomResizedCrop's box (top, left, h, w), drawn from (seed, epoch, index).
    """
def read_process_memory(pid: typing.SupportsInt | typing.SupportsIndex, address: typing.SupportsInt | typing.SupportsIndex, length: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> typing.Any:
    """
    length bytes of process pid's memory at address (/proc/<pid>/mem; fewer where the range ends in unmapped memory); None if the process is gone. OSError without ptrace access.
    """
def replacement_limit(num_workers: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Lost workers replaced per epoch for a loader of `num_workers` workers (at least 3); what LoaderOptions.max_replacements = REPLACE_EACH_WORKER resolves to.
    """
def reserve_stopping(tasks: typing.SupportsInt | typing.SupportsIndex) -> LedgerLease:
    """
    A lease of `tasks` threads of this process that run now and are about to be stopped and restarted (numpy's OpenBLAS pool around spindle's forks): pending until released, so no loader takes their tasks meanwhile. Granted without a check.
    """
def resize(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], size: tuple[typing.SupportsInt | typing.SupportsIndex, typing.SupportsInt | typing.SupportsIndex]) -> numpy.ndarray:
    """
    PIL-equal antialiased bilinear resize of an (H, W, C) uint8 array.
    """
def resolve_budget_policy(name: str | None = None) -> str:
    """
    The budget policy a loader runs with: name if given, else $SPINDLE_BUDGET_POLICY, else "shrink"; ValueError naming where a bad name came from. The one resolution of the policy; every front end asks here.
    """
def rgb_to_grayscale(image: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8]) -> numpy.ndarray:
    """
    torchvision rgb_to_grayscale(num_output_channels=3) of an (H, W, 3) copy.
    """
def sysctl_int(name: str, *, proc_root: str = '/proc') -> int | None:
    """
    An integer sysctl named as sysctl(8) names it ("kernel.threads-max"); None if absent or unreadable.
    """
def thread_stack_pointer(pid: typing.SupportsInt | typing.SupportsIndex, tid: typing.SupportsInt | typing.SupportsIndex, *, proc_root: str = '/proc') -> typing.Any:
    """
    The stack pointer of a blocked thread (/proc/<pid>/task/<tid>/syscall), "running" for a thread on a CPU, None if it is gone. OSError without ptrace access.
    """
BUDGET_POLICIES: tuple = ('shrink', 'wait', 'fail')
MIN_SLOT_BYTES: int = 65536
REPLACE_EACH_WORKER: int = -1
