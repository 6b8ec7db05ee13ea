"""Image ops of spindle's native pipelines, one sample at a time.

The same C++ code the native pipelines run (``runtime/include/spindle/ops/image_ops.hpp``),
callable from any dataset, e.g. inside ``spindle.torch.DataLoader`` workers: numpy in,
numpy out, the GIL released while the work runs. Images are ``(H, W, C)`` uint8 arrays,
RGB from the decoder. Bad image bytes raise :class:`spindle.errors.DecodeError`
(a ``ValueError``) with the decoder's message; misuse (an empty crop, a zero
size) raises ``ValueError``. A crop box that leaves the image is zero-padded there,
as torchvision pads before it crops.

Formats (by magic bytes): JPEG, PNG, WebP, TIFF, BMP and binary 8-bit PPM/PGM.
Compared with PIL/torchvision: decoding without crop or scaling gives PIL's
``convert("RGB")`` pixels exactly for JPEG (both use libjpeg-turbo, ISLOW IDCT) and
lossless files (docs/ops.md lists the cases); crop then resize gives
``Image.crop(box).resize(size, BILINEAR)`` exactly, unless the crop is at least
twice the size in both dimensions and the file is a JPEG, where DCT-domain
downscaling makes it close but not equal (see docs/ops.md for the
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
    "adjust_brightness",
    "adjust_contrast",
    "adjust_saturation",
    "adjust_hue",
    "rgb_to_grayscale",
    "color_jitter",
    "color_jitter_draw",
    "random_grayscale",
]

# A ColorJitter argument, as torchvision takes it: a number v ([max(0, 1 - v), 1 + v];
# hue [-v, v]) or a (min, max) range.
JitterArg = float | tuple[float, float]


class ImageInfo(NamedTuple):
    """What an image's headers say: size, channels as stored, and the format: ``"jpeg"``, ``"png"``,
    ``"webp"``, ``"tiff"``, ``"bmp"`` or ``"pnm"``."""

    height: int
    width: int
    channels: int
    format: str


def decode_image(data: bytes, crop: tuple[int, int, int, int] | None = None,
                 size: tuple[int, int] | None = None) -> np.ndarray:
    """Decodes JPEG, PNG, WebP, TIFF, BMP or PPM/PGM bytes to an ``(H, W, 3)`` uint8 RGB array.

    ``crop=(top, left, height, width)`` in source pixels is decoded alone (JPEG: only
    its rows and columns are decoded; zeros where it leaves the image);
    ``size=(height, width)`` then resizes it with PIL's antialiased bilinear filter.
    """
    return _core.decode_image(data, None if crop is None else tuple(crop),
                              None if size is None else tuple(size))


def image_info(data: bytes) -> ImageInfo:
    """Reads only the headers of the image bytes."""
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
    """torchvision ``CenterCrop``'s box; for a crop larger than the image it starts at ``-((crop - side) // 2)``,
    so that ``decode_image(data, crop=box)`` is torchvision's pad-with-zeros-then-crop."""
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


def adjust_brightness(image: np.ndarray, factor: float) -> np.ndarray:
    """torchvision ``adjust_brightness`` (its uint8 tensor formula) of an ``(H, W, 3)`` RGB copy."""
    return _core.adjust_brightness(np.ascontiguousarray(image), factor)


def adjust_contrast(image: np.ndarray, factor: float) -> np.ndarray:
    """torchvision ``adjust_contrast`` (blend with the grayscale mean) of an ``(H, W, 3)`` RGB copy."""
    return _core.adjust_contrast(np.ascontiguousarray(image), factor)


def adjust_saturation(image: np.ndarray, factor: float) -> np.ndarray:
    """torchvision ``adjust_saturation`` (blend with each pixel's gray) of an ``(H, W, 3)`` RGB copy."""
    return _core.adjust_saturation(np.ascontiguousarray(image), factor)


def adjust_hue(image: np.ndarray, factor: float) -> np.ndarray:
    """torchvision ``adjust_hue`` (HSV hue rotated by ``factor`` turns, in [-0.5, 0.5]) of an ``(H, W, 3)`` copy."""
    return _core.adjust_hue(np.ascontiguousarray(image), factor)


def rgb_to_grayscale(image: np.ndarray) -> np.ndarray:
    """torchvision ``rgb_to_grayscale(num_output_channels=3)`` of an ``(H, W, 3)`` RGB copy."""
    return _core.rgb_to_grayscale(np.ascontiguousarray(image))


def color_jitter_draw(seed: int, epoch: int, index: int, brightness: JitterArg = 0, contrast: JitterArg = 0,
                      saturation: JitterArg = 0, hue: JitterArg = 0
                      ) -> tuple[tuple[int, int, int, int], float | None, float | None, float | None, float | None]:
    """``ColorJitter.get_params``'s draw for sample ``(seed, epoch, index)``: the order of the four adjustments
    (0 brightness, 1 contrast, 2 saturation, 3 hue) and each factor (``None`` where torchvision's is)."""
    return _core.color_jitter_draw(seed, epoch, index, brightness, contrast, saturation, hue)


def color_jitter(image: np.ndarray, seed: int, epoch: int, index: int, brightness: JitterArg = 0,
                 contrast: JitterArg = 0, saturation: JitterArg = 0, hue: JitterArg = 0) -> np.ndarray:
    """torchvision ``ColorJitter`` of an ``(H, W, 3)`` RGB copy, with the draw of ``color_jitter_draw``."""
    return _core.color_jitter(np.ascontiguousarray(image), seed, epoch, index, brightness, contrast, saturation, hue)


def random_grayscale(image: np.ndarray, p: float, seed: int, epoch: int, index: int) -> tuple[np.ndarray, bool]:
    """torchvision ``RandomGrayscale(p)`` of an ``(H, W, 3)`` RGB copy: ``(image, whether it was applied)``."""
    return _core.random_grayscale(np.ascontiguousarray(image), p, seed, epoch, index)
