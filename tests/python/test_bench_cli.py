"""spindle bench: the harness end to end on a tiny workload, and its argument errors."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SAMPLES, IMAGES = 2048, 48


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """One `spindle bench --quick --json` over three workloads, with tensorflow made unimportable
    (a package on PYTHONPATH whose import raises), so tf.data must be reported skipped."""
    tmp = tmp_path_factory.mktemp("bench")
    shadow = tmp / "shadow"
    (shadow / "tensorflow").mkdir(parents=True)
    (shadow / "tensorflow" / "__init__.py").write_text("raise ImportError('hidden by test_bench_cli')\n")
    (shadow / "bench_user_data.py").write_text(textwrap.dedent("""
        import numpy as np
        class Tiny:
            def __len__(self): return 300
            def __getitem__(self, i): return np.full((8, 8), i, np.int32), i
        def make(): return Tiny()
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]))
    out = tmp / "out"
    cmd = [sys.executable, "-m", "spindle", "bench", "--quick", "--json",
           "--workload", "arrays,jpeg-native,dataset", "--dataset", "bench_user_data:make",
           "--loaders", "spindle,torch,torch+PIL,spindle-native-processes,tf.data",
           "--workers", "1,2", "--rounds", "1", "--samples", str(SAMPLES), "--images", str(IMAGES),
           "--out", str(out), "--timeout", "90"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout), done.stderr, out


def test_every_figure_is_present_and_plausible(bench):
    """Proves: each loader x workers row completed with every figure: rates > 0, threads >= processes
    >= workers + 1 (processes modes), samples counted equal to the dataset's, first batch within the epoch."""
    doc, _, _ = bench
    rows = {(r["workload"], r["loader"], r["workers"]): r for r in doc["results"]}
    expected = {("arrays", "spindle"), ("arrays", "torch"), ("jpeg-native", "spindle-native-processes"),
                ("jpeg-native", "torch+PIL"), ("dataset", "spindle"), ("dataset", "torch")}
    assert {(w, lo) for w, lo, _ in rows} == expected
    size = {"arrays": SAMPLES, "jpeg-native": IMAGES, "dataset": 300}
    for (workload, loader, workers), r in rows.items():
        where = f"{workload} {loader} w={workers}: {r}"
        assert r["completed"] == r["rounds"] == 1, where
        assert r["samples"] == size[workload], where
        assert r["samples_per_s"] > 0 and r["samples_per_s_min"] <= r["samples_per_s"] <= r["samples_per_s_max"]
        assert 0 < r["first_batch_s"] < r["samples"] / r["samples_per_s"], where
        assert r["peak_threads"] >= r["peak_processes"] >= workers + 1, where
        assert r["peak_pss_mib"] > 1, where
        assert r["cpu_s_per_1000"] > 0, where
    for run in doc["runs"]:
        assert run["outcome"] == "completed" and run["left_running"] == 0, run
    assert {a["workload"] for a in doc["advice"]} == set(size)
    assert all(a["workers"] in (1, 2) for a in doc["advice"] if a["fits"])


def test_missing_peer_is_skipped_with_the_reason(bench):
    """Proves: a peer that does not import is reported skipped, with the import error, and never run."""
    doc, stderr, _ = bench
    assert "hidden by test_bench_cli" in doc["skipped"]["tf.data"]
    assert not any(r["loader"] == "tf.data" for r in doc["runs"])
    assert "tf.data" in stderr and "skipped" in stderr


def test_plots_are_png_and_machine_is_recorded(bench):
    """Proves: one valid PNG per workload is written, and the machine, load and versions are recorded."""
    doc, stderr, out = bench
    assert len(doc["plots"]) == 3
    for path in doc["plots"]:
        with open(path, "rb") as f:
            data = f.read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, path
        assert path in stderr
    m = doc["machine"]
    assert m["nproc"] >= 1 and m["versions"]["numpy"] and m["versions"]["torch"]
    assert len(m["load_average_at_start"]) == 3 and len(doc["load_average_at_end"]) == 3
    assert json.loads((out / "bench.json").read_text())["results"] == doc["results"]


@pytest.mark.parametrize("args, message", [
    (["--workload", "nope"], "unknown workload 'nope'"),
    (["--loaders", "spindle,nope"], "unknown loader 'nope'"),
    (["--workload", "dataset"], "needs --dataset MODULE:FACTORY"),
    (["--workers", "1,x"], "comma-separated list of counts"),
])
def test_bad_arguments_say_what_to_change(args, message):
    """Proves: a wrong workload, loader or worker list fails at once with a message naming it."""
    done = subprocess.run([sys.executable, "-m", "spindle", "bench", *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_results_are_written_when_plotting_fails(tmp_path):
    """Proves: with matplotlib failing to import, `spindle bench` still completes and writes bench.json and
    bench.md (written before the plots), and says in one line why there are no plots."""
    shadow = tmp_path / "shadow"
    (shadow / "matplotlib").mkdir(parents=True)
    (shadow / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by test_bench_cli')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "spindle", "bench", "--workload", "arrays", "--loaders", "spindle",
                           "--workers", "1", "--rounds", "1", "--samples", "1024", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    doc = json.loads((out / "bench.json").read_text())
    assert doc["plots"] == [] and [r["loader"] for r in doc["results"]] == ["spindle"], doc["results"]
    assert "spindle" in (out / "bench.md").read_text()
    assert [line for line in done.stderr.splitlines() if "no plots" in line and "hidden by test_bench_cli" in line]
