"""Decode-bound loading: the native pipeline against the peers, in the same run.

    .venv/bin/python bench/python/native_bench.py          # writes bench/results/native.json

Workload (issue "native pipelines"): an ImageNet-like folder generated here
without network (JPEG q90, sides of 300-500 px, 10 classes; cached under
/tmp), decode + random-resized-crop 224 + horizontal flip, batch 64, on this
machine's cores. Loaders, alternating in rounds, medians reported:

* ``torch+PIL``: torch's DataLoader over a dataset that opens each file with PIL
  and applies torchvision's RandomResizedCrop rule with PIL (crop, then
  resize(224, BILINEAR), which is what torchvision's PIL path does) and a flip.
  torchvision itself is used when it imports; here PyPI's torchvision does not
  import beside the CPU torch, so the same ops are written out with PIL.
* ``spindle processes`` / ``spindle threads``: spindle.Loader over
  spindle.pipeline.image_folder(...).decode().random_resized_crop(224).random_flip().
* tf.data, SPDL, torchvision.io: measured only when they import (reported as
  skipped, with the reason, otherwise).

The physical limit is cores x one thread's rate of the same fused decode on
the same files (the native pipeline on one arena thread, measured here, median
of 3); each loader's rate is reported as a fraction of it, with the peak
thread count of its process tree.
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

from machine import machine_info, write_results

SIZE = 224
BATCH = 64


def make_folder(root: Path, n: int) -> Path:
    from PIL import Image

    marker = root / f".complete-{n}"
    if marker.exists():
        return root
    rng = np.random.default_rng(0)
    for k in range(n):
        cls = root / f"class{k % 10:02d}"
        cls.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(300, 501)), int(rng.integers(300, 501))
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([np.sin(x / rng.uniform(5, 40)), np.cos(y / rng.uniform(5, 40)),
                         np.sin((x + y) / rng.uniform(5, 40))], -1)
        img = ((base + 1) * 100 + rng.normal(0, 12, (h, w, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(cls / f"{k:05d}.jpg", quality=90)
    marker.touch()
    return root


class PilImageFolder:
    """torchvision's ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip, with PIL."""

    def __init__(self, root: Path) -> None:
        classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
        self.samples = [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import math
        import random

        from PIL import Image

        path, label = self.samples[i]
        img = Image.open(path).convert("RGB")
        w, h = img.size
        area = h * w
        box = None
        for _ in range(10):  # torchvision's RandomResizedCrop.get_params
            target = area * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                top, left = random.randint(0, h - ch), random.randint(0, w - cw)
                box = (left, top, left + cw, top + ch)
                break
        if box is None:
            cw, ch = w, h
            box = (0, 0, w, h)
        img = img.resize((SIZE, SIZE), Image.BILINEAR, box=box)
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return np.asarray(img), label


def tree_threads(pid: int) -> int:
    """Threads of `pid` and all its descendants."""
    children: dict[int, list[int]] = {}
    threads: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        threads[int(name)] = int(fields[17])
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        total += threads.get(p, 0)
        stack.extend(children.get(p, []))
    return total


def run_epoch(make, max_samples: int) -> tuple[float, int]:
    """Steady samples/s (after the first batch) and the peak threads of the tree."""
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_threads(os.getpid()))
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


def one_thread_rate(pipe, samples: int) -> float:
    """One thread's rate of the same fused decode + crop + resize + flip on the same files: the
    native pipeline itself on one arena thread (threads mode, 1 worker), after its first batch."""
    import spindle

    rate, _ = run_epoch(lambda: spindle.Loader(pipe, num_workers=1, shuffle=True, seed=1, mode="threads"), samples)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--samples", type=int, default=1536, help="samples timed per epoch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--root", default="/tmp/spindle-bench-imagenet")
    parser.add_argument("--out", default="native")
    args = parser.parse_args()

    root = make_folder(Path(args.root), args.images)
    import torch.utils.data

    import spindle
    from spindle import pipeline as sp

    pipe = sp.image_folder(root).decode().random_resized_crop(SIZE).random_flip().batch(BATCH)
    w = args.workers
    loaders = {
        "torch+PIL": lambda: torch.utils.data.DataLoader(PilImageFolder(root), BATCH, shuffle=True, num_workers=w),
        "spindle processes": lambda: spindle.Loader(pipe, num_workers=w, shuffle=True, seed=0, mode="processes"),
        "spindle threads": lambda: spindle.Loader(pipe, num_workers=w, shuffle=True, seed=0, mode="threads"),
    }
    skipped = {}
    for name, module in (("torchvision.io + transforms.v2", "torchvision"), ("tf.data", "tensorflow"),
                         ("SPDL", "spdl.io")):
        try:
            __import__(module)
            skipped[name] = "imports here, but its loader is not written into this benchmark yet"
        except Exception as e:  # noqa: BLE001 - any import failure means "not here"
            skipped[name] = f"not measured: import {module} failed ({type(e).__name__}: {str(e)[:120]})"

    limit_one = statistics.median(one_thread_rate(pipe, args.samples // 2) for _ in range(3))
    cores = len(os.sched_getaffinity(0))
    limit = cores * limit_one
    print(f"one thread's fused decode+crop+resize: {limit_one:,.0f} images/s; limit for {cores} cores: "
          f"{limit:,.0f}", flush=True)
    rates: dict[str, list[float]] = {k: [] for k in loaders}
    peaks: dict[str, int] = {k: 0 for k in loaders}
    for r in range(args.rounds):
        for name, make in loaders.items():
            gc.collect()
            rate, peak = run_epoch(make, args.samples)
            rates[name].append(rate)
            peaks[name] = max(peaks[name], peak)
        print(f"round {r}: " + ", ".join(f"{n} {v[-1]:,.0f}/s" for n, v in rates.items()), flush=True)
    base = statistics.median(rates["torch+PIL"])
    summary = {}
    for name, v in rates.items():
        m = statistics.median(v)
        summary[name] = {"median_images_per_s": m, "vs_torch_pil": m / base, "fraction_of_limit": m / limit,
                         "peak_threads": peaks[name]}
        print(f"{name:20} {m:8,.0f} images/s  {m / base:5.2f}x torch+PIL  {100 * m / limit:5.1f}% of the limit  "
              f"peak threads {peaks[name]}", flush=True)
    for name, why in skipped.items():
        print(f"{name}: {why}")
    write_results(args.out, {"machine": machine_info(), "workload": f"{args.images} JPEGs q90 300-500 px, "
                             f"decode + RRC {SIZE} + flip, batch {BATCH}, {w} workers", "one_thread_rate": limit_one,
                             "limit": limit, "rates": rates, "summary": summary, "skipped": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
