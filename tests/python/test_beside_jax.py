"""A consumer that already runs JAX: loaders start, iterate and stop without hangs or extra threads."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, {here!r})
import jax, jax.numpy as jnp
import spindle
from toy_datasets import Images

x = jnp.ones((512, 512))
(x @ x).block_until_ready()               # XLA's CPU pools are up and running
me = os.getpid()
before = spindle.count_process_threads(me)
peaks, bounds = [], []
for cycle in range(8):
    loader = spindle.DataLoader(Images(1600), batch_size=50, num_workers=16, shuffle=True, seed=cycle)
    it = iter(loader)
    seen = 0
    for batch in it:
        tree = spindle.count_process_threads(me) + sum(spindle.count_process_threads(p) for p in it.worker_pids)
        peaks.append(tree)
        bounds.append(spindle.count_process_threads(me) + 16 + it.plan.arena_threads)
        seen += len(batch)
        (x @ x).block_until_ready()       # JAX keeps working in the consumer meanwhile
    assert seen == 1600, seen
    del it, loader
after = spindle.count_process_threads(me)
print(json.dumps(dict(before=before, after=after, peak=max(peaks), worst_excess=max(p - b for p, b in zip(peaks, bounds)))))
"""


def test_sixteen_worker_loaders_cycle_beside_a_running_jax():
    """With JAX initialized and computing in the consumer, 8 create/iterate/drop cycles of a 16-worker loader
    finish (no hang), the tree never exceeds consumer threads + 16 + arena, and no thread is left behind."""
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(here=here)], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "os.fork() was called" not in done.stderr  # JAX's fork warning does not fire for spindle's forks
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["worst_excess"] <= 0, r
    assert r["after"] <= r["before"] + 1, r  # at most the arena's one extra thread (2 CPUs)
