"""What mixing costs (issue 19): spindle.mix over three sources vs the unmixed dataset, same loader, same run.

The arrays workload of ``spindle bench`` (in-memory 64x64x3 uint8 samples, ``dataset[i]`` a view of
row i and its label: transport-bound, so any per-sample cost of the mix shows): an epoch of
spindle.DataLoader (batch 256, 2 workers) over ``ArraySamples(N)`` against one over
``spindle.mix([ArraySamples(w * N) for w in (0.5, 0.3, 0.2)], [0.5, 0.3, 0.2])``, whose length
(where its first source runs out) is about N; the unmixed dataset has exactly as many samples.
Rounds alternate unmixed / mixed so that a change of the machine's load hits both; the result is
the ratio of the medians of samples/s (after each epoch's first batch; persistent workers, forked out of the clock), and beside it the ratio of
the workers' CPU time per sample (/proc schedstat), which a busy machine disturbs much less. The mix's schedule is built once, before the timed epochs (it is built
on first use: about 0.1 s per million elements).

Run from the repository root: ``.venv/bin/python bench/python/mix_bench.py [--samples N] [--rounds R]``.
Writes bench/results/mix.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dropin_bench import steady_rate  # noqa: E402  (samples/s after the first batch, CPU per sample)
from machine import RESULTS_DIR, load_average, machine_info  # noqa: E402

import spindle  # noqa: E402
from spindle.bench.workloads import ArraySamples  # noqa: E402

WEIGHTS = [0.5, 0.3, 0.2]


def epoch(dataset, workers: int, batch: int) -> tuple[float, float]:
    """(samples/s, the workers' CPU ns per sample) of one epoch after its first batch."""
    # persistent: the workers are still there to read their CPU time when the epoch ends
    loader = spindle.DataLoader(dataset, batch_size=batch, num_workers=workers, persistent_workers=True)
    try:
        rate, worker_cpu, _ = steady_rate(loader)
    finally:
        loader.close()
    return rate, worker_cpu * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    n = args.samples
    mixed = spindle.mix([ArraySamples(int(w * n) + 8) for w in WEIGHTS], WEIGHTS, seed=0)
    start = time.perf_counter()
    length = len(mixed)  # builds the schedule
    build_s = time.perf_counter() - start
    peers = {"unmixed": ArraySamples(length), "mix of 3 sources": mixed}  # as many samples each
    load_before = load_average()
    rates: dict[str, list[float]] = {name: [] for name in peers}
    cpu: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(args.rounds):
        for name, dataset in peers.items():
            rate, ns = epoch(dataset, args.workers, args.batch)
            rates[name].append(rate)
            cpu[name].append(ns)
    load_after = load_average()
    medians = {name: round(statistics.median(r)) for name, r in rates.items()}
    cpu_medians = {name: round(statistics.median(c)) for name, c in cpu.items()}
    ratio = medians["mix of 3 sources"] / medians["unmixed"]
    result = {"machine": machine_info(), "load_before": load_before, "load_after": load_after,
              "samples": length, "rounds": args.rounds, "workers": args.workers, "batch": args.batch,
              "weights": WEIGHTS, "samples_per_s_median": medians,
              "samples_per_s_rounds": {k: [round(x) for x in v] for k, v in rates.items()},
              "mixed_over_unmixed": round(ratio, 4),
              "worker_cpu_ns_per_sample_median": cpu_medians,
              "worker_cpu_ns_per_sample_rounds": {k: [round(x) for x in v] for k, v in cpu.items()},
              "mixed_cpu_over_unmixed": round(cpu_medians["mix of 3 sources"] / cpu_medians["unmixed"], 4),
              "schedule_build_s": round(build_s, 3)}
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "mix.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("load_before", "load_after", "samples_per_s_median", "mixed_over_unmixed",
                                             "worker_cpu_ns_per_sample_median", "mixed_cpu_over_unmixed")}, indent=2))


if __name__ == "__main__":
    main()
