"""Loader statistics (docs/observability.md): stats() and reset_stats() on every front, the wait
histogram against a dataset of known speed, the stall warning, the off switch, and the Prometheus
export read back with prometheus_client's own parser."""

import subprocess
import sys
import time

import numpy as np
import pytest

import spindle
import spindle.torch as storch
from spindle import StallWarning
from spindle import pipeline as sp
from toy_datasets import Waits


class Sleepy:
    """Sample i after `seconds` (only sample `slow` sleeps, if given)."""

    def __init__(self, n, seconds, slow=None):
        self.n, self.seconds, self.slow = n, seconds, slow

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.slow is None or i == self.slow:
            time.sleep(self.seconds)
        return np.full((4,), i, np.int64)


def test_wait_p50_tracks_a_known_per_sample_sleep():
    """Proves: with one worker taking 50 ms a batch and a consumer that does nothing, the median
    wait in next() is 50 ms within 20%, and wait_s adds up the waits."""
    loader = spindle.DataLoader(Sleepy(30, 0.05), batch_size=1, num_workers=1)
    for _ in loader:
        pass
    s = loader.stats()
    assert s["batches"] == s["samples"] == 30
    assert 40.0 <= s["wait_p50_ms"] <= 60.0, s
    assert s["wait_p50_ms"] <= s["wait_p95_ms"] <= s["wait_max_ms"]
    assert 30 * 0.05 * 0.8 <= s["wait_s"] <= s["elapsed_s"]
    (w,) = s["workers"]
    assert w["samples"] == 30 and w["busy_s"] >= 30 * 0.05 and w["batch"] == -1


def test_an_instant_dataset_shows_near_zero_wait():
    """Proves: when the workers keep ahead of a consumer that works 5 ms a batch, next() barely waits."""
    loader = spindle.DataLoader(Sleepy(40, 0.0, slow=-1), batch_size=2, num_workers=2)
    for _ in loader:
        time.sleep(0.005)
    s = loader.stats()
    assert s["batches"] == 20 and s["samples"] == 40
    assert s["wait_p50_ms"] < 1.0, s


def test_stats_add_up_over_epochs_and_reset():
    """Proves: a DataLoader's stats cover every epoch (one runtime each), and reset_stats zeroes them."""
    loader = spindle.DataLoader(Sleepy(12, 0.0, slow=-1), batch_size=4, num_workers=2)
    for _ in range(2):
        assert len(list(loader)) == 3
    s = loader.stats()
    assert (s["batches"], s["samples"]) == (6, 24)
    assert sum(w["samples"] for w in s["workers"]) == 24
    loader.reset_stats()
    s = loader.stats()
    assert (s["batches"], s["samples"], s["wait_s"]) == (0, 0, 0.0)


def test_every_front_counts_its_batches():
    """Proves: spindle.torch, spindle.grain and spindle.PipelineLoader keep the same counts."""
    torch_loader = storch.DataLoader(Sleepy(10, 0.0, slow=-1), batch_size=5, num_workers=2, persistent_workers=True)
    for _ in range(2):
        list(torch_loader)
    assert (torch_loader.stats()["batches"], torch_loader.stats()["samples"]) == (4, 20)

    pipe = sp.arrays(_npy()).batch(3)
    native = spindle.PipelineLoader(pipe, num_workers=2, mode="threads")
    list(native)
    s = native.stats()
    assert (s["batches"], s["samples"]) == (4, 10)
    assert sum(w["samples"] for w in s["workers"]) == 10


_NPY = []


def _npy():
    if not _NPY:
        import tempfile
        path = tempfile.NamedTemporaryFile(suffix=".npy", delete=False).name
        np.save(path, np.zeros((10, 4, 4, 3), np.uint8))
        _NPY.append(path)
    return _NPY[0]


def test_grain_front_counts_its_elements():
    """Proves: spindle.grain.DataLoader's stats() count the elements its workers delivered."""
    grain = pytest.importorskip("grain")
    import spindle.grain as sgrain
    sampler = grain.samplers.IndexSampler(num_records=9, shard_options=grain.sharding.NoSharding(), shuffle=False,
                                          num_epochs=1, seed=0)
    loader = sgrain.DataLoader(data_source=[np.int64(i) for i in range(9)], sampler=sampler, worker_count=2)
    assert len(list(loader)) == 9
    assert loader.stats()["batches"] == 9


def test_a_stall_warning_names_the_busy_worker_and_sample(monkeypatch):
    """Proves: a next() waiting past SPINDLE_STALL_WARNING warns once, naming the worker busy in the slow sample."""
    monkeypatch.setenv("SPINDLE_STALL_WARNING", "0.3")
    loader = spindle.DataLoader(Sleepy(4, 1.5, slow=2), batch_size=1, num_workers=1)
    with pytest.warns(StallWarning, match=r"worker 0 \(pid \d+\) busy for \d+\.\d s in batch 2, sample 2") as got:
        assert len(list(loader)) == 4
    # Once for the slow sample; a loaded machine may also warn for the first batch (the fork and
    # the worker's start), which names batch 0 and is not this stall.
    assert len([w for w in got if issubclass(w.category, StallWarning) and "in batch 2," in str(w.message)]) == 1


def test_the_off_switch_measures_nothing(monkeypatch):
    """Proves: SPINDLE_STATS=0 keeps every counter at zero (the benchmark's 'stats off')."""
    monkeypatch.setenv("SPINDLE_STATS", "0")
    loader = spindle.DataLoader(Sleepy(8, 0.0, slow=-1), batch_size=2, num_workers=1)
    assert len(list(loader)) == 4
    s = loader.stats()
    assert (s["batches"], s["workers"][0]["samples"], s["workers"][0]["busy_s"]) == (0, 0, 0.0)


def test_prometheus_text_parses_and_equals_stats():
    """Proves: the Collector's exposition parses with prometheus_client's parser and its counts equal stats()."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from spindle.metrics import Collector

    train = spindle.DataLoader(Sleepy(12, 0.0, slow=-1), batch_size=4, num_workers=2)
    evals = spindle.DataLoader(Sleepy(6, 0.0, slow=-1), batch_size=3, num_workers=1)
    list(train), list(evals)
    registry = CollectorRegistry()
    registry.register(Collector({"train": train, "eval": evals}))
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for name, loader in (("train", train), ("eval", evals)):
        st = loader.stats()
        label = (("loader", name),)
        assert samples[("spindle_batches_total", label)] == st["batches"]
        assert samples[("spindle_samples_total", label)] == st["samples"]
        assert samples[("spindle_wait_seconds_count", label)] == st["batches"]
        assert samples[("spindle_wait_seconds_sum", label)] == pytest.approx(st["wait_s"])
        for w in st["workers"]:
            ratio = samples[("spindle_worker_busy_ratio", (("loader", name), ("worker", str(w["worker"]))))]
            assert 0.0 <= ratio <= 1.0
        assert samples[("spindle_processes", label)] == st["processes"]
        assert samples[("spindle_max_processes", label)] == st["max_processes"]
        assert samples[("spindle_workers_replaced_total", label)] == st["replaced"]


def test_prometheus_shows_autos_processes_and_the_reason_of_the_last_change():
    """Proves: for a num_workers="auto" loader that grew, the exposition has the processes running,
    the most it may run, and the last change's reason as the INFO line words it (stats()'s)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from spindle.metrics import Collector

    loader = spindle.DataLoader(Waits(300, 0.01), batch_size=4, num_workers="auto")
    it = iter(loader)
    for _ in range(60):
        next(it)
    registry = CollectorRegistry()
    registry.register(Collector({"auto": loader}))
    text = generate_latest(registry).decode()
    st = loader.stats()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert st["processes"] > 1 and " worker processes (at most " in st["resize_reason"], st
    assert samples[("spindle_processes", (("loader", "auto"),))] == st["processes"]
    assert samples[("spindle_max_processes", (("loader", "auto"),))] == st["max_processes"]
    assert samples[("spindle_processes_change_info", (("loader", "auto"), ("reason", st["resize_reason"])))] == 1
    del it


def test_importing_spindle_does_not_import_prometheus_client():
    """Proves: prometheus_client is an optional extra: `import spindle` (and its fronts) never loads it."""
    code = "import sys, spindle, spindle.torch, spindle.pipeline; print('prometheus_client' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
