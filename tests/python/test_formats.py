"""image_folder takes torchvision's IMG_EXTENSIONS and decodes each format to PIL's
``Image.open(f).convert("RGB")`` pixels: exactly for JPEG and every lossless file,
within LOSSY_WEBP_MAX_ABS for lossy WebP (Pillow bundles its own libwebp build);
files no decoder reads fail naming the file and the decoder's message."""

from __future__ import annotations

import io

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import spindle  # noqa: E402
from spindle import ops  # noqa: E402
from spindle import pipeline as sp  # noqa: E402
from spindle.errors import DecodeError  # noqa: E402

# torchvision.datasets.folder.IMG_EXTENSIONS (torchvision 0.29).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Lossy WebP: Pillow's wheel and Debian's libwebp may differ in the YUV->RGB step.
LOSSY_WEBP_MAX_ABS = 3
SIDE = 32


def picture(seed: int, mode: str = "RGB") -> Image.Image:
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    a = np.stack([(x * 8) % 256, (y * 8) % 256, (x * y + seed * 40) % 256], -1).astype(np.int64)
    a = np.clip(a + r.integers(-20, 21, a.shape), 0, 255).astype(np.uint8)
    im = Image.fromarray(a)
    if mode == "RGBA":
        return Image.fromarray(np.dstack([a, ((x + y) * 4 % 256).astype(np.uint8)]), "RGBA")
    return im.convert(mode)


def encoded(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


# (file name, bytes, exact): one or more variants per extension, mixed case as torchvision allows.
def variants() -> list[tuple[str, bytes, bool]]:
    return [
        ("a.jpg", encoded(picture(1), "JPEG", quality=90), True),
        ("b.JPEG", encoded(picture(2, "L"), "JPEG", quality=90), True),
        ("c.png", encoded(picture(3, "RGBA"), "PNG"), True),
        ("d.ppm", encoded(picture(4), "PPM"), True),
        ("e.pgm", encoded(picture(5, "L"), "PPM"), True),
        ("f.bmp", encoded(picture(6), "BMP"), True),
        ("g.BMP", encoded(picture(7, "P"), "BMP"), True),
        ("h.bmp", encoded(picture(8, "L"), "BMP"), True),
        ("i.tif", encoded(picture(9), "TIFF"), True),
        ("j.tiff", encoded(picture(10), "TIFF", compression="tiff_lzw"), True),
        ("k.TIF", encoded(picture(11, "RGBA"), "TIFF", compression="tiff_adobe_deflate"), True),
        ("l.tiff", encoded(picture(12, "L"), "TIFF"), True),
        ("m.tif", encoded(picture(13, "P"), "TIFF"), True),
        ("n.tiff", encoded(picture(14, "1"), "TIFF"), True),
        ("o.webp", encoded(picture(15), "WEBP", lossless=True), True),
        ("p.WebP", encoded(picture(16, "RGBA"), "WEBP", lossless=True), True),
        ("q.webp", encoded(picture(17), "WEBP", quality=80), False),
    ]


def pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def check_equal(name: str, got: np.ndarray, want: np.ndarray, exact: bool) -> None:
    assert got.shape == want.shape, name
    diff = int(np.abs(got.astype(int) - want.astype(int)).max())
    assert diff <= (0 if exact else LOSSY_WEBP_MAX_ABS), f"{name}: max abs difference {diff}"


def test_every_img_extension_decodes_to_pils_convert_rgb():
    """Proves: each IMG_EXTENSIONS format (several modes each) decodes to PIL's convert("RGB"): lossless exactly."""
    covered = set()
    for name, data, exact in variants():
        covered.add("." + name.rsplit(".", 1)[1].lower())
        check_equal(name, ops.decode_image(data), pil_rgb(data), exact)
    assert covered == set(IMG_EXTENSIONS)


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    for k, (name, data, _) in enumerate(variants()):
        (root / f"class{k % 3}").mkdir(exist_ok=True)
        (root / f"class{k % 3}" / name).write_bytes(data)
    (root / "class0" / "notes.txt").write_text("not a sample (not in IMG_EXTENSIONS)")
    return root


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_image_folder_lists_and_decodes_every_format_like_torchvision(mixed_folder, mode):
    """Proves: image_folder lists every IMG_EXTENSIONS file in torchvision's order (no format dropped) and the
    pipeline's pixels equal PIL's convert("RGB") of each file, in both modes."""
    folder = spindle.ImageFolder(str(mixed_folder))
    want_paths = sorted(str(p) for p in mixed_folder.rglob("*") if p.suffix.lower() in IMG_EXTENSIONS)
    assert len(folder) == len(variants()) == len(want_paths)
    assert sorted(folder.path(i) for i in range(len(folder))) == want_paths
    exact = {name: e for name, _, e in variants()}
    pipe = sp.image_folder(mixed_folder).decode().center_crop(SIDE).batch(4)
    images = np.concatenate([b["image"] for b in spindle.PipelineLoader(pipe, num_workers=2, mode=mode)])
    for i in range(len(folder)):
        path = folder.path(i)
        with open(path, "rb") as f:
            check_equal(path, images[i], pil_rgb(f.read()), exact[path.rsplit("/", 1)[1]])


def broken_files() -> dict[str, bytes]:
    """Per format: a truncated file and one with corrupt bytes; plus variants no decoder here reads."""
    out = {}
    for name, data, _ in variants():
        ext = name.rsplit(".", 1)[1]
        out[f"trunc_{name[0]}.{ext}"] = data[: len(data) // 2]
        out[f"bad_{name[0]}.{ext}"] = data[:16] + bytes(range(256)) * 2
    out["plain.ppm"] = b"P3\n2 1\n255\n0 0 0 255 255 255\n"
    out["wide.pgm"] = encoded(Image.fromarray(np.full((4, 4), 40000, np.uint16)).convert("I;16"), "PPM")
    out["anim.webp"] = encoded(picture(1), "WEBP", save_all=True, append_images=[picture(2)], lossless=True)
    out["gif_inside.bmp"] = encoded(picture(1), "GIF")
    return out


@pytest.fixture(scope="module")
def broken_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("broken_formats")
    (root / "bad").mkdir()
    for name, data in broken_files().items():
        (root / "bad" / name).write_bytes(data)
    (root / "good").mkdir()
    (root / "good" / "ok.png").write_bytes(encoded(picture(0), "PNG"))
    return root


def test_each_corrupt_or_unsupported_file_fails_naming_the_file_and_the_decoder(broken_folder):
    """Proves: every truncated, corrupt or unsupported file of each format raises DecodeError naming the file
    and the decoding library's own message (or what is read instead)."""
    for name, data in broken_files().items():
        with pytest.raises(DecodeError) as info:
            ops.decode_image(data)
        assert "cannot decode" in str(info.value), name
    pipe = sp.image_folder(broken_folder).decode().center_crop(SIDE).batch(1)
    it = iter(spindle.PipelineLoader(pipe, num_workers=2))
    messages = []
    while True:
        try:
            next(it)
        except StopIteration:
            break
        except DecodeError as e:
            messages.append(str(e))
    assert len(messages) == len(broken_files()), messages
    for name in broken_files():
        (hit,) = [m for m in messages if f"/{name}" in m]
        assert any(lib in hit for lib in ("libjpeg", "libspng", "PNG", "JPEG", "libwebp", "libtiff", "stb_image",
                                          "truncated", "plain text", "maxval", "animated")), hit


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_skip_mode_counts_every_undecodable_file(broken_folder, mode):
    """Proves: on_error("skip") skips each undecodable file of any format and counts every one."""
    n_bad = len(broken_files())
    pipe = sp.image_folder(broken_folder).decode().center_crop(SIDE).batch(n_bad + 1).on_error("skip", max_ratio=0.01)
    with pytest.raises(spindle.SpindleError, match=rf"{n_bad} of {n_bad + 1} samples could not be read"):
        with pytest.warns(RuntimeWarning):
            list(spindle.PipelineLoader(pipe, num_workers=1, mode=mode))
