"""One rank of the multi-host test (tests/python/test_torchrun.py), started by torchrun.

    torchrun ... torchrun_job.py OUT_DIR fresh|resume|elastic

Each rank loads its part of a map-style dataset with
``spindle.torch.StatefulDataLoader(shard="auto")`` over gloo (CPU).

- ``fresh``: epoch 0 whole; the ranks gather their sample ids with
  ``all_gather_object`` and rank 0 writes them. Then epoch 1: after each batch
  the rank writes its loader state and the ids it has seen this epoch
  (atomically); after STOP_AFTER batches it waits to be killed (SIGKILL).
- ``resume``: each rank loads its saved state into a new loader and finishes
  epoch 1, writing the ids it loaded after resuming.
- ``elastic``: a job of another world size; every rank loads rank 0's saved
  state (the ranks advanced in lock step) and finishes epoch 1, writing the ids
  it loaded to elastic<world>.<rank>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from spindle.torch import StatefulDataLoader

SAMPLES = 96
BATCH = 4
STOP_AFTER = 3  # batches of epoch 1 before the job is killed (each rank has 96 / 4 / 4 = 6)


class Ids:
    """Sample i is the tensor [i]."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def make_loader() -> StatefulDataLoader:
    return StatefulDataLoader(Ids(), batch_size=BATCH, shuffle=True, num_workers=2, shard="auto", shard_seed=17)


def write_json(path: str, value: object) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # two jobs at once have a rank 1 each: each writes its own temporary
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)  # a reader (or a restart after SIGKILL) sees the old file or the new one


def main() -> None:
    out, phase = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(out, f"pid{rank}.{phase}" + (str(world) if phase == "elastic" else "")), "w") as f:
        f.write(str(os.getpid()))
    state_path = os.path.join(out, f"state{rank}.json")
    loader = make_loader()
    shard = loader._shard  # what shard="auto" found
    write_json(os.path.join(out, f"shard{rank}.json"), [shard.rank, shard.world_size, shard.source])
    if phase == "fresh":
        mine = [int(i) for batch in loader for i in batch.flatten()]
        everyone: list[list[int]] = [[] for _ in range(world)]
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            write_json(os.path.join(out, "epoch0.json"), everyone)
        seen: list[int] = []
        for k, batch in enumerate(loader):  # epoch 1
            seen += [int(i) for i in batch.flatten()]
            write_json(state_path, {"state": loader.state_dict(), "seen": seen})
            if k + 1 == STOP_AFTER:
                time.sleep(600)  # the test kills the whole job here
    elif phase == "resume":
        saved = json.load(open(state_path))
        loader.load_state_dict(saved["state"])
        rest = [int(i) for batch in loader for i in batch.flatten()]
        write_json(os.path.join(out, f"resumed{rank}.json"), {"before": saved["seen"], "after": rest})
        dist.barrier()
    else:
        saved = json.load(open(os.path.join(out, "state0.json")))
        loader.load_state_dict(saved["state"])  # rank 0's state, whatever this job's world size
        rest = [int(i) for batch in loader for i in batch.flatten()]
        write_json(os.path.join(out, f"elastic{world}.{rank}.json"), rest)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
