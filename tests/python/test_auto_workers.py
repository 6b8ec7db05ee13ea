"""num_workers="auto": the processes follow the machine while batches flow (more while the loop
waits and a core is free or the workers wait on I/O, fewer when the loop sets the pace or the
user's task budget runs short), and the batches are those of any fixed count."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import pytest

import spindle
from toy_datasets import Waits
from unprivileged import import_closure, run_limited


def test_auto_grows_while_the_loop_waits_on_io_and_gives_a_fixed_runs_batches(caplog):
    """Proves: with samples that wait 10 ms each, "auto" starts a process per idle core (at least one, at
    most the cpus) and adds more within the epoch (INFO lines naming the wait), and its shuffled batches
    equal num_workers=2's, in order."""
    dataset = Waits(600, 0.01)
    fixed = [b[:, 0].tolist() for b in spindle.DataLoader(dataset, batch_size=8, num_workers=2, shuffle=True, seed=4)]
    loader = spindle.DataLoader(dataset, batch_size=8, num_workers="auto", shuffle=True, seed=4)
    with caplog.at_level(logging.INFO, logger="spindle"):
        it = iter(loader)
        first = len(it.worker_pids)
        got = [b[:, 0].tolist() for b in it]
    assert got == fixed
    assert 1 <= first <= len(os.sched_getaffinity(0))
    stats = loader.stats()
    assert stats["processes"] > 2 and stats["max_processes"] >= stats["processes"], stats
    grew = [r.getMessage() for r in caplog.records if "worker processes" in r.getMessage()]
    assert grew and "next() waited" in grew[0] and grew[0].startswith(f"spindle: {first} -> "), grew
    assert stats["resize_reason"] == grew[-1]


def test_auto_starts_each_epoch_on_the_processes_the_last_one_ended_on(caplog):
    """Proves: a loader's next epoch starts on the processes its last one ended on (what the controller
    found for this data), not on the idle cores again: no change is needed to reach them, and the
    batches are a fixed run's."""
    dataset = Waits(600, 0.01)
    loader = spindle.DataLoader(dataset, batch_size=8, num_workers="auto", shuffle=True, seed=4)
    fixed = spindle.DataLoader(dataset, batch_size=8, num_workers=2, shuffle=True, seed=4)
    assert [b[:, 0].tolist() for b in loader] == [b[:, 0].tolist() for b in fixed]
    ended = loader.stats()["processes"]
    assert ended > len(os.sched_getaffinity(0)), loader.stats()
    with caplog.at_level(logging.INFO, logger="spindle"):
        it = iter(loader)
        assert len(it.worker_pids) == ended
        assert [b[:, 0].tolist() for b in it] == [b[:, 0].tolist() for b in fixed]  # epoch 1 of both
    grew = [r.getMessage() for r in caplog.records if f" -> {ended} worker processes" in r.getMessage()]
    assert not grew, grew


def test_auto_fills_the_slots_it_did_not_reserve_up_front_with_whole_batches():
    """Proves: an auto loader reserves only its first process's slots up front; once it has grown,
    batches of 256 KiB (past the 64 KiB its other slots start with) arrive whole in those slots,
    equal to a fixed run's in order."""
    dataset = Waits(480, 0.01, width=4096)  # 32 KiB a sample, 8 a batch
    fixed = [b.copy() for b in spindle.DataLoader(dataset, batch_size=8, num_workers=2, shuffle=True, seed=2)]
    loader = spindle.DataLoader(dataset, batch_size=8, num_workers="auto", shuffle=True, seed=2)
    got = [b.copy() for b in loader]
    assert len(got) == len(fixed) == 60
    for ours, theirs in zip(got, fixed):
        assert ours.shape == (8, 4096) and (ours == theirs).all()
    assert loader.stats()["processes"] > 1  # it grew: slots past the first process's held batches


def test_auto_retires_processes_when_the_loop_sets_the_pace(caplog):
    """Proves: after the processes grew on waiting samples, a loop that takes 30 ms a batch leaves
    the workers idle, and processes retire (each at its next claim: no batch lost or repeated)."""
    loader = spindle.DataLoader(Waits(1200, 0.004), batch_size=4, num_workers="auto", shuffle=True, seed=1)
    seen, peak = [], 0
    with caplog.at_level(logging.INFO, logger="spindle"):
        it = iter(loader)
        for k, batch in enumerate(it):
            seen += batch[:, 0].tolist()
            peak = max(peak, len(it.worker_pids))
            if k > 60:
                time.sleep(0.03)
    assert sorted(seen) == list(range(1200))
    retired = [r.getMessage() for r in caplog.records if "the consumer sets the pace" in r.getMessage()]
    assert peak > 1 and retired, (peak, [r.getMessage() for r in caplog.records])
    assert loader.stats()["processes"] < peak


def test_auto_is_refused_by_threads_mode(tmp_path):
    """Proves: a threads-mode PipelineLoader refuses "auto", naming why."""
    from spindle import pipeline as sp

    with pytest.raises(ValueError, match=r'num_workers="auto" needs mode="processes"'):
        spindle.PipelineLoader(sp.image_folder(tmp_path).decode().batch(2), num_workers="auto")


def write_shards(root, count):
    """`count` WebDataset shards of 2-4 small JPEGs each (key.jpg + key.cls): local paths."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for s in range(count):
        path = root / f"shard-{s:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(2 + s % 3):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(buf, format="JPEG")
                for name, data in ((f"s{s}_{k}.jpg", buf.getvalue()), (f"s{s}_{k}.cls", str(k).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def test_auto_webdataset_over_slow_http_restarts_its_streams_where_they_were(tmp_path, caplog):
    """Proves: a WebDataset stream over HTTP with 40 ms a request under "auto" starts on the idle cores,
    is advised all its logical workers (waiting on I/O) and starts its streams again on them mid-epoch,
    each from the shard and sample its last batch left it at: the batches equal those of
    num_workers=auto_workers() in order (none lost, none repeated, the same augmentation), and a
    checkpoint taken after the restart resumes to the same rest."""
    from shard_server import ShardServer
    from spindle import pipeline as sp

    paths = write_shards(tmp_path, 48)
    logical = spindle.auto_workers()
    with ShardServer(str(tmp_path)) as server:
        pipe = (sp.webdataset([server.url(f"slow/40/{p.name}") for p in paths])
                .decode().random_resized_crop(24).random_flip().batch(3))

        def run(loader, stop=None):
            out = []
            for b in loader:
                out.append((b["image"].tobytes(), b["label"].tolist()))
                if stop is not None and len(out) == stop:
                    break
            return out

        fixed = run(spindle.PipelineLoader(pipe, num_workers=logical, seed=7, mode="processes"))
        auto = spindle.PipelineLoader(pipe, num_workers="auto", seed=7, mode="processes")
        with caplog.at_level(logging.INFO, logger="spindle"):
            got = run(auto)
        assert len(got) == len(fixed) > 20 and got == fixed
        restarts = [r.getMessage() for r in caplog.records if "the streams start again" in r.getMessage()]
        assert restarts and f"-> {logical} worker processes" in restarts[0], restarts
        assert auto.stats()["processes"] == logical, auto.stats()
        # Its next epoch starts on them: no restart.
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="spindle"):
            again = run(auto)
        assert len(again) == len(fixed)
        assert not [r.getMessage() for r in caplog.records if "the streams start again" in r.getMessage()]
        assert auto.stats()["processes"] == logical, auto.stats()

        # Stopped after the restart, saved, resumed by a new loader: the same rest.
        first = spindle.PipelineLoader(pipe, num_workers="auto", seed=7, mode="processes")
        head = run(first, stop=len(fixed) // 2)
        resumed = spindle.PipelineLoader(pipe, num_workers="auto", seed=7, mode="processes")
        resumed.load_state_dict(first.state_dict())
        assert head + run(resumed) == fixed


# The loop of a limited run: at element `at` it takes every free task but one (threads that wait), then
# starts a checkpoint's burst of 4 threads once the processes gave tasks back (or after 5 s: then it fails).
TAKE_THEN_BURST = r"""
import json, logging, threading, time, spindle
logging.basicConfig(level=logging.INFO)
stop, held, report = threading.Event(), [], {}
budget = lambda: spindle.ThreadBudget().nproc_headroom

def after_element(k, at, it):
    if k == at:
        report["grown"] = len(it.worker_pids)
        while budget() > 1:
            t = threading.Thread(target=stop.wait); t.start(); held.append(t)
        report["held"] = len(held)
        report["took"] = time.monotonic()
    if held and "burst" not in report and (budget() >= 5 or time.monotonic() > report["took"] + 5):
        report["waited_s"] = round(time.monotonic() - report["took"], 2)
        report["processes"] = len(it.worker_pids)
        burst = [threading.Thread(target=stop.wait) for _ in range(4)]
        try:
            for t in burst: t.start()
            report["burst"] = "started"
        except RuntimeError as e:
            report["burst"] = str(e)
        held.extend(t for t in burst if t.is_alive())

def finish():
    stop.set()
    for t in held: t.join()
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged uid")
def test_auto_gives_processes_back_when_the_loop_needs_tasks_under_a_tight_limit():
    """Proves: as an unprivileged uid with 24 tasks of headroom, "auto" grows on waiting samples;
    then the loop starts threads until 1 task is left, and processes retire (naming the budget) so
    that 4 more threads of the loop start (a checkpoint's burst); every sample once."""
    script = TAKE_THEN_BURST + r'''
import numpy as np
class Waits:
    def __len__(self): return 6000
    def __getitem__(self, i):
        time.sleep(0.01)
        return np.full(2, i, np.int64)
loader = spindle.DataLoader(Waits(), batch_size=4, num_workers="auto")
it = iter(loader)
seen, peak = [], 0
for k, batch in enumerate(it):
    seen += batch[:, 0].tolist()
    peak = max(peak, len(it.worker_pids))
    after_element(k, 150, it)
finish()
report.update(samples=len(seen), distinct=len(set(seen)), peak=peak, processes=loader.stats()["processes"],
              reason=loader.stats()["resize_reason"])
print(json.dumps(report))
'''
    done = run_limited(script, headroom=24)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert (r["samples"], r["distinct"]) == (6000, 6000), r
    assert r["grown"] > 2 and r["held"] >= 1, r
    assert r["burst"] == "started", (r, done.stderr[-3000:])
    assert "of the user's budget left" in done.stderr, done.stderr[-3000:]


GRAIN_GIVES_BACK = TAKE_THEN_BURST + r"""
import grain, spindle.grain as sgrain
from absl import flags
flags.FLAGS.mark_as_parsed()

class Wait(grain.transforms.Map):
    def map(self, x):
        time.sleep(0.01)
        return x

ds = grain.MapDataset.range(4000).to_iter_dataset().map(Wait())
it = iter(sgrain.mp_prefetch(ds, grain.multiprocessing.MultiprocessingOptions(num_workers="auto")))
seen = []
for k, x in enumerate(it):
    seen.append(int(x))
    after_element(k, 800, it)
finish()
report.update(in_order=seen == list(range(4000)), logical=sgrain.auto_workers())
print(json.dumps(report))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged uid")
def test_grain_auto_gives_processes_back_when_the_loop_needs_tasks_under_a_tight_limit():
    """Proves: spindle.grain's num_workers="auto" as an unprivileged uid with 24 tasks of headroom: the
    slices grow on waiting elements; then the loop starts threads until 1 task is left, the controller
    advises fewer processes (naming the budget), the slices start again on them from their states, and 4
    more threads of the loop start; the elements are the fixed run's (the range, in order)."""
    done = run_limited(GRAIN_GIVES_BACK, headroom=24, timeout=240, packages=import_closure("spindle", "grain"))
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["in_order"], r
    assert r["grown"] > 1 and r["held"] >= 1, r
    assert r["burst"] == "started" and r["processes"] < r["grown"], (r, done.stderr[-3000:])
    assert "of the user's budget left" in done.stderr, done.stderr[-3000:]
    # A few changes, not a restart each window: advice past what the budget then grants is not repeated.
    changes = done.stderr.count("the streams start again on them from their states")
    assert 2 <= changes <= 4, done.stderr[-3000:]
