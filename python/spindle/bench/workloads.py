"""The workloads of ``spindle bench``: the same datasets for every loader.

- ``arrays``: transport-bound; in-memory 64x64x3 uint8 samples, ``dataset[i]`` returns
  ``(view of row i, i)``: no decode, no augment, the time goes into building and moving
  batches. Not shuffled.
- ``jpeg-pil``: a Python dataset over an ImageNet-like folder that decodes with PIL,
  takes torchvision's RandomResizedCrop(224) rule (crop, then resize BILINEAR) and a
  random horizontal flip: the per-sample Python work of a usual torch pipeline. Shuffled.
- ``jpeg-native``: the same folder and augmentation, done by each loader's native path
  (spindle's C++ pipeline in processes and threads mode; tf.data's ops). Shuffled.
- ``dataset``: the user's own map-style dataset, ``--dataset module:factory``.

Every sample has a label; a loader's epoch is checked by the count of samples and the sum
of their labels, which any order of delivery keeps.
"""

from __future__ import annotations

import importlib
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SIZE = 224
ARRAY_SHAPE = (64, 64, 3)


class ArraySamples:
    """`n` samples of 64x64x3 uint8 held in memory; sample i is filled with i % 251, label i.

    Pickles as its recipe, so spawned workers (grain) rebuild it instead of receiving
    the bytes through a pipe; forked workers share the parent's copy.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.data = np.empty((n,) + ARRAY_SHAPE, np.uint8)
        self.data[:] = (np.arange(n) % 251).astype(np.uint8)[:, None, None, None]

    def __reduce__(self) -> tuple[Any, ...]:
        return ArraySamples, (self.n,)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.data[i], int(i)


def folder_samples(root: str | os.PathLike) -> list[tuple[str, int]]:
    """(path, label) of every image in ImageNet layout, labels by sorted class folder (torchvision's rule)."""
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
    return [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))]


class PilJpegFolder:
    """torchvision's ImageFolder + RandomResizedCrop(224) + RandomHorizontalFlip, written with PIL.

    PyPI's torchvision does not import beside a CPU-only torch on every machine, so the
    same operations are spelled out: torchvision's PIL path crops, then resizes with
    BILINEAR (which antialiases in PIL).
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)
        self.samples = folder_samples(root)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as f:
            img = f.convert("RGB")
        return pil_random_resized_crop_flip(img), label


def pil_random_resized_crop_flip(img: Any) -> np.ndarray:
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip on a PIL image, spelled out
    with PIL (torchvision's PIL path crops, then resizes BILINEAR, which antialiases in PIL)."""
    from PIL import Image

    w, h = img.size
    box = (0, 0, w, h)
    for _ in range(10):  # torchvision's RandomResizedCrop.get_params, scale (0.08, 1), ratio (3/4, 4/3)
        target = w * h * random.uniform(0.08, 1.0)
        ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = random.randint(0, h - ch), random.randint(0, w - cw)
            box = (left, top, left + cw, top + ch)
            break
    img = img.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR, box=box)
    if random.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def make_image_folder(root: str | os.PathLike, n: int, classes: int = 10) -> Path:
    """Writes `n` JPEGs (q90, sides of 300-500 px, smooth patterns plus noise) in ImageNet layout, once.

    No network: the pictures are generated. A marker file says the folder is complete,
    so an interrupted run is redone rather than used half-written. Readable by everyone
    (the ``--ulimit`` mode reads it as another uid).
    """
    from PIL import Image

    root = Path(root)
    marker = root / f".complete-{n}"
    if marker.exists():
        return root
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    for k in range(n):
        cls = root / f"class{k % classes:02d}"
        cls.mkdir(exist_ok=True)
        os.chmod(cls, 0o755)
        h, w = int(rng.integers(300, 501)), int(rng.integers(300, 501))
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([np.sin(x / rng.uniform(5, 40)), np.cos(y / rng.uniform(5, 40)),
                         np.sin((x + y) / rng.uniform(5, 40))], -1)
        img = ((base + 1) * 100 + rng.normal(0, 12, (h, w, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(cls / f"{k:05d}.jpg", quality=90)
    marker.touch()
    return root


def user_dataset(spec: str) -> Any:
    """``module:factory`` -> ``factory()``, a map-style dataset (``len`` and ``[i]``)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"--dataset wants module:factory (a callable returning a map-style dataset), got {spec!r}")
    factory = getattr(importlib.import_module(module), name)
    ds = factory()
    if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise TypeError(f"{spec}() returned {type(ds).__name__}, which has no __len__ and __getitem__")
    return ds


def build(workload: str, *, samples: int, root: str, dataset: str | None) -> Any:
    """The dataset object of a Python-dataset workload (``jpeg-native`` loaders read `root` themselves)."""
    if workload == "arrays":
        return ArraySamples(samples)
    if workload in ("jpeg-pil", "jpeg-native"):
        return PilJpegFolder(root)
    if workload == "dataset":
        assert dataset is not None
        return user_dataset(dataset)
    raise ValueError(f"unknown workload {workload!r}")


def sample_label(sample: Any) -> int | None:
    """The label of one sample (its second element, or its "label"), None when it has none."""
    if isinstance(sample, dict):
        value = sample.get("label")
    elif isinstance(sample, (tuple, list)) and len(sample) >= 2:
        value = sample[1]
    else:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
