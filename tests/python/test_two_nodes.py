"""Two nodes on one machine (issue 33): torchrun --nnodes 2 --nproc-per-node 2 with c10d rendezvous
over a veth pair between two namespace "nodes" (tests/python/two_nodes.py: own network, /dev/shm,
hostname, pid namespace), each rank loading with spindle.torch (shard="auto"; the job is
tests/python/two_nodes_job.py); and two JAX processes, one a node (tests/python/jax_job.py).

Where the kernel refuses the namespaces (no root, no veth, a seccomp profile), the tests skip,
saying what was refused."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")

from two_nodes import Node, NamespacesRefused, Nodes  # noqa: E402

JOB = Path(__file__).with_name("two_nodes_job.py")
SAMPLES, BATCH, SEED = 96, 4, 17
STOP_AFTER, RESUME_STOP = 3, 2  # as in two_nodes_job.py
# The tight node's unprivileged uid: one nothing else on the machine runs as (the kernel counts a
# uid's tasks machine-wide; in a real cluster each node counts its own).
TIGHT_UID = 47733
TIGHT_HEADROOM = 6  # tasks the tight node's ranks may add: 4 workers for the first, 2 (of 4) for the second

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, request):
    """Two namespace nodes for this module's tests; torn down (every process, both namespaces, the veth)
    when the module is done, or the test run dies."""
    ctl = tmp_path_factory.mktemp("two-nodes")
    exchange = ctl / "out"
    exchange.mkdir()
    os.chmod(exchange, 0o777)  # the tight node's uid writes here (seen in the nodes as /mnt/out)
    binds = {"out": str(exchange), "venv": sys.prefix, "tests": str(JOB.parent)}
    cluster = Nodes(ctl, binds)
    try:
        cluster.start()
    except NamespacesRefused as refused:
        cluster.close()
        # Printed past pytest's capture, so a run without -rs says it too: never a silent skip.
        with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
            print(f"\ntest_two_nodes.py SKIPPED: two namespace nodes could not be made: {refused}", file=sys.stderr)
        pytest.skip(f"two namespace nodes could not be made: {refused}")
    cluster.exchange = exchange
    yield cluster
    outer = [n.process.pid for n in cluster.nodes]
    cluster.close()
    assert cluster.alive() == [] and all(not Path(f"/proc/{p}").exists() for p in outer)


_ports = iter(range(29500, 29600))


def torchrun(node: Node, out: Path, phase: str, *, nnodes: int, nproc: int, port: int,
             uid: int | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    argv = ["/mnt/venv/bin/python", "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=10.77.0.1:{port}", f"--rdzv-id=spindle-{phase}",
            "--max-restarts=0", "--monitor-interval=0.1", "/mnt/tests/two_nodes_job.py", f"/mnt/out/{out.name}", phase]
    base = {"PATH": "/mnt/venv/bin:/usr/bin:/bin", "HOME": f"/mnt/out/{out.name}", "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "SPINDLE_BUDGET_POLICY": "shrink"}
    log = open(out / f"{node.name}.{phase}.log", "w")
    return subprocess.Popen(node.command(argv, uid=uid), env={**base, **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def run_job(cluster: Nodes, phase: str, plan: list[tuple[Node, dict]], nproc: int) -> list[dict]:
    """torchrun on each node of `plan` (a node and its torchrun keywords); waits for all; rank 0's gather."""
    out = cluster.exchange / phase
    out.mkdir(exist_ok=True)
    os.chmod(out, 0o777)
    port = next(_ports)
    jobs = [torchrun(node, out, phase, nnodes=len(plan), nproc=nproc, port=port, **kw) for node, kw in plan]
    wait_all(jobs, out, timeout=180)
    return json.loads((out / f"{phase}.json").read_text())


def wait_all(jobs: list[subprocess.Popen], out: Path, timeout: float) -> None:
    """Waits for every job; kills those still running past `timeout` (an nsenter: what it started in the
    node dies with the node at teardown at the latest); asserts each exited 0, showing out's logs if not."""
    try:
        for job in jobs:
            job.wait(timeout=timeout)
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(out.glob("*.log")))
    assert [j.returncode for j in jobs] == [0] * len(jobs), logs


def sampler_order(world: int, rank: int, epoch: int) -> list[int]:
    """torch's DistributedSampler part of `rank` of `world` for `epoch`."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(SAMPLES), num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.fixture(scope="module")
def fresh(nodes):
    a, b = nodes.nodes
    started = time.monotonic()
    ranks = run_job(nodes, "fresh", [(a, {}), (b, {})], nproc=2)
    print(f"fresh 2 x 2 job: {time.monotonic() - started:.1f} s", file=sys.stderr)
    return ranks


def test_four_ranks_on_two_nodes_load_distributed_sampler_parts(fresh):
    """Proves: torchrun 2 nodes x 2 over c10d on the veth: each rank's shard="auto" is its global RANK (not
    LOCAL_RANK), the hosts are the two nodes, and per epoch the four ranks' indices are disjoint, complete and
    equal to torch's DistributedSampler(seed=17) with set_epoch."""
    assert [r["rank"] for r in fresh] == [0, 1, 2, 3]
    assert [r["shard"] for r in fresh] == [[r, 4, "torch.distributed"] for r in range(4)]
    assert [r["host"] for r in fresh] == ["node-a", "node-a", "node-b", "node-b"]
    assert [r["local_rank"] for r in fresh] == [0, 1, 0, 1]
    for epoch in range(2):
        parts = [r["epochs"][epoch] for r in fresh]
        assert sorted(sum(parts, [])) == list(range(SAMPLES))  # disjoint and complete
        assert parts == [sampler_order(4, rank, epoch) for rank in range(4)]
    assert fresh[0]["epochs"][0] != fresh[0]["epochs"][1]  # set_epoch reshuffles


def test_each_nodes_ledger_holds_its_own_two_ranks_only(fresh):
    """Proves: while all four ranks' loaders live, each node's budget ledger (/dev/shm/spindle-ledger.0 on
    the node's own /dev/shm) lists leases of exactly that node's two ranks, none of the other node's."""
    for node in ("node-a", "node-b"):
        here = [r for r in fresh if r["host"] == node]
        for r in here:
            assert r["ledger"]["status"]["usable"], r["ledger"]
            assert r["ledger"]["status"]["path"] == "/dev/shm/spindle-ledger.0"
            assert {e["pid"] for e in r["ledger"]["leases"] if e["alive"]} == {x["pid"] for x in here}, (node, r)


def test_checkpoint_on_two_nodes_resumes_exactly_on_one_node_of_three_and_back(nodes, fresh):
    """Proves: the four ranks' StatefulDataLoader states after 3 batches resume on 1 node x 3 ranks with
    exactly what the re-split rule gives (the epoch's order less the consumed, cut r::3), and that job's
    states after 2 more batches resume on 2 nodes x 2 ranks likewise: every sample of the epoch once."""
    a, b = nodes.nodes
    order = sampler_order(1, 0, 0)  # the epoch's global order (DistributedSampler over one rank)
    consumed = [i for r in fresh for i in r["consumed"]]
    assert len(consumed) == 4 * STOP_AFTER * BATCH

    started = time.monotonic()
    three = run_job(nodes, "resume", [(a, {})], nproc=3)
    print(f"resume 1 x 3 job: {time.monotonic() - started:.1f} s", file=sys.stderr)
    assert [r["host"] for r in three] == ["node-a"] * 3
    assert [r["shard"] for r in three] == [[r, 3, "torch.distributed"] for r in range(3)]
    remains = [i for i in order if i not in set(consumed)]
    for r in three:
        assert r["consumed"] + r["rest"] == remains[r["rank"]::3]
    consumed += [i for r in three for i in r["consumed"]]

    started = time.monotonic()
    back = run_job(nodes, "back", [(a, {}), (b, {})], nproc=2)
    print(f"back 2 x 2 job: {time.monotonic() - started:.1f} s", file=sys.stderr)
    assert [r["host"] for r in back] == ["node-a", "node-a", "node-b", "node-b"]
    remains = [i for i in order if i not in set(consumed)]
    for r in back:
        assert r["rest"] == remains[r["rank"]::4]
    assert sorted(consumed + [i for r in back for i in r["rest"]]) == list(range(SAMPLES))  # every sample once


def test_a_node_with_a_tight_thread_limit_shrinks_its_own_processes_only(nodes):
    """Proves: with node-b's ranks as an unprivileged uid under RLIMIT_NPROC = its tasks + 6, node-b's two
    ranks start at most 6 worker processes together, a shrunk rank saying "4 logical workers on P
    processes", while node-a's (root, exempt) start 4 each; each node's ledger (its own /dev/shm) holds its
    own ranks only; every rank's batches equal DistributedSampler's, each sample loaded by logical worker
    k mod 4 as with 4 processes."""
    a, b = nodes.nodes
    started = time.monotonic()
    tight_node = {"uid": TIGHT_UID, "env": {"TIGHT_HEADROOM": str(TIGHT_HEADROOM)}}
    ranks = run_job(nodes, "budget", [(a, {}), (b, tight_node)], nproc=2)
    print(f"budget 2 x 2 job: {time.monotonic() - started:.1f} s", file=sys.stderr)
    assert [r["uid"] for r in ranks] == [0, 0, TIGHT_UID, TIGHT_UID]
    roomy, tight = ranks[:2], ranks[2:]
    assert [r["processes"] for r in roomy] == [4, 4] and [r["notes"] for r in roomy] == [[], []]
    # node-b's first local rank takes what fits of the headroom, the second the rest (at least 1)
    assert all(r["processes"] >= 1 for r in tight) and sum(r["processes"] for r in tight) <= TIGHT_HEADROOM
    assert any(r["processes"] < 4 for r in tight), [r["processes"] for r in tight]
    for r in tight:
        if r["processes"] < 4:
            assert r["notes"] and r["notes"][0].startswith(f"spindle: 4 logical workers on {r['processes']} processes")
        else:
            assert r["notes"] == []
    for node, uid, here in (("node-a", 0, roomy), ("node-b", TIGHT_UID, tight)):
        for r in here:
            assert r["host"] == node
            assert r["ledger"]["status"]["path"] == f"/dev/shm/spindle-ledger.{uid}"
            assert {e["pid"] for e in r["ledger"]["leases"] if e["alive"]} == {x["pid"] for x in here}, (node, r)
    for r in ranks:
        batches = r["batches"]
        assert [s[0] for batch in batches for s in batch] == sampler_order(4, r["rank"], 0)
        assert [{s[1] for s in batch} for batch in batches] == [{k % 4} for k in range(len(batches))]


def test_jax_processes_on_two_nodes_load_grain_shards_and_resume_on_one_node(nodes):
    """Proves: 2 JAX processes, one per node, with jax.distributed.initialize's coordinator on node-a's veth
    address: spindle.grain sharded by jax.process_index() loads disjoint, complete parts, each process on its
    own node; their checkpoints resume on one process of node-a with exactly the rest of the epoch (grain's
    per old shard, spindle.DataLoader's elastically). tests/python/jax_job.py is the job."""
    for name in ("jax", "grain"):  # found, not imported: grain's import starts JAX's threads in this process
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"could not import {name!r}: not installed")
    a, b = nodes.nodes
    out = nodes.exchange / "jax"
    out.mkdir()
    port = str(next(_ports))
    env = {"PATH": "/mnt/venv/bin:/usr/bin:/bin", "HOME": "/mnt/out/jax", "LANG": "C.UTF-8", "JAX_PLATFORMS": "cpu",
           "COORDINATOR_HOST": a.address, "PYTHONDONTWRITEBYTECODE": "1"}

    def run(plan: list[tuple[Node, list[str]]]) -> None:
        jobs = [subprocess.Popen(node.command(["/mnt/venv/bin/python", "/mnt/tests/jax_job.py", port, *args]),
                                 env=env, stdout=open(out / f"{node.name}.{args[0]}.{args[2]}.log", "w"),
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL) for node, args in plan]
        wait_all(jobs, out, timeout=120)

    started = time.monotonic()
    run([(a, ["0", "/mnt/out/jax", "grain", "2"]), (b, ["1", "/mnt/out/jax", "grain", "2"])])
    found = [json.loads((out / f"grain.{i}.json").read_text()) for i in range(2)]
    assert [(f["host"], f["process"], f["shard"]) for f in found] == [("node-a", [0, 2], [0, 2]),
                                                                     ("node-b", [1, 2], [1, 2])]
    parts = [sum(f["epoch"], []) for f in found]
    assert sorted(parts[0] + parts[1]) == list(range(50))
    port = str(next(_ports))
    run([(a, ["0", "/mnt/out/jax", "resume", "1"])])
    print(f"jax 2 processes on 2 nodes, then 1: {time.monotonic() - started:.1f} s", file=sys.stderr)
    resumed = json.loads((out / "resume.json").read_text())
    assert resumed["grain"] == [f["rest"] for f in found]
    consumed = [i for f in found for i in f["elastic"]["head"]]
    assert sorted(consumed + resumed["elastic"]["rest"]) == list(range(30))
