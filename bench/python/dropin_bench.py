"""The drop-ins' speed against the physical limit and against their peers.

    .venv/bin/python bench/python/dropin_bench.py        # writes bench/results/dropin.json

Workload (issue "drop-in fidelity", speed): a map-style dataset whose
``__getitem__`` returns ``(uint8 array 64x64x3, int)``, a fresh array per
sample, batch 256, 2 workers.
The physical limit is what 2 processes can produce: 2 x one process's rate of
``dataset[i]`` (measured here, in this run). Each front's steady rate (after
its first batch, persistent workers, so forking is out of the clock) is
reported as a fraction of that limit, beside torch's DataLoader on the same
dataset in the same run. The same samples from an IterableDataset (each worker
taking every 2nd, as ``get_worker_info()`` sharding does) run through
spindle.torch and torch, against 2 x one process's rate of ``next()`` over
the stream. Time to first batch (``iter()`` + first ``next()``,
fresh workers) compares spindle.torch with torch at 2 and 16 workers, and at
2 workers over ImageNet's 1,281,167 samples, in order and shuffled. Imports
are done before any clock starts. Rounds alternate the loaders; medians are
reported.

Beside the rates, CPU time per sample (the workers' from /proc, the consumer's
own) against one process's CPU time per ``dataset[i]``: on 2 cores shared with
other work the rates move with the load, the CPU time per sample much less; its
ratio is what a worker spends beyond ``dataset[i]`` (the copy into the slot,
the loader's own work).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch.utils.data

from machine import load_average, machine_info, write_results

SHAPE = (64, 64, 3)
BATCH = 256
IMAGENET_SAMPLES = 1_281_167  # ImageNet-1k train: where drawing an epoch's keys shows in the first batch


class Pairs:
    """(image, label): each sample a fresh array, as a decoding dataset returns
    (no decode cost, so the loader's own work is all there is to see)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full(SHAPE, i % 251, np.uint8), i


class PairStream(torch.utils.data.IterableDataset):
    """The same samples from an IterableDataset, each worker taking every N-th (torch's usual
    sharding by get_worker_info())."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, k = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(w, self.n, k):
            yield np.full(SHAPE, i % 251, np.uint8), i


def stream_rate(ds: PairStream, passes: int = 5) -> tuple[float, float]:
    """One process's rate of next() over the stream and its CPU seconds per sample, the best of `passes`."""
    best, cpu = 0.0, float("inf")
    for _ in range(passes):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in ds:
            pass
        best = max(best, ds.n / (time.perf_counter() - start))
        cpu = min(cpu, (time.process_time() - start_cpu) / ds.n)
    return best, cpu


def dataset_rate(ds: Pairs, passes: int = 5) -> tuple[float, float]:
    """One process's rate of dataset[i] (samples/s) and its CPU seconds per sample, the best of `passes` passes."""
    best, cpu = 0.0, float("inf")
    n = len(ds)
    for _ in range(passes):
        start, start_cpu = time.perf_counter(), time.process_time()
        for i in range(n):
            ds[i]
        best = max(best, n / (time.perf_counter() - start))
        cpu = min(cpu, (time.process_time() - start_cpu) / n)
    return best, cpu


def _cpu_seconds(pids: list[int]) -> float:
    """CPU time of these processes' threads so far, in ns resolution (/proc/<pid>/task/*/schedstat;
    /proc/<pid>/stat counts 10 ms ticks, too coarse for an epoch of a fast loader)."""
    total = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:  # a thread that just ended
                pass
    return total / 1e9


def _worker_pids(it) -> list[int]:
    pids = getattr(it, "worker_pids", None)
    return list(pids) if pids is not None else [w.pid for w in it._workers]


def steady_rate(loader) -> tuple[float, float, float]:
    """Samples/s of one epoch after its first batch, and the workers' and the consumer's
    CPU seconds per sample over the same stretch."""
    it = iter(loader)
    first = next(it)
    pids = _worker_pids(it)
    samples = 0
    workers_cpu, consumer_cpu = _cpu_seconds(pids), time.process_time()
    start = time.perf_counter()
    for batch in it:
        samples += len(batch[1])
    seconds = time.perf_counter() - start
    workers_cpu, consumer_cpu = _cpu_seconds(pids) - workers_cpu, time.process_time() - consumer_cpu
    del first
    return samples / seconds, workers_cpu / samples, consumer_cpu / samples


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

    load_at_start = load_average()
    ds = Pairs(args.samples)
    one, one_cpu = dataset_rate(ds)
    limit = 2 * one
    print(f"one process's rate of dataset[i]: {one:,.0f} samples/s ({one_cpu * 1e9:.0f} ns CPU each); "
          f"limit for 2 workers {limit:,.0f}", flush=True)
    stream = PairStream(args.samples)
    one_stream, one_stream_cpu = stream_rate(stream)
    print(f"one process's rate of next() over the stream: {one_stream:,.0f} samples/s "
          f"({one_stream_cpu * 1e9:.0f} ns CPU each); limit for 2 workers {2 * one_stream:,.0f}", flush=True)
    fronts = {
        "spindle.DataLoader": spindle.DataLoader(ds, BATCH, num_workers=2, persistent_workers=True),
        "spindle.torch.DataLoader": spindle.torch.DataLoader(ds, BATCH, num_workers=2, persistent_workers=True),
        "torch.utils.data.DataLoader": torch.utils.data.DataLoader(ds, BATCH, num_workers=2,
                                                                   persistent_workers=True),
        "spindle.torch.DataLoader (stream)": spindle.torch.DataLoader(stream, BATCH, num_workers=2,
                                                                      persistent_workers=True),
        "torch.utils.data.DataLoader (stream)": torch.utils.data.DataLoader(stream, BATCH, num_workers=2,
                                                                            persistent_workers=True),
    }
    rates: dict[str, list[float]] = {name: [] for name in fronts}
    cpu: dict[str, dict[str, list[float]]] = {name: {"workers": [], "consumer": []} for name in fronts}
    for name, loader in fronts.items():  # warm-up: forks the persistent workers
        steady_rate(loader)
    for r in range(args.rounds):
        for name, loader in fronts.items():
            gc.collect()
            rate, workers_cpu, consumer_cpu = steady_rate(loader)
            rates[name].append(rate)
            cpu[name]["workers"].append(workers_cpu)
            cpu[name]["consumer"].append(consumer_cpu)
        print(f"round {r}: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in rates.items()), flush=True)
    for loader in fronts.values():
        close = getattr(loader, "close", None)
        if close:
            close()

    ttfb: dict[str, dict[str, float]] = {}
    imagenet = Pairs(IMAGENET_SAMPLES)
    cases = {f"{w} workers": dict(dataset=ds, num_workers=w) for w in (2, 16)}
    # An epoch's keys are drawn at iter() (torch draws them as it goes): at ImageNet's size
    # that is what the first batch waits for.
    cases.update({f"2 workers, {IMAGENET_SAMPLES:,} samples{', shuffled' if shuffle else ''}":
                  dict(dataset=imagenet, num_workers=2, shuffle=shuffle) for shuffle in (False, True)})
    for case, kw in cases.items():
        makers = {
            "spindle.torch.DataLoader": lambda: spindle.torch.DataLoader(batch_size=BATCH, **kw),
            "torch.utils.data.DataLoader": lambda: torch.utils.data.DataLoader(batch_size=BATCH, **kw),
        }
        times: dict[str, list[float]] = {name: [] for name in makers}
        for _ in range(args.rounds):
            for name, make in makers.items():
                gc.collect()
                times[name].append(first_batch_seconds(make))
        ttfb[case] = {name: statistics.median(v) for name, v in times.items()}
        print(f"first batch, {case}: " +
              ", ".join(f"{n} {statistics.median(v) * 1e3:.0f} ms" for n, v in times.items()), flush=True)

    summary = {}
    for name, v in rates.items():
        workers_cpu = statistics.median(cpu[name]["workers"])
        consumer_cpu = statistics.median(cpu[name]["consumer"])
        streamed = name.endswith("(stream)")  # against its own limit and torch's loader of the same stream
        peer = "torch.utils.data.DataLoader" + (" (stream)" if streamed else "")
        summary[name] = {
            "median_samples_per_s": statistics.median(v),
            "fraction_of_limit": statistics.median(v) / (2 * one_stream if streamed else limit),
            "vs_torch": statistics.median(v) / statistics.median(rates[peer]),
            "worker_cpu_ns_per_sample": workers_cpu * 1e9, "consumer_cpu_ns_per_sample": consumer_cpu * 1e9,
            # dataset[i]'s share of all CPU time the loader spends per sample: the fraction of the
            # limit it would reach with its processes alone on the cores
            "dataset_share_of_cpu": (one_stream_cpu if streamed else one_cpu) / (workers_cpu + consumer_cpu)}
    for name, s in summary.items():
        print(f"{name:36} {s['median_samples_per_s']:12,.0f} samples/s  {100 * s['fraction_of_limit']:5.1f}% of the "
              f"2-worker limit  {s['vs_torch']:5.2f}x torch  CPU/sample: workers {s['worker_cpu_ns_per_sample']:5.0f} ns, "
              f"consumer {s['consumer_cpu_ns_per_sample']:4.0f} ns (the dataset's own share: "
              f"{100 * s['dataset_share_of_cpu']:.0f}%)", flush=True)
    load_at_end = load_average()
    print(f"load average: {load_at_start} at start, {load_at_end} at the end", flush=True)
    write_results(Path(args.out).stem, {"machine": machine_info(), "workload": f"(uint8 {SHAPE}, int), batch {BATCH}, 2 workers",
                             "one_process_rate": one, "one_process_cpu_ns_per_sample": one_cpu * 1e9,
                             "limit_2_workers": limit, "one_process_stream_rate": one_stream,
                             "one_process_stream_cpu_ns_per_sample": one_stream_cpu * 1e9,
                             "stream_limit_2_workers": 2 * one_stream, "rates": rates, "cpu_seconds_per_sample": cpu,
                             "summary": summary, "first_batch_seconds": ttfb,
                             "load_average": {"start": load_at_start, "end": load_at_end}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
