"""Two questions of issue 20, each answered with both sides measured in the same run:

1. WebDataset shards over loopback HTTP against the same shards on local disk, for the
   ImageNet recipe (decode + RandomResizedCrop(224) + flip, native pipeline): the HTTP rate as a
   share of the local one (target >= 90%), and the peak threads of the loader tree in each
   (unchanged: libcurl starts none). The server is `python -m http.server` in its own process,
   so its threads are not counted.
2. The cost of keeping statistics on the arrays workload (spindle.DataLoader, 64x64x3 uint8
   samples, transport-bound): stats on against SPINDLE_STATS=0, rounds interleaved, each in
   its own process; target < 1%.

    python bench/python/streaming_bench.py [--images 1024] [--rounds 3] [--out bench/results/streaming.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402


def make_shards(folder: Path, out: Path, per_shard: int) -> list[str]:
    files = sorted(folder.glob("class*/*.jpg"))
    classes = sorted({f.parent.name for f in files})
    paths = []
    for s in range(0, len(files), per_shard):
        path = out / f"shard-{s // per_shard:04d}.tar"
        if not path.exists():
            with tarfile.open(path.with_suffix(".part"), "w", format=tarfile.USTAR_FORMAT) as tar:
                for f in files[s:s + per_shard]:
                    key = f"{f.parent.name}_{f.stem}"
                    for name, data in ((f"{key}.jpg", f.read_bytes()), (f"{key}.cls", str(classes.index(f.parent.name)).encode())):
                        info = tarfile.TarInfo(name)
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            path.with_suffix(".part").rename(path)
        paths.append(str(path))
    return paths


PIPELINE_CHILD = textwrap.dedent("""
    import json, os, sys, threading, time
    import spindle
    from spindle import _core, pipeline as sp
    urls, workers = json.loads(sys.argv[1]), int(sys.argv[2])
    pipe = sp.webdataset(urls).decode().random_resized_crop(224).random_flip().batch(32)
    peak, done = [0], threading.Event()
    def tree_threads():
        me = os.getpid()
        total = _core.count_process_threads(me) - 1  # less this sampling thread
        for pid in _core.process_ids():
            try:
                if _core.process_status(pid).ppid == me:
                    total += _core.count_process_threads(pid)
            except Exception:
                pass
        return total
    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_threads())
            time.sleep(0.05)
    loader = spindle.PipelineLoader(pipe, num_workers=workers, seed=1)
    n = sum(len(b["label"]) for b in loader)  # warm: page cache, connections
    t = threading.Thread(target=sample, daemon=True); t.start()
    start = time.perf_counter()
    n = sum(len(b["label"]) for b in loader)
    elapsed = time.perf_counter() - start
    done.set(); t.join()
    s = loader.stats()
    print(json.dumps({"images": n, "seconds": elapsed, "rate": n / elapsed, "peak_threads": peak[0],
                      "bytes_fetched": s["bytes_fetched"]}))
""")


ARRAYS_CHILD = textwrap.dedent("""
    import json, sys, time
    import spindle
    from spindle.bench.workloads import ArraySamples
    n, workers = int(sys.argv[1]), int(sys.argv[2])
    loader = spindle.DataLoader(ArraySamples(n), batch_size=64, num_workers=workers, persistent_workers=True)
    for _ in loader: pass
    start = time.perf_counter()
    for _ in range(3):
        for _ in loader: pass
    elapsed = time.perf_counter() - start
    print(json.dumps({"samples": 3 * n, "seconds": elapsed, "rate": 3 * n / elapsed,
                      "batches_counted": loader.stats()["batches"]}))
""")


def run_child(code: str, args: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--per-shard", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--array-samples", type=int, default=65536)
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "spindle-streaming-bench"))
    ap.add_argument("--out", default="bench/results/streaming.json")
    args = ap.parse_args()

    from spindle.bench.workloads import make_image_folder
    data = Path(args.data)
    folder = make_image_folder(data / "folder", args.images)
    shard_dir = data / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    shards = make_shards(folder, shard_dir, args.per_shard)

    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"], cwd=shard_dir,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(re.search(r"port (\d+)", server.stdout.readline()).group(1))
        urls = [f"http://127.0.0.1:{port}/{os.path.basename(p)}" for p in shards]
        env = dict(os.environ)
        runs: dict[str, list[dict]] = {"local": [], "http": []}
        for _ in range(args.rounds):  # interleaved, so drift hits both sides alike
            runs["local"].append(run_child(PIPELINE_CHILD, [json.dumps(shards), str(args.workers)], env))
            runs["http"].append(run_child(PIPELINE_CHILD, [json.dumps(urls), str(args.workers)], env))
    finally:
        server.kill()
        server.wait()

    stats_runs: dict[str, list[dict]] = {"on": [], "off": []}
    for _ in range(args.rounds):
        for side, value in (("on", "1"), ("off", "0")):
            env = dict(os.environ, SPINDLE_STATS=value)
            stats_runs[side].append(run_child(ARRAYS_CHILD, [str(args.array_samples), str(args.workers)], env))

    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    result = {
        "machine": machine_info(),
        "command": "python bench/python/streaming_bench.py " + " ".join(sys.argv[1:]),
        "http_vs_local": {
            "images": args.images, "shards": len(shards), "workers": args.workers,
            "local_rate": med(runs["local"], "rate"), "http_rate": med(runs["http"], "rate"),
            "ratio": med(runs["http"], "rate") / med(runs["local"], "rate"),
            "local_peak_threads": max(r["peak_threads"] for r in runs["local"]),
            "http_peak_threads": max(r["peak_threads"] for r in runs["http"]),
            "http_bytes_fetched": runs["http"][-1]["bytes_fetched"],
            "shard_bytes": sum(os.path.getsize(p) for p in shards),
            "runs": runs,
        },
        "stats_overhead": {
            "workload": "arrays (64x64x3 uint8, batch 64)", "samples_per_epoch": args.array_samples,
            "workers": args.workers,
            "on_rate": med(stats_runs["on"], "rate"), "off_rate": med(stats_runs["off"], "rate"),
            "overhead": 1 - med(stats_runs["on"], "rate") / med(stats_runs["off"], "rate"),
            "runs": stats_runs,
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    h, s = result["http_vs_local"], result["stats_overhead"]
    print(f"ImageNet recipe, {h['workers']} workers: local {h['local_rate']:.0f} img/s, http {h['http_rate']:.0f} img/s "
          f"({h['ratio']:.1%}); peak threads local {h['local_peak_threads']}, http {h['http_peak_threads']}")
    print(f"arrays: stats on {s['on_rate']:.0f}/s, off {s['off_rate']:.0f}/s, overhead {s['overhead']:+.2%}")


if __name__ == "__main__":
    main()
