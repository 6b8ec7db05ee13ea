"""One loader, one epoch, in a fresh process: ``python -m spindle.bench.child PARAMS_JSON``.

The harness starts one of these per measurement, so every loader runs in its own process
tree and none inherits another's threads, pools or page cache of objects. Imports and
building the dataset are out of the clock; the epoch is timed from ``iter(loader)`` to
its last batch, so starting the workers (fork or spawn) is in it. Prints one JSON line.

The loader runners below are written here, once, for every workload: each returns a
function that builds the loader for one epoch. A runner imports its library when it is
built, so a missing peer fails before anything is timed.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import signal
import sys
import time
import traceback
from typing import Any, Callable, Iterable

# grain's spawned workers import this module as __mp_main__: nothing below runs for them.


def _jax_step(batch_rows: int) -> Callable[[Any], None]:
    """A jitted matmul over the batch, run before the loader starts and after every batch, so the
    consumer's JAX thread pools are live the whole epoch (the grain + JAX seed scenario)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    w = jnp.ones((4096, 16), jnp.float32)

    @jax.jit
    def step(x: Any) -> Any:
        return (x.reshape(x.shape[0], -1)[:, :4096].astype(jnp.float32) @ w).sum()

    def run(images: Any) -> None:
        step(np.asarray(images)).block_until_ready()

    dummy = np.zeros((batch_rows, 4096), np.uint8)
    for _ in range(3):
        run(dummy)
    return run


def _grain_loader(cls: Any, ds: Any, P: dict[str, Any]) -> Callable[[], Iterable[Any]]:
    import grain

    sampler = grain.samplers.IndexSampler(num_records=len(ds), shard_options=grain.sharding.NoSharding(),
                                          shuffle=P["shuffle"], num_epochs=1, seed=7)
    return lambda: cls(data_source=ds, sampler=sampler, operations=[grain.transforms.Batch(batch_size=P["batch"])],
                       worker_count=P["workers"])


def _collate(items: list[Any]) -> Any:
    import numpy as np

    if isinstance(items[0], (tuple, list)):
        return tuple(np.stack([np.asarray(x[k]) for x in items]) for k in range(len(items[0])))
    return np.stack([np.asarray(x) for x in items])


def runner(P: dict[str, Any], ds: Any) -> Callable[[], Iterable[Any]]:
    """The loader `P["loader"]` over `ds` (or over P["root"] for the native pipelines), one epoch per call."""
    name, w, b, shuffle = P["loader"].removesuffix("+jax"), P["workers"], P["batch"], P["shuffle"]
    if name == "spindle":
        import spindle

        return lambda: spindle.DataLoader(ds, batch_size=b, shuffle=shuffle, num_workers=w, seed=0,
                                          timeout=P["loader_timeout"])
    if name == "spindle-torch":
        import spindle.torch

        return lambda: spindle.torch.DataLoader(ds, batch_size=b, shuffle=shuffle, num_workers=w,
                                                timeout=P["loader_timeout"])
    if name == "spindle-grain":
        import spindle.grain

        return _grain_loader(spindle.grain.DataLoader, ds, P)
    if name.startswith("spindle-native-"):
        import spindle
        from spindle import pipeline as sp

        pipe = sp.image_folder(P["root"]).decode().random_resized_crop(P["size"]).random_flip().batch(b)
        mode = name.removeprefix("spindle-native-")
        return lambda: spindle.PipelineLoader(pipe, num_workers=w, shuffle=shuffle, seed=0, mode=mode,
                                      timeout=P["loader_timeout"])
    if name in ("torch", "torch+PIL", "torchdata"):
        if name != "torchdata":
            from torch.utils.data import DataLoader
        else:
            from torchdata.stateful_dataloader import StatefulDataLoader as DataLoader
        return lambda: DataLoader(ds, batch_size=b, shuffle=shuffle, num_workers=w,
                                  timeout=P["loader_timeout"] if w else 0)
    if name == "grain":
        import grain
        from absl import flags

        flags.FLAGS.mark_as_parsed()  # grain's multiprocessing reads absl flags
        return _grain_loader(grain.DataLoader, ds, P)
    if name == "tf.data":
        return _tf_data(P, ds)
    if name == "spdl":
        return _spdl(P, ds)
    raise ValueError(f"unknown loader {P['loader']!r}")


def _tf_data(P: dict[str, Any], ds: Any) -> Callable[[], Iterable[Any]]:
    """tf.data with `workers` parallel calls: a Python dataset through tf.numpy_function, or, for
    jpeg-native, tf's own decode_and_crop_jpeg + resize(antialias=True) + flip (the Inception rule
    for the crop box: sample_distorted_bounding_box with torchvision's scale and ratio)."""
    import numpy as np
    import tensorflow as tf

    w, b = P["workers"], P["batch"]
    if P["workload"] == "jpeg-native":
        from .workloads import folder_samples

        files = folder_samples(P["root"])
        order = np.random.default_rng(0).permutation(len(files))
        paths = tf.constant([files[i][0] for i in order])
        labels = tf.constant([files[i][1] for i in order], tf.int64)
        size = P["size"]

        def load(path: Any, label: Any) -> Any:
            data = tf.io.read_file(path)
            shape = tf.io.extract_jpeg_shape(data)
            begin, extent, _ = tf.image.sample_distorted_bounding_box(
                shape, tf.zeros([0, 0, 4], tf.float32), area_range=(0.08, 1.0),
                aspect_ratio_range=(3 / 4, 4 / 3), max_attempts=10, use_image_if_no_bounding_boxes=True)
            crop = tf.stack([begin[0], begin[1], extent[0], extent[1]])
            img = tf.image.decode_and_crop_jpeg(data, crop, channels=3)
            img = tf.image.resize(img, (size, size), antialias=True)
            img = tf.image.random_flip_left_right(tf.cast(tf.round(img), tf.uint8))
            return img, label

        def make() -> Iterable[Any]:
            d = tf.data.Dataset.from_tensor_slices((paths, labels)).map(load, num_parallel_calls=w)
            return d.batch(b).prefetch(2).as_numpy_iterator()
        return make
    order = np.random.default_rng(0).permutation(len(ds)) if P["shuffle"] else np.arange(len(ds))
    first = ds[0]

    def get(i: Any) -> Any:
        img, label = ds[int(i)][:2]
        return np.asarray(img), np.int64(label)

    dtype = tf.as_dtype(np.asarray(first[0]).dtype)

    def make() -> Iterable[Any]:
        d = tf.data.Dataset.from_tensor_slices(order).map(
            lambda i: tuple(tf.numpy_function(get, [i], [dtype, tf.int64])), num_parallel_calls=w)
        return d.batch(b).prefetch(2).as_numpy_iterator()
    return make


def _spdl(P: dict[str, Any], ds: Any) -> Callable[[], Iterable[Any]]:
    """SPDL's pipeline: `dataset[i]` in `workers` threads, batched, collated with numpy."""
    import numpy as np
    from spdl.pipeline import PipelineBuilder

    if P["workload"] == "jpeg-native":
        raise NotImplementedError("no SPDL runner for jpeg-native: its image decode needs an FFmpeg filter graph "
                                  "for the random-resized crop, not written here")
    w, b = P["workers"], P["batch"]
    order = (np.random.default_rng(0).permutation(len(ds)) if P["shuffle"] else np.arange(len(ds))).tolist()

    def make() -> Iterable[Any]:
        pipeline = (PipelineBuilder().add_source(order).pipe(ds.__getitem__, concurrency=max(1, w))
                    .aggregate(b).pipe(_collate).add_sink(3).build(num_threads=max(1, w)))

        def run() -> Iterable[Any]:
            with pipeline.auto_stop():
                yield from pipeline
        return run()
    return make


def _count(batch: Any) -> tuple[int, int | None, Any]:
    """Samples in a batch, the sum of their labels (None without labels), and its first field."""
    import numpy as np

    if isinstance(batch, dict):
        labels, first = batch.get("label"), next(iter(batch.values()))
    elif isinstance(batch, (tuple, list)):
        first, labels = batch[0], (batch[1] if len(batch) >= 2 else None)
    else:
        first, labels = batch, None
    n = len(first)
    total = None
    if labels is not None:
        arr = np.asarray(labels)
        if arr.dtype.kind in "iu" and arr.shape == (n,):
            total = int(arr.sum())
    return n, total, first


def _cpu_seconds_with_children() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _stop_descendants() -> None:
    """Kills, by pid, what this process started and is still running (only its own descendants)."""
    from .tree import ProcessTree

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would raise about each worker
    me = os.getpid()
    for pid in ProcessTree(me).stats():
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main() -> None:
    P = json.loads(sys.argv[1])
    report: dict[str, Any] = {"loader": P["loader"], "workers": P["workers"], "uid": os.getuid(),
                              "rlimit_nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0]}

    def emit() -> None:
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()

    def on_alarm(signum: int, frame: Any) -> None:
        where = traceback.extract_stack(frame)[-1]
        report.update(outcome="hang", error=f"no end of epoch after {P['alarm_s']} s, waiting in {where.name} "
                      f"({os.path.basename(where.filename)}:{where.lineno}); stack:\n"
                      + "".join(traceback.format_stack(frame))[-2000:])
        emit()
        _stop_descendants()
        os._exit(3)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(P["alarm_s"])
    try:
        from . import tree, workloads

        import numpy as np  # noqa: F401 - imported out of the clock

        ds = None if P["workload"] == "jpeg-native" and P["loader"].startswith(("spindle-native", "tf.data")) \
            else workloads.build(P["workload"], samples=P["samples"], root=P["root"], dataset=P["dataset"])
        make = runner(P, ds)
        step = _jax_step(P["batch"]) if P["loader"].endswith("+jax") else None
        gc.collect()
        me = os.getpid()
        report["consumer_threads_before"] = len(os.listdir("/proc/self/task"))
        cpu0 = _cpu_seconds_with_children()
        samples, label_sum, first_s, first_n, paused = 0, 0, None, 0, 0.0
        start = time.perf_counter()
        loader = make()
        for batch in loader:
            n, total, images = _count(batch)
            if first_s is None:
                first_s = time.perf_counter() - start
                # The whole tree once, out of the clock: every worker is up by the first batch,
                # even when the epoch is too short for the harness's sampler to see it.
                t = time.perf_counter()
                counted = tree.tree_threads(me)
                report.update(tree_threads_at_first_batch=sum(counted.values()),
                              tree_processes_at_first_batch=len(counted))
                paused, first_n = time.perf_counter() - t, n
            samples += n
            label_sum = None if total is None or label_sum is None else label_sum + total
            if step is not None:
                step(images)
        seconds = time.perf_counter() - start - paused
        del batch, loader
        gc.collect()  # the loader's workers are stopped and reaped here, so their CPU time is counted
        # What the loader left running (grain: multiprocessing's resource tracker) is counted too.
        leftovers = [st for p, st in tree.ProcessTree(me).stats().items() if p != me]
        cpu = _cpu_seconds_with_children() - cpu0 + sum(st.cpu_s for st in leftovers)
        report.update(outcome="completed", samples=samples, label_sum=label_sum, seconds=seconds,
                      first_batch_s=first_s, samples_per_s=samples / seconds,
                      steady_samples_per_s=(samples - first_n) / (seconds - first_s)
                      if first_s is not None and seconds > first_s and samples > first_n else None,
                      left_running=len(leftovers),
                      cpu_s=cpu, consumer_threads_after=len(os.listdir("/proc/self/task")))
    except BaseException as exc:  # noqa: BLE001 - how each loader fails is part of the result
        report.update(outcome="failed", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-3000:])
    signal.alarm(0)
    emit()
    _stop_descendants()
    os._exit(0)  # no atexit hooks of the peers (a hung one would hang the measurement)


if __name__ == "__main__":
    main()
