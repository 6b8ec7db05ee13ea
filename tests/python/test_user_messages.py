"""What a user reads when a file is bad: the file's name, every skipped file, no C++ source locations."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import spindle
from spindle import pipeline as sp

SOURCE_LOCATION = re.compile(r"\[[\w/]+\.(cpp|hpp|h):\d+\]|runtime/src/")


@pytest.fixture
def folder(tmp_path):
    """2 classes x 3 good JPEGs, and `bad` broken files (truncated, empty, text) spread over the classes."""
    Image = pytest.importorskip("PIL.Image")
    root = tmp_path / "images"
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for k in range(3):
            Image.fromarray(np.full((24, 24, 3), 40 * k, np.uint8)).save(root / c / f"good{k}.jpg", quality=90)
    good = (root / "cat" / "good0.jpg").read_bytes()

    def add_bad(n):
        names = []
        for k in range(n):
            path = root / ("cat", "dog")[k % 2] / f"bad{k:02}.jpg"
            path.write_bytes((good[:len(good) // 3], b"", b"not an image\n" * 5)[k % 3])
            names.append(path.name)
        return names
    return root, add_bad


def test_a_decode_error_names_the_file_and_no_source_location(folder):
    """Proves: a bad file fails its batch with a DecodeError naming the file, and neither its str nor its
    notes carry a C++ source location ([runtime/src/...cpp:N])."""
    root, add_bad = folder
    add_bad(1)
    with pytest.raises(spindle.DecodeError) as caught:
        for _ in spindle.PipelineLoader(sp.image_folder(root).decode().center_crop(16).batch(16), num_workers=1):
            pass
    text = "\n".join([str(caught.value), *getattr(caught.value, "__notes__", [])])
    assert "bad00.jpg" in text, text
    assert not SOURCE_LOCATION.search(text), text


@pytest.mark.parametrize("mode", ["processes", "threads"])
@pytest.mark.parametrize("bad,listed", [(3, 3), (11, 8)])
def test_skip_warning_names_every_skipped_file_or_the_first_eight_and_a_count(folder, bad, listed, mode):
    """Proves: with on_error='skip' (processes and threads), the warning for a batch names each skipped
    file (3 of 3), or the first 8 and how many more (11: 8 named, 'and 3 more'), with no source location."""
    root, add_bad = folder
    names = add_bad(bad)
    pipe = sp.image_folder(root).decode().center_crop(16).batch(32).on_error("skip", max_ratio=0.99)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        batches = list(spindle.PipelineLoader(pipe, num_workers=1, mode=mode))
    assert len(batches) == 1 and len(batches[0]["label"]) == 6 + bad
    texts = [str(w.message) for w in seen if "skipped" in str(w.message)]
    assert len(texts) == 1, texts
    text = texts[0]
    assert f"skipped {bad} unreadable sample(s)" in text, text
    assert sum(name in text for name in names) == listed, text
    assert (f"and {bad - listed} more" in text) == (bad > listed), text
    assert not SOURCE_LOCATION.search(text), text
