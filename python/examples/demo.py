"""The main job: load a generated image dataset with spindle and show what it costs.

Generates 50,000 64x64x3 uint8 images with labels, iterates two shuffled
epochs with 2 worker processes, verifies every sample, and prints throughput,
the thread budget and the thread count of the whole loader tree.
"""

from __future__ import annotations

import os
import time

import numpy as np

import spindle


class GeneratedImages:
    """An in-memory dataset; sample i is an image filled with i % 251 and label i."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 255, size=(n, 64, 64, 3), dtype=np.uint8)
        self.images[:, 0, 0, 0] = np.arange(n) % 251

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": i}


def main() -> None:
    data = GeneratedImages(50_000)
    budget = spindle.ThreadBudget()
    print(f"thread budget: {budget!r}")
    loader = spindle.DataLoader(data, batch_size=256, shuffle=True, num_workers=2, seed=0)
    for epoch in range(2):
        it = iter(loader)
        start, seen, peak = time.perf_counter(), 0, 0
        for batch in it:
            labels = batch["label"]
            assert (batch["image"][:, 0, 0, 0] == labels % 251).all(), "corrupt batch"
            seen += len(labels)
            tree = spindle.count_process_threads(os.getpid()) + sum(
                spindle.count_process_threads(p) for p in it.worker_pids)
            peak = max(peak, tree)
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch}: {seen} samples verified in {elapsed:.2f} s = {seen / elapsed:,.0f} samples/s; "
              f"peak threads of the loader tree: {peak} (2 workers x 1 thread + consumer + "
              f"arena of {it.plan.arena_threads})")


if __name__ == "__main__":
    main()
