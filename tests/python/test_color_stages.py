"""The colour stages in native pipelines: .color_jitter(...) and .random_grayscale(p)
give, per sample, what spindle.ops gives for the same (seed, epoch, sample) draw, in
both modes, and their arguments are checked at the call with torchvision's rules."""

from __future__ import annotations

import io

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import spindle  # noqa: E402
from spindle import ops  # noqa: E402
from spindle import pipeline as sp  # noqa: E402

SIDE = 24
SEED = 11


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("colour")
    r = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir()
        for k in range(5):
            y, x = np.mgrid[0:SIDE, 0:SIDE]
            a = np.stack([x * 10 % 256, y * 10 % 256, (x + y + 40 * k) % 256], -1)
            a = np.clip(a + r.integers(-30, 31, a.shape), 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, "PNG")
            (root / f"c{c}" / f"{k}.png").write_bytes(buf.getvalue())
    return root


def originals(folder) -> list[np.ndarray]:
    f = spindle.ImageFolder(str(folder))
    return [np.asarray(Image.open(f.path(i)).convert("RGB")) for i in range(len(f))]


def run(pipe, mode: str) -> np.ndarray:
    return np.concatenate([b["image"] for b in spindle.PipelineLoader(pipe, num_workers=2, mode=mode, seed=SEED)])


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_color_jitter_stage_equals_ops_color_jitter_per_sample(folder, mode):
    """Proves: .color_jitter(0.4, 0.4, 0.4, 0.1) gives each sample ops.color_jitter's pixels for the draw
    (seed, epoch 0, sample index), in both modes (so the two modes agree bit for bit)."""
    pipe = sp.image_folder(folder).decode().center_crop(SIDE).color_jitter(0.4, 0.4, 0.4, 0.1).batch(3)
    got = run(pipe, mode)
    for i, a in enumerate(originals(folder)):
        assert np.array_equal(got[i], ops.color_jitter(a, SEED, 0, i, 0.4, 0.4, 0.4, 0.1)), i


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_random_grayscale_stage_equals_ops_random_grayscale_per_sample(folder, mode):
    """Proves: .random_grayscale(0.5) converts exactly the samples ops.random_grayscale does for the same draw
    (some but not all of 10), to rgb_to_grayscale's pixels."""
    got = run(sp.image_folder(folder).decode().center_crop(SIDE).random_grayscale(0.5).batch(4), mode)
    applied = 0
    for i, a in enumerate(originals(folder)):
        want, done = ops.random_grayscale(a, 0.5, SEED, 0, i)
        assert np.array_equal(got[i], want), i
        applied += done
    assert 0 < applied < 10


def test_the_imagenet_colour_recipe_runs_in_both_modes_with_the_same_bytes(folder):
    """Proves: decode + random_resized_crop + flip + color_jitter + random_grayscale (the bench's recipe) gives
    the same batches in processes and threads mode, and resize((h, w)) makes non-square images."""
    pipe = (sp.image_folder(folder).decode().random_resized_crop(16).random_flip()
            .color_jitter(0.4, 0.4, 0.4, 0.1).random_grayscale(0.1).resize((12, 20)).batch(5))
    a, b = run(pipe, "processes"), run(pipe, "threads")
    assert a.shape == (10, 12, 20, 3)
    assert np.array_equal(a, b)


def test_colour_stage_arguments_are_checked_at_the_call():
    """Proves: bad ColorJitter/RandomGrayscale arguments raise when the builder method is called, with
    torchvision's rules (negative number, range out of bounds, hue outside [-0.5, 0.5], p outside [0, 1])."""
    base = sp.image_folder(".")
    with pytest.raises(ValueError, match="non negative"):
        base.color_jitter(brightness=-0.2)
    with pytest.raises(ValueError, match="should be between"):
        base.color_jitter(saturation=(2.0, 1.0))
    with pytest.raises(ValueError, match="hue"):
        base.color_jitter(hue=0.7)
    with pytest.raises(TypeError, match="color_jitter contrast"):
        base.color_jitter(contrast="a lot")
    with pytest.raises(ValueError, match="random_grayscale p"):
        base.random_grayscale(1.5)
