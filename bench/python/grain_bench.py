"""grain + JAX, the issue's seed scenario: grain's 16 workers against spindle.grain's.

The consumer imports JAX and runs a jitted step (a matmul over the batch,
then ``block_until_ready``) before the loader starts and after every batch,
so JAX's thread pools are live the whole time. The pipeline, the same
operations on the same records for every peer:

- data source: ``--records`` (8,192) records of 64x64x3 uint8 held in memory
  (``InMemoryImages``);
- ``Normalize`` (a ``grain.transforms.Map``): float32, (x / 255 - 0.5) * 4;
- ``RandomFlip`` (a ``grain.transforms.RandomMap``): flips horizontally when
  the per-record rng says so;
- ``grain.transforms.Batch(batch_size=64)``;
- a shuffled ``IndexSampler`` (``NoSharding``, ``num_epochs=1``, seed 7).

| peer | loader |
|---|---|
| ``grain-dl`` | ``grain.DataLoader(worker_count=16)`` |
| ``spindle-dl`` | ``spindle.grain.DataLoader(worker_count=16)``, same arguments |
| ``grain-mp`` | ``ds.mp_prefetch(MultiprocessingOptions(num_workers=16))``, the dataset-API form |
| ``spindle-mp`` | ``spindle.grain.mp_prefetch(ds, MultiprocessingOptions(num_workers=16))`` |

Each peer runs in its own fresh consumer process (``--child``), one after
the other, so no loader inherits another's leftovers: after its first epoch
grain leaves a thread pool (4 threads) in its consumer and multiprocessing's
resource tracker (a process with 1 thread) beside it, both counted in grain's
later epochs. In each consumer: one warm-up epoch, then ``--rounds`` measured
epochs. grain's warm-up batches are saved (in ``/dev/shm``) and spindle's
warm-up batches are compared with them, ``np.array_equal`` batch by batch.
The mp_prefetch pair is skipped when the DataLoader pair took longer than
``--skip-mp-prefetch-after`` seconds (on 2 CPUs the whole run takes about
2 minutes).

An epoch is timed from ``iter(loader)`` to the last batch, so it includes
starting the workers: grain spawns 16 interpreters on every ``iter``,
spindle forks 16 processes. The time to the first batch is reported on its
own, and "steady" is the rate after the first batch. Every epoch has its
own thread sampler: a thread of the consumer that, every
``SAMPLE_PERIOD_S``, adds up the threads of the consumer (less the sampler
itself) and of all its descendant processes.

Run from the repository root: ``.venv/bin/python bench/python/grain_bench.py``.
Writes bench/results/grain.json.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np
import grain
from absl import flags

from machine import ForeignCpu, load_average, machine_info, write_results

# grain's multiprocessing reads absl flags. This line also runs in grain's
# spawned workers, which import this file as __mp_main__: hence the __main__
# guard, and JAX and spindle imported in child_main() only, so grain's workers
# never load them. (A training script that imports JAX at the top of its main
# module makes each of grain's spawned workers import JAX too, about 0.6 s of
# CPU each; this benchmark leaves that out, in grain's favour.)
flags.FLAGS.mark_as_parsed()

NUM_WORKERS = 16
BATCH_SIZE = 64
SHAPE = (64, 64, 3)
SAMPLER_SEED = 7
SAMPLE_PERIOD_S = 0.005
EXIT_WAIT_S = 20.0      # how long an epoch's workers may take to exit before the next epoch
CHILD_TIMEOUT_S = 240   # one peer's whole run (warm-up + rounds)
LIFELONG_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
PAIRS = {"dataloader": ("grain-dl", "spindle-dl"), "mp_prefetch": ("grain-mp", "spindle-mp")}


class InMemoryImages:
    """`n` distinct 64x64x3 uint8 records of random bytes in one in-memory array.

    Pickles as its recipe (n, seed): grain's spawned workers each rebuild the
    array (about 20 ms for 96 MiB) instead of receiving it through a pipe;
    spindle's forked workers share the consumer's copy. A deep copy copies
    the array, as it would for any object that holds one.

    The array tiles one random block of a prime number of bytes, larger than
    a record: record i starts at offset i * 12288 mod P of it, so no two of
    the first P records are equal, and building it costs one copy instead of
    generating 96 MiB of random numbers in each of grain's 16 workers.
    """

    BLOCK_BYTES = 1_048_583  # a prime

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed = n, seed
        block = np.frombuffer(np.random.default_rng(seed).bytes(self.BLOCK_BYTES), np.uint8)
        self.data = np.resize(block, n * int(np.prod(SHAPE))).reshape((n,) + SHAPE)

    def __reduce__(self) -> tuple[Any, ...]:
        return InMemoryImages, (self.n, self.seed)

    def __deepcopy__(self, memo: dict[int, Any]) -> "InMemoryImages":
        other = object.__new__(InMemoryImages)
        other.n, other.seed, other.data = self.n, self.seed, self.data.copy()
        return other

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> np.ndarray:
        return self.data[index]


class Normalize(grain.transforms.Map):
    def map(self, x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32) * np.float32(1 / 255) - np.float32(0.5)) * np.float32(4.0)


class RandomFlip(grain.transforms.RandomMap):
    def random_map(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.ascontiguousarray(x[:, ::-1]) if rng.random() < 0.5 else x


def data_loader(cls: Any, source: InMemoryImages) -> Any:
    """`cls` is grain.DataLoader or spindle.grain.DataLoader; the same arguments for both."""
    sampler = grain.samplers.IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=SAMPLER_SEED)
    return cls(data_source=source, sampler=sampler,
               operations=[Normalize(), RandomFlip(), grain.transforms.Batch(batch_size=BATCH_SIZE)],
               worker_count=NUM_WORKERS)


def dataset_pipeline(source: InMemoryImages) -> Any:
    """The same operations in the dataset API: records shuffled, mapped one by one, then batched."""
    return (grain.MapDataset.source(source).shuffle(seed=SAMPLER_SEED).map(Normalize())
            .random_map(RandomFlip(), seed=SAMPLER_SEED).to_iter_dataset().batch(BATCH_SIZE))


def make_loader(peer: str, source: InMemoryImages) -> Iterable[Any]:
    options = grain.multiprocessing.MultiprocessingOptions(num_workers=NUM_WORKERS)
    if peer == "grain-dl":
        return data_loader(grain.DataLoader, source)
    if peer == "grain-mp":
        return dataset_pipeline(source).mp_prefetch(options)
    import spindle.grain

    if peer == "spindle-dl":
        return data_loader(spindle.grain.DataLoader, source)
    if peer == "spindle-mp":
        return spindle.grain.mp_prefetch(dataset_pipeline(source), options)
    raise ValueError(f"unknown peer {peer!r}; one of {[p for pair in PAIRS.values() for p in pair]}")


# ---- threads of the loader tree --------------------------------------------------------------

def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "?"


class TreeSampler:
    """Polls the loader tree from a thread of the consumer: the consumer's threads, less the sampler,
    plus the threads of every descendant process."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree
        self.me = tree.root
        self.at_start = set(tree.threads()) - {self.me}  # helpers left running by earlier epochs
        self.peak = self.peak_processes = self.consumer_peak = self.polls = 0
        self.worker_threads: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def sample(self) -> dict[int, int]:
        tree = self.tree.threads()
        consumer = tree.get(self.me, 1) - (1 if self._thread.is_alive() else 0)
        others = {pid: n for pid, n in tree.items() if pid != self.me}
        self.peak = max(self.peak, consumer + sum(others.values()))
        self.peak_processes = max(self.peak_processes, 1 + len(others))
        self.consumer_peak = max(self.consumer_peak, consumer)
        self.worker_threads.update(n for pid, n in others.items() if pid not in self.at_start)
        self.polls += 1
        return others

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(SAMPLE_PERIOD_S)

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def wait_for_exit(self, limit_s: float) -> tuple[float, dict[int, str]]:
        """Waits until the workers this epoch started are gone: (seconds waited, those still alive).
        Helpers that live as long as the consumer (multiprocessing's resource tracker) are not waited for;
        they stay in the tree, and in the count, for the next epochs."""
        t0 = time.perf_counter()
        while True:
            new = {pid: describe(pid) for pid in set(self.sample()) - self.at_start}
            workers = {pid: cmd for pid, cmd in new.items() if not any(h in cmd for h in LIFELONG_HELPERS)}
            if not workers or time.perf_counter() - t0 > limit_s:
                return time.perf_counter() - t0, workers
            time.sleep(0.02)


def consumer_threads() -> int:
    return len(os.listdir("/proc/self/task"))


# ---- one peer, in its own consumer process ---------------------------------------------------

def close_iterator(it: Any) -> None:
    # grain.DataLoader's iterator has no close(); the dataset iterator inside it has.
    for obj in (it, getattr(it, "_iterator", None)):
        close = getattr(obj, "close", None)
        if close is not None:
            close()


def run_epoch(peer: str, loader: Iterable[Any], train_step: Callable[[Any], None], tree: Any,
              records: int, save_dir: Optional[Path] = None, reference_dir: Optional[Path] = None) -> dict[str, Any]:
    """One pass over `loader`, a JAX step after every batch. `save_dir`: where to save the batches;
    `reference_dir`: saved batches to compare with, np.array_equal batch by batch."""
    gc.collect()
    references = sorted(reference_dir.glob("*.npy")) if reference_dir else []
    mismatched: list[int] = []
    samples = batches = 0
    before = consumer_threads()
    with ForeignCpu() as cpu, TreeSampler(tree) as sampler:
        t0 = time.perf_counter()
        it = iter(loader)
        t_first, batch = None, None
        for batch in it:
            if t_first is None:
                t_first = time.perf_counter()
            train_step(batch)
            if save_dir is not None:
                np.save(save_dir / f"{batches:06d}.npy", np.asarray(batch))
            if reference_dir is not None and not (
                    batches < len(references) and np.array_equal(np.load(references[batches]), batch)):
                mismatched.append(batches)
            samples += len(batch)
            batches += 1
        t_end = time.perf_counter()
        close_iterator(it)
        del it, batch
        gc.collect()
    exit_s, lingering = sampler.wait_for_exit(EXIT_WAIT_S)
    if samples != records:
        raise RuntimeError(f"{peer}: the epoch gave {samples} samples in {batches} batches, expected {records}")
    epoch_s, first_s = t_end - t0, (t_first or t_end) - t0
    out: dict[str, Any] = {
        "epoch_s": round(epoch_s, 4),
        "first_batch_s": round(first_s, 4),
        "samples_per_s": round(samples / epoch_s, 1),
        "steady_samples_per_s": round((samples - BATCH_SIZE) / (t_end - t_first), 1),
        "batches": batches,
        "consumer_threads_before": before,
        "consumer_threads_peak": sampler.consumer_peak,
        "peak_tree_threads": sampler.peak,
        "peak_tree_processes": sampler.peak_processes,
        "threads_per_worker_seen": sorted(sampler.worker_threads),
        "helpers_from_earlier_epochs": {pid: describe(pid) for pid in sampler.at_start},
        "sampler_polls": sampler.polls,
        "workers_exit_s": round(exit_s, 3),
        "cpu": cpu.summary(),
    }
    if lingering:
        out["still_alive_after_wait"] = lingering
    if reference_dir is not None:
        out["values_equal"] = not mismatched and batches == len(references)
        out["reference_batches"] = len(references)
        if mismatched:
            out["mismatched_batches"] = mismatched[:20]
    return out


def child_main(args: argparse.Namespace) -> int:
    """One peer in a fresh consumer: JAX live, a warm-up epoch, then the measured ones. Prints JSON."""
    import jax
    import jax.numpy as jnp

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # spindle.bench.tree: the one code path for a process tree (imported here, not at the top,
    # so grain's spawned workers, which re-import this module, do not load spindle).
    from spindle.bench.tree import ProcessTree

    tree = ProcessTree(os.getpid())
    threads_at_start = consumer_threads()

    @jax.jit
    def step(w: Any, batch: Any) -> Any:
        # A stand-in for a training step: a (64, 12288) @ (12288, 16) matmul, then a small update.
        logits = batch.reshape(batch.shape[0], -1) @ w
        return w - 1e-6 * jnp.mean(logits)

    state = {"w": jnp.full((int(np.prod(SHAPE)), 16), 1e-3, jnp.float32)}

    def train_step(batch: Any) -> None:
        state["w"] = step(state["w"], batch)
        state["w"].block_until_ready()

    for _ in range(3):  # JAX's thread pools are live before any loader exists
        train_step(np.zeros((BATCH_SIZE,) + SHAPE, np.float32))
    report: dict[str, Any] = {"peer": args.child, "consumer_threads_at_start": threads_at_start,
                              "consumer_threads_with_jax_live": consumer_threads()}
    source = InMemoryImages(args.records)
    loader = make_loader(args.child, source)
    saves = args.child.startswith("grain")
    ref = Path(args.reference_dir) if args.reference_dir else None
    report["warmup"] = run_epoch(args.child, loader, train_step, tree, args.records,
                                 save_dir=ref if saves else None, reference_dir=None if saves else ref)
    w = report["warmup"]
    log(f"  {args.child:10} warm-up: {w['epoch_s']:6.2f} s, first batch {w['first_batch_s']:.2f} s, "
        f"peak threads {w['peak_tree_threads']}" + ("" if saves else f", values equal: {w.get('values_equal')}"))
    report["epochs"] = []
    for r in range(args.rounds):
        e = run_epoch(args.child, loader, train_step, tree, args.records)
        report["epochs"].append(e)
        log(f"  {args.child:10} epoch {r + 1}: {e['epoch_s']:6.2f} s ({e['samples_per_s']:,.0f} samples/s), "
            f"first batch {e['first_batch_s']:.2f} s, peak threads {e['peak_tree_threads']}")
    print(json.dumps(report), flush=True)
    return 0


# ---- the parent: peers one after the other, side by side -------------------------------------

def run_peer(peer: str, args: argparse.Namespace, reference_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", peer, "--records", str(args.records),
           "--rounds", str(args.rounds), "--reference-dir", str(reference_dir)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=CHILD_TIMEOUT_S)
        out, err, rc = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        decode = (lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or ""))
        out, err, rc = decode(exc.stdout), decode(exc.stderr), None
    progress = [line for line in err.splitlines() if line.startswith("  ")]
    print("\n".join(progress), flush=True)
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            report = json.loads(line)
            break
    else:
        report = {"peer": peer, "error": f"no report (exit status {rc})", "stderr_tail": err[-3000:]}
        print(f"  {peer}: {report['error']}\n{err[-1500:]}", flush=True)
    report["process_wall_s"] = round(time.perf_counter() - t0, 1)
    warnings = [line for line in err.splitlines() if "Warning" in line or "warning" in line]
    if warnings:
        report["stderr_warnings"] = warnings[:10]
    return report


def summarize(peer: dict[str, Any]) -> dict[str, Any]:
    epochs = peer["epochs"]
    every = [peer["warmup"]] + epochs

    def med(key: str) -> float:
        return statistics.median(e[key] for e in epochs)

    return {
        "median_samples_per_s": round(med("samples_per_s"), 1),
        "median_steady_samples_per_s": round(med("steady_samples_per_s"), 1),
        "median_epoch_s": round(med("epoch_s"), 4),
        "median_first_batch_s": round(med("first_batch_s"), 4),
        "warmup_first_batch_s": peer["warmup"]["first_batch_s"],
        "peak_tree_threads": max(e["peak_tree_threads"] for e in every),
        "peak_tree_threads_per_epoch": [e["peak_tree_threads"] for e in every],
        "peak_tree_processes": max(e["peak_tree_processes"] for e in every),
        "consumer_threads_before_per_epoch": [e["consumer_threads_before"] for e in every],
        "consumer_threads_peak": max(e["consumer_threads_peak"] for e in every),
        "threads_per_worker_seen": sorted(set().union(*(e["threads_per_worker_seen"] for e in every))),
        "max_foreign_share_of_machine": max(e["cpu"]["foreign_share_of_machine"] for e in every),
    }


def ratios(spindle: dict[str, Any], grain_: dict[str, Any]) -> dict[str, float]:
    """spindle / grain for rates; grain / spindle for times and threads (so > 1 favours spindle)."""
    return {
        "samples_per_s_spindle_over_grain": round(spindle["median_samples_per_s"]
                                                  / grain_["median_samples_per_s"], 2),
        "steady_samples_per_s_spindle_over_grain": round(spindle["median_steady_samples_per_s"]
                                                         / grain_["median_steady_samples_per_s"], 2),
        "first_batch_grain_over_spindle": round(grain_["median_first_batch_s"]
                                                / spindle["median_first_batch_s"], 1),
        "peak_threads_grain_over_spindle": round(grain_["peak_tree_threads"] / spindle["peak_tree_threads"], 2),
    }


def print_table(results: dict[str, Any]) -> None:
    print()
    print(f"{'peer':10} {'consumer before':>15} {'peak threads':>12} {'processes':>9} {'per worker':>10} "
          f"{'samples/s':>9} {'steady':>8} {'epoch':>7} {'1st batch':>9} {'(warm-up)':>9}")
    for pair, names in PAIRS.items():
        for name in names:
            s = results.get(pair, {}).get(name, {}).get("summary")
            if s is None:
                continue
            before = sorted(set(s["consumer_threads_before_per_epoch"]))
            per_worker = s["threads_per_worker_seen"]
            per_worker = (f"{per_worker[0]}-{per_worker[-1]}" if len(per_worker) > 1
                          else ",".join(map(str, per_worker)))
            print(f"{name:10} {'-'.join(map(str, before[::len(before) - 1 or 1])):>15} "
                  f"{s['peak_tree_threads']:>12} {s['peak_tree_processes']:>9} {per_worker:>10} "
                  f"{s['median_samples_per_s']:>9,.0f} {s['median_steady_samples_per_s']:>8,.0f} "
                  f"{s['median_epoch_s']:>6.2f}s {s['median_first_batch_s']:>8.2f}s "
                  f"{s['warmup_first_batch_s']:>8.2f}s")
    print()
    for pair in PAIRS:
        r = results.get(pair, {}).get("ratios")
        if r:
            print(f"{pair:11} spindle/grain samples/s {r['samples_per_s_spindle_over_grain']:.2f}x "
                  f"(steady {r['steady_samples_per_s_spindle_over_grain']:.2f}x); grain/spindle: first batch "
                  f"{r['first_batch_grain_over_spindle']:.1f}x, peak threads "
                  f"{r['peak_threads_grain_over_spindle']:.2f}x; values equal: {results[pair]['values_equal']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3, help="measured epochs per peer, after one warm-up")
    parser.add_argument("--skip-mp-prefetch-after", type=float, default=110.0, metavar="S",
                        help="skip the mp_prefetch pair when the DataLoader pair took longer than S seconds")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--reference-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(args)

    t_start = time.perf_counter()
    info = machine_info()
    for name in ("grain", "jax", "jaxlib"):
        try:
            info[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    print(f"grain bench: {NUM_WORKERS} workers, {args.records} records of 64x64x3 uint8 -> float32, batch "
          f"{BATCH_SIZE}, 1 warm-up + {args.rounds} epochs per peer; {info['nproc']} cpus, grain {info['grain']}, "
          f"jax {info['jax']}", flush=True)
    results: dict[str, Any] = {}
    scratch = Path(tempfile.mkdtemp(prefix="spindle-grain-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm")
                                    else None))
    try:
        for pair, (grain_peer, spindle_peer) in PAIRS.items():
            elapsed = time.perf_counter() - t_start
            if pair != "dataloader" and elapsed > args.skip_mp_prefetch_after:
                print(f"{pair} pair skipped: {elapsed:.0f} s had passed (--skip-mp-prefetch-after "
                      f"{args.skip_mp_prefetch_after:.0f})", flush=True)
                results[pair] = {"skipped": f"{elapsed:.0f} s had passed"}
                continue
            print(f"{pair} pair", flush=True)
            reference = scratch / pair
            reference.mkdir()
            pair_result = {peer: run_peer(peer, args, reference) for peer in (grain_peer, spindle_peer)}
            shutil.rmtree(reference)
            if all("warmup" in pair_result[p] for p in (grain_peer, spindle_peer)):
                for peer in (grain_peer, spindle_peer):
                    pair_result[peer]["summary"] = summarize(pair_result[peer])
                pair_result["values_equal"] = pair_result[spindle_peer]["warmup"].get("values_equal")
                pair_result["ratios"] = ratios(pair_result[spindle_peer]["summary"],
                                               pair_result[grain_peer]["summary"])
            results[pair] = pair_result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print_table(results)
    path = write_results("grain", {
        "benchmark": "grain",
        "workload": {"records": args.records, "record_shape": list(SHAPE), "record_dtype": "uint8",
                     "element_dtype": "float32", "batch_size": BATCH_SIZE, "num_workers": NUM_WORKERS,
                     "operations": ["Map: float32, (x/255 - 0.5) * 4", "RandomMap: horizontal flip, p=0.5",
                                    "Batch(64)"],
                     "sampler": f"IndexSampler(shuffle=True, NoSharding, num_epochs=1, seed={SAMPLER_SEED})",
                     "consumer_step": "jax.jit (64, 12288) @ (12288, 16) matmul + update, block_until_ready, "
                                      "3 times before the loader and after every batch",
                     "warmup_epochs": 1, "measured_epochs": args.rounds, "sample_period_s": SAMPLE_PERIOD_S},
        "machine": info,
        "results": results,
        "load_average_at_end": load_average(),
        "wall_s": round(time.perf_counter() - t_start, 1),
    })
    print(f"\nwrote {path} ({time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
