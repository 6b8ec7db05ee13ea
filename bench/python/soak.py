"""Soak: back-to-back epochs for a long time; resources must stay flat.

    .venv/bin/python bench/python/soak.py --minutes 60     # or: make soak SOAK_MINUTES=60

Cycles through five loaders, one epoch each, until the time is up:
spindle.DataLoader (fresh workers per epoch, and persistent workers),
spindle.torch.DataLoader (the same two), and spindle.grain.DataLoader. Every
epoch is checked complete and duplicate-free (sample ids). Once a minute it
records the consumer's RSS, open descriptors, threads, its live child
processes and the bytes used in /dev/shm. It fails (exit 1) if an epoch is
wrong, or if the last minute's figures exceed the first minute's by more than
the stated slack; the figures go to bench/results/soak.json and are summarized
in docs/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

N = 2000  # samples per epoch


class Samples:
    """A dict of an image-like array and the sample id."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return {"image": np.full((32, 32, 3), i % 251, np.uint8), "id": np.int64(i)}


def ids_of(batch) -> list[int]:
    return np.asarray(batch["id"]).reshape(-1).tolist()


def make_loaders():
    import spindle
    import spindle.torch

    loaders = {
        "spindle": spindle.DataLoader(Samples(), batch_size=32, shuffle=True, num_workers=2),
        "spindle persistent": spindle.DataLoader(Samples(), batch_size=32, shuffle=True, num_workers=2,
                                                 persistent_workers=True),
        "torch drop-in": spindle.torch.DataLoader(Samples(), batch_size=32, shuffle=True, num_workers=2),
        "torch drop-in persistent": spindle.torch.DataLoader(Samples(), batch_size=32, shuffle=True, num_workers=2,
                                                             persistent_workers=True),
    }
    try:
        import grain
        from absl import flags

        import spindle.grain

        flags.FLAGS.mark_as_parsed()
        source = [{"image": np.full((32, 32, 3), i % 251, np.uint8), "id": np.int64(i)} for i in range(N)]

        def grain_epoch(epoch: int):
            sampler = grain.samplers.IndexSampler(num_records=N, shard_options=grain.sharding.NoSharding(),
                                                  shuffle=True, num_epochs=1, seed=epoch)
            return spindle.grain.DataLoader(data_source=source, sampler=sampler, worker_count=2,
                                            operations=[grain.transforms.Batch(batch_size=32)])
        loaders["grain drop-in"] = grain_epoch
    except ImportError:
        pass
    return loaders


def sample_resources() -> dict[str, float]:
    me = os.getpid()
    with open(f"/proc/{me}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    children = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children += int(fields[1]) == me
            except OSError:
                pass
    shm = os.statvfs("/dev/shm")
    return {
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "fds": len(os.listdir(f"/proc/{me}/fd")),
        "threads": int(status["Threads"]),
        "children": children,
        "shm_used_mib": (shm.f_blocks - shm.f_bfree) * shm.f_frsize / 2**20,
        "shm_names": len([n for n in os.listdir("/dev/shm") if n.startswith(f"spindle.{me}.")]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "soak.json"))
    args = parser.parse_args()

    loaders = make_loaders()
    start = time.monotonic()
    deadline = start + args.minutes * 60
    samples, epochs, errors = [], {name: 0 for name in loaders}, []
    next_sample = start
    epoch = 0
    while time.monotonic() < deadline:
        for name, loader in loaders.items():
            it = loader(epoch) if callable(loader) else loader
            seen = [i for batch in it for i in ids_of(batch)]
            if sorted(seen) != list(range(N)):
                errors.append(f"{name} epoch {epochs[name]}: {len(seen)} ids, {len(set(seen))} distinct")
            epochs[name] += 1
        epoch += 1
        if time.monotonic() >= next_sample:
            point = {"minute": round((time.monotonic() - start) / 60, 2), **sample_resources()}
            samples.append(point)
            print(json.dumps(point), flush=True)
            next_sample += 60
    for loader in loaders.values():
        if hasattr(loader, "close"):
            loader.close()
    samples.append({"minute": round((time.monotonic() - start) / 60, 2), "after_close": True, **sample_resources()})

    first, last = samples[0], samples[-2] if len(samples) > 1 else samples[0]
    slack = {"rss_mib": 64, "fds": 0, "threads": 0, "children": 0, "shm_names": 0}
    drift = {k: last[k] - first[k] for k in slack}
    flat = all(drift[k] <= slack[k] for k in slack)
    ended = samples[-1]
    clean = ended["children"] == 0 and ended["shm_names"] == 0
    report = {"minutes": args.minutes, "epochs": epochs, "errors": errors, "samples": samples, "drift": drift,
              "slack": slack, "flat": flat, "clean_after_close": clean}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("epochs", "errors", "drift", "flat", "clean_after_close")}, indent=1))
    return 0 if flat and clean and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
