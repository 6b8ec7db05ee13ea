"""One JAX process of test_distributed.py's multi-process tests:

    python jax_job.py PORT PROCESS_ID OUT_DIR [PHASE [NUM_PROCESSES]]

jax.distributed.initialize with its coordinator on 127.0.0.1 (or $COORDINATOR_HOST: the first namespace
node of test_two_nodes.py), CPU, NUM_PROCESSES (default 2), then by PHASE:

- ``shard`` (default): spindle.DataLoader(shard="auto"), which reads jax.process_index()/process_count();
  writes what it found and the ids it loaded to OUT/PROCESS_ID.json.
- ``grain``: spindle.grain.DataLoader whose IndexSampler shards by jax.process_index() and
  process_count() (grain's ShardByJaxProcess's shard, as explicit ShardOptions): a whole
  epoch of batches; then a new epoch stopped after STOP batches with its grain checkpoint, and
  spindle.DataLoader(shard="auto") stopped likewise with its state; writes OUT/grain.PROCESS_ID.json.
- ``resume`` (one process): the 2 processes' checkpoints (OUT/grain.*.json) resumed here. A grain
  checkpoint holds its sampler's shard (grain refuses another), so each old process's shard is resumed
  by a loader of that shard; spindle.DataLoader's states, of both old ranks, by one loader of rank 0 of
  1 (elastic resume). Writes OUT/resume.json.
"""

import json
import os
import sys

import jax

port, process_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
phase = sys.argv[4] if len(sys.argv) > 4 else "shard"
count = int(sys.argv[5]) if len(sys.argv) > 5 else 2
host = os.environ.get("COORDINATOR_HOST", "127.0.0.1")
jax.distributed.initialize(coordinator_address=f"{host}:{port}", num_processes=count, process_id=process_id)

import numpy as np  # noqa: E402

import spindle  # noqa: E402

GRAIN_RECORDS, BATCH, STOP = 50, 4, 3


class Ids:
    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> np.int64:
        return np.int64(i)


def grain_loader(shard_options):
    import grain
    import spindle.grain as sgrain

    sampler = grain.samplers.IndexSampler(num_records=GRAIN_RECORDS, shard_options=shard_options, shuffle=True,
                                          num_epochs=1, seed=5)
    return sgrain.DataLoader(data_source=[np.int64(i) for i in range(GRAIN_RECORDS)], sampler=sampler,
                             operations=[grain.transforms.Batch(batch_size=BATCH)], worker_count=2)


def elastic_loader() -> spindle.DataLoader:
    return spindle.DataLoader(Ids(), batch_size=BATCH, shuffle=True, num_workers=2, seed=0, shard="auto")


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in np.asarray(b).reshape(-1)]


if phase == "shard":
    loader = spindle.DataLoader(Ids(), batch_size=4, shuffle=True, num_workers=2, shard="auto")
    loaded = [int(i) for batch in loader for i in batch]
    with open(f"{out}/{process_id}.json", "w") as f:
        json.dump({"shard": [loader.shard.rank, loader.shard.world_size, loader.shard.source], "ids": loaded}, f)
elif phase == "grain":
    from absl import flags
    from grain.sharding import ShardByJaxProcess, ShardOptions

    flags.FLAGS.mark_as_parsed()
    # grain's ShardByJaxProcess picks the same shard, but a checkpoint names its sampler's class
    # (grain validates repr(sampler)) and one process cannot build ShardByJaxProcess(shard_index=1,
    # shard_count=2) to resume it: the explicit ShardOptions can be rebuilt anywhere.
    by_process = ShardByJaxProcess()
    options = ShardOptions(shard_index=jax.process_index(), shard_count=jax.process_count())
    assert (by_process.shard_index, by_process.shard_count) == (options.shard_index, options.shard_count)
    loader = grain_loader(options)
    epoch = [ids([b]) for b in loader]
    it = iter(grain_loader(options))
    head = [ids([next(it)]) for _ in range(STOP)]
    state = it.get_state()
    rest = [ids([b]) for b in it]
    elastic = elastic_loader()
    eit = iter(elastic)
    elastic_head = ids(next(eit) for _ in range(STOP))
    import socket

    record = {"process": [jax.process_index(), jax.process_count()], "host": socket.gethostname(),
              "shard": [options.shard_index, options.shard_count], "epoch": epoch, "head": head,
              "state": state.decode() if isinstance(state, bytes) else state, "rest": rest,
              "elastic": {"head": elastic_head, "state": elastic.state_dict(),
                          "shard": [elastic.shard.rank, elastic.shard.world_size]}}
    with open(f"{out}/grain.{process_id}.json", "w") as f:
        json.dump(record, f)
else:
    from absl import flags
    from grain.sharding import ShardOptions

    flags.FLAGS.mark_as_parsed()
    old = [json.load(open(f"{out}/grain.{p}.json")) for p in range(2)]
    resumed = []
    for record in old:
        index, shard_count = record["shard"]
        it = iter(grain_loader(ShardOptions(shard_index=index, shard_count=shard_count)))
        it.set_state(record["state"].encode())
        resumed.append([ids([b]) for b in it])
    elastic = elastic_loader()
    elastic.load_state_dict([r["elastic"]["state"] for r in old])
    record = {"process": [jax.process_index(), jax.process_count()], "grain": resumed,
              "elastic": {"rest": ids(elastic), "shard": [elastic.shard.rank, elastic.shard.world_size]}}
    with open(f"{out}/resume.json", "w") as f:
        json.dump(record, f)
jax.distributed.shutdown()
