"""Native pipelines as stages: the builder's argument checks, the stage order, and WebDataset
members kept as variable-length byte fields (captions, JSON) through both modes."""

import io
import json
import tarfile

import numpy as np
import pytest

import spindle
from spindle import pipeline as sp

PIL = pytest.importorskip("PIL.Image")


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def caption_shards(tmp_path_factory):
    """4 shards x 7 samples: key.jpg, key.txt (a caption of 0-300 bytes, some non-ASCII),
    key.json ({"label": n, "id": key})."""
    root = tmp_path_factory.mktemp("wds-captions")
    rng = np.random.default_rng(1)
    shards, expected = [], {}
    for s in range(4):
        path = root / f"shard-{s}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(7):
                key = f"s{s}k{k}"
                h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
                img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                buf = io.BytesIO()
                PIL.fromarray(img).save(buf, format="JPEG", quality=90)
                caption = ("a photo ünd " * int(rng.integers(0, 25)))[: int(rng.integers(0, 300))].encode()
                meta = json.dumps({"label": s * 7 + k, "id": key}).encode()
                _add(tar, f"{key}.jpg", buf.getvalue())
                _add(tar, f"{key}.txt", caption)
                _add(tar, f"{key}.json", meta)
                expected[s * 7 + k] = (caption, meta)
        shards.append(str(path))
    return shards, expected


def _samples(loader):
    """[(label, image bytes, txt, json)] of one epoch, in delivery order."""
    out = []
    for b in loader:
        assert len(b["txt"]) == len(b["label"]) == len(b["json"])
        for i in range(len(b["label"])):
            out.append((int(b["label"][i]), b["image"][i].tobytes(), b["txt"][i], b["json"][i]))
    return out


def test_kept_members_come_through_both_modes_and_any_worker_count_bit_for_bit(caption_shards):
    """Proves: keep=("txt", "json") gives each sample its own members' bytes exactly, the same
    batches in processes and threads mode for 1, 2 and 3 workers, and the same samples whatever
    the worker count."""
    shards, expected = caption_shards
    pipe = sp.webdataset(shards, keep=("txt", "json")).decode().random_resized_crop(24).random_flip().batch(5)
    per_count = {}
    for workers in (1, 2, 3):
        got = {mode: _samples(spindle.PipelineLoader(pipe, num_workers=workers, seed=4, mode=mode))
               for mode in ("processes", "threads")}
        assert got["processes"] == got["threads"], f"{workers} workers: the modes differ"
        per_count[workers] = sorted(got["threads"])
    assert per_count[1] == per_count[2] == per_count[3]
    samples = per_count[1]
    assert [label for label, *_ in samples] == list(range(28))
    for label, _, txt, meta in samples:
        assert (txt, meta) == expected[label]
    assert any(txt == b"" for _, _, txt, _ in samples) or len({len(t) for _, _, t, _ in samples}) > 5


def test_byte_fields_as_arrays_are_values_and_offsets_over_the_slot(caption_shards):
    """Proves: byte_fields="arrays" gives (values uint8, offsets uint64 [n + 1]) whose rows are
    exactly the list form's bytes."""
    shards, _ = caption_shards
    pipe = sp.webdataset(shards[:1], keep="txt").decode().center_crop(16).batch(4)
    lists = [b["txt"] for b in spindle.PipelineLoader(pipe, num_workers=1)]
    for b, listed in zip(spindle.PipelineLoader(pipe, num_workers=1, byte_fields="arrays"), lists):
        values, offsets = b["txt"]
        assert values.dtype == np.uint8 and offsets.dtype == np.uint64
        assert len(offsets) == len(b["label"]) + 1 and offsets[0] == 0
        assert [values[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)] == listed


def _shard_without(tmp_path, missing_key):
    path = tmp_path / "partial.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for k in range(6):
            buf = io.BytesIO()
            PIL.fromarray(np.full((20, 20, 3), k * 40, np.uint8)).save(buf, format="PNG")
            _add(tar, f"k{k}.png", buf.getvalue())
            _add(tar, f"k{k}.cls", str(k).encode())
            if f"k{k}" != missing_key:
                _add(tar, f"k{k}.txt", f"caption {k}".encode())
    return str(path)


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_a_missing_kept_member_names_the_shard_and_key_and_skip_counts_it(tmp_path, mode):
    """Proves: a sample without a kept member fails naming the shard and key (DataError with
    path and key); with on_error("skip") it is dropped from the stream and counted."""
    shard = _shard_without(tmp_path, "k3")
    pipe = sp.webdataset(shard, keep=("txt",)).decode().center_crop(8).batch(2)
    with pytest.raises(spindle.DataError, match=r"k3 has no 'txt' member") as err:
        list(spindle.PipelineLoader(pipe, num_workers=1, mode=mode))
    assert err.value.path == shard and err.value.key == "k3"
    skipping = pipe.on_error("skip", max_ratio=0.5)
    with pytest.warns(RuntimeWarning, match=r"skipped 1 unreadable sample.*k3 has no 'txt' member"):
        batches = list(spindle.PipelineLoader(skipping, num_workers=1, mode=mode))
    kept = [(int(label), txt) for b in batches for label, txt in zip(b["label"], b["txt"])]
    assert kept == [(k, f"caption {k}".encode()) for k in (0, 1, 2, 4, 5)]


def test_captions_larger_than_the_slot_fail_naming_the_sample_and_the_size_to_set(caption_shards):
    """Proves: a batch whose captions exceed bytes_per_sample x batch_size fails (never cut),
    naming the field, a sample and the bytes_per_sample that fits; that value then works."""
    shards, _ = caption_shards
    pipe = sp.webdataset(shards[:1], keep="txt").decode().center_crop(8)
    with pytest.raises(spindle.SpindleError, match=r"'txt' fields of a batch of 7 samples take \d+ bytes.*"
                                                   r"s0k\d is the first that does not fit\. Set bytes_per_sample "
                                                   r"to at least (\d+)") as err:
        list(spindle.PipelineLoader(pipe.batch(7, bytes_per_sample=1), num_workers=1))
    fits = int(str(err.value).split("to at least ")[1].split()[0].rstrip("."))
    assert len(list(spindle.PipelineLoader(pipe.batch(7, bytes_per_sample=fits), num_workers=1))) == 1


def test_stages_run_in_the_order_called(tmp_path):
    """Proves: the builder's stages run in call order (flip before or after a non-central crop
    differ), where the old fixed recipe ran them in one order."""
    images = np.arange(2 * 12 * 16 * 3, dtype=np.uint8).reshape(2, 12, 16, 3)
    np.save(tmp_path / "a.npy", images)
    base = sp.arrays(tmp_path / "a.npy")
    crop_then_flip = next(iter(spindle.PipelineLoader(base.center_crop((12, 10)).random_flip(1.0).batch(2), 1)))
    resize_then_crop = next(iter(spindle.PipelineLoader(base.resize((6, 8)).center_crop(4).batch(2), 1)))
    np.testing.assert_array_equal(crop_then_flip["image"], images[:, :, 3:13][:, :, ::-1])
    assert resize_then_crop["image"].shape == (2, 4, 4, 3)


@pytest.mark.parametrize("build, message", [
    (lambda p: p.center_crop(8).decode(), r"stage 0 \(center_crop\) needs decoded pixels: add decode\(\) before it"),
    (lambda p: p.decode().center_crop(8).normalize((0, 0, 0), (1, 1, 1)).random_flip(),
     r"stage 3 \(random_flip\) comes after normalize\(\)"),
    (lambda p: p.decode().resize(32), r"same size to be batched"),
    (lambda p: p.decode().decode().center_crop(8), r"stage 1 \(decode\)"),
    (lambda p: p, r"add decode\(\) after the source"),
])
def test_stage_order_errors_name_the_stage(tmp_path, build, message):
    """Proves: a stage list in an order that cannot run is refused when the loader is made (before
    any sample is read), naming the stage and the fix."""
    (tmp_path / "c").mkdir()
    PIL.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "c" / "a.png")
    with pytest.raises(ValueError, match=message):
        spindle.PipelineLoader(build(sp.image_folder(tmp_path)).batch(1), num_workers=1)


P = sp.image_folder("root")


@pytest.mark.parametrize("call, error, message", [
    (lambda: P.batch("8"), TypeError, r"batch_size must be an int, not '8'"),
    (lambda: P.batch(0), ValueError, r"batch_size must be >= 1, not 0"),
    (lambda: P.batch(True), TypeError, r"batch_size must be an int, not True"),
    (lambda: P.batch(4, drop_last="yes"), TypeError, r"drop_last must be a bool"),
    (lambda: P.batch(4, bytes_per_sample=0), ValueError, r"bytes_per_sample must be >= 1"),
    (lambda: P.random_resized_crop(0), ValueError, r"random_resized_crop size must be >= 1, not 0"),
    (lambda: P.random_resized_crop("224"), TypeError, r"random_resized_crop size must be an int or a \(height, "),
    (lambda: P.random_resized_crop(224, scale=(0.5, 0.1)), ValueError, r"scale must satisfy 0 < min <= max <= 1"),
    (lambda: P.random_resized_crop(224, ratio=(0, 1)), ValueError, r"ratio must satisfy 0 < min <= max"),
    (lambda: P.random_resized_crop(224, scale=0.5), TypeError, r"scale must be a \(min, max\) pair"),
    (lambda: P.center_crop((8, 0)), ValueError, r"center_crop size\[1\] \(width\) must be >= 1"),
    (lambda: P.center_crop(8.0), TypeError, r"center_crop size must be an int or a \(height, width\)"),
    (lambda: P.resize(-1), ValueError, r"resize size must be >= 1, not -1"),
    (lambda: P.resize((1, 2, 3)), TypeError, r"resize size must be an int or a \(height, width\)"),
    (lambda: P.random_flip(1.5), ValueError, r"random_flip p must be in \[0.0, 1.0\], not 1.5"),
    (lambda: P.random_flip("0.5"), TypeError, r"random_flip p must be a number, not '0.5'"),
    (lambda: P.normalize((0.5, 0.5), (1, 1, 1)), TypeError, r"normalize mean must be 3 numbers"),
    (lambda: P.normalize((0.5,) * 3, (1, 0, 1)), ValueError, r"normalize std must be positive"),
    (lambda: P.normalize((0.5,) * 3, (1,) * 3, "NCHW"), ValueError, r"layout must be 'HWC' or 'CHW'"),
    (lambda: P.on_error("ignore"), ValueError, r"policy must be 'raise' or 'skip', not 'ignore'"),
    (lambda: P.on_error("skip", 2), ValueError, r"max_ratio must be in \[0.0, 1.0\], not 2"),
    (lambda: sp.image_folder(3), TypeError, r"image_folder root must be a path .* not 3"),
    (lambda: sp.arrays(""), ValueError, r"arrays path must be a non-empty str path"),
    (lambda: sp.webdataset([]), ValueError, r"webdataset needs at least one shard"),
    (lambda: sp.webdataset(["a.tar", 5]), TypeError, r"a webdataset shard must be a path"),
    (lambda: sp.webdataset("a.tar", keep=("txt", 3)), TypeError, r"keep must be member names"),
    (lambda: sp.webdataset("a.tar", keep=("jpg",)), ValueError, r"keep='jpg': name members other than"),
    (lambda: sp.webdataset("a.tar", keep=("txt", "txt")), ValueError, r"keep names a member twice"),
    (lambda: spindle.PipelineLoader(P, num_workers="2"), TypeError, r"num_workers must be an int, not '2'"),
    (lambda: spindle.PipelineLoader(P, byte_fields="tuple"), ValueError, r"byte_fields must be 'list' or 'arrays'"),
    (lambda: spindle.PipelineLoader("pipe"), TypeError, r"pipeline must be a spindle.pipeline.Pipeline"),
])
def test_builder_arguments_are_checked_at_the_call(call, error, message):
    """Proves: every builder method refuses a bad argument when it is called, with the error type
    and a message naming the argument and the value (not a later DecodeError)."""
    with pytest.raises(error, match=message):
        call()
