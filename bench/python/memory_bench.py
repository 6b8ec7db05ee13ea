"""What N workers cost in memory (issue 26, part 1): the dataset's Python objects, paid once or per worker.

A map dataset holding Python objects (a list of 3M ``str`` paths; a list of 1M annotation dicts, as
COCO-style datasets keep them) is read by forked workers, one shuffled pass over a share of the
samples. Reading an object writes its reference count, so a worker of torch's DataLoader copies the
pages it reads; spindle's loaders (``share="auto"``, the default) store such attributes once in
shared memory (spindle.shared) and the workers read the same pages.

Measured per run, in a fresh interpreter each (so no run inherits another's heap):

- consumer PSS: the consumer after building the dataset, before the loader (what one process needs);
- peak tree PSS: the consumer and its workers, polled every 0.5 s (PSS splits each shared page among
  the processes mapping it, so the tree's PSS adds up to the memory it really takes) from ``iter()``
  to the end of the pass;
- the ratio of the two: 1.0 means the workers cost nothing beyond the data; torch pays ~1x per worker.

``spindle.DataLoader+shared()`` is the same loader with the dataset's list replaced by
``spindle.shared(list)`` by hand in the consumer (which then holds only the segment); with
``share="auto"`` the consumer keeps the user's list and the workers' segment besides.

Also the time to the first batch under ``multiprocessing_context="spawn"`` with 1.2M paths:
spindle.torch (the dataset's list handed over as a segment descriptor) against torch (the dataset
pickled into every worker), and spindle.torch with ``share="off"`` (the pickle, written once into a
memfd that every worker maps).

Run from the repository root: ``.venv/bin/python bench/python/memory_bench.py`` (about 5 minutes on
2 cores; ``--quick`` for a smaller check). Writes bench/results/memory.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

LOADERS = ("torch", "spindle.torch", "spindle.DataLoader", "spindle.DataLoader+shared()")
BATCH = 512


class Paths:
    """A list of image paths; item i is a small array computed from path i (no file is read)."""

    def __init__(self, n: int) -> None:
        self.paths = [f"/datasets/imagenet/train/n{i % 1000:08d}/img_{i:09d}.JPEG" for i in range(n)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        p = self.paths[i]
        return np.array([len(p), ord(p[-6])], dtype=np.int64)


class Annotations:
    """A list of COCO-style annotation dicts; item i is a small array computed from annotation i."""

    def __init__(self, n: int) -> None:
        self.annotations = [
            {"id": i, "image_id": i // 7, "category_id": i % 80, "iscrowd": 0, "area": float(i % 5000) + 0.5,
             "bbox": [float(i % 640), float(i % 480), 32.0 + i % 50, 24.0 + i % 40],
             "file_name": f"train2017/{i // 7:012d}.jpg"}
            for i in range(n)]

    def __len__(self) -> int:
        return len(self.annotations)

    def __getitem__(self, i: int) -> np.ndarray:
        a = self.annotations[i]
        return np.array([a["category_id"], int(a["bbox"][2]), len(a["file_name"])], dtype=np.int64)


DATASETS = {"paths": Paths, "annotations": Annotations}


def _loader(name: str, dataset: Any, workers: int, spawn: bool = False, share: str = "auto") -> Any:
    if name == "torch":
        import torch.utils.data

        return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                                           multiprocessing_context="spawn" if spawn else None)
    if name == "spindle.torch":
        import spindle.torch

        return spindle.torch.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                                        multiprocessing_context="spawn" if spawn else None, share=share)
    import spindle

    return spindle.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, seed=0, share=share)


def one_memory_run(loader_name: str, dataset_name: str, n: int, workers: int, fraction: float) -> dict[str, Any]:
    """In this (fresh) process: build the dataset, then one shuffled pass over `fraction` of it."""
    from spindle.bench.tree import TreeSampler, pss_kib

    if "torch" in loader_name:
        import torch  # noqa: F401  (imported before the baseline: both torch loaders pay it alike)
    dataset = DATASETS[dataset_name](n)
    if loader_name.endswith("+shared()"):  # by hand: the consumer keeps only the shared container
        import spindle

        for name, value in vars(dataset).items():
            setattr(dataset, name, spindle.shared(value))
        del name, value
    gc.collect()
    consumer_kib = pss_kib(os.getpid())
    loader = _loader(loader_name, dataset, workers)
    batches = int(n * fraction) // BATCH
    start = time.perf_counter()
    # Every 0.5 s: summing a tree's PSS walks every process's page tables (17 processes of ~1 GB
    # each take the kernel a good part of a core on a busy machine), which would slow what it measures.
    with TreeSampler(os.getpid(), period_s=0.5, pss_every=1) as sampler:
        it = iter(loader)
        for _ in range(batches):
            next(it)
        sampler.poll()
        from spindle import _core

        workers_uss = [m.uss for pid in sampler.tree.stats() if pid != os.getpid()
                       for m in [_core.process_memory(pid)] if m is not None]
        del it
    return dict(loader=loader_name, dataset=dataset_name, samples=n, workers=workers, batches=batches,
                seconds=time.perf_counter() - start, consumer_pss_mib=consumer_kib / 1024,
                peak_tree_pss_mib=sampler.peaks.pss_kib / 1024, ratio=sampler.peaks.pss_kib / consumer_kib,
                worker_uss_mib=round(statistics.median(workers_uss) / 2**20, 1) if workers_uss else None)


def one_spawn_run(loader_name: str, n: int, workers: int, share: str) -> dict[str, Any]:
    """In this (fresh) process: time from iter() to the first batch with spawned workers."""
    import torch  # noqa: F401

    dataset = Paths(n)
    loader = _loader(loader_name, dataset, workers, spawn=True, share=share)
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    del it
    return dict(loader=loader_name if share == "auto" else f"{loader_name} share=off", samples=n, workers=workers,
                first_batch_s=first)


def _child(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"memory_bench child {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a tenth of the data, one round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--fraction", type=float, default=0.25,
                        help="share of the epoch each run loads (a shuffled pass touches every page early)")
    parser.add_argument("--one", nargs=4, metavar=("LOADER", "DATASET", "N", "WORKERS"))
    parser.add_argument("--spawn", nargs=4, metavar=("LOADER", "N", "WORKERS", "SHARE"))
    args = parser.parse_args()
    if args.one:
        loader, dataset, n, workers = args.one
        print(json.dumps(one_memory_run(loader, dataset, int(n), int(workers), args.fraction)))
        return
    if args.spawn:
        loader, n, workers, share = args.spawn
        print(json.dumps(one_spawn_run(loader, int(n), int(workers), share)))
        return

    from machine import load_average, machine_info, write_results

    scale = 0.1 if args.quick else 1.0
    sizes = {"paths": int(3_000_000 * scale), "annotations": int(1_000_000 * scale)}
    load_before = load_average()
    memory: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for dataset, n in sizes.items():
            for workers in (4, 16):
                for loader in LOADERS:
                    row = _child(["--fraction", str(args.fraction), "--one", loader, dataset, str(n), str(workers)])
                    print(f"{dataset:12s} {workers:2d} workers {loader:19s} consumer {row['consumer_pss_mib']:7.0f} MiB"
                          f"  peak tree {row['peak_tree_pss_mib']:7.0f} MiB  {row['ratio']:.2f}x"
                          f"  worker USS {row['worker_uss_mib']} MiB"
                          f"  ({row['seconds']:.1f} s)", flush=True)
                    memory.append(row)
    spawn: list[dict[str, Any]] = []
    n_spawn = int(1_200_000 * scale)
    for _ in range(max(args.rounds, 3 if not args.quick else 1)):
        for loader, share in (("torch", "auto"), ("spindle.torch", "auto"), ("spindle.torch", "off")):
            row = _child(["--spawn", loader, str(n_spawn), "4", share])
            print(f"spawn, {n_spawn:,} paths, 4 workers: {row['loader']:23s} first batch {row['first_batch_s']:.2f} s",
                  flush=True)
            spawn.append(row)

    def median(rows: list[dict[str, Any]], key: str, **match: Any) -> float:
        return statistics.median(r[key] for r in rows if all(r[k] == v for k, v in match.items()))

    summary = {
        "memory_ratio": {f"{d}/{w}/{ld}": round(median(memory, "ratio", dataset=d, workers=w, loader=ld), 2)
                         for d in sizes for w in (4, 16) for ld in LOADERS},
        "worker_uss_mib": {f"{d}/{w}/{ld}": median(memory, "worker_uss_mib", dataset=d, workers=w, loader=ld)
                           for d in sizes for w in (4, 16) for ld in LOADERS},
        "first_batch_s": {name: round(median(spawn, "first_batch_s", loader=name), 2)
                          for name in ("torch", "spindle.torch", "spindle.torch share=off")},
    }
    print(json.dumps(summary, indent=1))
    write_results("memory", dict(
        machine=machine_info(), load_average_before=load_before, load_average_after=load_average(),
        command=" ".join([Path(sys.executable).name, *sys.argv]), batch_size=BATCH, fraction=args.fraction,
        summary=summary, memory=memory, spawn=spawn))


if __name__ == "__main__":
    main()
