"""Does num_workers="auto" find the best worker count? (issue 32, part 1)

    python bench/python/auto_workers_bench.py            # writes bench/results/auto_workers.json
    python bench/python/auto_workers_bench.py --quick    # tiny sizes, one round: a smoke test

One run, one process, side by side: for each workload, ``num_workers="auto"``
against fixed ``num_workers`` in {1, 2, 4, 8, 16}. Every epoch is a fresh
runtime (no persistent workers), so auto starts from one process each time and
its ramp-up is inside the clock, as a fixed setting's forks are. After each
auto epoch, its loader runs a second epoch ("next epoch"): a loader starts its
next epoch on the processes its last one ended on, so this is what the epochs
of a training run after the first cost. Rounds
alternate the loaders (the order of the settings rotates each round); medians
over the rounds are reported. Before the rounds, one unrecorded epoch of each
workload at the largest fixed count warms what every setting shares (the page
cache, the HTTP server, the decoders); without it round 0's first setting paid
for them. Imports, the image folder and the HTTP server
are set up before any clock starts.

Per epoch: samples/s over the whole epoch (``iter()`` to the last batch), over
its first 10% (``iter()`` to the batch that passes 10% of the samples) and over
the rest after it; for auto, when its last change came (a share of the epoch:
the issue asks it to have found its setting within the first 10%);
the peak task count (threads) of the loader's process tree (the consumer and
its children, from /proc every 50 ms, less the sampling thread and less the
HTTP server's process); for auto, ``stats()["processes"]`` at the last batch
(what it settled on), the most processes it ran and every change (the INFO
lines of logger "spindle", with their times in the epoch).

Workloads:

* ``arrays``: transport-bound; spindle.DataLoader over in-memory 224x224x3
  uint8 samples (sample i views row i mod 256 of one array), batch 64.
* ``jpeg-pil``: Python-heavy; spindle.DataLoader over
  spindle.bench.workloads.PilJpegFolder (PIL decode + RandomResizedCrop(224) +
  flip), batch 64, shuffled.
* ``jpeg-native``: spindle.PipelineLoader(mode="processes") over
  image_folder().decode().random_resized_crop(224).random_flip().batch(64),
  shuffled; the same folder.
* ``http-latency``: I/O-bound; spindle.DataLoader whose ``__getitem__`` GETs
  its sample (64x64x3 uint8) from a local HTTP server (127.0.0.1, another
  process, keep-alive) that sleeps 20 ms per request, batch 16 (one worker
  takes ~1.3 s for 64 samples at 20 ms each: an epoch of a few seconds would
  be a handful of batches).
* ``wds-http``: the issue's WebDataset shards over local HTTP: a PipelineLoader
  (mode="processes") over ``--wds`` samples in shards of WDS_PER_SHARD small
  JPEGs (64x64, q90, with .cls) that the same server sends after sleeping
  20 ms per request, ``.decode().center_crop(56).random_flip().batch(16)``: a stream, so
  "auto" keeps ``spindle.auto_workers()`` logical workers (its batches are
  those of that fixed count) and starts them again on the processes the
  controller advises, each from the shard and sample its last batch left it at.
* ``grain-http``: the same HTTP samples through spindle.grain.DataLoader
  (records in order, grain's Batch(16)): streams, one per worker, so "auto"
  keeps ``spindle.grain.auto_workers()`` logical workers (their elements
  are those of that fixed count) and restarts them on more processes from
  their states when the controller advises it.

The image folder: ``make_image_folder`` writes ``--images`` distinct JPEGs
(q90, 300-500 px); the folder read is that many hard links repeated to
``--folder`` files, so an epoch is long enough without generating them all.

``--pair``: two consumer processes, each running ``num_workers="auto"`` on
jpeg-pil (one long epoch), the second started ``--pair-gap`` seconds after the
first; each one's samples/s per second and its processes over time.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from machine import ForeignCpu, load_average, machine_info, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the docs' number format
from report_docs import rate  # noqa: E402

SETTINGS: list[Any] = ["auto", 1, 2, 4, 8, 16]
BATCH = 64
IO_BATCH = 16
IO_SHAPE = (64, 64, 3)
LATENCY_S = 0.020
FULL = dict(rounds=3, arrays=196608, images=400, folder=4608, http=3072, wds=12288)
QUICK = dict(rounds=1, arrays=2048, images=64, folder=256, http=128, wds=512)
WDS_PER_SHARD = 8
RESIZED = re.compile(r"(\d+) -> (\d+) worker processes")


# --- the HTTP server (its own process: its threads are not the loader's) -----------------------

def serve(latency_s: float, shards: Path) -> None:
    """Serves /sample/<i>: 64x64x3 uint8 bytes filled with i % 251, and /shard/<name>: that file of
    `shards`, each after sleeping `latency_s`. Prints its port on stdout, then serves until stdin closes."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: one connection per worker process
        disable_nagle_algorithm = True  # else the body, sent after the headers, waits for a delayed ACK (40 ms)

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            kind, name = self.path.split("/")[1:3]
            time.sleep(latency_s)
            if kind == "shard":
                body = (shards / name).read_bytes()
            else:
                i = int(name)
                body = bytes([i % 251]) * int(np.prod(IO_SHAPE))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        # socketserver listens with a backlog of 5: 16 workers connecting at once had their SYNs
        # dropped and retried a second later (fixed 8's 8th element at 1.4 s instead of 0.4 s).
        request_queue_size = 128

        def handle_error(self, request: Any, client_address: Any) -> None:
            # A client gone mid-request is expected: grain's "auto" stops its old workers at once.
            if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                super().handle_error(request, client_address)

    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(httpd.server_address[1], flush=True)
    sys.stdin.read()  # the parent closes it (or dies)
    httpd.shutdown()


_conn: dict[int, http.client.HTTPConnection] = {}


class HttpSamples:
    """Sample i is GET http://127.0.0.1:<port>/sample/i (a 20 ms wait on the server), label i.
    One keep-alive connection per process (a forked worker opens its own)."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        pid = os.getpid()
        for attempt in range(3):
            conn = _conn.get(pid)
            if conn is None:
                conn = _conn[pid] = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                conn.request("GET", f"/sample/{i}")
                resp = conn.getresponse()
                data = resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"sample {i}: HTTP {resp.status} from 127.0.0.1:{self.port}")
                return np.frombuffer(data, np.uint8).reshape(IO_SHAPE), int(i)
            except (http.client.HTTPException, OSError):
                conn.close()
                del _conn[pid]
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


class GrainLoader:
    """spindle.grain.DataLoader over HttpSamples' records in order, grain's Batch(IO_BATCH): a stream per
    worker (worker w reads records w, w + N, ...), so "auto" keeps auto_workers() logical workers
    and moves the processes under them. len() and stats() for run_epoch."""

    def __init__(self, source: HttpSamples, workers: Any) -> None:
        import grain
        import spindle.grain as sgrain
        from absl import flags

        flags.FLAGS.mark_as_parsed()  # grain reads absl flags
        self.n = len(source)
        sampler = grain.samplers.IndexSampler(num_records=self.n, shard_options=grain.sharding.NoSharding(),
                                              shuffle=False, num_epochs=1, seed=0)
        self.loader = sgrain.DataLoader(data_source=source, sampler=sampler, worker_count=workers,
                                        operations=[grain.transforms.Batch(IO_BATCH, drop_remainder=False)])

    def __len__(self) -> int:
        return -(-self.n // IO_BATCH)

    def __iter__(self) -> Any:
        return iter(self.loader)

    def stats(self) -> dict[str, Any]:
        return self.loader.stats()


class Arrays:
    """`n` samples of 224x224x3 uint8; sample i views row i mod `rows` of one in-memory array
    (the worker copies it into the batch: transport is all the work)."""

    def __init__(self, n: int, rows: int = 256) -> None:
        self.n = n
        self.data = np.empty((rows, 224, 224, 3), np.uint8)
        self.data[:] = (np.arange(rows) % 251).astype(np.uint8)[:, None, None, None]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.data[i % len(self.data)], int(i)


def linked_folder(base: Path, root: Path, files: int) -> Path:
    """`files` hard links, in ImageNet layout, cycling over the JPEGs of `base` (made once)."""
    marker = root / f".complete-{files}"
    if marker.exists():
        return root
    from spindle.bench.workloads import folder_samples

    sources = folder_samples(base)
    root.mkdir(parents=True, exist_ok=True)
    for k in range(files):
        path, label = sources[k % len(sources)]
        cls = root / f"class{label:02d}"
        cls.mkdir(exist_ok=True)
        dst = cls / f"{k:06d}.jpg"
        if not dst.exists():
            os.link(path, dst)
    marker.touch()
    return root


def make_shards(root: Path, samples: int) -> Path:
    """`samples` small JPEGs (64x64, q90, smooth patterns plus noise) with .cls labels, in WebDataset
    shards of WDS_PER_SHARD, written once (a marker says the folder is complete)."""
    import io as bytes_io
    import tarfile

    from PIL import Image

    marker = root / f".complete-{samples}"
    if marker.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:64, 0:64].astype(np.float32)
    for s in range(-(-samples // WDS_PER_SHARD)):
        with tarfile.open(root / f"shard-{s:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(s * WDS_PER_SHARD, min(samples, (s + 1) * WDS_PER_SHARD)):
                base = np.stack([np.sin(x / rng.uniform(3, 20)), np.cos(y / rng.uniform(3, 20)),
                                 np.sin((x + y) / rng.uniform(3, 20))], -1)
                img = ((base + 1) * 100 + rng.normal(0, 12, (64, 64, 3))).clip(0, 255).astype(np.uint8)
                jpeg = bytes_io.BytesIO()
                Image.fromarray(img).save(jpeg, format="JPEG", quality=90)
                for name, data in ((f"{k:07d}.jpg", jpeg.getvalue()), (f"{k:07d}.cls", str(k % 10).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, bytes_io.BytesIO(data))
    marker.touch()
    return root


class WdsLoader:
    """spindle.PipelineLoader(mode="processes") over the shards, each a GET to the server: a stream
    (len() is its batches: every logical worker's shards hold whole batches). stats() for run_epoch."""

    def __init__(self, port: int, shards: Path, samples: int, workers: Any) -> None:
        import spindle
        from spindle import pipeline as sp

        names = sorted(p.name for p in shards.glob("shard-*.tar"))
        urls = [f"http://127.0.0.1:{port}/shard/{n}" for n in names]
        self.batches = samples // IO_BATCH
        pipe = sp.webdataset(urls).decode().center_crop(56).random_flip().batch(IO_BATCH)
        self.loader = spindle.PipelineLoader(pipe, num_workers=workers, mode="processes", seed=0)

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Any:
        return iter(self.loader)

    def stats(self) -> dict[str, Any]:
        return self.loader.stats()


# --- measuring one epoch -------------------------------------------------------------------

class ResizeLog(logging.Handler):
    """Keeps logger "spindle"'s process-count changes (time, before, after, line)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[float, int, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        m = RESIZED.search(msg)
        if m:
            self.lines.append((time.perf_counter(), int(m.group(1)), int(m.group(2)), msg))


def peak_threads_sampler(exclude: set[int]):
    """A Poller keeping the peak task count of this process's tree, less `exclude` (and their children)."""
    from spindle.bench.tree import Poller, ProcessTree

    class PeakThreads(Poller):
        def __init__(self) -> None:
            super().__init__(0.05, name="auto-bench-threads")
            self.tree = ProcessTree(os.getpid())
            self.peak = 0

        def poll(self) -> None:
            stats = self.tree.stats()
            skip = set(exclude)
            for pid, st in stats.items():  # children of excluded ones too (listed after their parents)
                if st.ppid in skip:
                    skip.add(pid)
            self.peak = max(self.peak, sum(st.threads for pid, st in stats.items() if pid not in skip) - 1)

    return PeakThreads()


def batch_len(batch: Any) -> int:
    return len(batch["label"] if isinstance(batch, dict) else batch[1])


def run_epoch(loader: Any, samples: int, log: ResizeLog, exclude: set[int]) -> dict[str, Any]:
    """One epoch from iter() to its last batch: rates, peak threads, auto's processes."""
    gc.collect()
    log.lines.clear()
    batches = len(loader)
    got, k, first10_s, settled = 0, 0, None, None
    with peak_threads_sampler(exclude) as sampler:
        start = time.perf_counter()
        it = iter(loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            got += batch_len(batch)
            k += 1
            del batch
            if first10_s is None and got >= 0.1 * samples:
                first10_s = time.perf_counter() - start
                first10_n = got
            if k == batches:  # the last batch: the runtime is still there
                settled = loader.stats().get("processes")
        seconds = time.perf_counter() - start
        del it
    assert got == samples, f"{got} samples, expected {samples}"
    changes = [(round(t - start, 3), a, b) for t, a, b, _ in log.lines]
    last_change = changes[-1][0] if changes else 0.0
    out = {"seconds": seconds, "samples_per_s": got / seconds,
           "first10_samples_per_s": first10_n / first10_s, "first10_s": first10_s,
           "rest90_samples_per_s": (got - first10_n) / (seconds - first10_s),
           "settled_share": last_change / seconds,
           "peak_threads": sampler.peak, "processes_at_end": settled,
           "max_processes_run": max([settled or 1] + [max(a, b) for _, a, b in changes])}
    if changes:
        out["changes"] = changes
        out["reasons"] = [line for _, _, _, line in log.lines]
    return out


# --- the workloads -----------------------------------------------------------------------

def workloads(args: argparse.Namespace, folder: Path, shards: Path, port: int) -> dict[str, dict[str, Any]]:
    import spindle
    from spindle import pipeline as sp
    from spindle.bench.workloads import PilJpegFolder

    arrays = Arrays(args.arrays)
    pil = PilJpegFolder(folder)
    io = HttpSamples(port, args.http)

    def native(w: Any) -> Any:
        pipe = sp.image_folder(folder).decode().random_resized_crop(224).random_flip().batch(BATCH)
        return spindle.PipelineLoader(pipe, num_workers=w, mode="processes", shuffle=True, seed=0)

    return {
        "arrays": dict(samples=len(arrays), make=lambda w: spindle.DataLoader(arrays, BATCH, num_workers=w),
                       description=f"spindle.DataLoader, {len(arrays):,} in-memory 224x224x3 uint8 samples "
                                   f"(views of 256 rows), batch {BATCH}"),
        "jpeg-pil": dict(samples=len(pil), make=lambda w: spindle.DataLoader(pil, BATCH, shuffle=True, seed=0,
                                                                             num_workers=w),
                         description=f"spindle.DataLoader over PilJpegFolder ({len(pil):,} JPEGs, PIL decode + "
                                     f"RandomResizedCrop(224) + flip), batch {BATCH}, shuffled"),
        "jpeg-native": dict(samples=len(pil), make=native,
                            description=f"spindle.PipelineLoader(mode='processes'): image_folder ({len(pil):,} "
                                        f"JPEGs).decode().random_resized_crop(224).random_flip(), batch {BATCH}, "
                                        "shuffled"),
        "http-latency": dict(samples=len(io), make=lambda w: spindle.DataLoader(io, IO_BATCH, num_workers=w),
                             description=f"spindle.DataLoader, each of {len(io):,} samples (64x64x3 uint8) a GET "
                                         f"to a local HTTP server that sleeps {LATENCY_S * 1e3:.0f} ms per request, "
                                         f"batch {IO_BATCH}"),
        "grain-http": dict(samples=len(io), make=lambda w: GrainLoader(io, w),
                           description=f"spindle.grain.DataLoader over the same {len(io):,} HTTP samples in order, "
                                       f"grain's Batch({IO_BATCH}): streams, auto_workers() logical workers"),
        "wds-http": dict(samples=args.wds, make=lambda w: WdsLoader(port, shards, args.wds, w),
                         description=f"spindle.PipelineLoader(mode='processes') over {args.wds:,} 64x64 JPEGs in "
                                     f"WebDataset shards of {WDS_PER_SHARD}, each shard a GET to the local HTTP "
                                     f"server (sleeps {LATENCY_S * 1e3:.0f} ms per request), "
                                     f".decode().center_crop(56).random_flip(), batch {IO_BATCH}: streams, "
                                     "auto_workers() logical workers"),
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per setting; auto against the fixed setting with the best median."""
    med = {s: {key: statistics.median(r[key] for r in rs)
               for key in ("samples_per_s", "first10_samples_per_s", "rest90_samples_per_s", "peak_threads",
                           "seconds")}
           for s, rs in runs.items()}
    fixed = {s: m for s, m in med.items() if s != "auto"}
    if "auto" not in med or not fixed:
        return {"median": med}
    best = max(fixed, key=lambda s: fixed[s]["samples_per_s"])
    best10 = max(fixed, key=lambda s: fixed[s]["first10_samples_per_s"])
    auto = med["auto"]
    settled = [r["processes_at_end"] for r in runs["auto"]]
    nexts = [r["next_epoch"] for r in runs["auto"] if "next_epoch" in r]
    return {"median": med, "best_fixed": best, "best_fixed_first10": best10,
            "auto_over_best": auto["samples_per_s"] / fixed[best]["samples_per_s"],
            "auto_over_best_first10": auto["first10_samples_per_s"] / fixed[best10]["first10_samples_per_s"],
            "auto_over_best_rest90": auto["rest90_samples_per_s"] / fixed[best]["rest90_samples_per_s"],
            "auto_settled_share": max(r["settled_share"] for r in runs["auto"]),
            "auto_threads": auto["peak_threads"], "best_threads": fixed[best]["peak_threads"],
            "auto_threads_le_best": auto["peak_threads"] <= fixed[best]["peak_threads"],
            "auto_processes_at_end": settled,
            "auto_max_processes_run": [r.get("max_processes_run", 1) for r in runs["auto"]],
            **({"auto_next_epoch_over_best": statistics.median(n["samples_per_s"] for n in nexts)
                / fixed[best]["samples_per_s"],
                "auto_next_epoch_changes": [n.get("changes", []) for n in nexts]} if nexts else {})}


# --- two loaders, one node -------------------------------------------------------------------

def consumer(args: argparse.Namespace) -> None:
    """One consumer of --pair: jpeg-pil with num_workers="auto" for --seconds, one long epoch;
    prints RESULT {batch times, sample counts, process changes, peak threads}."""
    import spindle
    from spindle.bench.workloads import PilJpegFolder

    log = ResizeLog()
    logging.getLogger("spindle").addHandler(log)
    logging.getLogger("spindle").setLevel(logging.INFO)
    pil = PilJpegFolder(args.image_root)

    class Cycle:
        def __len__(self) -> int:
            return 100 * len(pil)

        def __getitem__(self, i: int) -> Any:
            return pil[i % len(pil)]

    loader = spindle.DataLoader(Cycle(), BATCH, shuffle=True, seed=0, num_workers="auto")
    t0 = time.time()
    times: list[float] = []
    with peak_threads_sampler(set()) as sampler:
        it = iter(loader)
        for batch in it:
            times.append(round(time.time() - t0, 3))
            del batch
            if time.time() - t0 >= args.seconds:
                break
        processes = loader.stats().get("processes")
        del it
    offset = time.time() - time.perf_counter()
    print("RESULT " + json.dumps({"start": t0, "batch_times": times, "batch": BATCH, "processes_at_end": processes,
                                  "peak_threads": sampler.peak,
                                  "changes": [(round(t + offset - t0, 3), a, b) for t, a, b, _ in log.lines],
                                  "reasons": [line for *_, line in log.lines]}), flush=True)


def pair(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Two consumers (consumer()), the second started args.pair_gap s after the first, each running
    args.pair_seconds; per-second rates on one clock (the first one's start)."""
    cmd = [sys.executable, __file__, "--consumer", "--image-root", str(folder), "--seconds", str(args.pair_seconds)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    time.sleep(args.pair_gap)
    second = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = {}
    for name, proc in (("first", first), ("second", second)):
        stdout, _ = proc.communicate(timeout=args.pair_seconds * 3 + 120)
        line = next((l for l in stdout.splitlines() if l.startswith("RESULT ")), None)
        out[name] = json.loads(line[len("RESULT "):]) if line else {"failed": f"exit {proc.returncode}"}
    if "failed" in out["first"] or "failed" in out["second"]:
        return out
    t0 = out["first"]["start"]
    horizon = int(max(out[n]["start"] - t0 + out[n]["batch_times"][-1] for n in out)) + 1
    for name in out:
        r = out[name]
        shift = r["start"] - t0
        per_s = [0] * horizon
        for t in r["batch_times"]:
            per_s[int(t + shift)] += r["batch"]
        r["samples_per_s_by_second"] = per_s
        r["started_at_s"] = round(shift, 2)
        r["changes_on_first_clock"] = [(round(t + shift, 2), a, b) for t, a, b in r["changes"]]
        del r["batch_times"]
    gap, end_first = out["second"]["started_at_s"], args.pair_seconds

    def window(name: str, lo: float, hi: float) -> float:
        per_s = out[name]["samples_per_s_by_second"]
        lo_i, hi_i = int(lo) + 1, int(hi)  # whole seconds only, inside the window
        return statistics.mean(per_s[lo_i:hi_i]) if hi_i > lo_i else float("nan")

    out["windows"] = {
        "first alone": {"first": window("first", 0, gap)},
        "both": {"first": window("first", gap + 2, end_first), "second": window("second", gap + 2, end_first)},
        "second alone": {"second": window("second", end_first + 1, horizon - 1)},
    }
    return out


# --- the tables of docs/benchmarks.md ---------------------------------------------------------



def markdown(d: dict[str, Any]) -> str:
    """The tables of the page's section, from a results file (``--table``)."""
    fixed = [s for s in d["settings"] if s != "auto"]
    head = (["workload", "auto"] + [f"{s}" for s in fixed]
            + ["auto / best", "first 10%: auto / best", "after it: auto / best", "next epoch: auto / best",
               "last change at",
               "threads: auto / best", "auto's processes at the end"])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for name, s in d["summary"].items():
        med = s["median"]
        cells = [name, rate(med["auto"]["samples_per_s"])]
        cells += [f"**{rate(med[f]['samples_per_s'])}**" if f == s["best_fixed"] else rate(med[f]["samples_per_s"])
                  for f in fixed]
        cells += [f"{s['auto_over_best']:.3f}x",  # three digits: 0.948 is not 0.95
                  f"{s['auto_over_best_first10']:.3f}x (best: {s['best_fixed_first10']})",
                  f"{s['auto_over_best_rest90']:.3f}x" if "auto_over_best_rest90" in s else "—",
                  f"{s['auto_next_epoch_over_best']:.3f}x" if "auto_next_epoch_over_best" in s else "—",
                  f"{100 * s['auto_settled_share']:.0f}% of the epoch" if "auto_settled_share" in s else "—",
                  f"{s['auto_threads']:.0f} / {s['best_threads']:.0f}",
                  ", ".join(map(str, s["auto_processes_at_end"]))]
        lines.append("| " + " | ".join(cells) + " |")
    out = "\n".join(lines)
    p = d.get("pair")
    if p and "windows" in p:
        w = p["windows"]
        rows = [["first alone", rate(w["first alone"]["first"]), "—"],
                ["both", rate(w["both"]["first"]), rate(w["both"]["second"])],
                ["second alone", "—", rate(w["second alone"]["second"])]]
        out += ("\n\n| two consumers, jpeg-pil, auto | first | second |\n|---|---|---|\n"
                + "\n".join("| " + " | ".join(r) + " |" for r in rows))
        steps = {n: ", ".join(f"{a}→{b} at {t:.1f} s" for t, a, b in p[n]["changes_on_first_clock"])
                 for n in ("first", "second")}
        out += "\n\nProcesses: " + "; ".join(f"{n} {v or '1 throughout'}" for n, v in steps.items())
    return out


# --- the run ---------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round (a smoke test)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; --quick 1)")
    parser.add_argument("--arrays", type=int, help="samples of the arrays workload (default 196608)")
    parser.add_argument("--images", type=int, help="distinct JPEGs generated (default 400)")
    parser.add_argument("--folder", type=int, help="files of the image folder read, hard links (default 4608)")
    parser.add_argument("--http", type=int, help="samples of the http-latency and grain-http workloads (default 3072)")
    parser.add_argument("--wds", type=int, help="samples of the wds-http workload (default 12288)")
    parser.add_argument("--workloads", default="arrays,jpeg-pil,jpeg-native,http-latency,wds-http,grain-http")
    parser.add_argument("--settings", default=",".join(map(str, SETTINGS)))
    parser.add_argument("--no-pair", action="store_true", help="skip the two-consumer scenario")
    parser.add_argument("--pair-seconds", type=float, default=30.0)
    parser.add_argument("--pair-gap", type=float, default=10.0)
    parser.add_argument("--root", default="/tmp/spindle-auto-bench", help="where the image folders are kept")
    parser.add_argument("--out", default="auto_workers", help="name of the results file in bench/results/")
    parser.add_argument("--table", action="store_true", help="print the docs' tables from the results file and exit")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--consumer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--image-root", help=argparse.SUPPRESS)
    parser.add_argument("--shards", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=30.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.table:
        from machine import RESULTS_DIR

        print(markdown(json.loads((RESULTS_DIR / f"{Path(args.out).stem}.json").read_text())))
        return 0
    if args.serve:
        serve(LATENCY_S, Path(args.shards))
        return 0
    if args.consumer:
        consumer(args)
        return 0
    sizes = QUICK if args.quick else FULL
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.pair_seconds, args.pair_gap = 8.0, 3.0
        if args.out == "auto_workers":
            args.out = "auto_workers-quick"  # never the committed results
    files = args.folder
    settings = [s if s == "auto" else int(s) for s in args.settings.split(",")]
    names = args.workloads.split(",")

    import spindle  # imports before any clock
    import spindle.pipeline  # noqa: F401
    from spindle.bench.workloads import make_image_folder

    uptime_start = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    load_at_start = load_average()
    print(f"spindle {spindle.__version__} from {spindle.__file__}; {uptime_start}", flush=True)
    root = Path(args.root)
    base = make_image_folder(root / f"base-{args.images}", args.images)
    folder = linked_folder(base, root / f"linked-{args.images}-{files}", files)
    # Every (logical) worker's shards hold whole batches, for each count run: len() is then samples / batch.
    counts = [spindle.auto_workers()] + [s for s in settings if s != "auto"]
    unit = WDS_PER_SHARD * (IO_BATCH // math.gcd(IO_BATCH, WDS_PER_SHARD)) * math.lcm(*counts)
    if "wds-http" in names and args.wds % unit:
        parser.error(f"--wds must be a multiple of {unit}: every worker's shards then hold whole batches")
    shards = make_shards(root / f"wds-{args.wds}", args.wds)

    server = subprocess.Popen([sys.executable, __file__, "--serve", "--shards", str(shards)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    log = ResizeLog()
    logging.getLogger("spindle").addHandler(log)
    logging.getLogger("spindle").setLevel(logging.INFO)
    works = {n: w for n, w in workloads(args, folder, shards, port).items() if n in names}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {str(s): [] for s in settings} for n in works}
    try:
        with ForeignCpu() as foreign:
            # One epoch of each workload before any is recorded, at the largest fixed count: the first
            # epoch of a workload pays for cold caches (the page cache of its files, the server's
            # first connections, the decoders' first use) whatever setting runs it, and round 0 would
            # charge that to the setting that happens to go first.
            warm = max((s for s in settings if s != "auto"), default="auto")
            for name, w in works.items():
                res = run_epoch(w["make"](warm), w["samples"], log, {server.pid})
                print(f"warm-up  {name:12} {str(warm):>4}: {res['seconds']:5.1f} s (not recorded)", flush=True)
            for r in range(args.rounds):
                order = settings[r % len(settings):] + settings[:r % len(settings)]  # alternate who goes first
                for name, w in works.items():
                    for s in order:
                        loader = w["make"](s)
                        res = run_epoch(loader, w["samples"], log, {server.pid})
                        if s == "auto":  # its next epoch, on the same loader: where the first one ended
                            res["next_epoch"] = run_epoch(loader, w["samples"], log, {server.pid})
                        del loader
                        runs[name][str(s)].append(res)
                        extra = (f", processes {res['processes_at_end']} at the end (at most "
                                 f"{res.get('max_processes_run', 1)}); next epoch "
                                 f"{res['next_epoch']['samples_per_s']:9,.0f} samples/s" if s == "auto" else "")
                        print(f"round {r} {name:12} {str(s):>4}: {res['samples_per_s']:9,.0f} samples/s "
                              f"(first 10%: {res['first10_samples_per_s']:9,.0f}), {res['seconds']:5.1f} s, "
                              f"{res['peak_threads']:3} threads{extra}", flush=True)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    summary = {n: summarize(rs) for n, rs in runs.items()}
    for n, s in summary.items():
        if "auto_over_best" not in s:
            continue
        print(f"{n:12}: auto {s['median']['auto']['samples_per_s']:,.0f}/s vs best fixed ({s['best_fixed']}) "
              f"{s['median'][s['best_fixed']]['samples_per_s']:,.0f}/s = {s['auto_over_best']:.2f}x; first 10%: "
              f"{s['auto_over_best_first10']:.2f}x of {s['best_fixed_first10']}, after it "
              f"{s['auto_over_best_rest90']:.2f}x; next epoch {s.get('auto_next_epoch_over_best', 0):.2f}x; "
              f"last change at {100 * s['auto_settled_share']:.0f}% of the epoch; threads auto "
              f"{s['auto_threads']:.0f} vs {s['best_threads']:.0f}; settled on {s['auto_processes_at_end']}",
              flush=True)

    pair_result: Optional[dict[str, Any]] = None
    if not args.no_pair:
        pair_result = pair(args, folder)
        print("two consumers: " + json.dumps(pair_result.get("windows", pair_result)), flush=True)

    load_at_end = load_average()
    uptime_end = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"load average: {load_at_start} at start, {load_at_end} at the end", flush=True)
    command = "python bench/python/auto_workers_bench.py" + "".join(f" {a}" for a in sys.argv[1:])
    write_results(Path(args.out).stem, {
        "machine": machine_info(), "command": command, "settings": [str(s) for s in settings],
        "rounds": args.rounds,
        "workloads": {n: w["description"] for n, w in works.items()},
        "runs": runs, "summary": summary, "pair": pair_result,
        "foreign_cpu": foreign.summary(),
        "load_average": {"start": load_at_start, "end": load_at_end},
        "uptime": {"start": uptime_start, "end": uptime_end}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
