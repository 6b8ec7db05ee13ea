"""Runs torch's own DataLoader tests with spindle.torch.DataLoader in place of torch's.

With this folder on PYTHONPATH and SPINDLE_PEER_PATCH=torch, every interpreter
(pytest, and each process the tests start: multiprocessing's spawned children,
``python -c`` subprocesses, spindle's own spawned workers) replaces
``torch.utils.data.DataLoader`` and ``torch.utils.data.dataloader.DataLoader``
with ``spindle.torch.DataLoader`` as it starts, the monkeypatch a user would
write. spindle.torch keeps torch's class for itself (it validates arguments
with it), bound when spindle.torch is imported.

With SPINDLE_PEER_START_METHOD=spawn (or forkserver), the interpreter also sets
multiprocessing's start method globally as it starts, before any test (what a
CUDA user's script does first), so every DataLoader whose
``multiprocessing_context`` is None starts its workers that way.

Used by tests/peers/torch/run.sh; torch's test file stays outside this
repository (it is PyTorch's test/test_dataloader.py).
"""

import os

if os.environ.get("SPINDLE_PEER_PATCH") == "torch":
    import torch.utils.data
    import torch.utils.data.dataloader

    import spindle.torch

    torch.utils.data.DataLoader = torch.utils.data.dataloader.DataLoader = spindle.torch.DataLoader

if os.environ.get("SPINDLE_PEER_START_METHOD"):
    import multiprocessing

    multiprocessing.set_start_method(os.environ["SPINDLE_PEER_START_METHOD"], force=True)
