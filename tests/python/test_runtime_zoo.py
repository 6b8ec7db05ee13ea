"""Workers of a dataset that calls the thread-pool runtimes of the runtime table that datasets use
most (HF tokenizers, OpenCV, pyarrow, polars) are capped as the table says: forked from a consumer
that loaded tokenizers, OpenCV and pyarrow before starting them, and importing polars themselves."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from unprivileged import run_limited

for _name in ("tokenizers", "cv2", "pyarrow", "polars"):
    pytest.importorskip(_name)

# The consumer imports and uses tokenizers, OpenCV and pyarrow before its workers start (as a
# training script does); polars is imported in the workers only: it sizes its pool at import, and a
# forked child of a process that ran a polars query deadlocks in its next one (polars's own warning).
ZOO = r'''
import collections, json, os, sys, tempfile
import numpy as np
import cv2
import pyarrow as pa, pyarrow.parquet as pq
from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = "the quick brown fox jumps over a lazy dog while seven cats sleep".split()


def threads():
    """This process's threads by name (/proc/self/task)."""
    names = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[f.read().strip()] += 1
        except OSError:
            pass
    return names


class Zoo:
    def __init__(self, path, n):
        vocab = {w: i for i, w in enumerate(["[UNK]", *WORDS])}  # built here: no hub download
        self.tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        self.tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
        self.path, self.n, self.names = path, n, True

    def __len__(self):
        return self.n

    def warm(self, i):
        """tokenizers, OpenCV and Arrow: what the consumer also runs."""
        ids = self.tokenizer.encode_batch([" ".join(WORDS[k % 13:] + WORDS[:k % 13]) for k in range(i, i + 256)])
        image = cv2.resize(np.full((1024, 1024, 3), i % 251, np.uint8), (512, 384), interpolation=cv2.INTER_AREA)
        assert int(image[0, 0, 0]) == i % 251 and len(ids) == 256
        return pq.read_table(self.path, use_threads=True)

    def __getitem__(self, i):
        import polars as pl  # in the worker: polars sizes its pool at import

        sums = pl.from_arrow(self.warm(i)).group_by("key").agg(pl.col("value").sum()).sort("key")
        assert sums.height == 16
        names = threads()
        sample = {"index": i, "pid": os.getpid(), "threads": sum(names.values())}
        if self.names:  # torch's collate batches strings; spindle.DataLoader batches arrays only
            sample["names"] = json.dumps(dict(names))
        return sample


def write_parquet(folder):
    path = os.path.join(folder, "zoo.parquet")
    keys = np.arange(65536) % 16
    pq.write_table(pa.table({"key": keys, "value": np.arange(65536)}), path, row_group_size=4096)
    return path


def run(loader_kind, workers, samples):
    folder = tempfile.mkdtemp(prefix="spindle-zoo-")
    dataset = Zoo(write_parquet(folder), samples)
    dataset.warm(0)  # the consumer's own use: tokenizers, OpenCV and Arrow loaded, their pools started
    if loader_kind == "torch":
        import torch.utils.data as data
        loader = data.DataLoader(dataset, batch_size=4, num_workers=workers)
    elif loader_kind == "spindle.torch":
        import spindle.torch as data
        loader = data.DataLoader(dataset, batch_size=4, num_workers=workers)
    else:
        import spindle
        dataset.names = False
        loader = spindle.DataLoader(dataset, batch_size=4, num_workers=workers)
    seen, per_worker = [], {}
    for batch in loader:
        names = batch.get("names", ["{}"] * len(batch["index"]))
        for index, pid, count, names in zip(batch["index"], batch["pid"], batch["threads"], names):
            seen.append(int(index))
            if int(count) >= per_worker.get(int(pid), (0, ""))[0]:
                per_worker[int(pid)] = (int(count), names)
    import shutil
    shutil.rmtree(folder)
    return {"seen": seen, "workers": {str(p): {"threads": c, "names": json.loads(n)}
                                      for p, (c, n) in per_worker.items()}}


if sys.argv[1] == "reference":
    # The least a worker can hold: a fresh process started with the workers' environment (the runtime
    # table's one-thread variables), running the same sample.
    from spindle._budget.caps import one_thread_environment
    os.environ.update(one_thread_environment())
    folder = tempfile.mkdtemp(prefix="spindle-zoo-")
    sample = Zoo(write_parquet(folder), 1)[0]
    import shutil
    shutil.rmtree(folder)
    print(json.dumps({"threads": sample["threads"], "names": json.loads(sample["names"])}))
else:
    print(json.dumps(run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
'''

SAMPLES = 64


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The threads of a fresh process started with the workers' environment, after one sample."""
    return _zoo(tmp_path_factory.mktemp("zoo"), "reference")


def _zoo(tmp_path, *args: str) -> dict:
    script = tmp_path / "zoo.py"
    script.write_text(ZOO)
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_capped_workers_add_no_pool_threads_where_torchs_add_several(tmp_path, reference):
    """Proves: with tokenizers, OpenCV and pyarrow loaded in the consumer and polars imported in the workers,
    spindle.torch's 4 workers hold no more threads than a fresh process started with the workers' one-thread
    environment, while torch's DataLoader workers hold several more each."""
    ours = _zoo(tmp_path, "spindle.torch", "4", str(SAMPLES))
    theirs = _zoo(tmp_path, "torch", "4", str(SAMPLES))
    for run in (ours, theirs):
        assert sorted(run["seen"]) == list(range(SAMPLES))
        assert len(run["workers"]) == 4, run["workers"]
    for pid, w in ours["workers"].items():
        assert w["threads"] <= reference["threads"], (pid, w, reference)
    for pid, w in theirs["workers"].items():
        assert w["threads"] >= reference["threads"] + 3, (pid, w, reference)


# The same dataset under a thread limit: 16 workers as an unprivileged uid, with the headroom capped
# workers need (their reference count each, plus the consumer's arena) and far less than uncapped ones.
LIMITED = ZOO.replace('''if sys.argv[1] == "reference":''', '''if len(sys.argv) == 1:
    sys.argv[1:] = ["spindle", "16", "96"]
if sys.argv[1] == "reference":''')

_STAGED = ("spindle", "numpy", "tokenizers", "cv2", "pyarrow", "polars", "_polars_runtime_32")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged uid")
def test_sixteen_capped_workers_finish_the_zoo_under_little_headroom(reference):
    """Proves: 16 workers running tokenizers, OpenCV, a threaded parquet read and polars complete an epoch, every
    sample once, as an unprivileged uid with ulimit -u headroom for 16 capped workers and little more."""
    headroom = 16 * reference["threads"] + 8
    done = run_limited(LIMITED, headroom=headroom, timeout=240, packages=_STAGED)
    assert done.returncode == 0, done.stderr[-4000:]
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(run["seen"]) == list(range(96))
    assert len(run["workers"]) == 16


# The zoo at the headroom: 48 tasks for 16 workers that each run 7 threads (their own, Arrow's 2,
# polars's 4: docs/threads.md). Polars is imported in the workers only, so no start can know its threads
# before a worker runs it: a first loader of 4 workers runs an epoch (the watchdog sees what a worker runs),
# then the 16-worker loader counts that per worker and starts the processes that fit beside the consumer's
# reserve. The peak is the uid's tasks (/proc, every process of the real uid) sampled per batch.
AT_48 = ZOO.replace('''if sys.argv[1] == "reference":''', '''if len(sys.argv) == 1:
    import warnings
    from spindle.bench.tree import uid_tasks
    import spindle

    folder = tempfile.mkdtemp(prefix="spindle-zoo-")
    dataset = Zoo(write_parquet(folder), 96)
    dataset.names = False
    dataset.warm(0)
    limit, peak, report = int(os.environ["SPINDLE_TEST_NPROC_LIMIT"]), 0, {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for workers in (4, 16):
            seen = []
            for batch in spindle.DataLoader(dataset, batch_size=4, num_workers=workers):
                seen += [int(i) for i in batch["index"]]
                peak = max(peak, uid_tasks(os.getuid()))
            report[workers] = sorted(seen) == list(range(96))
    report.update(peak=peak, limit=limit, warnings=[str(w.message) for w in caught])
    print(json.dumps(report))
    sys.exit()
if sys.argv[1] == "reference":''')


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged uid")
def test_the_zoo_at_48_tasks_counts_what_its_workers_ran_and_stays_under_the_limit():
    """Proves: as an unprivileged uid with 48 tasks of headroom, after one epoch of 4 zoo workers (7 threads each),
    16 workers of the zoo complete an epoch, every sample once, the uid's tasks never reach the limit, and the
    watchdog's one warning per loader names polars's and Arrow's threads."""
    done = run_limited(AT_48, headroom=48, timeout=240, packages=_STAGED)
    assert done.returncode == 0, done.stderr[-4000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["4"] and r["16"], r
    assert r["peak"] < r["limit"], r
    leases = [w for w in r["warnings"] if "over its lease" in w]
    assert leases and "polars x4" in leases[0] and "Arrow x2" in leases[0], r["warnings"]


# num_workers="auto" over the zoo at 48 tasks of headroom, each sample waiting 50 ms first (a remote read),
# so that the processes grow fast (the workers wait: I/O) and each new one starts polars's and Arrow's
# threads: no count known before the start can say what a process costs. Growth counts what the busiest
# worker runs now, so the processes stop where the budget (less the consumer's reserve) holds them.
AUTO_AT_48 = ZOO.replace('''if sys.argv[1] == "reference":''', '''if len(sys.argv) == 1:
    import time
    from spindle.bench.tree import uid_tasks
    import spindle

    class Waiting(Zoo):
        def __getitem__(self, i):
            time.sleep(0.05)
            return super().__getitem__(i)

    folder = tempfile.mkdtemp(prefix="spindle-zoo-")
    dataset = Waiting(write_parquet(folder), 192)
    dataset.names = False
    dataset.warm(0)
    limit, peak, most, busiest, seen = int(os.environ["SPINDLE_TEST_NPROC_LIMIT"]), 0, 0, 0, []
    loader = spindle.DataLoader(dataset, batch_size=4, num_workers="auto")
    it = iter(loader)
    for batch in it:
        seen += [int(i) for i in batch["index"]]
        peak = max(peak, uid_tasks(os.getuid()))
        most = max(most, len(it.worker_pids))
        busiest = max(busiest, int(max(batch["threads"])))
    print(json.dumps(dict(complete=sorted(seen) == list(range(192)), peak=peak, limit=limit, most=most,
                          threads=busiest, reason=loader.stats()["resize_reason"])))
    sys.exit()
if sys.argv[1] == "reference":''')


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged uid")
def test_auto_grows_the_zoo_only_as_far_as_its_workers_threads_fit_under_48_tasks():
    """Proves: as an unprivileged uid with 48 tasks of headroom, num_workers="auto" over zoo samples that wait
    50 ms grows past one process, but only as far as processes of 7 threads each (polars's and Arrow's,
    started inside the workers) fit beside the consumer's reserve: every sample once, and the uid's tasks
    never reach the limit."""
    done = run_limited(AUTO_AT_48, headroom=48, timeout=240, packages=_STAGED)
    assert done.returncode == 0, done.stderr[-4000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["complete"] and r["peak"] < r["limit"], r
    assert r["threads"] >= 5 and 1 < r["most"] <= 48 // r["threads"], r


# A training loop that saves a checkpoint mid-epoch: its writer starts 6 threads in the consumer (orbax's
# async checkpointer starts its commit thread and executors the same way) while 24 workers were asked for
# under 24 tasks of headroom.
BURST = r"""
import json, os, threading, time, warnings
import numpy as np, spindle

class Images:
    def __len__(self): return 2048
    def __getitem__(self, i): return {"label": np.int64(i)}

def save_checkpoint():
    threads = [threading.Thread(target=time.sleep, args=(0.05,)) for _ in range(6)]
    for t in threads:
        t.start()  # RuntimeError: can't start new thread when the workers took every task
    for t in threads:
        t.join()

seen, saved = [], 0
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    loader = spindle.DataLoader(Images(), batch_size=64, num_workers=24)
    for step, batch in enumerate(loader):
        seen += batch["label"].tolist()
        if step % 8 == 4:
            save_checkpoint()
            saved += 1
print(json.dumps({"samples": sorted(seen) == list(range(2048)), "saved": saved}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to switch to an unprivileged uid")
def test_a_consumer_that_starts_checkpoint_threads_mid_epoch_finds_room_under_a_tight_limit():
    """Proves: with 24 workers asked under 24 tasks of headroom, the start leaves the consumer its reserve, so a
    checkpoint save that starts 6 threads mid-epoch succeeds every time and the epoch completes, every sample once."""
    done = run_limited(BURST, headroom=24, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r == {"samples": True, "saved": 4}, r
