"""Decode-bound loading: the native pipeline against the peers, in the same run.

    make bench-peers                                     # the peers' venv, then this, under the bench lock
    .venv-peers/bin/python bench/python/native_bench.py  # writes bench/results/native.json
    .venv-peers/bin/python bench/python/native_bench.py --recipe jitter --out native-jitter

Workload (issue "native pipelines"): an ImageNet-like folder generated here
without network (JPEG q90, sides of 300-500 px, 10 classes; cached under
/tmp), decode + random-resized-crop 224 + horizontal flip, batch 64, on this
machine's cores (one worker per core). Each loader runs in its own process
tree (a child of this script, imports done before its clock starts), in
alternating rounds; medians are reported:

* ``torch+PIL``: torch's DataLoader over torchvision's ImageFolder with
  transforms RandomResizedCrop(224) (PIL bilinear, antialiased),
  RandomHorizontalFlip and PILToTensor. Where torchvision does not import,
  the same ops written out with PIL (crop + resize(224, BILINEAR) + flip).
* ``torchvision.io+v2``: torch's DataLoader, each sample read with
  torchvision.io.read_file, decoded by torchvision.io.decode_jpeg, then
  transforms.v2 RandomResizedCrop(224, antialias=True) + RandomHorizontalFlip.
* ``tf.data``: tf.io.read_file -> tf.image.sample_distorted_bounding_box
  (torchvision's area and aspect ranges, 10 tries) -> tf.image.decode_and_crop_jpeg
  -> tf.image.resize(bilinear, antialias=True) -> uint8 -> random_flip_left_right,
  map(num_parallel_calls=AUTOTUNE), batch 64, prefetch(AUTOTUNE).
* ``SPDL``: spdl.pipeline with a source of file paths, a stage of concurrency
  = cores that demuxes (spdl.io.demux_image), picks torchvision's box from the
  header's size and decodes through FFmpeg with the filter
  crop + scale=224:224:flags=bilinear (swscale's bilinear widens its filter
  when shrinking: antialiased) + hflip, then batches of 64 stacked with numpy.
* ``spindle processes`` / ``spindle threads``: spindle.PipelineLoader over
  spindle.pipeline.image_folder(...).decode().random_resized_crop(224).random_flip().

``--recipe jitter`` adds the colour augmentation of the ImageNet recipe after the
flip, ColorJitter(0.4, 0.4, 0.4, 0.1) then RandomGrayscale(0.1): torchvision's own
transforms for torch+PIL (on PIL images) and torchvision.io+v2 (v2, on uint8
tensors); spindle's color_jitter(0.4, 0.4, 0.4, 0.1).random_grayscale(0.1). tf.data
and SPDL have no ColorJitter; they get the same four adjustments with factors
drawn from the same ranges in their own terms (tf.image.adjust_* in a fixed order,
grayscale with p 0.1; FFmpeg's eq and hue filters), the same work, not the same
pixels.

A peer that does not import is skipped with the reason (never estimated).
The physical limit is cores x one thread's rate of the same fused decode on
the same files (the native pipeline on one arena thread, measured here,
median of 3); each loader's rate is reported as a fraction of it, with the
peak thread count of its process tree (the measuring thread excluded).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from machine import child_result, machine_info, write_results
from spindle.bench.tree import ProcessTree
# The harness's folder and its PIL reading of it: one generator, one torchvision-like dataset.
from spindle.bench.workloads import PilJpegFolder, folder_samples, make_image_folder

SIZE = 224
BATCH = 64
RECIPE = "rrc"  # or "jitter" (--recipe): + ColorJitter(0.4, 0.4, 0.4, 0.1) + RandomGrayscale(0.1)
JITTER = (0.4, 0.4, 0.4, 0.1)
GRAY_P = 0.1


def run_epoch(make, max_samples: int) -> tuple[float, int]:
    """Steady samples/s (after the first batch) and the peak threads of the tree."""
    peak = [0]
    stop = threading.Event()
    tree = ProcessTree(os.getpid())

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], sum(tree.threads().values()))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    loader = make()
    it = iter(loader)
    next(it)
    watcher.start()
    samples, start = 0, time.perf_counter()
    for batch in it:
        samples += len(batch[1] if isinstance(batch, (list, tuple)) else batch["label"])
        if samples >= max_samples:
            break
    seconds = time.perf_counter() - start
    stop.set()
    watcher.join()
    del it, loader
    return samples / seconds, peak[0] - 1  # less the watcher thread


def spindle_pipeline(root: Path):
    from spindle import pipeline as sp

    pipe = sp.image_folder(root).decode().random_resized_crop(SIZE).random_flip()
    if RECIPE == "jitter":
        pipe = pipe.color_jitter(*JITTER).random_grayscale(GRAY_P)
    return pipe.batch(BATCH)


def torch_pil(root: Path, workers: int):
    import torch.utils.data

    try:
        from torchvision import datasets, transforms
    except Exception:  # noqa: BLE001 - torchvision absent or broken: the same ops with PIL
        dataset = PilJpegFolder(root)
    else:
        colour = [transforms.ColorJitter(*JITTER), transforms.RandomGrayscale(GRAY_P)] if RECIPE == "jitter" else []
        dataset = datasets.ImageFolder(str(root), transform=transforms.Compose(
            [transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip(), *colour,
             transforms.PILToTensor()]))
    return torch.utils.data.DataLoader(dataset, BATCH, shuffle=True, num_workers=workers)


class DecodeJpegFolder:
    """torchvision.io.read_file + decode_jpeg + transforms.v2 RandomResizedCrop + flip."""

    def __init__(self, root: Path) -> None:
        from torchvision.transforms import v2

        self.samples = folder_samples(root)
        colour = [v2.ColorJitter(*JITTER), v2.RandomGrayscale(GRAY_P)] if RECIPE == "jitter" else []
        self.transform = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip(), *colour])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import torchvision.io

        path, label = self.samples[i]
        img = torchvision.io.decode_jpeg(torchvision.io.read_file(path), mode=torchvision.io.ImageReadMode.RGB)
        return self.transform(img), label


def torchvision_io(root: Path, workers: int):
    import torch.utils.data

    return torch.utils.data.DataLoader(DecodeJpegFolder(root), BATCH, shuffle=True, num_workers=workers)


def tf_data(root: Path, workers: int):
    import tensorflow as tf

    paths, labels = zip(*folder_samples(root))

    def load(path, label):
        data = tf.io.read_file(path)
        shape = tf.image.extract_jpeg_shape(data)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, tf.zeros([0, 0, 4], tf.float32), area_range=(0.08, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        img = tf.image.decode_and_crop_jpeg(data, window, channels=3)
        img = tf.image.resize(img, (SIZE, SIZE), method="bilinear", antialias=True)
        if RECIPE == "jitter":  # the four adjustments with factors from ColorJitter's ranges, fixed order
            b, c, s, h = JITTER
            img = img * tf.random.uniform([], 1 - b, 1 + b)
            img = tf.image.adjust_contrast(img, tf.random.uniform([], 1 - c, 1 + c))
            img = tf.image.adjust_saturation(img, tf.random.uniform([], 1 - s, 1 + s))
            img = tf.image.adjust_hue(img / 255.0, tf.random.uniform([], -h, h)) * 255.0
            img = tf.cond(tf.random.uniform([]) < GRAY_P,
                          lambda: tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(img)), lambda: img)
        img = tf.image.random_flip_left_right(tf.cast(tf.round(tf.clip_by_value(img, 0, 255)), tf.uint8))
        return img, label

    ds = (tf.data.Dataset.from_tensor_slices((list(paths), list(labels))).shuffle(len(paths))
          .map(load, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE))
    return ds.as_numpy_iterator()


def spdl_pipeline(root: Path, workers: int):
    import math
    import random

    import spdl.io
    from spdl.pipeline import PipelineBuilder

    samples = folder_samples(root)
    random.shuffle(samples)

    def load(sample):
        path, label = sample
        packets = spdl.io.demux_image(path)
        h, w = packets.height, packets.width
        box = (0, 0, w, h)
        for _ in range(10):  # torchvision's RandomResizedCrop.get_params
            target = h * w * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                box = (random.randint(0, w - cw), random.randint(0, h - ch), cw, ch)
                break
        x, y, cw, ch = box
        flip = ",hflip" if random.random() < 0.5 else ""
        colour = ""
        if RECIPE == "jitter":  # FFmpeg's eq (brightness is additive there) and hue (degrees; s=0 is grayscale)
            b, c, s, h = JITTER
            colour = (f",eq=brightness={random.uniform(-b, b) / 2:.3f}:contrast={random.uniform(1 - c, 1 + c):.3f}"
                      f":saturation={random.uniform(1 - s, 1 + s):.3f},hue=h={360 * random.uniform(-h, h):.1f}"
                      + (":s=0" if random.random() < GRAY_P else ""))
        frames = spdl.io.decode_packets(
            packets, filter_desc=f"crop={cw}:{ch}:{x}:{y},scale={SIZE}:{SIZE}:flags=bilinear{flip}{colour},"
                                 "format=pix_fmts=rgb24")
        return spdl.io.to_numpy(spdl.io.convert_frames(frames)), label

    def stack(items):
        return np.stack([a for a, _ in items]), np.array([b for _, b in items])

    pipeline = (PipelineBuilder().add_source(samples).pipe(load, concurrency=workers).aggregate(BATCH)
                .pipe(stack).add_sink(3).build(num_threads=workers))

    class Loader:
        def __iter__(self):
            with pipeline.auto_stop():
                yield from pipeline

    return Loader()


# name -> (module that must import, loader factory(root, workers))
PEERS = {
    "torch+PIL": ("torch", torch_pil),
    "torchvision.io+v2": ("torchvision", torchvision_io),
    "tf.data": ("tensorflow", tf_data),
    "SPDL": ("spdl.io", spdl_pipeline),
    "spindle processes": ("spindle", lambda root, w: __import__("spindle").PipelineLoader(
        spindle_pipeline(root), num_workers=w, shuffle=True, seed=0, mode="processes")),
    "spindle threads": ("spindle", lambda root, w: __import__("spindle").PipelineLoader(
        spindle_pipeline(root), num_workers=w, shuffle=True, seed=0, mode="threads")),
    # the limit's one thread: the native pipeline on one arena thread
    "one thread": ("spindle", lambda root, w: __import__("spindle").PipelineLoader(
        spindle_pipeline(root), num_workers=1, shuffle=True, seed=1, mode="threads")),
}


def child(name: str, root: Path, workers: int, samples: int) -> int:
    """Runs one loader in this process (its own tree) and prints its result as one JSON line."""
    import json

    module, factory = PEERS[name]
    try:
        __import__(module)
        if name == "SPDL":  # spdl.io imports lazily: load FFmpeg now, out of the clock
            import spdl.io

            spdl.io.demux_image(folder_samples(root)[0][0])
    except Exception as e:  # noqa: BLE001 - any import failure means "not here"
        print("RESULT " + json.dumps({"skipped": f"import {module} failed: {type(e).__name__}: {str(e)[:200]}"}))
        return 0
    rate, peak = run_epoch(lambda: factory(root, workers), samples)
    print("RESULT " + json.dumps({"rate": rate, "peak_threads": peak}), flush=True)
    return 0


def measure(name: str, args) -> dict:
    """One run of a loader in a fresh child process."""
    cmd = [sys.executable, __file__, "--child", name, "--recipe", args.recipe, "--root", args.root,
           "--workers", str(args.workers),
           "--samples", str(args.samples if name != "one thread" else args.samples // 2)]
    return child_result(cmd)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--samples", type=int, default=1536, help="samples timed per epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--root", default="/tmp/spindle-bench-imagenet")
    parser.add_argument("--out", default="native")
    parser.add_argument("--only", nargs="*", help="measure only these loaders (names as in the table)")
    parser.add_argument("--recipe", choices=["rrc", "jitter"], default="rrc",
                        help="jitter: + ColorJitter(0.4, 0.4, 0.4, 0.1) + RandomGrayscale(0.1)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global RECIPE
    RECIPE = args.recipe
    if args.child:
        return child(args.child, Path(args.root), args.workers, args.samples)

    root = make_image_folder(Path(args.root), args.images)
    load_before = machine_info()["load_average_at_start"]
    names = [n for n in PEERS if n != "one thread" and (not args.only or n in args.only)]
    skipped: dict[str, str] = {}
    limit_runs = [measure("one thread", args) for _ in range(3)]
    limit_one = statistics.median(r["rate"] for r in limit_runs)
    cores = len(os.sched_getaffinity(0))
    limit = cores * limit_one
    print(f"one thread's fused decode+crop+resize+flip{' + colour' if RECIPE == 'jitter' else ''}: "
          f"{limit_one:,.0f} images/s; limit for {cores} cores: "
          f"{limit:,.0f}", flush=True)
    rates: dict[str, list[float]] = {}
    peaks: dict[str, int] = {}
    loads = []
    for r in range(args.rounds):
        for name in names:
            if name in skipped:
                continue
            gc.collect()
            res = measure(name, args)
            if "rate" not in res:
                skipped[name] = res.get("skipped") or res.get("failed")
                print(f"{name}: skipped: {skipped[name]}", flush=True)
                continue
            rates.setdefault(name, []).append(res["rate"])
            peaks[name] = max(peaks.get(name, 0), res["peak_threads"])
        loads.append([round(x, 2) for x in os.getloadavg()])
        print(f"round {r} (load {loads[-1]}): " + ", ".join(f"{n} {v[-1]:,.0f}/s" for n, v in rates.items()),
              flush=True)
    base = statistics.median(rates["torch+PIL"]) if "torch+PIL" in rates else float("nan")
    summary = {}
    for name, v in rates.items():
        m = statistics.median(v)
        summary[name] = {"median_images_per_s": m, "vs_torch_pil": m / base, "fraction_of_limit": m / limit,
                         "peak_threads": peaks[name]}
        print(f"{name:20} {m:8,.0f} images/s  {m / base:5.2f}x torch+PIL  {100 * m / limit:5.1f}% of the limit  "
              f"peak threads {peaks[name]}", flush=True)
    for name, why in skipped.items():
        print(f"{name}: not measured: {why}")
    write_results(args.out, {"machine": machine_info(), "workload": f"{args.images} JPEGs q90 300-500 px, "
                             f"decode + RRC {SIZE} + flip"
                             + (" + ColorJitter(0.4, 0.4, 0.4, 0.1) + RandomGrayscale(0.1)" if RECIPE == "jitter" else "")
                             + f", batch {BATCH}, {args.workers} workers",
                             "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
                             "load_average_before": load_before, "load_average_after_each_round": loads,
                             "one_thread_rate": limit_one, "one_thread_runs": [r["rate"] for r in limit_runs],
                             "limit": limit, "rates": rates, "summary": summary, "skipped": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
