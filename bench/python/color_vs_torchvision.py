"""spindle.ops' colour ops and padded center crop against torchvision itself.

    .venv-peers/bin/python bench/python/color_vs_torchvision.py    # after make peers-venv

`make test` cannot import torchvision (its wheel needs another torch), so
tests/python/test_color_ops.py compares with torchvision's formulas restated in
numpy; this script is the check against the real thing: transforms.v2.functional
on uint8 tensors, and transforms.functional on PIL images (ColorJitter's path for
PIL input). Prints, per op and factor, the largest difference and the share of
equal values; writes bench/results/color_vs_torchvision.json.
"""

from __future__ import annotations

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision.transforms import functional as F1
from torchvision.transforms.v2 import functional as F2

from machine import machine_info, write_results
from spindle import ops

FACTORS = {"brightness": [0.0, 0.6, 1.37, 2.5], "contrast": [0.0, 0.6, 1.4, 3.0],
           "saturation": [0.0, 0.6, 1.4, 3.0], "hue": [-0.5, -0.1, 0.07, 0.5]}


def photo(seed: int, h: int = 96, w: int = 128) -> np.ndarray:
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([128 + 100 * np.sin(x / 7 + seed), 128 + 90 * np.cos(y / 5), (x * y) % 256], -1)
    return np.clip(a + r.normal(0, 12, a.shape), 0, 255).astype(np.uint8)


def stats(ours: np.ndarray, theirs: np.ndarray) -> dict:
    d = np.abs(ours.astype(int) - theirs.astype(int))
    return {"max_abs": int(d.max()), "mean_abs": float(d.mean()), "equal": float((d == 0).mean())}


def main() -> None:
    rows = []
    for op, factors in FACTORS.items():
        for f in factors:
            for seed in range(3):
                a = photo(seed)
                ours = getattr(ops, f"adjust_{op}")(a, f)
                t = torch.from_numpy(a).permute(2, 0, 1).contiguous()
                v2 = getattr(F2, f"adjust_{op}")(t, f).permute(1, 2, 0).numpy()
                pil = np.asarray(getattr(F1, f"adjust_{op}")(Image.fromarray(a), f))
                rows.append({"op": op, "factor": f, "seed": seed, "vs_v2_tensor": stats(ours, v2),
                             "vs_pil": stats(ours, pil)})
    for seed in range(3):
        a = photo(seed)
        t = torch.from_numpy(a).permute(2, 0, 1).contiguous()
        rows.append({"op": "grayscale", "seed": seed,
                     "vs_v2_tensor": stats(ops.rgb_to_grayscale(a),
                                           F2.rgb_to_grayscale(t, 3).permute(1, 2, 0).numpy()),
                     "vs_pil": stats(ops.rgb_to_grayscale(a), np.asarray(F1.rgb_to_grayscale(Image.fromarray(a), 3)))})
    import io
    for (h, w), crop in [((10, 12), (32, 32)), ((10, 12), (31, 33)), ((40, 12), (32, 32))]:
        a = np.random.default_rng(h).integers(1, 256, (h, w, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, "PNG")
        ours = ops.decode_image(buf.getvalue(), crop=ops.center_crop_box(h, w, crop))
        theirs = np.asarray(F1.center_crop(Image.fromarray(a), list(crop)))
        rows.append({"op": "center_crop_padded", "image": [h, w], "crop": list(crop), "vs_pil": stats(ours, theirs)})
    worst: dict[str, dict] = {}
    for r in rows:
        for ref in ("vs_v2_tensor", "vs_pil"):
            if ref in r:
                k = f"{r['op']} {ref}"
                w = worst.setdefault(k, {"max_abs": 0, "mean_abs": 0.0, "min_equal": 1.0})
                w["max_abs"] = max(w["max_abs"], r[ref]["max_abs"])
                w["mean_abs"] = max(w["mean_abs"], r[ref]["mean_abs"])
                w["min_equal"] = min(w["min_equal"], r[ref]["equal"])
    print(f"torchvision {torchvision.__version__}, torch {torch.__version__}")
    for k, w in worst.items():
        print(f"{k:32} max |diff| {w['max_abs']:3d}  worst mean {w['mean_abs']:.3f}  equal >= {100 * w['min_equal']:.2f}%")
    write_results("color_vs_torchvision", {"machine": machine_info(), "torchvision": torchvision.__version__,
                                           "worst": worst, "rows": rows})


if __name__ == "__main__":
    main()
