"""Native pipelines: an ImageNet-like folder decoded and augmented in C++, in
forked workers and on the arena's threads, with the same batches either way."""

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import spindle
from spindle import pipeline as sp
from toy_datasets import add_broken_images

PIL = pytest.importorskip("PIL.Image")

CLASSES = ["cat", "dog", "zebra"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 classes x 12 JPEGs (q90, 300-500 px sides) with smooth content, plus one PNG."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir()
        for k in range(12):
            h, w = int(rng.integers(300, 501)), int(rng.integers(300, 501))
            y, x = np.mgrid[0:h, 0:w]
            img = np.stack([(x * 255 // w), (y * 255 // h), np.full((h, w), 80 * c + k)], -1).astype(np.uint8)
            PIL.fromarray(img).save(root / name / f"img{k:02d}.jpg", quality=90)
    PIL.fromarray(np.full((320, 400, 3), 200, np.uint8)).save(root / "zebra" / "extra.png")
    return root


def collect(loader):
    return [(b["image"].copy(), b["label"].copy()) for b in loader]


def rrc_pipe(root, batch=8):
    return sp.image_folder(root).decode().random_resized_crop(64).random_flip().batch(batch)


def test_labels_follow_the_sorted_class_folders(folder):
    """Labels are the index of the class folder among the sorted folders; every file once per epoch."""
    pipe = sp.image_folder(folder).decode().center_crop(64).batch(5)
    labels = np.concatenate([b["label"] for b in spindle.PipelineLoader(pipe, num_workers=2)])
    assert sorted(labels.tolist()) == [0] * 12 + [1] * 12 + [2] * 13
    assert len(spindle.PipelineLoader(pipe, num_workers=2)) == -(-37 // 5)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_batches_are_identical_for_any_worker_count_and_both_modes(folder, workers):
    """With a seed, 1/2/3 workers in processes and threads mode give the same batches bit for bit."""
    reference = collect(spindle.PipelineLoader(rrc_pipe(folder), num_workers=1, shuffle=True, seed=5, mode="processes"))
    for mode in ("processes", "threads"):
        got = collect(spindle.PipelineLoader(rrc_pipe(folder), num_workers=workers, shuffle=True, seed=5, mode=mode))
        assert len(got) == len(reference)
        for (image, label), (ref_image, ref_label) in zip(got, reference):
            assert image.shape == (len(label), 64, 64, 3) and image.dtype == np.uint8
            assert np.array_equal(label, ref_label) and np.array_equal(image, ref_image), mode


@pytest.mark.parametrize("flip,size", [(0.0, 64), (1.0, 64), (1.0, 63)])
def test_fused_sample_step_equals_the_ops_one_at_a_time(folder, flip, size):
    """Proves: the pipeline's fused decode + random-resized-crop + flip (into the slot) gives, bit for bit,
    spindle.ops' decode_image(crop=box, size) (+ hflip) for the box drawn from (seed, epoch, index), JPEG and PNG."""
    from spindle import ops

    files = sorted(p for c in CLASSES for p in (folder / c).iterdir())
    pipe = sp.image_folder(folder).decode().random_resized_crop(size)
    if flip:
        pipe = pipe.random_flip(flip)
    loader = spindle.PipelineLoader(pipe.batch(7), num_workers=2, seed=11, mode="threads")
    loader.set_epoch(2)
    images = np.concatenate([b["image"].copy() for b in loader])
    assert len(images) == len(files)
    for index, path in enumerate(files):
        data = path.read_bytes()
        info = ops.image_info(data)
        box = ops.random_resized_crop_box(info.height, info.width, 11, 2, index)
        ref = ops.decode_image(data, crop=box, size=(size, size))
        np.testing.assert_array_equal(images[index], ops.hflip(ref) if flip else ref, err_msg=str(path))


def test_epochs_and_seeds_change_the_augmentation(folder):
    """A new epoch (or seed) draws new crops and order; the same (seed, epoch) repeats exactly."""
    loader = spindle.PipelineLoader(rrc_pipe(folder), num_workers=2, shuffle=True, seed=1)
    first, second = collect(loader), collect(loader)
    loader.set_epoch(0)
    again = collect(loader)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(first, second))
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(first, again))


def test_center_crop_without_scaling_equals_pils_pixels(folder):
    """decode + center_crop (no resize) gives PIL's decoded pixels of the same box exactly."""
    pipe = sp.image_folder(folder).decode().center_crop(128).batch(1)
    files = sorted((folder / c / f) for c in CLASSES for f in os.listdir(folder / c))
    for (image, _), path in zip(collect(spindle.PipelineLoader(pipe, num_workers=1)), files):
        ref = np.asarray(PIL.open(path).convert("RGB"))
        h, w = ref.shape[:2]
        top, left = int(round((h - 128) / 2.0)), int(round((w - 128) / 2.0))
        assert np.array_equal(image[0], ref[top:top + 128, left:left + 128]), path


def test_normalize_gives_float_chw_batches(folder):
    """normalize(mean, std, 'CHW') turns the uint8 crop into (x/255 - mean)/std, channels first."""
    base = sp.image_folder(folder).decode().center_crop(32).batch(4)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    raw = collect(spindle.PipelineLoader(base, num_workers=1))
    norm = collect(spindle.PipelineLoader(base.normalize(mean, std, "CHW"), num_workers=1))
    for (u8, _), (f32, _) in zip(raw, norm):
        expect = (u8.astype(np.float32) / 255 - np.array(mean, np.float32)) / np.array(std, np.float32)
        assert f32.dtype == np.float32 and f32.shape == (len(u8), 3, 32, 32)
        np.testing.assert_allclose(f32, expect.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)


@pytest.fixture()
def broken(folder, tmp_path):
    """The folder plus a truncated JPEG, a zero-byte file, a text file named .jpg and corrupt bytes."""
    root = tmp_path / "broken"
    shutil.copytree(folder, root)
    add_broken_images(root)
    return root


def test_a_bad_file_fails_its_batch_naming_the_file(broken):
    """By default a corrupt/truncated/empty/non-image file raises, naming the file and the decoder's words."""
    pipe = sp.image_folder(broken).decode().center_crop(64).batch(1)
    messages = []
    it = iter(spindle.PipelineLoader(pipe, num_workers=2))
    while True:
        try:
            next(it)
        except StopIteration:
            break
        except Exception as e:  # noqa: BLE001 - the test looks at what arrives
            messages.append(f"{type(e).__name__}: {e}")
    text = "\n".join(messages)
    for name in ("truncated.jpg", "empty.jpg", "notes.jpg", "garbage.jpg"):
        assert name in text, text


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_skip_replaces_bad_files_counts_them_and_raises_over_the_ratio(broken, mode):
    """on_error='skip' replaces each bad file by a good sample of its batch (warning with the reason);
    with max_ratio below the bad share the loader raises naming the counts."""
    pipe = sp.image_folder(broken).decode().center_crop(64).batch(4).on_error("skip", max_ratio=0.5)
    with pytest.warns(RuntimeWarning, match="skipped"):
        batches = collect(spindle.PipelineLoader(pipe, num_workers=2, mode=mode))
    assert sum(len(label) for _, label in batches) == 41
    strict = sp.image_folder(broken).decode().center_crop(64).batch(41).on_error("skip", max_ratio=0.01)
    with pytest.raises(spindle.SpindleError, match=r"4 of 41 samples could not be read"):
        with pytest.warns(RuntimeWarning):
            collect(spindle.PipelineLoader(strict, num_workers=1, mode=mode))


def test_batches_go_zero_copy_to_torch(folder):
    """torch.from_dlpack shares the batch's memory (no copy)."""
    torch = pytest.importorskip("torch")
    batch = next(iter(spindle.PipelineLoader(rrc_pipe(folder), num_workers=1)))
    t = torch.from_dlpack(batch["image"])
    assert t.data_ptr() == batch["image"].ctypes.data and t.shape == batch["image"].shape


def test_threads_mode_forks_nothing_and_stays_within_consumer_plus_arena(folder):
    """mode='threads': no child process; the process's threads are its own plus the arena's workers."""
    code = textwrap.dedent(f"""
        import os, spindle
        from spindle import pipeline as sp
        def children():
            found = []
            for p in os.listdir("/proc"):
                try:
                    if p.isdigit() and open(f"/proc/{{p}}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid()):
                        found.append(p)
                except OSError:
                    pass
            return found
        base = spindle.count_process_threads(os.getpid())
        pipe = sp.image_folder({str(folder)!r}).decode().random_resized_crop(64).batch(4)
        loader = spindle.PipelineLoader(pipe, num_workers=2, mode="threads")
        peak = 0
        it = iter(loader)
        for b in it:
            peak = max(peak, spindle.count_process_threads(os.getpid()))
            assert not children(), children()
        print(base, peak)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    base, peak = map(int, done.stdout.split())
    assert base < peak <= base + 2 + 1, (base, peak)  # the 2 worker threads (+1: the arena's copy-out share)


def make_shards(folder, out, per_shard=10):
    """The folder's JPEGs as WebDataset shards of `per_shard` samples: key.jpg + key.cls."""
    import io
    import tarfile
    files = sorted((c, f) for c in CLASSES for f in sorted(os.listdir(folder / c)) if f.endswith(".jpg"))
    shards = []
    for s in range(0, len(files), per_shard):
        path = out / f"shard-{s // per_shard:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for c, f in files[s:s + per_shard]:
                key = f"{c}_{f[:-4]}"
                for name, data in ((f"{key}.jpg", (folder / c / f).read_bytes()),
                                   (f"{key}.cls", str(CLASSES.index(c)).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        shards.append(str(path))
    return shards


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_webdataset_shards_are_read_end_to_end(folder, tmp_path, mode):
    """WebDataset shards stream every sample once with its cls label; a sample's crop is the same
    whichever worker (and mode) reads it."""
    shards = make_shards(folder, tmp_path)
    pipe = sp.webdataset(shards).decode().random_resized_crop(48).batch(4)
    with pytest.raises(TypeError):
        len(spindle.PipelineLoader(pipe, num_workers=2))
    one = collect(spindle.PipelineLoader(pipe, num_workers=1, seed=3, mode=mode))
    two = collect(spindle.PipelineLoader(pipe, num_workers=2, seed=3, mode=mode))
    for got in (one, two):
        labels = np.concatenate([label for _, label in got])
        assert sorted(labels.tolist()) == [0] * 12 + [1] * 12 + [2] * 12
    key = lambda batches: sorted(image.tobytes() for b, _ in batches for image in b)  # noqa: E731
    assert key(one) == key(two)
