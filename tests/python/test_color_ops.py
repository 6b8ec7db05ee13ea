"""ColorJitter and RandomGrayscale against torchvision's formulas and PIL.

torchvision is not installed by `make test` (its wheel needs another torch), so the
reference here is torchvision.transforms.v2.functional's uint8-tensor formulas
written out in numpy float32 (tv_* below, step for step), plus PIL's ImageEnhance /
HSV versions that torchvision applies to PIL images (the torch+PIL peer's path).
bench/python/color_vs_torchvision.py runs the same comparison against torchvision
itself (docs/ops.md has its numbers).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageEnhance  # noqa: E402

from spindle import ops  # noqa: E402

F32 = np.float32
# Largest |spindle - reference| per op, in levels of 255. vs torchvision's formulas: only
# float32 summation order differs (the contrast mean). vs PIL: PIL's rounded 8-bit gray
# (299/587/114) and integer mean, and its HSV in 8 bits for hue.
TV_MAX_ABS = 1
PIL_MAX_ABS = {"brightness": 0, "contrast": 2, "saturation": 2, "hue": 16, "grayscale": 1}
PIL_MEAN_ABS = {"hue": 2.0}  # hue: PIL's 8-bit HSV round trip, 1.55 levels on average at worst here


def photo(seed: int, h: int = 48, w: int = 64) -> np.ndarray:
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([128 + 100 * np.sin(x / 7 + seed), 128 + 90 * np.cos(y / 5), (x * y) % 256], -1)
    return np.clip(a + r.normal(0, 12, a.shape), 0, 255).astype(np.uint8)


# ---- torchvision.transforms.v2.functional, uint8 tensors, in numpy float32 ----------

def tv_gray(a: np.ndarray) -> np.ndarray:
    r, g, b = (a[..., k].astype(F32) for k in range(3))
    return np.floor(r * F32(0.2989) + g * F32(0.587) + b * F32(0.114))


def tv_to_u8(v: np.ndarray) -> np.ndarray:
    return np.clip(v, 0, 255).astype(np.uint8)


def tv_blend(a: np.ndarray, other, ratio: float) -> np.ndarray:
    return tv_to_u8(a.astype(F32) * F32(ratio) + np.asarray(other, F32) * F32(1.0 - ratio))


def tv_brightness(a, f):
    return tv_to_u8(a.astype(F32) * F32(f))


def tv_contrast(a, f):
    return tv_blend(a, F32(tv_gray(a).mean(dtype=np.float64)), f)


def tv_saturation(a, f):
    return tv_blend(a, tv_gray(a)[..., None], f)


def tv_hue(a, f):
    img = a.astype(F32) * F32(1.0 / 255.0)
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    maxc, minc = img.max(-1), img.min(-1)
    eqc = maxc == minc
    cr = maxc - minc
    ones = np.ones_like(maxc)
    s = cr / np.where(eqc, ones, maxc)
    div = np.where(eqc, ones, cr)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    hr = (bc - gc) * (maxc == r)
    hg = (rc + F32(2.0) - bc) * ((maxc == g) & (maxc != r))
    hb = (gc + F32(4.0) - rc) * ((maxc != g) & (maxc != r))
    h = np.fmod((hr + hg + hb) * F32(1.0 / 6.0) + F32(1.0), F32(1.0))
    h = h + F32(f)
    h = h - np.floor(h)
    h6 = h * F32(6)
    i = np.floor(h6)
    fr = h6 - i
    i = i.astype(np.int32) % 6
    v = maxc
    sxf = s * fr
    q = np.clip((F32(1) - sxf) * v, 0, 1)
    t = np.clip((sxf + (F32(1) - s)) * v, 0, 1)
    p = np.clip((F32(1) - s) * v, 0, 1)
    vpqt = np.stack([v, p, q, t], -1)
    select = np.array([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])
    out = np.stack([np.take_along_axis(vpqt, select[c][i][..., None], -1)[..., 0] for c in range(3)], -1)
    return (out * F32(255.0 + 1.0 - 1e-3)).astype(np.uint8)


def tv_grayscale(a):
    return np.repeat(tv_gray(a).astype(np.uint8)[..., None], 3, -1)


# ---- PIL (torchvision.transforms.functional on PIL images) ----------------------------

def pil_hue(a, f):
    h, s, v = Image.fromarray(a).convert("HSV").split()
    np_h = np.array(h, dtype=np.uint8)
    with np.errstate(over="ignore"):
        np_h += np.int8(f * 255).view(np.uint8)  # torchvision's F_pil.adjust_hue: wraps around, as intended
    return np.asarray(Image.merge("HSV", (Image.fromarray(np_h, "L"), s, v)).convert("RGB"))


PIL_REF = {
    "brightness": lambda a, f: np.asarray(ImageEnhance.Brightness(Image.fromarray(a)).enhance(f)),
    "contrast": lambda a, f: np.asarray(ImageEnhance.Contrast(Image.fromarray(a)).enhance(f)),
    "saturation": lambda a, f: np.asarray(ImageEnhance.Color(Image.fromarray(a)).enhance(f)),
    "hue": pil_hue,
}
TV_REF = {"brightness": tv_brightness, "contrast": tv_contrast, "saturation": tv_saturation, "hue": tv_hue}
OURS = {"brightness": ops.adjust_brightness, "contrast": ops.adjust_contrast,
        "saturation": ops.adjust_saturation, "hue": ops.adjust_hue}
FACTORS = {"brightness": [0.0, 0.6, 1.0, 1.37, 2.5], "contrast": [0.0, 0.6, 1.0, 1.4, 3.0],
           "saturation": [0.0, 0.6, 1.0, 1.4, 3.0], "hue": [-0.5, -0.1, -0.013, 0.0, 0.07, 0.1, 0.5]}


def diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
    return np.abs(a.astype(int) - b.astype(int))


@pytest.mark.parametrize("op", list(OURS))
def test_each_adjustment_equals_torchvisions_formula_and_is_close_to_pil(op):
    """Proves: adjust_<op> at fixed factors is within TV_MAX_ABS of torchvision's uint8 formula (>= 99.9% of
    values equal) and within PIL_MAX_ABS[op] of PIL's version (mean within PIL_MEAN_ABS for hue)."""
    for seed, f in itertools.product(range(3), FACTORS[op]):
        a = photo(seed)
        ours = OURS[op](a, f)
        d_tv = diff(ours, TV_REF[op](a, f))
        assert d_tv.max() <= TV_MAX_ABS and (d_tv == 0).mean() >= 0.999, (op, f, d_tv.max(), (d_tv == 0).mean())
        d_pil = diff(ours, PIL_REF[op](a, f))
        assert d_pil.max() <= PIL_MAX_ABS[op], (op, f, d_pil.max())
        assert d_pil.mean() <= PIL_MEAN_ABS.get(op, 1.0), (op, f, d_pil.mean())


def test_grayscale_equals_torchvisions_formula_and_pils_l_within_one():
    """Proves: rgb_to_grayscale is torchvision's floored 0.2989/0.587/0.114 gray in 3 equal channels (exactly),
    within one level of PIL's convert("L").convert("RGB")."""
    for seed in range(3):
        a = photo(seed)
        g = ops.rgb_to_grayscale(a)
        assert np.array_equal(g, tv_grayscale(a))
        assert diff(g, np.asarray(Image.fromarray(a).convert("L").convert("RGB"))).max() <= PIL_MAX_ABS["grayscale"]


def test_color_jitter_applies_its_draw_in_the_drawn_order():
    """Proves: color_jitter equals the four tv_* formulas applied in color_jitter_draw's order with its factors."""
    a = photo(7)
    for index in range(12):
        order, *factors = ops.color_jitter_draw(1, 0, index, 0.4, 0.4, 0.4, 0.1)
        want = a
        for k in order:
            want = TV_REF[["brightness", "contrast", "saturation", "hue"][k]](want, factors[k])
        got = ops.color_jitter(a, 1, 0, index, 0.4, 0.4, 0.4, 0.1)
        assert diff(got, want).max() <= TV_MAX_ABS, (index, order)


def ks_uniform(xs: np.ndarray, lo: float, hi: float) -> float:
    """Kolmogorov-Smirnov statistic of xs against U(lo, hi)."""
    u = np.sort((xs - lo) / (hi - lo))
    n = len(u)
    return float(max((np.arange(1, n + 1) / n - u).max(), (u - np.arange(n) / n).max()))


def test_color_jitter_draws_follow_the_ranges_and_every_order_is_equally_likely():
    """Proves: over 4800 samples, factors lie in torchvision's ranges (a number v: [max(0, 1 - v), 1 + v], hue
    [-v, v]; a pair as given) and are uniform there (KS test at p = 0.001), the 24 orders are uniform
    (chi-square at p = 0.001), and an identity range draws nothing (None), as torchvision's get_params."""
    n = 4800
    draws = [ops.color_jitter_draw(3, 1, i, 0.4, (0.5, 1.5), 1.5, (-0.2, 0.05)) for i in range(n)]
    ranges = [(0.6, 1.4), (0.5, 1.5), (0.0, 2.5), (-0.2, 0.05)]
    for k, (lo, hi) in enumerate(ranges):
        xs = np.array([d[1 + k] for d in draws])
        assert xs.min() >= lo and xs.max() < hi, k
        assert ks_uniform(xs, lo, hi) < 1.95 / math.sqrt(n), k  # 1.95: KS critical value at p = 0.001
    counts = np.zeros(24)
    perms = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    for d in draws:
        counts[perms[tuple(d[0])]] += 1
    chi2 = float(((counts - n / 24) ** 2 / (n / 24)).sum())
    assert chi2 < 49.7, counts  # chi-square, 23 degrees of freedom, p = 0.001
    order, b, c, s, h = ops.color_jitter_draw(0, 0, 0, 0, (1, 1), 0.0, 0)
    assert (b, c, s, h) == (None, None, None, None)
    assert sorted(order) == [0, 1, 2, 3]


def test_random_grayscale_applies_with_probability_p():
    """Proves: random_grayscale(p=0.1) converts a binomial(0.1) share of 4000 samples (within 4 sigma), each
    converted one equal to rgb_to_grayscale, the rest untouched; p=0 and p=1 never/always."""
    a = photo(1, 8, 8)
    n, p = 4000, 0.1
    applied = 0
    for i in range(n):
        out, done = ops.random_grayscale(a, p, 5, 0, i)
        assert np.array_equal(out, ops.rgb_to_grayscale(a) if done else a)
        applied += done
    assert abs(applied - n * p) < 4 * math.sqrt(n * p * (1 - p)), applied
    assert not any(ops.random_grayscale(a, 0.0, 5, 0, i)[1] for i in range(50))
    assert all(ops.random_grayscale(a, 1.0, 5, 0, i)[1] for i in range(50))


def test_bad_factors_raise_torchvisions_errors():
    """Proves: a negative number, a range outside the bounds and a hue factor outside [-0.5, 0.5] are ValueErrors."""
    a = photo(0, 4, 4)
    with pytest.raises(ValueError, match="non negative"):
        ops.color_jitter_draw(0, 0, 0, brightness=-0.1)
    with pytest.raises(ValueError, match="should be between"):
        ops.color_jitter_draw(0, 0, 0, contrast=(1.5, 0.5))
    with pytest.raises(ValueError, match=r"hue values should be between \(-0.5, 0.5\)"):
        ops.color_jitter_draw(0, 0, 0, hue=0.6)
    with pytest.raises(ValueError, match="not in"):
        ops.adjust_hue(a, 0.7)
    with pytest.raises(ValueError, match="not non-negative"):
        ops.adjust_saturation(a, -1.0)
    with pytest.raises(ValueError, match="RGB"):
        ops.adjust_brightness(a[..., :1], 1.0)
