"""Crops larger than the image, as torchvision does them: center_crop pads with zeros
(torchvision.transforms.functional.center_crop's padding, then its crop), and
random_resized_crop takes its box inside the image and resizes it up."""

from __future__ import annotations

import io

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import spindle  # noqa: E402
from spindle import ops  # noqa: E402
from spindle import pipeline as sp  # noqa: E402


def tv_center_crop(a: np.ndarray, crop_h: int, crop_w: int) -> np.ndarray:
    """torchvision.transforms.functional.center_crop, step for step, on an (H, W, C) array."""
    h, w = a.shape[:2]
    if crop_w > w or crop_h > h:
        left = (crop_w - w) // 2 if crop_w > w else 0
        top = (crop_h - h) // 2 if crop_h > h else 0
        right = (crop_w - w + 1) // 2 if crop_w > w else 0
        bottom = (crop_h - h + 1) // 2 if crop_h > h else 0
        a = np.pad(a, ((top, bottom), (left, right), (0, 0)))  # fill=0
        h, w = a.shape[:2]
        if crop_w == w and crop_h == h:
            return a
    top, left = int(round((h - crop_h) / 2.0)), int(round((w - crop_w) / 2.0))
    return a[top:top + crop_h, left:left + crop_w]


def small_png(h: int, w: int, seed: int) -> tuple[bytes, np.ndarray]:
    a = np.random.default_rng(seed).integers(1, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue(), a


@pytest.mark.parametrize("shape,crop", [((10, 12), (32, 32)), ((10, 12), (31, 33)), ((40, 12), (32, 32)),
                                        ((9, 50), (16, 20))])
def test_decode_of_center_crop_box_is_torchvisions_pad_then_crop(shape, crop):
    """Proves: decode_image(crop=center_crop_box(...)) equals torchvision's center_crop (pad with zeros, then
    crop) for crops larger than the image in one or both dimensions, odd and even padding."""
    data, a = small_png(*shape, seed=shape[0])
    box = ops.center_crop_box(shape[0], shape[1], crop)
    assert np.array_equal(ops.decode_image(data, crop=box), tv_center_crop(a, *crop))


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    arrays = []
    for c in range(2):
        (root / f"c{c}").mkdir()
        for k in range(3):
            data, a = small_png(10 + k, 12 + c, seed=10 * c + k)
            (root / f"c{c}" / f"{k}.png").write_bytes(data)
            arrays.append(a)
    return root, arrays


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_pipeline_center_crop_of_a_smaller_image_pads_like_torchvision(small_folder, mode):
    """Proves: .decode().center_crop(32) on images of 10-12 x 12-13 px gives torchvision's zero-padded crops in
    both modes (it used to fail as a bug in the pipeline)."""
    root, arrays = small_folder
    pipe = sp.image_folder(root).decode().center_crop(32).batch(4)
    images = np.concatenate([b["image"] for b in spindle.PipelineLoader(pipe, num_workers=2, mode=mode)])
    assert images.shape == (6, 32, 32, 3)
    for got, a in zip(images, arrays):
        assert np.array_equal(got, tv_center_crop(a, 32, 32))


def test_pipeline_random_resized_crop_of_a_smaller_image_resizes_up(small_folder):
    """Proves: random_resized_crop(32) on images smaller than 32 px gives 32x32 crops (box inside the image,
    resized up, as torchvision), the same in both modes."""
    root, _ = small_folder
    pipe = sp.image_folder(root).decode().random_resized_crop(32).batch(3)
    got = {m: np.concatenate([b["image"] for b in spindle.PipelineLoader(pipe, num_workers=2, mode=m, seed=4)])
           for m in ("processes", "threads")}
    assert got["processes"].shape == (6, 32, 32, 3)
    assert np.array_equal(got["processes"], got["threads"])
