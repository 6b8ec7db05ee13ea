"""The drop-ins' speed against the physical limit and against their peers.

    .venv/bin/python bench/python/dropin_bench.py        # writes bench/results/dropin.json

Workload (issue "drop-in fidelity", speed): a map-style dataset whose
``__getitem__`` returns ``(uint8 array 64x64x3, int)``, a fresh array per
sample, batch 256, 2 workers.
The physical limit is what 2 processes can produce: 2 x one process's rate of
``dataset[i]`` (measured here, in this run). Each front's steady rate (after
its first batch, persistent workers, so forking is out of the clock) is
reported as a fraction of that limit, beside torch's DataLoader on the same
dataset in the same run. Time to first batch (``iter()`` + first ``next()``,
fresh workers) compares spindle.torch with torch at 2 and 16 workers. Imports
are done before any clock starts. Rounds alternate the loaders; medians are
reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from machine import machine_info, write_results

SHAPE = (64, 64, 3)
BATCH = 256


class Pairs:
    """(image, label): each sample a fresh array, as a decoding dataset returns
    (no decode cost, so the loader's own work is all there is to see)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full(SHAPE, i % 251, np.uint8), i


def dataset_rate(ds: Pairs, passes: int = 5) -> float:
    """One process's rate of dataset[i] (samples/s), the best of `passes` passes."""
    best = 0.0
    n = len(ds)
    for _ in range(passes):
        start = time.perf_counter()
        for i in range(n):
            ds[i]
        best = max(best, n / (time.perf_counter() - start))
    return best


def steady_rate(loader) -> float:
    """Samples/s of one epoch after its first batch."""
    it = iter(loader)
    first = next(it)
    samples = 0
    start = time.perf_counter()
    for batch in it:
        samples += len(batch[1])
    del first
    return samples / (time.perf_counter() - start)


def first_batch_seconds(make) -> float:
    loader = make()
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    seconds = time.perf_counter() - start
    del it
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="dropin", help="name of the results file in bench/results/")
    args = parser.parse_args()

    import torch.utils.data

    import spindle
    import spindle.torch

    ds = Pairs(args.samples)
    one = dataset_rate(ds)
    limit = 2 * one
    print(f"one process's rate of dataset[i]: {one:,.0f} samples/s; limit for 2 workers {limit:,.0f}", flush=True)
    fronts = {
        "spindle.DataLoader": spindle.DataLoader(ds, BATCH, num_workers=2, persistent_workers=True),
        "spindle.torch.DataLoader": spindle.torch.DataLoader(ds, BATCH, num_workers=2, persistent_workers=True),
        "torch.utils.data.DataLoader": torch.utils.data.DataLoader(ds, BATCH, num_workers=2,
                                                                   persistent_workers=True),
    }
    rates: dict[str, list[float]] = {name: [] for name in fronts}
    for name, loader in fronts.items():  # warm-up: forks the persistent workers
        steady_rate(loader)
    for r in range(args.rounds):
        for name, loader in fronts.items():
            gc.collect()
            rates[name].append(steady_rate(loader))
        print(f"round {r}: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in rates.items()), flush=True)
    for loader in fronts.values():
        close = getattr(loader, "close", None)
        if close:
            close()

    ttfb: dict[str, dict[str, float]] = {}
    for workers in (2, 16):
        makers = {
            "spindle.torch.DataLoader": lambda: spindle.torch.DataLoader(ds, BATCH, num_workers=workers),
            "torch.utils.data.DataLoader": lambda: torch.utils.data.DataLoader(ds, BATCH, num_workers=workers),
        }
        times: dict[str, list[float]] = {name: [] for name in makers}
        for _ in range(args.rounds):
            for name, make in makers.items():
                gc.collect()
                times[name].append(first_batch_seconds(make))
        ttfb[f"{workers} workers"] = {name: statistics.median(v) for name, v in times.items()}
        print(f"first batch, {workers} workers: " +
              ", ".join(f"{n} {statistics.median(v) * 1e3:.0f} ms" for n, v in times.items()), flush=True)

    summary = {name: {"median_samples_per_s": statistics.median(v), "fraction_of_limit": statistics.median(v) / limit,
                      "vs_torch": statistics.median(v) / statistics.median(rates["torch.utils.data.DataLoader"])}
               for name, v in rates.items()}
    for name, s in summary.items():
        print(f"{name:28} {s['median_samples_per_s']:12,.0f} samples/s  {100 * s['fraction_of_limit']:5.1f}% of the "
              f"2-worker limit  {s['vs_torch']:5.2f}x torch", flush=True)
    write_results(Path(args.out).stem, {"machine": machine_info(), "workload": f"(uint8 {SHAPE}, int), batch {BATCH}, 2 workers",
                             "one_process_rate": one, "limit_2_workers": limit, "rates": rates, "summary": summary,
                             "first_batch_seconds": ttfb})
    return 0


if __name__ == "__main__":
    sys.exit(main())
