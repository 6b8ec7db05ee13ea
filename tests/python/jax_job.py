"""One JAX process of test_distributed.py's multi-process test:

    python jax_job.py PORT PROCESS_ID OUT_DIR

jax.distributed.initialize over 127.0.0.1 (CPU), then spindle.DataLoader(shard="auto"),
which reads jax.process_index()/process_count(); writes what it found and the ids it loaded.
"""

import json
import sys

import jax

port, process_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id)

import numpy as np  # noqa: E402

import spindle  # noqa: E402


class Ids:
    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> np.int64:
        return np.int64(i)


loader = spindle.DataLoader(Ids(), batch_size=4, shuffle=True, num_workers=2, shard="auto")
loaded = [int(i) for batch in loader for i in batch]
with open(f"{out}/{process_id}.json", "w") as f:
    json.dump({"shard": [loader.shard.rank, loader.shard.world_size, loader.shard.source], "ids": loaded}, f)
jax.distributed.shutdown()
