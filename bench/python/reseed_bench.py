"""What per-sample reseeding costs (issue 10: random draws keyed by (seed, epoch, sample index)).

With a seed, spindle.DataLoader and spindle.torch.StatefulDataLoader reseed
``random``, numpy's global generator (and torch's CPU generator) before each
``dataset[i]``, so that a sample's augmentation does not depend on the worker
that loads it and a resumed loader draws what the uninterrupted one drew.
This measures that cost in one process, where the workers pay it: ``dataset[i]``
of an 8x8x3 uint8 array (tests/python/toy_datasets.Images), plain vs wrapped in
spindle._state.checkpoint.Reseeded (random + numpy; random + numpy + torch), 5 alternating
rounds of 20,000 samples, medians. The ratio to a real sample's cost is what
matters: a JPEG decode + crop is ~1-5 ms.

Run from the repository root: ``.venv/bin/python bench/python/reseed_bench.py``.
Writes bench/results/reseed.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402,F401  (imported before timing: Reseeded(torch_cpu=True) reseeds it)
from toy_datasets import Images  # noqa: E402
from machine import RESULTS_DIR, load_average, machine_info  # noqa: E402

from spindle._state.checkpoint import Reseeded  # noqa: E402

SAMPLES, ROUNDS = 20_000, 5


def per_sample_us(dataset) -> float:
    start = time.perf_counter()
    for i in range(SAMPLES):
        dataset[i]
    return (time.perf_counter() - start) / SAMPLES * 1e6


def main() -> None:
    data = Images(SAMPLES)
    peers = {"plain": data, "reseeded (random, numpy)": Reseeded(data, 1, 0),
             "reseeded (random, numpy, torch)": Reseeded(data, 1, 0, torch_cpu=True)}
    load_before = load_average()
    times: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(ROUNDS):
        for name, dataset in peers.items():
            times[name].append(per_sample_us(dataset))
    load_after = load_average()
    medians = {name: round(statistics.median(t), 2) for name, t in times.items()}
    result = {"machine": machine_info(), "load_before": load_before, "load_after": load_after,
              "us_per_sample": medians,
              "added_us_per_sample": {name: round(m - medians["plain"], 2) for name, m in medians.items()}}
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "reseed.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("load_before", "load_after", "us_per_sample")}, indent=2))


if __name__ == "__main__":
    main()
