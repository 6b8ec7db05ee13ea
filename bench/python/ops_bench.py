"""One core's rate of spindle's fused decode + random-resized-crop(224) + flip against PIL's.

The per-sample work of the issue's image pipeline, on ``--files`` ImageNet-like
JPEGs (q90, 400x400, photo-like content) held in memory, one thread, no loader:

| path | per sample |
|---|---|
| ``spindle-fused`` | ``ops.image_info`` (headers), ``ops.random_resized_crop_box``, ``ops.decode_image(crop=box, size=(224, 224))`` (region-only decode, DCT scaling when the crop is >= 2x 224), ``ops.hflip`` half the time |
| ``spindle-unfused`` | ``ops.decode_image`` of the whole image, then crop + ``ops.resize`` + flip: what the fusion saves |
| ``pil`` | ``Image.open(...).convert("RGB")``, the same box, ``crop(box).resize((224, 224), BILINEAR)``, ``transpose(FLIP_LEFT_RIGHT)`` half the time: torchvision's ``RandomResizedCrop`` + ``RandomHorizontalFlip`` on PIL without torch's overhead |

Rates are samples per CPU-second of the measuring thread (``time.thread_time``),
so other jobs on a shared machine do not lower them; the best of ``--rounds``.
Writes bench/results/ops.json.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info, write_results  # noqa: E402

from spindle import ops  # noqa: E402


def photo_like(size: int, seed: int) -> bytes:
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    a = np.full((size, size, 3), 128.0)
    for c in range(3):
        for _ in range(4):
            a[..., c] += r.uniform(20, 50) * np.sin(2 * np.pi * (r.uniform(0.5, 6) * x + r.uniform(0.5, 6) * y)
                                                    + r.uniform(0, 6.3))
    im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(12):
        x0, y0 = int(r.integers(0, size)), int(r.integers(0, size))
        draw.ellipse([x0, y0, x0 + int(r.integers(10, size // 2)), y0 + int(r.integers(10, size // 2))],
                     fill=tuple(int(v) for v in r.integers(0, 255, 3)))
    im = im.filter(ImageFilter.GaussianBlur(1.0))
    noisy = np.clip(np.asarray(im).astype(float) + r.normal(0, 3, (size, size, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noisy).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def spindle_fused(files, epoch):
    for i, data in enumerate(files):
        info = ops.image_info(data)
        box = ops.random_resized_crop_box(info.height, info.width, 0, epoch, i)
        img = ops.decode_image(data, crop=box, size=(224, 224))
        if (i + epoch) & 1:
            img = ops.hflip(img)


def spindle_unfused(files, epoch):
    for i, data in enumerate(files):
        full = ops.decode_image(data)
        t, l, h, w = ops.random_resized_crop_box(full.shape[0], full.shape[1], 0, epoch, i)
        img = ops.resize(full[t:t + h, l:l + w], (224, 224))
        if (i + epoch) & 1:
            img = ops.hflip(img)


def pil(files, epoch):
    for i, data in enumerate(files):
        im = Image.open(io.BytesIO(data)).convert("RGB")
        t, l, h, w = ops.random_resized_crop_box(im.height, im.width, 0, epoch, i)
        im = im.crop((l, t, l + w, t + h)).resize((224, 224), Image.BILINEAR)
        if (i + epoch) & 1:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        np.asarray(im)  # torchvision's ToTensor/PILToTensor reads the pixels out too


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    files = [photo_like(400, s) for s in range(args.files)]
    rates = {}
    for name, fn in [("spindle-fused", spindle_fused), ("spindle-unfused", spindle_unfused), ("pil", pil)]:
        best = 0.0
        for r in range(args.rounds):
            t0 = time.thread_time()
            fn(files, r)
            best = max(best, len(files) / (time.thread_time() - t0))
        rates[name] = round(best, 1)
        print(f"{name:16s} {best:8.1f} samples/s on one core")
    print(f"fused vs PIL: {rates['spindle-fused'] / rates['pil']:.2f}x; "
          f"fused vs unfused: {rates['spindle-fused'] / rates['spindle-unfused']:.2f}x")
    write_results("ops", {"machine": machine_info(), "files": args.files, "image": "400x400 JPEG q90",
                          "samples_per_cpu_second": rates,
                          "fused_over_pil": round(rates["spindle-fused"] / rates["pil"], 2)})


if __name__ == "__main__":
    main()
