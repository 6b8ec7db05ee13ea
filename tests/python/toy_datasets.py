"""Small map-style datasets the tests share. Values encode the sample index."""

from __future__ import annotations

import collections
import faulthandler
import multiprocessing
import os
import resource
import signal
import time

import numpy as np

Pair = collections.namedtuple("Pair", ["x", "y"])


class Images:
    """64x64x3 uint8 images filled with index % 251."""

    def __init__(self, n: int = 1000, shape=(8, 8, 3)) -> None:
        self.n, self.shape = n, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(self.shape, i % 251, np.uint8)


class Nested:
    """A dict with an array, a tuple of scalars and a namedtuple."""

    def __len__(self) -> int:
        return 103

    def __getitem__(self, i: int):
        return {
            "image": np.arange(12, dtype=np.float32).reshape(3, 4) + i,
            "meta": (i, float(i) / 2, i % 2 == 0, np.int16(i)),
            "pair": Pair(np.array([i, -i], np.int32), [np.float64(i)]),
        }


class BadAt(Images):
    """Images whose one index `bad` goes wrong in the way a subclass's `go_wrong` says."""

    def __init__(self, bad: int, n: int = 200) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int):
        if i == self.bad:
            self.go_wrong(i)
        return super().__getitem__(i)

    def go_wrong(self, i: int) -> None:
        raise NotImplementedError


class FailsAt(BadAt):
    """Raises ValueError for one index."""

    def go_wrong(self, i: int) -> None:
        raise ValueError(f"corrupt record {i}")


class KillsItselfAt(BadAt):
    """The worker that loads `bad` dies by SIGKILL, as if OOM-killed."""

    def go_wrong(self, i: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class SegfaultsAt(BadAt):
    """The worker that loads `bad` dies by SIGSEGV (no core file)."""

    def go_wrong(self, i: int) -> None:
        faulthandler.disable()  # pytest's handler would print this worker's stack first
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), signal.SIGSEGV)


class ExitsAt(BadAt):
    """The worker that loads `bad` calls exit(3) (no Python cleanup)."""

    def go_wrong(self, i: int) -> None:
        os._exit(3)


def add_broken_images(root) -> None:
    """Adds to an image folder (classes cat, dog, zebra; cat/img00.jpg a good JPEG) a truncated
    JPEG, a zero-byte file, a text file named .jpg and corrupt bytes: 4 files no decoder reads."""
    good = (root / "cat" / "img00.jpg").read_bytes()
    (root / "cat" / "truncated.jpg").write_bytes(good[:len(good) // 3])
    (root / "dog" / "empty.jpg").write_bytes(b"")
    (root / "dog" / "notes.jpg").write_bytes(b"this is not an image\n" * 10)
    (root / "zebra" / "garbage.jpg").write_bytes(good[:20] + bytes(range(256)) * 8)


class SlowAt(Images):
    """Sleeps `seconds` on one index."""

    def __init__(self, slow: int, seconds: float, n: int = 200) -> None:
        super().__init__(n)
        self.slow, self.seconds = slow, seconds

    def __getitem__(self, i: int):
        if i == self.slow:
            time.sleep(self.seconds)
        return super().__getitem__(i)


class CountsUnderSemaphore:
    """An mp.Value (with its own lock) and an mp.Semaphore of `context` (by default the default context,
    as a script that sets a start method globally makes them); each of the `n` samples counts itself under both."""

    def __init__(self, n: int = 6, context=multiprocessing) -> None:
        self.n = n
        self.count = context.Value("i", 0)  # lock=True: a named semaphore outside 'fork'
        self.slots = context.Semaphore(2)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        with self.slots, self.count.get_lock():
            self.count.value += 1
        return i

    def names_exist(self) -> list[bool]:
        """Whether both named semaphores are still in /dev/shm (a worker's exit must not unlink them)."""
        return [os.path.exists("/dev/shm/sem." + lock._semlock.name.lstrip("/"))
                for lock in (self.count.get_lock(), self.slots)]


def save_index_images(path, n: int, shape=(6, 8, 3)):
    """Saves `n` uint8 images of `shape` as a .npy at `path` and returns it: image i is filled with i
    (n <= 200), but for column 0 of channel 0, which is 200, so that a left-right flip shows."""
    images = np.zeros((n, *shape), np.uint8)
    for i in range(n):
        images[i] = i
        images[i, :, 0, 0] = 200
    np.save(path, images)
    return path


class Waits:
    """Sample i is `width` copies of i; each takes `delay` seconds of waiting (I/O: little CPU), so
    a loader's processes matter and a kill lands mid-batch."""

    def __init__(self, n: int, delay: float, width: int = 2) -> None:
        self.n, self.delay, self.width = n, delay, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(self.delay)
        return np.full(self.width, i, np.int64)
