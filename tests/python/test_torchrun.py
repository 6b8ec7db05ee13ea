"""Multi-host for real: 2 "nodes" x 2 processes started by torchrun on 127.0.0.1 (gloo, CPU),
each rank loading with shard="auto"; then the whole job SIGKILLed mid-epoch and restarted
from the ranks' saved states, and with 2 and with 3 ranks from rank 0's state (elastic
resume; the job itself is tests/python/torchrun_job.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

JOB = Path(__file__).with_name("torchrun_job.py")
NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
SAMPLES, STOP_AFTER, BATCH = 96, 3, 4


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports: each socket stays bound until all are chosen (jobs started together
    must not be handed the same rendezvous port before the first one binds it)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start_job(out: Path, phase: str, nodes: int = NODES, per_node: int = PER_NODE,
              port: int | None = None) -> list[subprocess.Popen]:
    """One torchrun per "node", each in its own session (so the whole tree can be killed)."""
    port = port or free_ports(1)[0]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}", f"--nproc-per-node={per_node}",
         f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}", str(JOB), str(out), phase],
        env=env, start_new_session=True,
        stdout=open(out / f"node{node}.{phase}{nodes * per_node}.log", "w"), stderr=subprocess.STDOUT)
        for node in range(nodes)]


def logs(out: Path) -> str:
    # The tail of each log, and every line a rank's error left before it (the first rank to fail says why).
    parts = []
    for p in sorted(out.glob("node*.log")):
        text = p.read_text()
        errors = [line for line in text[:-3000].splitlines() if "Error" in line or "error" in line]
        parts.append(f"--- {p.name}\n" + "".join(line + "\n" for line in errors[-20:]) + text[-3000:])
    return "\n".join(parts)


def wait_for(predicate, jobs, out: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if any(j.poll() not in (None, 0) for j in jobs):
            kill(jobs)
            pytest.fail(f"the torchrun job failed while waiting for {what}:\n{logs(out)}")
        if time.monotonic() > deadline:
            kill(jobs)
            pytest.fail(f"timed out waiting for {what}:\n{logs(out)}")
        time.sleep(0.1)


def kill(jobs) -> None:
    """SIGKILL to the whole job, as a scheduler ends it: torchrun's agents and every rank's session
    (torchrun starts each rank as a session leader; a rank's spindle workers are in its group)."""
    out = Path(jobs[0].args[-2])
    for pid_file in [*out.glob("pid*.fresh"), *out.glob("pid*.resume"), *out.glob("pid*.elastic*")]:
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    for j in jobs:
        try:
            os.killpg(j.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for j in jobs:
        j.wait()


def progress(out: Path, rank: int) -> int:
    try:
        return len(json.loads((out / f"state{rank}.json").read_text())["seen"]) // BATCH
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def run_to_end(out: Path, phase: str, sizes: list[tuple[int, int]]) -> None:
    """Jobs of (nodes, processes per node) each, at once, to their end."""
    ports = free_ports(len(sizes))
    jobs = [j for (nodes, per_node), port in zip(sizes, ports) for j in start_job(out, phase, nodes, per_node, port)]
    try:
        for j in jobs:
            assert j.wait(timeout=150) == 0, logs(out)
    finally:
        kill(jobs)
    for p in out.glob(f"pid*.{phase}*"):
        p.rename(p.with_name("done-" + p.name))  # a later kill() must not signal reused pids


@pytest.mark.timeout(300)
def test_torchrun_two_nodes_shard_auto_then_sigkill_and_resume(tmp_path):
    """Proves: 4 torchrun ranks with shard="auto" load disjoint parts whose union is the dataset; after
    SIGKILL of the whole job mid-epoch, a restart from the saved states completes the epoch with every
    sample exactly once, and nothing of spindle's is left (processes, /dev/shm); restarts with 2 and with 3
    ranks from rank 0's state alone (elastic resume) complete it with every sample exactly once too."""
    jobs = start_job(tmp_path, "fresh")
    wait_for(lambda: all(progress(tmp_path, r) >= STOP_AFTER for r in range(WORLD)), jobs, tmp_path, 150,
             "every rank to load 3 batches of epoch 1")
    shards = [json.loads((tmp_path / f"shard{r}.json").read_text()) for r in range(WORLD)]
    assert shards == [[r, WORLD, "torch.distributed"] for r in range(WORLD)]
    epoch0 = json.loads((tmp_path / "epoch0.json").read_text())
    assert [len(part) for part in epoch0] == [SAMPLES // WORLD] * WORLD
    assert sorted(i for part in epoch0 for i in part) == list(range(SAMPLES))  # disjoint and complete

    pids = [int((tmp_path / f"pid{r}.fresh").read_text()) for r in range(WORLD)]
    kill(jobs)  # SIGKILL to both nodes' whole trees: torchrun, the ranks, their spindle workers
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(p) for p in pids)

    for p in tmp_path.glob("pid*.fresh"):
        p.rename(p.with_suffix(".killed"))  # the resumed job's kill() must not signal reused pids
    run_to_end(tmp_path, "resume", [(NODES, PER_NODE)])
    seen, consumed = [], []
    for rank in range(WORLD):
        record = json.loads((tmp_path / f"resumed{rank}.json").read_text())
        assert len(record["before"]) == STOP_AFTER * BATCH
        assert len(record["before"]) + len(record["after"]) == SAMPLES // WORLD
        seen += record["before"] + record["after"]
        consumed += record["before"]
    assert sorted(seen) == list(range(SAMPLES))  # complete, and no sample twice in the epoch

    run_to_end(tmp_path, "elastic", [(1, 2), (1, 3)])  # two jobs at once, every rank from rank 0's state
    for world in (2, 3):
        after = [json.loads((tmp_path / f"elastic{world}.{r}.json").read_text()) for r in range(world)]
        assert [len(a) for a in after] == [(SAMPLES - len(consumed)) // world] * world  # in step
        assert sorted(consumed + sum(after, [])) == list(range(SAMPLES))  # every sample exactly once
    time.sleep(0.5)  # workers of the killed ranks die with them (parent-death signal)
    left = [n for n in os.listdir("/dev/shm") if any(n.startswith(f"spindle.{p}.") for p in pids)]
    assert left == []
