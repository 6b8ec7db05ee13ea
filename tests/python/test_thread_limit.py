"""Thread-limit promises, shown as an unprivileged uid (root ignores RLIMIT_NPROC)."""

import json
import os
import shutil

import pytest

from unprivileged import run_limited

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root to switch to an unprivileged uid")

EPOCH_UNDER_LIMIT = r'''
import json, os, numpy as np, spindle

class Images:
    def __len__(self): return 4096
    def __getitem__(self, i): return {"image": np.full((32, 32, 3), i % 251, np.uint8), "label": i}

report = {"headroom": spindle.ThreadBudget().nproc_headroom}
base_threads = spindle.count_process_threads(os.getpid())
loader = spindle.DataLoader(Images(), batch_size=64, num_workers=16, shuffle=True, seed=0)
it = iter(loader)
peak, worker_threads, seen, ok = 0, set(), [], True
for batch in it:
    pids = it.worker_pids
    per_worker = [spindle.count_process_threads(p) for p in pids]
    worker_threads.update(per_worker)
    peak = max(peak, spindle.count_process_threads(os.getpid()) + sum(per_worker))
    labels = batch["label"].tolist()
    ok &= all(int(batch["image"][k, 0, 0, 0]) == l % 251 for k, l in enumerate(labels))
    seen += labels
report.update(samples=len(seen), distinct=len(set(seen)), values_ok=bool(ok), peak=peak,
              base_threads=base_threads, workers=len(pids), worker_threads=sorted(worker_threads),
              arena=it.plan.arena_threads)
try:
    iter(spindle.DataLoader(Images(), batch_size=64, num_workers=40, budget_policy="fail"))
    report["too_many"] = "no error"
except spindle.ThreadBudgetError as e:
    report["too_many"] = str(e)
print(json.dumps(report))
'''


def test_sixteen_workers_finish_an_epoch_with_24_tasks_of_headroom():
    """16 workers complete a shuffled epoch as an unprivileged uid under ulimit -u = its tasks + 24,
    and the tree never holds more than the consumer's threads + 16 + the arena."""
    done = run_limited(EPOCH_UNDER_LIMIT, headroom=24)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["headroom"] == 24  # the budget read the real limit and the uid's tasks
    assert (r["samples"], r["distinct"], r["values_ok"]) == (4096, 4096, True)
    assert r["workers"] == 16 and r["worker_threads"] == [1]
    assert r["peak"] <= r["base_threads"] + 16 + r["arena"], r


def test_workers_beyond_the_budget_fail_before_forking_with_the_numbers():
    """40 workers under 24 tasks of headroom with budget_policy="fail" raise ThreadBudgetError naming
    ulimit -u and the budget."""
    done = run_limited(EPOCH_UNDER_LIMIT, headroom=24)
    assert done.returncode == 0, done.stderr
    msg = json.loads(done.stdout.strip().splitlines()[-1])["too_many"]
    assert "40 workers do not fit the thread budget of 24 tasks" in msg, msg
    assert "ulimit -u" in msg and "RLIMIT_NPROC soft=" in msg


PIPELINE_UNDER_LIMIT = r'''
import json, os, shutil, tempfile, warnings
import numpy as np, spindle
from spindle import pipeline as sp

root = tempfile.mkdtemp(prefix="spindle-pipeline-budget-")
path = os.path.join(root, "images.npy")
np.save(path, np.zeros((48, 8, 8, 3), np.uint8))
pipe = sp.arrays(path).batch(8)
report = {}
for mode in ("processes", "threads"):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = sum(len(b["label"]) for b in spindle.PipelineLoader(pipe, num_workers=40, mode=mode))
    report[mode] = {"samples": samples, "warnings": [str(w.message) for w in caught
                                                     if issubclass(w.category, spindle.ThreadBudgetWarning)]}
os.environ["SPINDLE_BUDGET_POLICY"] = "fail"
try:
    iter(spindle.PipelineLoader(pipe, num_workers=40, mode="processes"))
    report["fail"] = "no error"
except spindle.ThreadBudgetError as e:
    report["fail"] = str(e)
shutil.rmtree(root)
print(json.dumps(report))
'''


def test_pipeline_loader_shrinks_with_a_warning_and_honours_the_budget_policy_variable():
    """Proves: PipelineLoader starts through the one start path: 40 workers under 12 tasks of headroom shrink
    with one ThreadBudgetWarning naming the numbers (processes and threads) and every sample comes, and
    $SPINDLE_BUDGET_POLICY=fail raises ThreadBudgetError instead."""
    done = run_limited(PIPELINE_UNDER_LIMIT, headroom=12)
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    for mode in ("processes", "threads"):
        assert r[mode]["samples"] == 48, r
        assert len(r[mode]["warnings"]) == 1, r
        assert "40 workers asked" in r[mode]["warnings"][0], r
    assert "40 workers do not fit the thread budget" in r["fail"], r
