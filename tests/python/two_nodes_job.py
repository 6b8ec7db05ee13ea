"""One rank of tests/python/test_two_nodes.py, started by torchrun in a namespace "node".

    torchrun --nnodes N --nproc-per-node P ... two_nodes_job.py OUT PHASE

Every rank joins gloo over the nodes' veth, loads with spindle.torch (shard="auto"), gathers what it
saw on rank 0, which writes OUT/PHASE.json (a list, one entry per rank in rank order).

- ``fresh`` (2 nodes x 2): two epochs of ``spindle.torch.DataLoader(shard="auto")``; the node's
  budget ledger as each rank reads it while every rank's loader lives; then
  ``StatefulDataLoader(shard="auto")``: STOP_AFTER batches of epoch 0 and the state there.
- ``resume`` (any world): every old rank's state (OUT/../fresh/fresh.json) into a new loader; RESUME_STOP
  batches, the state there, then the rest of the epoch.
- ``back`` (any world): OUT/../resume/resume.json's states; the rest of the epoch.
- ``budget`` (2 nodes x 2; ``$TIGHT_HEADROOM`` set on the node with a thread limit):
  ``spindle.torch.DataLoader(num_workers=4)`` whose samples name the worker that loaded them; on a
  node with ``TIGHT_HEADROOM`` each rank lowers its RLIMIT_NPROC to the uid's tasks + that
  headroom (as an unprivileged uid: root is exempt). The node's first local rank starts its loader
  first, then the second: the ledger gives the first what fits and the second the rest.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

from spindle import _core
from spindle.torch import DataLoader, StatefulDataLoader

SAMPLES = 96
BATCH = 4
SEED = 17
STOP_AFTER = 3  # batches of the fresh run's epoch 0 before its states are taken (6 a rank in 2 x 2)
RESUME_STOP = 2  # batches of the resumed run before its states are taken


class Ids:
    """Sample i is the tensor [i]."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


class Loaded(Ids):
    """Sample i is [i, the id of the (logical) worker that loaded it]."""

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, get_worker_info().id])


def ids(batch: torch.Tensor) -> list[int]:
    return [int(i) for i in batch.flatten()]


def stateful() -> StatefulDataLoader:
    return StatefulDataLoader(Ids(), batch_size=BATCH, shuffle=True, num_workers=2, shard="auto", shard_seed=SEED)


def uid_tasks() -> int:
    """Tasks (threads) of this real uid that this process can see (its node's pid namespace)."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) == uid:
            n += int(status["Threads"])
    return n


def fresh(rank: int, world: int) -> dict:
    mine: dict = {}
    loader = DataLoader(Ids(), batch_size=BATCH, shuffle=True, num_workers=2, shard="auto", shard_seed=SEED)
    mine["shard"] = [loader._shard.rank, loader._shard.world_size, loader._shard.source]
    epochs = []
    for epoch in range(2):
        seen = []
        for k, batch in enumerate(loader):
            seen += ids(batch)
            if epoch == 0 and k == 0:
                dist.barrier()  # every rank's loader lives (its workers forked) ...
                mine["ledger"] = {"status": _core.ledger_status(), "leases": _core.ledger_leases()}
                dist.barrier()  # ... while each rank reads its node's ledger
        epochs.append(seen)
    mine["epochs"] = epochs

    checkpointed = stateful()
    it = iter(checkpointed)
    mine["consumed"] = [i for _ in range(STOP_AFTER) for i in ids(next(it))]
    mine["state"] = checkpointed.state_dict()
    mine["rest"] = [i for batch in it for i in ids(batch)]  # the uninterrupted run, for reference
    return mine


def resume(out: str, source: str, stop: int | None) -> dict:
    states = [r["state"] for r in json.load(open(os.path.join(out, "..", source, f"{source}.json")))]
    loader = stateful()
    loader.load_state_dict(states)  # every old rank's state, whatever the old world size
    mine: dict = {"shard": [loader._shard.rank, loader._shard.world_size, loader._shard.source]}
    it = iter(loader)
    if stop is not None:
        mine["consumed"] = [i for _ in range(stop) for i in ids(next(it))]
        mine["state"] = loader.state_dict()
    mine["rest"] = [i for batch in it for i in ids(batch)]
    return mine


def budget(rank: int, local_rank: int) -> dict:
    mine: dict = {"uid": os.getuid()}
    headroom = os.environ.get("TIGHT_HEADROOM")
    dist.barrier()  # every rank of the node exists with its gloo threads: count them once
    if headroom is not None:
        soft = uid_tasks() + int(headroom)
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, resource.getrlimit(resource.RLIMIT_NPROC)[1]))
        mine["nproc_soft"] = soft
    dist.barrier()
    loader = DataLoader(Loaded(), batch_size=BATCH, shuffle=True, num_workers=4, shard="auto", shard_seed=SEED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = []
        it = None
        for turn in range(2):  # the node's local rank 0 starts first, then local rank 1
            if turn == local_rank:
                it = iter(loader)
                batches.append(next(it).tolist())
            dist.barrier()
        mine["processes"] = len(it._workers)  # worker processes the loader started
        mine["ledger"] = {"status": _core.ledger_status(), "leases": _core.ledger_leases()}
        dist.barrier()
        batches += [b.tolist() for b in it]
    mine["batches"] = batches
    mine["notes"] = [str(w.message) for w in caught if "logical workers" in str(w.message)]
    return mine


def main() -> None:
    out, phase = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    if phase == "fresh":
        mine = fresh(rank, world)
    elif phase == "resume":
        mine = resume(out, "fresh", RESUME_STOP)
    elif phase == "back":
        mine = resume(out, "resume", None)
    else:
        mine = budget(rank, local_rank)
    mine.update(rank=rank, world=world, local_rank=local_rank, host=socket.gethostname(), pid=os.getpid(),
                env_rank=os.environ.get("RANK"), env_local_rank=os.environ.get("LOCAL_RANK"))
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        path = os.path.join(out, f"{phase}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(everyone, f)
        os.replace(path + ".tmp", path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
