"""spindle.torch inside the training frameworks people run (issue 25): Lightning 2.6's Trainer (DDP over 2
ranks and 1 device), accelerate 1.15 under torchrun, HF transformers' Trainer. Each training program is
tests/python/framework_jobs.py, run in a subprocess (Lightning's DDP and torchrun start the ranks as
processes of their own); it trains with torch's DataLoader and with spindle from the same seed, and writes
what each rank's steps saw and which process loaded each sample. Skipped where a framework is not installed
(`pip install '.[frameworks]'`, or `make deps`)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("torch")

JOBS = Path(__file__).with_name("framework_jobs.py")
SAMPLES, BATCH = 64, 4  # framework_jobs.py's dataset and batch size


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install '.[frameworks]')")


def job_pids(out: Path) -> list[int]:
    """The programs' main processes (every rank): framework_jobs.write_pid."""
    return [int(p.name.rsplit(".", 1)[1]) for p in out.glob("pid.*")]


def kill_job(proc: subprocess.Popen, out: Path) -> None:
    """SIGKILL to the job's process group and to each rank's (torchrun starts a rank as a session leader)."""
    for pgid in {proc.pid, *job_pids(out)}:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def run_job(argv: list[str], out: Path, timeout: float = 240) -> None:
    """Runs one program of framework_jobs.py to its end; fails with its log's end if it fails or hangs."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SPINDLE_TORCH"):
        env.pop(name, None)  # the job's reference runs are torch's own; only the program installs spindle
    log = out / "job.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([str(a) for a in argv], env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc, out)
        pytest.fail(f"{argv[-3:]} did not end in {timeout} s; its log ends:\n{log.read_text()[-6000:]}")
    assert rc == 0, f"{argv[-3:]} exited with {rc}; its log ends:\n{log.read_text()[-6000:]}"
    left = [n for n in os.listdir("/dev/shm") if any(n.startswith(f"spindle.{p}.") for p in job_pids(out))]
    assert left == [], f"shared memory the job left behind: {left}"


def loads(out: Path) -> dict[str, list[tuple[int, str]]]:
    """tag -> [(sample index, name of the process that loaded it)], from the dataset's names.<pid>.txt."""
    seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for path in out.glob("names.*.txt"):
        for line in path.read_text().splitlines():
            tag, index, name = line.split(" ", 2)
            seen[tag].append((int(index), name))
    return seen


def not_spindle_workers(loaded: list[tuple[int, str]]) -> set[str]:
    return {name for _, name in loaded if not name.startswith("SpindleWorker-")}


def read(out: Path, name: str) -> dict:
    return json.loads((out / name).read_text())


@pytest.mark.timeout(300)
def test_lightning_ddp_two_ranks_split_as_with_torch_on_spindle_workers(tmp_path):
    """Proves: under Lightning's Trainer(devices=2, strategy="ddp") on CPU (gloo), a spindle.torch.DataLoader
    from train_dataloader() gets Lightning's DistributedSampler: each rank's indices per epoch equal those of the
    same program with torch's DataLoader and seed, the ranks' parts are disjoint and complete, and spindle's
    workers load every sample exactly as often as torch's workers do (no probe epoch)."""
    needs("pytorch_lightning")
    run_job([sys.executable, JOBS, "lightning", tmp_path, 2], tmp_path)
    epochs = {}
    for rank in range(2):
        torch_run = read(tmp_path, f"lightning2.torch.rank{rank}.json")
        spindle_run = read(tmp_path, f"lightning2.spindle.rank{rank}.json")
        assert sorted(torch_run) == ["0", "1"]
        assert spindle_run == torch_run, f"rank {rank}: spindle's epochs differ from torch's"
        epochs[rank] = spindle_run
    for epoch in ("0", "1"):
        parts = [epochs[rank][epoch] for rank in range(2)]
        assert [len(p) for p in parts] == [SAMPLES // 2] * 2
        assert sorted(parts[0] + parts[1]) == list(range(SAMPLES)), f"epoch {epoch}: ranks overlap"
    loaded = loads(tmp_path)
    assert loaded["spindle"], "no sample was loaded in the spindle run"
    assert not_spindle_workers(loaded["spindle"]) == set()
    assert sorted(i for i, _ in loaded["spindle"]) == sorted(i for i, _ in loaded["torch"])


@pytest.mark.timeout(300)
def test_lightning_one_device_epochs_as_with_torch(tmp_path):
    """Proves: under Lightning's Trainer(devices=1) a shuffling spindle.torch.DataLoader's epochs have the
    orders torch's DataLoader has in the same program from the same seed (Lightning's handling starts no extra
    epoch), loaded by spindle's workers, each sample as often as torch's workers load it."""
    needs("pytorch_lightning")
    run_job([sys.executable, JOBS, "lightning", tmp_path, 1], tmp_path)
    torch_run = read(tmp_path, "lightning1.torch.rank0.json")
    assert sorted(torch_run) == ["0", "1"] and torch_run["0"] != torch_run["1"]
    assert read(tmp_path, "lightning1.spindle.rank0.json") == torch_run
    loaded = loads(tmp_path)
    assert loaded["spindle"], "no sample was loaded in the spindle run"
    assert not_spindle_workers(loaded["spindle"]) == set()
    assert sorted(i for i, _ in loaded["spindle"]) == sorted(i for i, _ in loaded["torch"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["loader", "install"])
def test_accelerate_torchrun_prepare_accumulate_skip_on_spindle_workers(tmp_path, mode):
    """Proves: under torchrun with 2 ranks (gloo, CPU), accelerate's prepare() re-creates a
    spindle.torch.DataLoader ("loader") or a torch DataLoader after spindle.torch.install() ("install") so
    that each rank gets the batches torch's gets, disjoint and complete; gradient accumulation over 3 syncs
    where torch's does, the last batch included (end_of_dataloader); skip_first_batches(dl, 2) yields torch's
    batches; and every sample of all that, the skipping loader's too, is loaded by spindle's workers."""
    needs("accelerate")
    run_job([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
             JOBS, "accelerate", tmp_path, mode], tmp_path)
    seen = []
    for rank in range(2):
        runs = read(tmp_path, f"accelerate.{mode}.rank{rank}.json")
        torch_run, spindle_run = runs["torch"], runs["spindle"]
        assert spindle_run["untouched"] is False, "prepare() returned the loader it was given"
        assert spindle_run["order"] == torch_run["order"], f"rank {rank}: prepare() split unlike torch's"
        assert torch_run["syncs"][-1] and torch_run["ends"][-1]
        assert (spindle_run["syncs"], spindle_run["ends"]) == (torch_run["syncs"], torch_run["ends"])
        assert spindle_run["skipped"] == torch_run["skipped"]
        seen += [i for batch in spindle_run["order"] for i in batch]
    assert sorted(seen) == list(range(SAMPLES))
    loaded = loads(tmp_path)
    for tag, what in (("spindle", "the prepared loader"), ("spindle-skip", "skip_first_batches' loader")):
        assert loaded[tag], f"{what} loaded nothing"
        assert not_spindle_workers(loaded[tag]) == set(), f"{what} loaded outside spindle's workers"
        assert sorted(i for i, _ in loaded[tag]) == sorted(i for i, _ in loaded[tag.replace("spindle", "torch")])


@pytest.mark.timeout(300)
def test_hf_trainer_after_install_loads_on_spindle_workers(tmp_path):
    """Proves: after spindle.torch.install(), HF transformers' Trainer (dataloader_num_workers=2, its own
    default_data_collator) trains a tiny model its 4 steps with every batch loaded by spindle's workers."""
    needs("transformers")
    run_job([sys.executable, JOBS, "trainer", tmp_path], tmp_path)
    assert read(tmp_path, "trainer.rank0.json") == {"global_step": 4}
    loaded = loads(tmp_path)["trainer"]
    assert len(loaded) >= 4 * BATCH
    assert not_spindle_workers(loaded) == set()
