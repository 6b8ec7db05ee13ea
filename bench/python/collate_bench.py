"""What an explicit collate_fn costs: spindle.torch against torch's DataLoader, in one run.

    .venv/bin/python bench/python/collate_bench.py        # writes bench/results/collate.json

Workload (issue 25, "any collate_fn, zero-copy"): ImageNet-shaped float32 samples
(3x224x224, a fresh tensor per sample, and an int label), batch 64, 2 workers,
persistent workers (forking is out of the clock), steady rate after the first batch.
Three collate functions:

- ``None``: torch's default, spindle's array path;
- ``default_collate`` named explicitly (torchvision's reference train.py does);
- a custom one returning a dataclass batch (``Batch(images, labels, names)``): spindle
  pickles it with its tensors as out-of-band buffers in the slot.

Goal: each of spindle.torch's rates >= torch's with the same collate_fn, and the explicit
ones >= 0.8x spindle.torch's ``collate_fn=None`` rate. Rounds alternate the loaders;
medians are reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
import torch.utils.data
from torch.utils.data import default_collate

from machine import load_average, machine_info, write_results

SHAPE = (3, 224, 224)
BATCH = 64


class Images(torch.utils.data.Dataset):
    """A fresh float32 image per sample, as a decoding + normalizing dataset returns it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full(SHAPE, float(i % 251)), i


@dataclasses.dataclass
class Batch:
    images: torch.Tensor
    labels: torch.Tensor
    names: list


def dataclass_collate(samples):
    images, labels = default_collate(samples)
    return Batch(images, labels, [f"sample-{int(i)}" for i in labels])


COLLATES = {"None": None, "default_collate": default_collate, "dataclass": dataclass_collate}


def steady_rate(loader, batches: int) -> float:
    """Samples per second over `batches` batches after the first (an epoch of persistent workers)."""
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    n = 0
    for _ in range(batches):
        batch = next(it)
        n += len(batch.labels) if isinstance(batch, Batch) else len(batch[1])
    rate = n / (time.perf_counter() - start)
    for _ in it:
        pass
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args()
    import spindle.torch

    ds = Images((args.batches + 2) * BATCH)
    loaders = {}
    for name, collate in COLLATES.items():
        for peer, cls in (("torch", torch.utils.data.DataLoader), ("spindle.torch", spindle.torch.DataLoader)):
            loaders[(peer, name)] = cls(ds, BATCH, num_workers=2, persistent_workers=True, collate_fn=collate)
    for loader in loaders.values():  # warm-up: forks the persistent workers
        for _ in loader:
            pass
    rates: dict = {key: [] for key in loaders}
    for _ in range(args.rounds):
        for key, loader in loaders.items():
            rates[key].append(steady_rate(loader, args.batches))
    median = {key: statistics.median(r) for key, r in rates.items()}
    base = median[("spindle.torch", "None")]
    table = []
    for name in COLLATES:
        ours, torchs = median[("spindle.torch", name)], median[("torch", name)]
        table.append({"collate_fn": name, "spindle.torch samples/s": round(ours), "torch samples/s": round(torchs),
                      "spindle / torch": round(ours / torchs, 2), "spindle / spindle with None": round(ours / base, 2)})
        print(f"{name:16s} spindle.torch {ours:8.0f}/s  torch {torchs:8.0f}/s  x{ours / torchs:.2f} vs torch, "
              f"x{ours / base:.2f} vs collate_fn=None")
    write_results("collate", {"machine": machine_info(), "load_average": load_average(), "batch": BATCH,
                              "shape": list(SHAPE), "workers": 2, "rounds": args.rounds, "batches": args.batches,
                              "table": table, "rates": {f"{p}/{n}": r for (p, n), r in rates.items()}})


if __name__ == "__main__":
    main()
