"""The data sources (spindle.ImageFolder, ArraySource, WebDataset) against their references:
torchvision's ImageFolder rule, numpy, Python's tarfile and webdataset's key grouping."""

import io
import os
import re
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import spindle
from spindle import ArraySource, DataError, ImageFolder, WebDataset

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png")


# --- references -------------------------------------------------------------

def reference_image_folder(root):
    """torchvision.datasets.ImageFolder's find_classes + make_dataset, restricted to IMG_EXTENSIONS."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    samples = []
    for index, cls in enumerate(classes):
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, fname), index))
    return classes, samples


def reference_webdataset(path):
    """webdataset's tar_file_iterator + group_by_keys over what tarfile reads."""
    samples, current = [], None
    with tarfile.open(path) as tar:
        for info in tar:
            if not info.isreg():
                continue
            name = info.name
            if "/" not in name and name.startswith("__") and name.endswith("__"):
                continue
            data = tar.extractfile(info).read()
            m = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
            if not m:
                continue
            key, field = m.group(1), m.group(2).lower()
            if current is None or key != current["__key__"]:
                if current is not None:
                    samples.append(current)
                current = {"__key__": key, "__url__": path}
            assert field not in current
            current[field] = data
    if current is not None:
        samples.append(current)
    return samples


def add_member(tar, name, data=b"", kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def shard_of(tmp_path, name, members, fmt=tarfile.USTAR_FORMAT):
    path = str(tmp_path / name)
    with tarfile.open(path, "w", format=fmt) as tar:
        for m in members:
            add_member(tar, *m)
    return path


# --- ImageFolder ------------------------------------------------------------

def make_tree(root, files):
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def test_image_folder_classes_and_order_equal_torchvision_rule(tmp_path):
    """Class indices (sorted subfolders) and sample order (sorted walk, sorted files, extension filter in any
    case, nested folders) equal torchvision.datasets.ImageFolder's rule, and so does torchvision where it imports."""
    make_tree(tmp_path, {
        "dog/b.jpg": b"1", "dog/A.PNG": b"2", "dog/notes.txt": b"x", "dog/sub/c.jpeg": b"3",
        "dog/sub-a/d.jpg": b"4", "dog/sub.b/e.JPG": b"5", "Cat/z.jpg": b"6", "ant/x.JPEG": b"7",
        "_under/u.png": b"8", "caf\u00e9/e.jpg": b"9", "top.jpg": b"not a class",
    })
    ours = ImageFolder(str(tmp_path))
    classes, samples = reference_image_folder(str(tmp_path))
    assert ours.classes == classes
    assert [(ours.path(i), ours.label(i)) for i in range(len(ours))] == samples
    try:
        from torchvision.datasets import ImageFolder as TvImageFolder
    except Exception:  # torchvision is optional and may fail to import here
        return
    tv = TvImageFolder(str(tmp_path), loader=lambda p: p, is_valid_file=lambda p: p.lower().endswith(IMG_EXTENSIONS))
    assert tv.classes == ours.classes and tv.samples == samples


def test_image_folder_read_gives_bytes_label_origin(tmp_path):
    """read(i) returns the file's bytes, its class index and its path; out of range is an IndexError."""
    make_tree(tmp_path, {"a/1.jpg": b"\xff\xd8abc", "b/2.png": b"\x89PNGxyz"})
    f = ImageFolder(str(tmp_path))
    assert len(f) == 2
    assert f.read(1) == (b"\x89PNGxyz", 1, str(tmp_path / "b" / "2.png"))
    with pytest.raises(IndexError):
        f.read(2)


def test_image_folder_errors_name_the_folder(tmp_path):
    """A class folder without images is a DataError naming it; a missing root is FileNotFoundError."""
    make_tree(tmp_path, {"a/1.jpg": b"1", "empty/readme.txt": b"-"})
    with pytest.raises(DataError, match="empty"):
        ImageFolder(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        ImageFolder(str(tmp_path / "missing"))


def test_image_folder_opened_in_parent_reads_in_forked_child(tmp_path):
    """An ImageFolder opened and read in the parent reads the same bytes in a forked child (no shared fd offset)."""
    make_tree(tmp_path, {f"c{c}/{i}.jpg": bytes([c * 16 + i]) * (100 + 37 * i) for c in range(3) for i in range(5)})
    f = ImageFolder(str(tmp_path))
    parent = [f.read(i) for i in range(len(f))]
    pid = os.fork()
    if pid == 0:
        ok = all(f.read(i) == parent[i] for i in reversed(range(len(f))))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert f.read(0) == parent[0]


# --- ArraySource ------------------------------------------------------------

@pytest.mark.parametrize("dtype,shape", [
    ("u1", (7, 3, 4, 3)), ("<i2", (5,)), ("<i8", (4, 2)), ("<f2", (3, 5)), ("<f4", (6, 2, 2)),
    ("<f8", (2, 9)), ("?", (8, 3)), ("<c8", (3, 2)), (">i4", (4, 3)), ("S5", (3,)), ("<f4", (0, 3)),
])
def test_npy_rows_equal_numpy(tmp_path, dtype, shape):
    """A C-order .npy file, memory-mapped and read row by row (and whole), equals numpy's array, read-only."""
    rng = np.random.default_rng(0)
    a = (rng.integers(0, 250, size=shape) if dtype != "S5" else rng.integers(0, 9, size=shape).astype(str)).astype(dtype)
    path = tmp_path / "a.npy"
    np.save(path, a)
    src = ArraySource.from_npy(str(path))
    assert len(src) == shape[0]
    assert src.dtype == a.dtype.str
    assert tuple(src.row_shape) == shape[1:]
    for i in range(len(src)):
        row = src.row(i)
        assert row.dtype == a.dtype and row.shape == a[i].shape
        np.testing.assert_array_equal(row, a[i])
    whole = src.array()
    np.testing.assert_array_equal(whole, a)
    assert not whole.flags.writeable
    del src  # the views keep the mapping alive
    np.testing.assert_array_equal(whole, a)


def test_fortran_order_and_object_npy_are_refused(tmp_path):
    """A Fortran-order or object .npy is refused with a DataError (a ValueError) naming the file and the fix."""
    np.save(tmp_path / "f.npy", np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)))
    with pytest.raises(DataError, match=r"f\.npy.*Fortran-order.*ascontiguousarray"):
        ArraySource.from_npy(str(tmp_path / "f.npy"))
    np.save(tmp_path / "o.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"o\.npy"):
        ArraySource.from_npy(str(tmp_path / "o.npy"))


# --- WebDataset -------------------------------------------------------------

LONG = "d/" + "a" * 60 + "/" + "b" * 60  # with the file name, over 100 characters


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT],
                         ids=["ustar", "gnu", "pax"])
def test_webdataset_shard_equals_tarfile_grouped_by_key(tmp_path, fmt):
    """A shard written by tarfile (long name, empty member, directory member, metadata member) reads end to end as
    tarfile's regular members grouped by webdataset's key rule."""
    members = [
        ("__meta__", b"meta"), ("dir", b"", tarfile.DIRTYPE), ("0001.jpg", b"\xff\xd8jpeg1"), ("0001.cls", b"3"),
        ("0002.jpg", b"jpeg2"), ("0002.json", b'{"label": 7, "x": [1, 2]}'), ("0002.seg.PNG", b"png"),
        ("0003.txt", b""), (LONG + "/0004.jpg", b"long name"), (LONG + "/0004.cls", b"4"),
        ("noext", b"skipped"), ("0005.jpg", bytes(range(256)) * 5),
    ]
    path = shard_of(tmp_path, "s.tar", members, fmt)
    ds = WebDataset([path])
    assert ds.num_shards == 1
    ours = list(ds.iter_shard(0))
    assert ours == reference_webdataset(path)
    assert [WebDataset.label_of(s) for s in ours] == [3, 7, -1, 4, -1]


def test_shards_are_assigned_to_workers_whole(tmp_path):
    """Worker w of n reads shards w, w+n, ... (webdataset's split_by_worker)."""
    ds = WebDataset([str(tmp_path / f"{i}.tar") for i in range(5)])
    assert [ds.shards_of_worker(w, 2) for w in range(2)] == [[0, 2, 4], [1, 3]]


def corrupt_shard(tmp_path, name, mutate):
    path = shard_of(tmp_path, name, [("a.jpg", b"x" * 700), ("a.cls", b"1")])
    data = bytearray(open(path, "rb").read())
    data = mutate(data)
    with open(path, "wb") as f:
        f.write(data)
    return path


def set_size(data, at, field):
    """Writes a size field into the header at `at` and fixes its checksum."""
    data[at + 124:at + 136] = field
    data[at + 148:at + 156] = b" " * 8
    data[at + 148:at + 156] = b"%06o\0 " % sum(data[at:at + 512])
    return data


def flip(data, at):
    data[at] ^= 1
    return data


# a.jpg: header 0, data 512..1212 padded to 1536; a.cls: header 1536, data 2048.
@pytest.mark.parametrize("mutate,offset,what", [
    (lambda d: d[:1536 + 300], 1536, "mid-header"),
    (lambda d: d[:900], 0, "runs past the end"),
    (lambda d: flip(d, 1536 + 5), 1536, "checksum"),
    (lambda d: set_size(d, 1536, b"77777777777\0"), 1536, "runs past the end"),
    (lambda d: d[:2560], 2560, "end-of-archive"),
], ids=["truncated-mid-header", "truncated-mid-data", "bad-checksum", "absurd-size", "truncated-between-members"])
def test_corrupt_shard_raises_data_error_naming_shard_and_offset(tmp_path, mutate, offset, what):
    """A corrupt shard raises DataError naming the shard file and the byte offset of the damage."""
    path = corrupt_shard(tmp_path, "bad.tar", mutate)
    with pytest.raises(DataError) as info:
        list(WebDataset([path]).iter_shard(0))
    msg = str(info.value)
    assert f"'{path}'" in msg and f"byte offset {offset}:" in msg and what in msg, msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, spindle.SpindleError)


def test_label_of_refuses_malformed_labels():
    """A .cls that is not an integer is a DataError naming the sample."""
    with pytest.raises(DataError, match="s.tar:k"):
        WebDataset.label_of({"__key__": "k", "__url__": "s.tar", "cls": b"three"})
    assert WebDataset.label_of({"cls": b" 12\n"}) == 12


def test_concurrent_reads_from_threads_agree(tmp_path):
    """Threads reading one ImageFolder, one .npy and one shard at once all see the single-threaded result."""
    make_tree(tmp_path / "img", {f"c{c}/{i}.png": bytes([i]) * (500 + i + c) for c in range(4) for i in range(10)})
    path = shard_of(tmp_path, "s.tar", [(f"{i:04d}.{ext}", bytes([i]) * (100 + i)) for i in range(40)
                                        for ext in ("jpg", "cls")])
    np.save(tmp_path / "a.npy", np.arange(4000, dtype=np.int32).reshape(1000, 4))
    folder, ds = ImageFolder(str(tmp_path / "img")), WebDataset([path])
    arr = ArraySource.from_npy(str(tmp_path / "a.npy"))

    def snapshot(_=None):
        return ([folder.read(i) for i in range(len(folder))], list(ds.iter_shard(0)),
                [arr.row(i).tobytes() for i in range(len(arr))])

    want = snapshot()
    with ThreadPoolExecutor(4) as pool:
        assert all(got == want for got in pool.map(snapshot, range(8)))
    shared, seen, lock = ds.iter_shard(0), [], threading.Lock()

    def drain(_):
        for s in shared:  # one iterator shared by threads: each sample goes to exactly one
            with lock:
                seen.append(s["__key__"])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(drain, range(4)))
    assert sorted(seen) == [s["__key__"] for s in want[1]]
