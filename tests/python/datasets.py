"""Small map-style datasets the tests share. Values encode the sample index."""

from __future__ import annotations

import collections
import os
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


class SlowAt(Images):
    """Sleeps `seconds` on one index."""

    def __init__(self, slow: int, seconds: float, n: int = 200) -> None:
        super().__init__(n)
        self.slow, self.seconds = slow, seconds

    def __getitem__(self, i: int):
        if i == self.slow:
            time.sleep(self.seconds)
        return super().__getitem__(i)
