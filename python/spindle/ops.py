"""Image ops of spindle's native pipelines, one sample at a time.

The same C++ code the native pipelines run (``runtime/include/spindle/ops/image_ops.hpp``),
callable from any dataset, e.g. inside ``spindle.torch.DataLoader`` workers: numpy in,
numpy out, the GIL released while the work runs. Images are ``(H, W, C)`` uint8 arrays,
RGB from the decoder. Bad image bytes raise :class:`spindle.errors.DecodeError`
(a ``ValueError``) with the decoder's message; misuse (a crop outside the image,
a zero size) raises ``ValueError``.

Compared with PIL/torchvision: decoding without crop or scaling gives PIL's pixels
exactly (both use libjpeg-turbo, ISLOW IDCT); crop then resize gives
``Image.crop(box).resize(size, BILINEAR)`` exactly, unless the crop is at least
twice the size in both dimensions and the file is a JPEG, where DCT-domain
downscaling makes it close but not equal (see docs/ops.md for the measured
tolerance). Crop boxes follow torchvision's rules; their random draws come from
``(seed, epoch, index)``, not from torch's generator.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from . import _core

__all__ = [
    "ImageInfo",
    "decode_image",
    "image_info",
    "random_resized_crop_box",
    "center_crop_box",
    "resize",
    "hflip",
    "normalize",
]


class ImageInfo(NamedTuple):
    """What an image's headers say: size, channels as stored, and ``"jpeg"`` or ``"png"``."""

    height: int
    width: int
    channels: int
    format: str


def decode_image(data: bytes, crop: tuple[int, int, int, int] | None = None,
                 size: tuple[int, int] | None = None) -> np.ndarray:
    """Decodes JPEG/PNG bytes to an ``(H, W, 3)`` uint8 RGB array.

    ``crop=(top, left, height, width)`` in source pixels is decoded alone (JPEG: only
    its rows and columns are decoded); ``size=(height, width)`` then resizes it with
    PIL's antialiased bilinear filter.
    """
    return _core.decode_image(data, None if crop is None else tuple(crop),
                              None if size is None else tuple(size))


def image_info(data: bytes) -> ImageInfo:
    """Reads only the headers of JPEG/PNG bytes."""
    return ImageInfo(*_core.image_info(data))


def random_resized_crop_box(height: int, width: int, seed: int, epoch: int, index: int,
                            scale: tuple[float, float] = (0.08, 1.0),
                            ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)) -> tuple[int, int, int, int]:
    """torchvision ``RandomResizedCrop.get_params``'s rule: ``(top, left, height, width)``.

    The draws are a pure function of ``(seed, epoch, index)``: the same box in any
    process, thread or order.
    """
    return _core.random_resized_crop_box(height, width, seed, epoch, index, tuple(scale), tuple(ratio))


def center_crop_box(height: int, width: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """torchvision ``CenterCrop``'s box, except that a crop larger than the image is clamped, not padded."""
    return _core.center_crop_box(height, width, tuple(size))


def resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resizes an ``(H, W, C)`` uint8 array to ``size=(height, width)``; equal to PIL's ``resize(BILINEAR)``."""
    return _core.resize(np.ascontiguousarray(image), tuple(size))


def hflip(image: np.ndarray) -> np.ndarray:
    """A left-right mirrored copy of an ``(H, W, C)`` uint8 array."""
    return _core.hflip(np.ascontiguousarray(image))


def normalize(image: np.ndarray, mean: Sequence[float], std: Sequence[float], *, chw: bool = False) -> np.ndarray:
    """``(image / 255 - mean) / std`` as float32, ``(H, W, C)`` or, with ``chw``, ``(C, H, W)``."""
    return _core.normalize(np.ascontiguousarray(image), list(mean), list(std), chw)
