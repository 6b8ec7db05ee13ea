"""Native pipelines: decode and augment in C++, batches straight into shared memory.

    pipe = (spindle.pipeline.image_folder(root)   # or spindle.pipeline.arrays("images.npy")
            .decode()                             # RGB uint8
            .random_resized_crop(224)
            .random_flip()
            .batch(64))
    for b in spindle.PipelineLoader(pipe, num_workers=2, shuffle=True, seed=0):   # mode="threads" (default) | "processes"
        b["image"]   # (64, 224, 224, 3) uint8, zero-copy; b["label"] (64,) int64

No Python runs per sample: the workers are forked processes running C++
(``mode="processes"``, isolation from a crashing decoder) or threads of the
one arena in this process (``mode="threads"``, no fork), within the same
thread budget, giving the same batches bit for bit. Every random draw comes
from (seed, epoch, sample index), so batches do not depend on the worker count
or the mode. The stages run in the order the builder calls come in (checked when
the loader is made: a crop needs decode() before it, ...); see docs/native.md.

WebDataset members kept as byte fields (captions, JSON) come as one ``bytes``
per sample: ``webdataset(shards, keep=("txt",))`` gives ``b["txt"]`` a list of
``bytes``; ``PipelineLoader(..., byte_fields="arrays")`` gives the zero-copy
``(values, offsets)`` numpy pair instead (row i is
``values[offsets[i]:offsets[i + 1]]``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from . import _core
from ._runtime.epoch import EpochIterator
from ._runtime.stats import HasStats
from ._runtime.start import LOADER_DEFAULTS, StartSpec, replacements_for, start_pipeline
from ._state.checkpoint import Progress
from ._state.epoch_plan import EpochPlan
from ._state.sharding import resolve_shard, shard_list
from .errors import DataError, DecodeError, InternalError, ProcessesAdvised, SpindleError

__all__ = ["Pipeline", "image_folder", "webdataset", "arrays", "PipelineLoader"]

_FORMAT = "spindle.Loader"

# The core's defaults (pipeline.hpp, shard_stream.hpp), read once: the builders' signatures use them.
_PIPELINE_DEFAULTS = _core.PipelineOptions()
_SHARD_DEFAULTS = _core.ShardOptions()


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _count(value: Any, what: str, minimum: int = 1) -> int:
    """An int >= minimum, or TypeError / ValueError naming `what` and the value."""
    if not _is_int(value):
        raise TypeError(f"{what} must be an int, not {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, not {value!r}")
    return int(value)


def _size(value: Any, what: str) -> tuple[int, int]:
    """An output size: an int (square) or (height, width) of ints >= 1."""
    if _is_int(value):
        side = _count(value, what)
        return side, side
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return _count(value[0], f"{what}[0] (height)"), _count(value[1], f"{what}[1] (width)")
    raise TypeError(f"{what} must be an int or a (height, width) pair of ints, not {value!r}")


def _real(value: Any, what: str, lo: float, hi: float) -> float:
    if not _is_real(value):
        raise TypeError(f"{what} must be a number, not {value!r} ({type(value).__name__})")
    if not lo <= float(value) <= hi:
        raise ValueError(f"{what} must be in [{lo}, {hi}], not {value!r}")
    return float(value)


def _interval(value: Any, what: str, hi: float) -> tuple[float, float]:
    """(lo, hi) with 0 < lo <= hi <= `hi`."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_real(v) for v in value)):
        raise TypeError(f"{what} must be a (min, max) pair of numbers, not {value!r}")
    lo_, hi_ = float(value[0]), float(value[1])
    if not 0 < lo_ <= hi_ <= hi:
        raise ValueError(f"{what} must satisfy 0 < min <= max{' <= ' + str(hi) if hi != float('inf') else ''}, "
                         f"not {value!r}")
    return lo_, hi_


def _jitter_arg(value: Any, what: str) -> float | tuple[float, float]:
    """A ColorJitter argument: a number or a (min, max) pair of numbers (their ranges: the C++ stage checks)."""
    if _is_real(value):
        return float(value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_real(v) for v in value):
        return float(value[0]), float(value[1])
    raise TypeError(f"{what} must be a number or a (min, max) pair of numbers, not {value!r}")


def _triple(value: Any, what: str, positive: bool) -> tuple[float, float, float]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 3 or not all(
            _is_real(v) for v in value):
        raise TypeError(f"{what} must be 3 numbers (R, G, B), not {value!r}")
    out = tuple(float(v) for v in value)
    if not all(np.isfinite(out)) or (positive and not all(v > 0 for v in out)):
        raise ValueError(f"{what} must be {'positive and ' if positive else ''}finite, not {value!r}")
    return out  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A native pipeline: a source, then per-sample stages in the order they are called, then
    batching. Build it with :func:`image_folder`, :func:`webdataset` or :func:`arrays` and the
    methods below; each checks its arguments (TypeError / ValueError at the call) and returns a new
    Pipeline. The order of the stages is checked when a PipelineLoader is made (e.g. a crop needs
    decode() before it; normalize() is the last stage that touches the image). The fields record
    what the methods set; read them, do not set them."""

    source: tuple[str, Any]  # ("image_folder", root), ("npy", path) or ("webdataset", [shards])
    """What :func:`image_folder`, :func:`webdataset` or :func:`arrays` was given."""
    stages: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """The stages in call order: (name of a ``_core.Stage`` factory, its checked arguments)."""
    keep: tuple[str, ...] = ()
    """:func:`webdataset`'s kept members (byte fields)."""
    errors: tuple[str, float] = ("raise", _PIPELINE_DEFAULTS.max_skip_ratio)
    """:meth:`on_error`'s (policy, max_ratio)."""
    batch_size: int = 1
    """:meth:`batch`'s samples per batch."""
    drop_last: bool = False
    """:meth:`batch`'s drop_last."""
    bytes_per_sample: int = _PIPELINE_DEFAULTS.bytes_per_sample
    """:meth:`batch`'s room per sample for each byte field."""
    fetch: tuple[tuple[str, Any], ...] = ()
    """:func:`webdataset`'s ShardOptions fields (cache_dir, cache_limit_bytes, retries, timeout)."""

    def _then(self, name: str, *args: Any) -> "Pipeline":
        return dataclasses.replace(self, stages=self.stages + ((name, args),))

    def decode(self) -> "Pipeline":
        """Decodes JPEG, PNG, WebP, TIFF, BMP and PPM/PGM files to RGB uint8 (a JPEG fused with a
        random_resized_crop or center_crop that directly follows it)."""
        return self._then("decode")

    def random_resized_crop(self, size: int | tuple[int, int], scale: tuple[float, float] = (0.08, 1.0),
                            ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> "Pipeline":
        """torchvision's RandomResizedCrop: a random area fraction in `scale` and aspect in
        `ratio` (log-uniform), 10 tries then a center crop, resized to `size` (int: square, or
        (height, width))."""
        return self._then("random_resized_crop", _size(size, "random_resized_crop size"),
                          _interval(scale, "random_resized_crop scale", 1.0),
                          _interval(ratio, "random_resized_crop ratio", float("inf")))

    def resize(self, size: int | tuple[int, int]) -> "Pipeline":
        """torchvision's Resize: an int sets the shorter side, keeping the aspect; (height, width)
        resizes to exactly that (antialiased bilinear, PIL's)."""
        if _is_int(size):
            return self._then("resize_shorter", _count(size, "resize size"))
        return self._then("resize", _size(size, "resize size"))

    def center_crop(self, size: int | tuple[int, int]) -> "Pipeline":
        """torchvision's CenterCrop(size) (int: square, or (height, width))."""
        return self._then("center_crop", _size(size, "center_crop size"))

    def random_flip(self, p: float = 0.5) -> "Pipeline":
        """Horizontal flip with probability p."""
        return self._then("random_flip", _real(p, "random_flip p", 0.0, 1.0))

    def color_jitter(self, brightness: float | tuple[float, float] = 0.0, contrast: float | tuple[float, float] = 0.0,
                     saturation: float | tuple[float, float] = 0.0, hue: float | tuple[float, float] = 0.0
                     ) -> "Pipeline":
        """torchvision ColorJitter: each argument a number v (factor uniform in [max(0, 1 - v), 1 + v];
        hue in [-v, v]) or a (min, max) range (hue within [-0.5, 0.5]); 0 leaves that adjustment out.
        The order of the four and their factors are drawn per sample; the pixels follow
        torchvision's adjust_* formulas for uint8 tensors (docs/ops.md)."""
        args = tuple(_jitter_arg(v, f"color_jitter {name}") for v, name in
                     ((brightness, "brightness"), (contrast, "contrast"), (saturation, "saturation"), (hue, "hue")))
        _core.Stage.color_jitter(*args)  # torchvision's range rules, owned by the C++ stage: checked now
        return self._then("color_jitter", *args)

    def random_grayscale(self, p: float = 0.1) -> "Pipeline":
        """torchvision RandomGrayscale(p): with probability p, the image's grayscale in all 3 channels."""
        return self._then("random_grayscale", _real(p, "random_grayscale p", 0.0, 1.0))

    def normalize(self, mean: Sequence[float], std: Sequence[float], layout: str = "HWC") -> "Pipeline":
        """float32 (x / 255 - mean) / std per channel; layout "HWC" or "CHW". The last stage that
        touches the image."""
        if layout not in ("HWC", "CHW"):
            raise ValueError(f"layout must be 'HWC' or 'CHW', not {layout!r}")
        return self._then("normalize", _triple(mean, "normalize mean", False), _triple(std, "normalize std", True),
                          layout == "CHW")

    def on_error(self, policy: str = "raise", max_ratio: float = _PIPELINE_DEFAULTS.max_skip_ratio) -> "Pipeline":
        """'raise' (default): a bad file fails its batch, naming the file and the decoder's message.
        'skip': it is replaced by a good sample of its batch and counted; the loader raises once
        skips exceed `max_ratio` of the samples seen (judged from the 100th sample on, and at
        the end of each epoch)."""
        if policy not in ("raise", "skip"):
            raise ValueError(f"on_error policy must be 'raise' or 'skip', not {policy!r}")
        return dataclasses.replace(self, errors=(policy, _real(max_ratio, "on_error max_ratio", 0.0, 1.0)))

    def batch(self, batch_size: int, drop_last: bool = False, *,
              bytes_per_sample: int = _PIPELINE_DEFAULTS.bytes_per_sample) -> "Pipeline":
        """Samples per batch; with `drop_last`, an epoch's short last batch is dropped. `bytes_per_sample`: room for each byte field (a kept WebDataset
        member) in a batch's slot, bytes_per_sample x batch_size in all; a batch whose captions
        take more fails naming the sample and the value that fits (nothing is cut)."""
        if not isinstance(drop_last, (bool, np.bool_)):
            raise TypeError(f"drop_last must be a bool, not {drop_last!r}")
        return dataclasses.replace(self, batch_size=_count(batch_size, "batch_size"), drop_last=bool(drop_last),
                                   bytes_per_sample=_count(bytes_per_sample, "bytes_per_sample"))

    def options(self) -> _core.PipelineOptions:
        """The runtime's PipelineOptions for this pipeline."""
        o = _core.PipelineOptions()
        kind, where = self.source
        if kind == "image_folder":
            o.image_folder = where
        elif kind == "webdataset":
            o.webdataset = list(where)
            for name, value in self.fetch:
                setattr(o.webdataset_options, name, value)
        else:
            o.npy = where
        o.keep = list(self.keep)
        o.stages = [getattr(_core.Stage, name)(*args) for name, args in self.stages]
        o.bytes_per_sample = self.bytes_per_sample
        o.on_error = _core.OnError.SKIP if self.errors[0] == "skip" else _core.OnError.RAISE
        o.max_skip_ratio = self.errors[1]
        return o


def _path(value: Any, what: str) -> str:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path (str or os.PathLike), not {value!r} ({type(value).__name__})")
    path = os.fspath(value)
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what} must be a non-empty str path, not {value!r}")
    return path


def image_folder(root: str | os.PathLike) -> Pipeline:
    """Images in ImageNet layout: root/<class>/<file> with one of torchvision's IMG_EXTENSIONS (.jpg .jpeg
    .png .ppm .bmp .pgm .tif .tiff .webp, any case); the label is the class's index among the sorted
    class folders (torchvision's ImageFolder rule)."""
    return Pipeline(("image_folder", _path(root, "image_folder root")))


def webdataset(shards: str | os.PathLike | Sequence[str | os.PathLike],
               keep: str | Sequence[str] = (), *, cache_dir: Optional[str | os.PathLike] = None,
               cache_limit_bytes: int = _SHARD_DEFAULTS.cache_limit_bytes, retries: int = _SHARD_DEFAULTS.retries,
               timeout: float = _SHARD_DEFAULTS.timeout) -> Pipeline:
    """WebDataset tar shards, streamed (never extracted): members grouped by key; the image is the
    sample's jpg/jpeg/png, the label its cls (or json "label"). Worker w reads shards w, w + N, ...
    (shard-level assignment); batches come from the workers in turn, as torch's IterableDataset's do.

    `keep` names members passed through as byte fields: ``webdataset(shards, keep=("txt", "json"))``
    gives ``b["txt"]`` and ``b["json"]``, one ``bytes`` per sample (or ``(values, offsets)`` arrays:
    PipelineLoader's ``byte_fields="arrays"``). A sample without a kept member fails naming its
    shard and key (with on_error("skip"): dropped and counted).

    A shard is a path, ``file://``, ``http://``/``https://`` (streamed by libcurl in the worker) or
    ``pipe:CMD`` (a command's stdout); webdataset's brace notation (``shard-{000..099}.tar``) and
    ``::`` lists are expanded. ``cache_dir`` keeps remote shards whole on local disk (at most
    ``cache_limit_bytes``, 0: no limit, least recently used removed first); transient failures are
    retried ``retries`` times with backoff; ``timeout`` (seconds) bounds connecting and every wait
    for the next byte. See docs/streaming.md."""
    if isinstance(shards, (str, os.PathLike)):
        shards = [shards]
    if isinstance(shards, (bytes, dict)) or not isinstance(shards, Sequence):
        raise TypeError(f"webdataset shards must be a path or a sequence of paths, not {shards!r}")
    paths = tuple(url for s in shards for url in _core.expand_shard_urls(_path(s, "a webdataset shard")))
    if not paths:
        raise ValueError("webdataset needs at least one shard")
    if isinstance(keep, str):
        keep = (keep,)
    if not isinstance(keep, Sequence) or not all(isinstance(k, str) for k in keep):
        raise TypeError(f"keep must be member names (str), e.g. ('txt', 'json'), not {keep!r}")
    for k in keep:
        if not k or k.startswith(".") or k in ("jpg", "jpeg", "png", "image", "label"):
            raise ValueError(f"keep={k!r}: name members other than the image and label, without a dot "
                             "(e.g. 'txt', 'json')")
    if len(set(keep)) != len(keep):
        raise ValueError(f"keep names a member twice: {tuple(keep)!r}")
    fetch = (("cache_dir", os.fspath(cache_dir) if cache_dir is not None else ""),
             ("cache_limit_bytes", int(cache_limit_bytes)), ("retries", int(retries)), ("timeout", float(timeout)))
    return Pipeline(("webdataset", paths), keep=tuple(keep), fetch=fetch)


def arrays(path: str | os.PathLike) -> Pipeline:
    """uint8 images [N, H, W, 3] in a .npy file, memory-mapped (labels are -1)."""
    return Pipeline(("npy", _path(path, "arrays path")))


class PipelineLoader(HasStats):
    """Iterates a native :class:`Pipeline` in batches of ``{"image": ..., "label": ...}``.

    Args:
        pipeline: what to read and do.
        num_workers: worker processes (``mode="processes"``) or arena threads (``"threads"``).
            ``"auto"`` (``mode="processes"``): a process per idle core starts (from the second
            epoch, as many as the last epoch ended on), more
            are added while your loop waits for batches and a core is free, and one retires when
            the workers idle; the batches do not depend on it (``spindle.DataLoader``'s
            ``num_workers="auto"``). A WebDataset stream's batches are those of
            ``num_workers=spindle.auto_workers()`` logical workers (8 a cpu, at most 64: chosen
            once, from the machine); its streams start again on the processes the controller advises,
            each from the shard and sample its last batch left it at. A lost worker process of an
            image-folder or array loader is replaced (its batch made again, at most one per process
            a epoch, at least 3; docs/reliability.md).
        shuffle: a new permutation every epoch, from (seed, epoch).
        seed: makes order and augmentation reproducible; None draws fresh entropy per epoch.
        mode: "threads" (the default: no fork, the arena's threads in this process; the faster
            mode in docs/native.md's benchmark) or "processes" (forked C++ workers, isolated
            from a crashing decoder).
        timeout: seconds to wait for a batch (0 or inf: forever).
        prefetch_factor: batches in flight per worker.
        max_threads: cap on the tasks the loader adds, on top of ulimit -u and pids.max.
        budget_policy: when fewer tasks are free than num_workers: ``"shrink"`` (run with fewer,
            one ``ThreadBudgetWarning``), ``"wait"`` (up to ``timeout``) or ``"fail"``
            (``ThreadBudgetError``); None reads ``$SPINDLE_BUDGET_POLICY`` (default ``"shrink"``).
        shard: None, ``"auto"`` or ``(rank, world_size)``: this rank's part of each epoch's
            global order, as ``spindle.DataLoader`` and torch's DistributedSampler cut it; a
            WebDataset is split by shard file (rank r reads files r, r + world_size, ...).
        shard_drop_last: with a shard, cut the order's tail to divide by world_size instead of
            padding it (DistributedSampler's drop_last).

        byte_fields: how byte fields (``webdataset(keep=...)``) come: ``"list"`` (default), a
            list of ``bytes`` per batch; or ``"arrays"``, a ``(values, offsets)`` pair of numpy
            arrays viewing the slot (uint8 [total bytes], uint64 [batch + 1]; sample i is
            ``values[offsets[i]:offsets[i + 1]]``), no copy.

    ``state_dict()`` / ``load_state_dict()`` checkpoint the position (small, JSON-able); a
    resumed image-folder or array loader yields exactly the batches the saved one would have
    yielded next, with any num_workers and either mode (a WebDataset stream: the same
    num_workers; the state holds each logical worker's shard and sample, where its stream starts
    again: the shards it finished are not read again).

    Batches are numpy arrays viewing shared memory (zero-copy; ``torch.from_dlpack`` and
    ``jax.dlpack`` take them without copying) and stay valid as long as you keep them.
    """

    def __init__(self, pipeline: Pipeline, num_workers: int = 2, *, shuffle: bool = False,
                 seed: Optional[int] = None, mode: str = "threads", timeout: float = 0,
                 prefetch_factor: int = LOADER_DEFAULTS.prefetch_factor, max_threads: Optional[int] = None,
                 shard: Any = None,
                 shard_drop_last: bool = False, byte_fields: str = "list",
                 budget_policy: Optional[str] = None) -> None:
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"pipeline must be a spindle.pipeline.Pipeline, not {type(pipeline).__name__}")
        if byte_fields not in ("list", "arrays"):
            raise ValueError(f"byte_fields must be 'list' or 'arrays', not {byte_fields!r}")
        if mode not in ("processes", "threads"):
            raise ValueError(f"mode must be 'processes' or 'threads', not {mode!r}")
        auto = isinstance(num_workers, str) and num_workers == "auto"
        if auto and mode != "processes":
            raise ValueError('num_workers="auto" needs mode="processes" (threads do not follow the machine yet)')
        if not auto:
            _count(num_workers, "num_workers")
        _count(prefetch_factor, "prefetch_factor")
        if not isinstance(shuffle, (bool, np.bool_)):
            raise TypeError(f"shuffle must be a bool, not {shuffle!r}")
        if seed is not None and not _is_int(seed):
            raise TypeError(f"seed must be an int or None, not {seed!r}")
        if not _is_real(timeout):
            raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
        if not timeout >= 0:
            raise ValueError(f"timeout should be non-negative, but got timeout={timeout!r}")
        self.pipeline = pipeline
        self.num_workers: int | str = "auto" if auto else int(num_workers)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.mode = mode
        self.timeout = float(timeout)
        self.prefetch_factor = int(prefetch_factor)
        self.max_threads = max_threads
        self.budget_policy = _core.resolve_budget_policy(budget_policy)
        self.shard = resolve_shard(shard)
        self.shard_drop_last = bool(shard_drop_last)
        if self.shard is not None and pipeline.source[0] == "webdataset":
            pipeline = dataclasses.replace(
                pipeline, source=("webdataset", tuple(shard_list(list(pipeline.source[1]), self.shard, "shard files"))))
        self.byte_fields = byte_fields
        self._native = _core.Pipeline(pipeline.options())  # validates; opens nothing per sample yet
        # A stream's batches are defined by its logical workers: under "auto" the core's choice, once.
        self._streams_count = (_core.auto_workers() if auto else self.num_workers) if self._native.streaming else 0
        self._names = list(self._native.field_names)
        self._streams: Optional[_Streams] = None  # a stream's epoch now: where its logical workers stand
        self._resume_streams: Optional[dict[str, Any]] = None  # a loaded state's, for the next epoch
        # The epochs' orders, their entropy, the length per rank and the checkpointed position.
        self._plan = EpochPlan(self._native, pipeline.batch_size, shuffle=self.shuffle, seed=seed, shard=self.shard,
                               shard_drop_last=self.shard_drop_last, drop_last=pipeline.drop_last)

    def __len__(self) -> int:
        if self._native.streaming:
            raise TypeError("a WebDataset pipeline is a stream: its length is not known before reading it")
        return len(self._plan)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (order and augmentation derive from it)."""
        self._plan.epoch = int(epoch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        position = self._plan.begin()
        return Progress(self._epoch_iterator(position.epoch, position.yielded, position.resplits), position)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: the epoch and the batches of it handed out (JSON-able, versioned)."""
        # The checkpoint's format name is the one states were saved under (before the class was
        # renamed PipelineLoader): saved states keep loading.
        state = self._plan.state(_FORMAT, {**self._plan.shard_field(), **self._state_settings()})
        streams = self._streams
        if streams is not None and state["batches"] and streams.epoch == state["epoch"]:
            # Where each logical worker's stream stands after the batches handed out: a resume starts
            # the streams there instead of reading those batches again.
            state["streams"] = streams.state()
        return state

    def load_state_dict(self, state: Any) -> None:
        """Makes the next ``iter()`` yield what the loader that saved `state` would have yielded next.

        With a shard, `state` may come from another world size or rank (elastic resume,
        docs/distributed.md): one rank's state when the ranks advanced in lock step, else the list
        of every old rank's state. A WebDataset stream resumes mid-epoch at its own world size only."""
        self._plan.load(state, _FORMAT, self._state_settings, stream=self._native.streaming)
        # A stream's positions, where the state has them (one rank's state, mid-epoch).
        self._resume_streams = state.get("streams") if isinstance(state, dict) else None

    def _state_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = dict(
            seed=self._plan.entropy, source=list(self.pipeline.source[:1]) + [_jsonable(self.pipeline.source[1])],
            samples=len(self._native), batch_size=self.pipeline.batch_size, drop_last=self.pipeline.drop_last,
            shuffle=self.shuffle, shard_drop_last=self.shard_drop_last)
        if self._native.streaming:  # a stream's batch order depends on its (logical) worker count
            settings["num_workers"] = self._streams_count
        return settings

    def _epoch_iterator(self, epoch: int, skip: int, resplits: tuple) -> Iterator[dict[str, np.ndarray]]:
        order, _ = self._plan.order(epoch, resplits)  # with drop_last, whole batches only
        if not self._native.streaming:
            order = order[skip * self.pipeline.batch_size:]  # resuming: the batches already handed out
            if len(order) == 0:
                return iter(())
        auto = self.num_workers == "auto"
        stream = self._native.streaming
        processes = self.mode == "processes" and not stream  # a lost one is replaced
        # "auto": the epoch starts on the processes the last one ended on (0: the cores idle now).
        spec = StartSpec(num_workers=self._streams_count if stream else 0 if auto else self.num_workers,
                         adaptive=auto, processes=self._stats_book().processes_at_end if auto else 0,
                         round_robin=stream, logical_workers=stream,
                         batch_capacity=self.pipeline.batch_size,
                         prefetch_factor=self.prefetch_factor, timeout=self.timeout, max_threads=self.max_threads,
                         budget_policy=self.budget_policy,
                         max_replacements=replacements_for("replace" if processes else "raise"))
        decode = functools.partial(_decode_fields, names=self._names, as_arrays=self.byte_fields == "arrays")

        def epoch_iterator(spec: StartSpec, stream_starts: Sequence[int] = (),
                           note: Optional[Callable[[Any], None]] = None, stacklevel: int = 1) -> EpochIterator:
            # `stacklevel`: the frame a budget warning names, 1 being this function's caller.
            runtime = start_pipeline(spec, self._native, order=order, seed=self._plan.entropy, epoch=epoch,
                                     threads=self.mode == "threads", drop_last=self.pipeline.drop_last,
                                     stream_starts=stream_starts, stacklevel=stacklevel + 1)
            return EpochIterator(runtime, decode if note is None else _noting(note, decode), owns=True,
                                 reraise=_native_error, stats=self._stats_book())

        if not stream:
            return _SkipWarnings(epoch_iterator(spec, stacklevel=3))  # _epoch_iterator, __iter__, the user's
        resume, self._resume_streams = (self._resume_streams if skip else None), None
        self._streams = streams = _Streams(spec, epoch_iterator, epoch, self._streams_count, resume)
        if resume is None:
            # A state without positions (saved by an older spindle): the first `skip` batches are read
            # again and dropped (batch k comes from logical worker k mod N: the same N, the same batches).
            for _ in range(skip):
                if next(streams, None) is None:
                    break
        return _SkipWarnings(streams)


def _noting(note: Callable[[Any], None], decode: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def noted(lease: Any) -> Any:
        note(lease)
        return decode(lease)
    return noted


class _Wrapper:
    """An epoch's iterator around another (an EpochIterator, or a wrapper of one): its workers, its close."""

    _it: Any

    def __iter__(self) -> "_Wrapper":
        return self

    @property
    def worker_pids(self) -> list[int]:
        return self._it.worker_pids

    def close(self) -> None:
        self._it.close()


class _Streams(_Wrapper):
    """A WebDataset stream's epoch: batches from its N logical workers in turn, noting where each
    one's stream stands after its last batch handed out (``Batch.stream_position``) and whose turn
    is next. A checkpoint keeps them (:meth:`state`), and a resume starts there.

    Under ``num_workers="auto"`` the logical workers run on the processes the core's controller
    advises (``Loader.advised_processes``; 0, and no ``ProcessesAdvised``, for a fixed count). On advice the processes stop (what they had
    in flight is read again) and new ones start each stream where it stands: the batches are those
    of a fixed run with N workers."""

    def __init__(self, spec: StartSpec, start: Callable[..., EpochIterator], epoch: int, count: int,
                 resume: Optional[dict[str, Any]]) -> None:
        self._spec = spec
        self._start = start
        self.epoch = epoch
        self._positions = [0] * count  # 0: the stream's start
        self._next = 0  # the logical worker whose batch comes next
        if resume is not None:
            positions, self._next = list(resume["positions"]), int(resume["next"])
            if len(positions) != count or not 0 <= self._next < count:
                raise ValueError(f"spindle: the state's stream positions are for {len(positions)} workers "
                                 f"(next {self._next}), this loader runs {count}")
            self._positions = [int(p) for p in positions]
        self._it = self._begin(spec, stacklevel=4)  # __init__, _epoch_iterator, __iter__, the user's

    def state(self) -> dict[str, Any]:
        return {"positions": list(self._positions), "next": self._next}

    def _begin(self, spec: StartSpec, stacklevel: int) -> EpochIterator:
        spec = dataclasses.replace(spec, first_worker=self._next)
        return self._start(spec, self._positions, note=self._note, stacklevel=stacklevel + 1)

    def _note(self, lease: Any) -> None:
        self._positions[lease.stream] = lease.stream_position
        self._next = (lease.stream + 1) % len(self._positions)

    def __next__(self) -> Any:
        while True:
            try:
                batch = next(self._it)
                break
            except ProcessesAdvised:
                self._restart()  # advised while no batch was ready: now, not after the one in flight
        if self._it.advised_processes:
            self._restart()
        return batch

    def _restart(self) -> None:
        processes = self._it.advised_processes
        self._it.close(grace=0.0)  # their batches in flight are made again by the new processes
        # _restart, __next__, _SkipWarnings' and Progress' __next__, the user's
        self._it = self._begin(dataclasses.replace(self._spec, processes=processes), stacklevel=5)


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _native_error(failed: Any) -> BaseException:
    """A native worker's failed batch as the exception its failure kind names (no text parsed)."""
    message = failed.payload.decode(errors="replace")
    where = f" (worker {failed.worker_id}, pid {failed.pid}, batch {failed.batch_id})"
    if failed.kind == "decode":
        return DecodeError(message + where, path=failed.path, key=failed.key)
    if failed.kind == "data":
        return DataError(message + where, path=failed.path, key=failed.key)
    if failed.kind == "internal":
        return InternalError(message + where)
    return SpindleError(message + where)


def _decode_fields(lease: Any, names: list[str], as_arrays: bool) -> dict[str, Any]:
    fields = lease.arrays()
    batch: dict[str, Any] = {"image": fields[0], "label": fields[1]}
    for name, field in zip(names[2:], fields[2:]):  # byte fields: (values, offsets) over the slot
        if as_arrays:
            batch[name] = field
        else:
            values, offsets = field
            flat, ends = values.tobytes(), offsets.tolist()
            batch[name] = [flat[ends[i]:ends[i + 1]] for i in range(len(ends) - 1)]
    if lease.skipped:  # the batch's own count; its structure bytes the first few reasons, one a line
        batch["_skipped"] = (lease.skipped, lease.structure.decode(errors="replace").split("\n"))
    return batch


class _SkipWarnings(_Wrapper):
    """Warns for each batch in which on_error='skip' replaced samples (the runtime enforces the ratio)."""

    def __init__(self, it: Any) -> None:
        self._it = it

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self._it.__next__()  # raises SkipRatioError itself (LoaderOptions::max_skip_ratio)
        skipped = batch.pop("_skipped", None)
        if skipped:
            count, reasons = skipped
            more = f"; and {count - len(reasons)} more" if count > len(reasons) else ""
            warnings.warn(f"spindle: skipped {count} unreadable sample(s) in a batch: " + "; ".join(reasons) + more,
                          RuntimeWarning, stacklevel=2)
        return batch
