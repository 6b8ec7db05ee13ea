"""What mixing costs (issue 19): spindle.mix over three sources vs the unmixed dataset, same loader, same run.

The arrays workload of ``spindle bench`` (in-memory 64x64x3 uint8 samples, ``dataset[i]`` a view of
row i and its label: transport-bound, so any per-sample cost of the mix shows): epochs of
spindle.DataLoader (batch 256, 2 workers) over ``ArraySamples(N)`` against epochs over
``spindle.mix([ArraySamples(w * N) for w in (0.5, 0.3, 0.2)], [0.5, 0.3, 0.2])``, whose length
(where its first source runs out) is about N; the unmixed dataset has exactly as many samples.

The loaders are made once (persistent workers, forked out of the clock) and take turns epoch by
epoch, so that a change of the machine's load hits all of them: a round is `--epochs` epochs of
each, one after the other, in the order A B C, then C B A the next round (no loader always runs
after the same other); each epoch is timed after its first batch, and an untimed epoch of each
comes first (it also touches the ring's slots for the first time: 0.15 minor faults a sample).
The result is the ratio of the medians of samples/s; beside it the median of the rounds' own
ratios, the ratio of the workers' CPU time per sample (/proc schedstat), which a busy machine
disturbs less, and the consumer's CPU time per sample (all its threads). The mix's schedule is
built once, before the timed epochs (it is built on first use: about 0.1 s per million elements).

In spindle's workers the mix is read through its RoutedDataset (``Mix.spindle_routed``): the C++
row reader looks up each element's source and index and calls the source's ``__getitem__``, with
no Python call of the mix's own, so what is left to measure is the mix's memory access (three
sources read side by side) and the reader's lookup. A third loader, over the same mix read through
``Mix.__getitem__`` (a subclass that hands no RoutedDataset: the path torch's own DataLoader takes,
and spindle's before the routed read), shows in the same run what the routing saves.

Run from the repository root: ``.venv/bin/python bench/python/mix_bench.py [--samples N] [--rounds R] [--epochs E]``.
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
MIXED, BY_GETITEM = "mix of 3 sources", "mix read by Mix.__getitem__"


class ByGetitem(spindle.Mix):
    """The same mix, read in the workers by a Python call of Mix.__getitem__ a sample."""

    def spindle_routed(self) -> None:
        return None


def one_round(loaders: dict, order: list[str], epochs: int) -> dict[str, tuple[float, float, float]]:
    """name -> (samples/s, the workers' and the consumer's CPU ns per sample) over `epochs` epochs of each
    loader, each after its first batch, the loaders taking turns epoch by epoch in `order`."""
    runs: dict[str, list] = {name: [] for name in order}
    for _ in range(epochs):
        for name in order:
            runs[name].append(steady_rate(loaders[name]))
    # every epoch has as many samples: a rate is the mean time a sample, inverted
    return {name: (1 / statistics.fmean(1 / rate for rate, _, _ in r), statistics.fmean(w for _, w, _ in r) * 1e9,
                   statistics.fmean(c for _, _, c in r) * 1e9) for name, r in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=65536)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=8, help="epochs of each loader a round")
    args = parser.parse_args()
    n = args.samples
    mixed = spindle.mix([ArraySamples(int(w * n) + 8) for w in WEIGHTS], WEIGHTS, seed=0)
    start = time.perf_counter()
    length = len(mixed)  # builds the schedule
    build_s = time.perf_counter() - start
    by_getitem = ByGetitem(mixed.datasets, WEIGHTS, seed=0)  # the same sources
    assert len(by_getitem) == length
    peers = {"unmixed": ArraySamples(length), MIXED: mixed, BY_GETITEM: by_getitem}  # as many samples each
    load_before = load_average()
    rates: dict[str, list[float]] = {name: [] for name in peers}
    cpu: dict[str, list[float]] = {name: [] for name in peers}
    consumer: dict[str, list[float]] = {name: [] for name in peers}
    # persistent: the workers are still there to read their CPU time when an epoch ends, and the
    # loaders wait (blocked, no CPU) while another takes its turn
    loaders = {name: spindle.DataLoader(dataset, batch_size=args.batch, num_workers=args.workers,
                                        persistent_workers=True) for name, dataset in peers.items()}
    try:
        for loader in loaders.values():
            steady_rate(loader)  # untimed: the first epoch also touches the ring's slots for the first time
        for r in range(args.rounds):
            order = list(peers) if r % 2 == 0 else list(peers)[::-1]  # A B C, then C B A
            for name, (rate, ns, consumer_ns) in one_round(loaders, order, args.epochs).items():
                rates[name].append(rate)
                cpu[name].append(ns)
                consumer[name].append(consumer_ns)
    finally:
        for loader in loaders.values():
            loader.close()
    load_after = load_average()
    medians = {name: round(statistics.median(r)) for name, r in rates.items()}
    cpu_medians = {name: round(statistics.median(c)) for name, c in cpu.items()}

    def over_unmixed(name: str) -> tuple[float, float, float]:
        """(ratio of the medians of samples/s, median of the rounds' ratios, ratio of the CPU medians)."""
        paired = statistics.median(m / u for m, u in zip(rates[name], rates["unmixed"]))
        return (round(medians[name] / medians["unmixed"], 4), round(paired, 4),
                round(cpu_medians[name] / cpu_medians["unmixed"], 4))

    mixed_ratio, mixed_paired, mixed_cpu = over_unmixed(MIXED)
    getitem_ratio, getitem_paired, getitem_cpu = over_unmixed(BY_GETITEM)
    result = {"machine": machine_info(), "load_before": load_before, "load_after": load_after,
              "samples": length, "rounds": args.rounds, "epochs_a_round": args.epochs, "workers": args.workers,
              "batch": args.batch, "weights": WEIGHTS, "samples_per_s_median": medians,
              "samples_per_s_rounds": {k: [round(x) for x in v] for k, v in rates.items()},
              "mixed_over_unmixed": mixed_ratio, "mixed_over_unmixed_rounds_median": mixed_paired,
              "by_getitem_over_unmixed": getitem_ratio, "by_getitem_over_unmixed_rounds_median": getitem_paired,
              "worker_cpu_ns_per_sample_median": cpu_medians,
              "worker_cpu_ns_per_sample_rounds": {k: [round(x) for x in v] for k, v in cpu.items()},
              "mixed_cpu_over_unmixed": mixed_cpu, "by_getitem_cpu_over_unmixed": getitem_cpu,
              "consumer_cpu_ns_per_sample_median": {name: round(statistics.median(c)) for name, c in consumer.items()},
              "schedule_build_s": round(build_s, 3)}
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "mix.json").write_text(json.dumps(result, indent=2) + "\n")
    shown = ("load_before", "load_after", "samples_per_s_median", "mixed_over_unmixed",
             "mixed_over_unmixed_rounds_median", "by_getitem_over_unmixed", "by_getitem_over_unmixed_rounds_median",
             "worker_cpu_ns_per_sample_median", "mixed_cpu_over_unmixed", "by_getitem_cpu_over_unmixed",
             "consumer_cpu_ns_per_sample_median")
    print(json.dumps({k: result[k] for k in shown}, indent=2))


if __name__ == "__main__":
    main()
