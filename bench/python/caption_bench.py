"""The image-text recipe: JPEG + caption WebDataset shards, spindle against webdataset + PIL in
torch's DataLoader, in the same run.

    python bench/python/caption_bench.py      # writes bench/results/captions.json

Workload: the harness's generated ImageNet-like JPEGs (q90, sides of 300-500 px; no network)
packed into tar shards of key.jpg + key.txt (a caption of 20-400 bytes, UTF-8) + key.cls (cached
under /tmp). Per sample: decode, random-resized-crop 224, horizontal flip; the caption comes
through as bytes; batch 64; one worker per core. Each loader runs in its own process (a child
of this script, imports done before its clock starts), in alternating rounds; medians reported:

* ``webdataset+PIL``: torch's DataLoader over ``webdataset.WebDataset(shards).decode("pil")
  .to_tuple("jpg", "txt", "cls")`` with torchvision's RandomResizedCrop(224) (PIL bilinear,
  antialiased), RandomHorizontalFlip and PILToTensor (where torchvision does not import, the
  same ops written with PIL: crop + resize(224, BILINEAR) + flip); the default collate (a list
  of captions).
  Shards are split by worker (webdataset's split_by_worker), as spindle splits them.
* ``spindle threads`` / ``spindle processes``: spindle.PipelineLoader over
  ``spindle.pipeline.webdataset(shards, keep=("txt",)).decode().random_resized_crop(224)
  .random_flip().batch(64)``; ``b["txt"]`` is a list of 64 ``bytes``.

Every loader is checked to deliver every caption (their total bytes) before it is timed.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

from machine import child_result, machine_info, write_results
from spindle.bench.workloads import make_image_folder, pil_random_resized_crop_flip

SIZE = 224
BATCH = 64
WORDS = "a photo of the small red large blue cat dog on with under grass sky city street ünd café".split()


def make_shards(folder: Path, out: Path, shards: int) -> list[str]:
    """The folder's JPEGs as `shards` tar shards with a caption per image, once (a marker says done)."""
    files = sorted(p for p in folder.rglob("*.jpg"))
    marker = out / f".complete-{len(files)}-{shards}"
    paths = [str(out / f"shard-{s:03d}.tar") for s in range(shards)]
    if marker.exists():
        return paths
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s, path in enumerate(paths):
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k, f in enumerate(files[s::shards]):
                key = f"{s:03d}{k:05d}"
                words = rng.choice(WORDS, int(rng.integers(4, 60)))
                caption = " ".join(words).encode()[: int(rng.integers(20, 400))].decode(errors="ignore").encode()
                for name, data in ((f"{key}.jpg", f.read_bytes()), (f"{key}.txt", caption),
                                   (f"{key}.cls", str(int(f.parent.name[-2:])).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    marker.touch()
    return paths


def pil_rrc_flip(img):
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip, as the bench's PIL loaders do."""
    return pil_random_resized_crop_flip(img)


def webdataset_pil(shards: list[str], workers: int):
    import torch.utils.data
    import webdataset as wds

    try:
        from torchvision import transforms
    except Exception:  # noqa: BLE001 - torchvision absent or broken: the same ops with PIL
        t = pil_rrc_flip
    else:
        t = transforms.Compose([transforms.RandomResizedCrop(SIZE), transforms.RandomHorizontalFlip(),
                                transforms.PILToTensor()])
    dataset = (wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode("pil")
               .to_tuple("jpg", "txt", "cls").map_tuple(t, _same, int))
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=workers)


def _same(x):
    return x


def spindle_loader(shards: list[str], workers: int, mode: str):
    import spindle
    from spindle import pipeline as sp

    pipe = sp.webdataset(shards, keep=("txt",)).decode().random_resized_crop(SIZE).random_flip().batch(BATCH)
    return spindle.PipelineLoader(pipe, num_workers=workers, seed=0, mode=mode)


PEERS = {
    "webdataset+PIL": webdataset_pil,
    "spindle threads": lambda s, w: spindle_loader(s, w, "threads"),
    "spindle processes": lambda s, w: spindle_loader(s, w, "processes"),
}


def captions_of(batch) -> list:
    return batch["txt"] if isinstance(batch, dict) else batch[1]


def child(name: str, shards: list[str], workers: int) -> int:
    """One epoch of one loader in this process; prints its rate and caption bytes as one JSON line."""
    import json

    loader = PEERS[name](shards, workers)
    it = iter(loader)
    first = next(it)
    size = lambda caps: sum(len(c.encode() if isinstance(c, str) else c) for c in caps)  # noqa: E731
    samples, chars = 0, size(captions_of(first))
    start = time.perf_counter()
    for batch in it:
        caps = captions_of(batch)
        samples += len(caps)
        chars += size(caps)
    seconds = time.perf_counter() - start
    print("RESULT " + json.dumps({"rate": samples / seconds, "caption_bytes": chars}), flush=True)
    return 0


def measure(name: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--shards-dir", args.shards_dir, "--workers", str(args.workers),
           "--images", str(args.images), "--shards", str(args.shards)]
    return child_result(cmd)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--root", default="/tmp/spindle-bench-imagenet-captions")
    parser.add_argument("--shards-dir", default="/tmp/spindle-bench-caption-shards")
    parser.add_argument("--out", default="captions")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shards = [str(Path(args.shards_dir) / f"shard-{s:03d}.tar") for s in range(args.shards)]
    if args.child:
        return child(args.child, shards, args.workers)
    folder = make_image_folder(Path(args.root), args.images)
    shards = make_shards(folder, Path(args.shards_dir), args.shards)
    load_before = [round(x, 2) for x in os.getloadavg()]
    rates: dict[str, list[float]] = {}
    caption_bytes: dict[str, int] = {}
    failed: dict[str, str] = {}
    loads = []
    for r in range(args.rounds):
        for name in PEERS:
            if name in failed:
                continue
            res = measure(name, args)
            if "rate" not in res:
                failed[name] = res["failed"]
                print(f"{name}: failed: {failed[name]}", flush=True)
                continue
            rates.setdefault(name, []).append(res["rate"])
            caption_bytes[name] = res["caption_bytes"]
        loads.append([round(x, 2) for x in os.getloadavg()])
        print(f"round {r} (load {loads[-1]}): " + ", ".join(f"{n} {v[-1]:,.0f}/s" for n, v in rates.items()),
              flush=True)
    if len(set(caption_bytes.values())) > 1:
        print(f"the loaders delivered different caption bytes: {caption_bytes}", flush=True)
        return 1
    base = statistics.median(rates["webdataset+PIL"]) if "webdataset+PIL" in rates else float("nan")
    summary = {}
    for name, v in rates.items():
        m = statistics.median(v)
        summary[name] = {"median_samples_per_s": m, "vs_webdataset_pil": m / base}
        print(f"{name:18} {m:8,.0f} samples/s  {m / base:5.2f}x webdataset+PIL", flush=True)
    write_results(args.out, {"machine": machine_info(), "workload": f"{args.images} JPEGs q90 300-500 px + captions "
                             f"(20-400 bytes) in {args.shards} shards; decode + RRC {SIZE} + flip, caption as bytes, "
                             f"batch {BATCH}, {args.workers} workers",
                             "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
                             "load_average_before": load_before, "load_average_after_each_round": loads,
                             "caption_bytes": caption_bytes, "rates": rates, "summary": summary, "failed": failed})
    return 0


if __name__ == "__main__":
    sys.exit(main())
