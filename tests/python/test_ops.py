"""spindle.ops against PIL/torchvision: decode, crop, resize, crop boxes, errors.

Test images are made with PIL (JPEG q90, 300-500 px sides) in a tmp dir. PIL and
spindle both decode with libjpeg-turbo's ISLOW IDCT and fancy upsampling, so
pixels must be equal wherever no DCT-domain scaling is involved.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageDraw, ImageFilter  # noqa: E402

from spindle import ops  # noqa: E402
from spindle.errors import DecodeError, SpindleError  # noqa: E402

# Measured on the photo-like images below (20 images x 20 boxes x 3 sizes, DCT-scaled
# cases only): mean abs difference per image 0.60 on average, worst 1.36 levels.
DCT_MEAN_ABS_TOLERANCE = 2.0


def photo_like(height: int, width: int, seed: int) -> Image.Image:
    """Smooth gradients, hard-edged shapes, light blur and noise: closer to a photo than noise."""
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    a = np.full((height, width, 3), 128.0)
    for c in range(3):
        for _ in range(4):
            fx, fy, ph = r.uniform(0.5, 6), r.uniform(0.5, 6), r.uniform(0, 6.3)
            a[..., c] += r.uniform(20, 50) * np.sin(2 * np.pi * (fx * x + fy * y) + ph)
    im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(12):
        x0, y0 = int(r.integers(0, width)), int(r.integers(0, height))
        draw.ellipse([x0, y0, x0 + int(r.integers(10, width // 2)), y0 + int(r.integers(10, height // 2))],
                     fill=tuple(int(v) for v in r.integers(0, 255, 3)))
    im = im.filter(ImageFilter.GaussianBlur(1.0))
    noisy = np.asarray(im).astype(float) + r.normal(0, 3, (height, width, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def encode(im: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    if fmt == "JPEG":
        kw.setdefault("quality", 90)
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def pil_rgb(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """(height, width, bytes) of q90 JPEGs, 300-500 px sides, every chroma subsampling, written to a tmp dir."""
    root = tmp_path_factory.mktemp("jpegs")
    out = []
    for i, (h, w, sub) in enumerate([(400, 300, 2), (333, 497, 0), (501 - 1, 379, 1), (317, 451, 2), (480, 480, 2)]):
        path = root / f"{i}.jpg"
        photo_like(h, w, i).save(path, "JPEG", quality=90, subsampling=sub)
        out.append((h, w, path.read_bytes()))
    return out


def test_decode_equals_pil_without_crop_or_scale(jpegs):
    """Proves: a whole-image decode gives PIL's RGB pixels exactly (4:2:0, 4:4:4, 4:2:2)."""
    for h, w, data in jpegs:
        got = ops.decode_image(data)
        assert got.shape == (h, w, 3) and got.dtype == np.uint8
        np.testing.assert_array_equal(got, np.asarray(pil_rgb(data)))


def test_grayscale_jpeg_decodes_to_pil_rgb():
    """Proves: a 1-channel JPEG decodes to 3 equal channels, PIL's convert('RGB') exactly."""
    data = encode(photo_like(320, 410, 7).convert("L"))
    assert ops.image_info(data) == ops.ImageInfo(320, 410, 1, "jpeg")
    np.testing.assert_array_equal(ops.decode_image(data), np.asarray(pil_rgb(data)))


def test_cmyk_jpeg_decodes_to_pil_rgb():
    """Proves: a CMYK JPEG (Adobe-inverted, as PIL writes it) converts to RGB exactly as PIL's convert('RGB')."""
    data = encode(photo_like(200, 300, 8).convert("CMYK"))
    assert ops.image_info(data).channels == 4
    np.testing.assert_array_equal(ops.decode_image(data), np.asarray(pil_rgb(data)))
    np.testing.assert_array_equal(ops.decode_image(data, crop=(10, 20, 50, 60)),
                                  np.asarray(pil_rgb(data))[10:60, 20:80])


def test_cropped_decode_equals_pil_decode_then_crop(jpegs):
    """Proves: decoding only a region (iMCU-aligned skip + crop_scanline) equals PIL's full decode then crop."""
    for h, w, data in jpegs:
        full = np.asarray(pil_rgb(data))
        boxes = [ops.random_resized_crop_box(h, w, 3, 0, i) for i in range(25)]
        boxes += [(0, 0, 1, 1), (h - 1, w - 1, 1, 1), (16, 16, 100, 100), (17, 1, 33, 99), (0, 0, h, w)]
        for top, left, bh, bw in boxes:
            got = ops.decode_image(data, crop=(top, left, bh, bw))
            np.testing.assert_array_equal(got, full[top:top + bh, left:left + bw], err_msg=str((top, left, bh, bw)))


def test_crop_and_resize_without_dct_scaling_equals_pil(jpegs):
    """Proves: crop + resize below the 2x DCT threshold equals PIL's crop().resize(BILINEAR) exactly."""
    checked = 0
    for h, w, data in jpegs:
        im = pil_rgb(data)
        for i in range(30):
            top, left, bh, bw = ops.random_resized_crop_box(h, w, 5, 1, i)
            for size in [(224, 224), (160, 128), (96, 96)]:
                if bh >= 2 * size[0] and bw >= 2 * size[1]:
                    continue  # DCT-scaled: the tolerance test covers it
                ref = np.asarray(im.crop((left, top, left + bw, top + bh)).resize(size[::-1], Image.BILINEAR))
                np.testing.assert_array_equal(ops.decode_image(data, crop=(top, left, bh, bw), size=size), ref)
                checked += 1
    assert checked > 100


def test_dct_scaled_decode_within_tolerance_of_pil_resize():
    """Proves: with DCT-domain downscaling the result is within DCT_MEAN_ABS_TOLERANCE levels (mean abs) of PIL's."""
    diffs = []
    for s in range(8):
        h, w = 300 + 25 * s, 500 - 20 * s
        data = encode(photo_like(h, w, 100 + s))
        im = pil_rgb(data)
        for i in range(12):
            top, left, bh, bw = ops.random_resized_crop_box(h, w, 9, s, i, scale=(0.5, 1.0))
            for size in [(112, 112), (64, 64), (32, 48)]:
                if not (bh >= 2 * size[0] and bw >= 2 * size[1]):
                    continue
                ref = np.asarray(im.crop((left, top, left + bw, top + bh)).resize(size[::-1], Image.BILINEAR))
                got = ops.decode_image(data, crop=(top, left, bh, bw), size=size)
                assert got.shape == ref.shape
                diffs.append(np.abs(got.astype(int) - ref).mean())
    assert len(diffs) > 50
    assert max(diffs) < DCT_MEAN_ABS_TOLERANCE, f"mean abs diffs: mean {np.mean(diffs):.3f}, worst {max(diffs):.3f}"


def test_resize_equals_pil_bilinear():
    """Proves: ops.resize equals PIL's resize(BILINEAR) for up/down/mixed scaling, incl. Pillow 13's pass order."""
    r = np.random.default_rng(0)
    for _ in range(150):
        ih, iw = (int(v) for v in r.integers(1, 200, 2))
        oh, ow = (int(v) for v in r.integers(1, 260, 2))
        a = r.integers(0, 256, (ih, iw, 3), dtype=np.uint8)
        ref = np.asarray(Image.fromarray(a).resize((ow, oh), Image.BILINEAR))
        np.testing.assert_array_equal(ops.resize(a, (oh, ow)), ref, err_msg=str((ih, iw, oh, ow)))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P", "LA"])
def test_png_equals_pil(mode):
    """Proves: PNG decode (libspng, RGB8) equals PIL's convert('RGB') for RGB, RGBA, gray, palette, gray+alpha."""
    im = photo_like(310, 420, 11)
    if mode == "RGBA":
        im = im.copy()
        im.putalpha(Image.fromarray(np.random.default_rng(1).integers(0, 256, (310, 420), dtype=np.uint8)))
    elif mode == "LA":
        im = im.convert("L")
        im.putalpha(128)
    else:
        im = im.convert(mode)
    data = encode(im, "PNG")
    ref = np.asarray(pil_rgb(data))
    np.testing.assert_array_equal(ops.decode_image(data), ref)
    np.testing.assert_array_equal(ops.decode_image(data, crop=(5, 7, 200, 300)), ref[5:205, 7:307])
    assert ops.image_info(data).format == "png"


def test_png_crop_and_resize_equals_pil():
    """Proves: PNG crop + resize equals PIL's crop().resize(BILINEAR) exactly (no DCT path for PNG)."""
    data = encode(photo_like(400, 350, 12), "PNG")
    im = pil_rgb(data)
    for i in range(10):
        top, left, bh, bw = ops.random_resized_crop_box(400, 350, 1, 2, i)
        ref = np.asarray(im.crop((left, top, left + bw, top + bh)).resize((100, 80), Image.BILINEAR))
        np.testing.assert_array_equal(ops.decode_image(data, crop=(top, left, bh, bw), size=(80, 100)), ref)


def test_image_info_reads_headers():
    """Proves: image_info reports height, width, stored channels and format without decoding."""
    data = encode(photo_like(333, 444, 3))
    assert ops.image_info(data) == ops.ImageInfo(333, 444, 3, "jpeg")
    assert ops.image_info(data[: len(data) // 2]).height == 333  # headers only: a truncated body is fine


def torchvision_rule(height, width, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params, restated with a numpy generator."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def reference_boxes(height, width, n):
    try:
        import torch
        from torchvision.transforms import RandomResizedCrop
    except Exception:  # PyPI's torchvision does not import beside torch 2.13.0+cpu here
        rng = np.random.default_rng(1234)
        return [torchvision_rule(height, width, rng) for _ in range(n)], "restated rule"
    torch.manual_seed(1234)
    img = torch.zeros(3, height, width)
    return [tuple(RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))) for _ in range(n)], "torchvision"


@pytest.mark.parametrize("height,width", [(400, 300), (375, 500), (64, 512), (500, 40)])
def test_random_resized_crop_boxes_follow_torchvision_rule(height, width):
    """Proves: RRC boxes stay in the image with area in [0.08, 1] and ratio in [3/4, 4/3] (or the fallback), distributed as torchvision's."""
    n = 20000
    ours = np.array([ops.random_resized_crop_box(height, width, 0, 0, i) for i in range(n)])
    ref_list, source = reference_boxes(height, width, n)
    ref = np.array(ref_list)
    top, left, h, w = ours.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    tries_ok = (h < height) | (w < width) | (abs(w / h - width / height) < 1e-9)
    frac = h * w / (height * width)
    # Rounding the sides moves the area a little outside [0.08, 1] for tiny crops: allow 1 px per side.
    assert (frac[tries_ok] >= 0.08 * (1 - 2 / min(h.min(), w.min())) - 1e-9).all() and (frac <= 1).all()
    # Rounding each side by up to 0.5 px moves w/h by up to (0.5 + 0.5 * 4/3) / h.
    in_range = (w / h >= 3 / 4 - 1.5 / h) & (w / h <= 4 / 3 + 1.5 / h)
    fallback = (top == (height - h) // 2) & (left == (width - w) // 2)
    assert (in_range | fallback).all()
    for ours_col, ref_col, name in [(frac, ref[:, 2] * ref[:, 3] / (height * width), "area"),
                                    (np.log(w / h), np.log(ref[:, 3] / ref[:, 2]), "log ratio"),
                                    ((top + h / 2) / height, (ref[:, 0] + ref[:, 2] / 2) / height, "center y")]:
        qs = np.linspace(0.05, 0.95, 19)
        gap = np.abs(np.quantile(ours_col, qs) - np.quantile(ref_col, qs)).max()
        spread = np.quantile(ref_col, 0.95) - np.quantile(ref_col, 0.05)
        # 3% of the spread, plus a floor for thin images where most draws fall back to one box.
        assert gap < 0.03 * spread + 0.005, f"{name} quantiles differ from {source} by {gap:.4f} (spread {spread:.3f})"
    assert abs(fallback.mean() - np.mean([(t == (height - hh) // 2) and (lf == (width - ww) // 2)
                                          for t, lf, hh, ww in ref_list])) < 0.01


def test_random_resized_crop_fallback_is_clamped_center():
    """Proves: when no try fits (a very thin image), the box is the center crop clamped to the ratio range."""
    boxes = {ops.random_resized_crop_box(20, 1000, 1, 0, i, scale=(0.99, 1.0)) for i in range(50)}
    assert boxes == {(0, (1000 - round(20 * 4 / 3)) // 2, 20, round(20 * 4 / 3))}


def test_same_box_in_two_processes():
    """Proves: (seed, epoch, index) gives the same boxes in a separate process, and different epochs differ."""
    code = ("import sys; from spindle import ops; "
            "print([ops.random_resized_crop_box(375, 500, 42, 3, i) for i in range(200)])")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=None).stdout.strip()
    here = [ops.random_resized_crop_box(375, 500, 42, 3, i) for i in range(200)]
    assert child == str(here)
    assert here != [ops.random_resized_crop_box(375, 500, 42, 4, i) for i in range(200)]
    assert list(reversed(here)) == [ops.random_resized_crop_box(375, 500, 42, 3, i) for i in reversed(range(200))]


def test_center_crop_box_matches_torchvision_and_pads():
    """Proves: center_crop_box uses torchvision's round((H - h) / 2) and, for a crop larger than the image,
    starts at -((h - H) // 2): torchvision's pad-then-crop."""
    assert ops.center_crop_box(375, 500, (224, 224)) == (int(round(151 / 2)), int(round(276 / 2)), 224, 224)
    assert ops.center_crop_box(101, 101, (50, 50)) == (int(round(51 / 2)), int(round(51 / 2)), 50, 50)
    assert ops.center_crop_box(100, 80, (224, 224)) == (-(124 // 2), -(144 // 2), 224, 224)


def test_hflip_and_normalize():
    """Proves: hflip mirrors columns; normalize is (x/255 - mean)/std in HWC and CHW."""
    a = np.random.default_rng(2).integers(0, 256, (31, 17, 3), dtype=np.uint8)
    np.testing.assert_array_equal(ops.hflip(a), a[:, ::-1])
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    ref = (a / 255.0 - np.array(mean)) / np.array(std)
    hwc = ops.normalize(a, mean, std)
    assert hwc.dtype == np.float32 and hwc.shape == (31, 17, 3)
    np.testing.assert_allclose(hwc, ref, rtol=0, atol=2e-6)
    np.testing.assert_allclose(ops.normalize(a, mean, std, chw=True), ref.transpose(2, 0, 1), rtol=0, atol=2e-6)


def bad_inputs():
    good_jpeg = encode(photo_like(300, 300, 5))
    good_png = encode(photo_like(300, 300, 5), "PNG")
    corrupt_header = bytearray(good_jpeg)
    corrupt_header[20:200] = bytes(180)  # zeroes over the quantization/Huffman tables
    bad_crc = bytearray(good_png)
    bad_crc[30] ^= 0xFF  # inside IHDR: its CRC no longer matches
    return {
        "zero-byte": (b"", "empty"),
        "text": (b"hello, this is not an image at all", "not a JPEG, PNG, WebP, TIFF, BMP or PPM/PGM"),
        "jpeg-magic-only": (good_jpeg[:3], "JPEG"),
        "truncated-jpeg-header": (good_jpeg[:100], "JPEG"),
        "truncated-jpeg-body": (good_jpeg[: len(good_jpeg) // 2], "Premature end"),
        "corrupt-jpeg-tables": (bytes(corrupt_header), "JPEG"),
        "truncated-png": (good_png[: len(good_png) // 2], "PNG"),
        "png-bad-crc": (bytes(bad_crc), "PNG"),
        "png-magic-only": (good_png[:8], "PNG"),
    }


@pytest.mark.parametrize("name", list(bad_inputs()))
def test_bad_input_raises_decode_error(name, capfd):
    """Proves: truncated/corrupt/empty/non-image bytes raise DecodeError (a ValueError) naming the problem, print nothing."""
    data, words = bad_inputs()[name]
    with pytest.raises(DecodeError, match=words) as info:
        ops.decode_image(data, size=(64, 64))
    assert isinstance(info.value, ValueError) and isinstance(info.value, SpindleError)
    if name not in ("truncated-jpeg-body", "truncated-png", "png-bad-crc"):  # probe reads intact headers only
        with pytest.raises(DecodeError):
            ops.image_info(data)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_misuse_raises_value_error(jpegs):
    """Proves: an empty crop or a zero size is the caller's mistake: ValueError, not DecodeError."""
    h, w, data = jpegs[0]
    with pytest.raises(ValueError, match="is empty"):
        ops.decode_image(data, crop=(h - 10, 0, 0, 20))
    with pytest.raises(ValueError, match="must be positive"):
        ops.decode_image(data, size=(0, 10))
    with pytest.raises(ValueError):
        ops.resize(np.zeros((4, 4), np.uint8), (2, 2))


def test_ops_start_no_threads():
    """Proves: decoding (JPEG and PNG), resizing and normalizing start no thread in the calling process."""
    code = """
import io, os, numpy as np
from PIL import Image
from spindle import ops
def threads():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
a = (np.arange(300 * 400 * 3) % 251).astype(np.uint8).reshape(300, 400, 3)
jpeg, png = io.BytesIO(), io.BytesIO()
Image.fromarray(a).save(jpeg, "JPEG", quality=90); Image.fromarray(a).save(png, "PNG")
before = threads()
for i in range(20):
    box = ops.random_resized_crop_box(300, 400, 0, 0, i)
    img = ops.decode_image(jpeg.getvalue(), crop=box, size=(224, 224))
    ops.decode_image(png.getvalue(), crop=box, size=(64, 64))
    ops.normalize(ops.hflip(ops.resize(img, (100, 90))), [0.5] * 3, [0.25] * 3, chw=True)
print(before, threads())
"""
    env = {**__import__("os").environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    before, after = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                   env=env).stdout.split()
    assert before == after
