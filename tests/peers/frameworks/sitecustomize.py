"""Runs a training framework's own tests with every torch DataLoader on spindle's workers.

With this folder on PYTHONPATH and SPINDLE_PEER_PATCH=install, every
interpreter (pytest, and each process the tests start: multiprocessing's
spawned children, ``torchrun``/``python -c`` subprocesses, spindle's own
spawned workers) calls ``spindle.torch.install()`` as it starts, the one call a
user adds to a training script. That routes every torch DataLoader with
``num_workers > 0`` (torch's class, the frameworks' subclasses, the loaders
they build inside) through spindle. The tests and the frameworks are not
changed.

Used by tests/peers/frameworks/run.sh; the frameworks' tests stay outside this
repository (tests/peers/frameworks/prepare.sh exports them).
"""

import os

if os.environ.get("SPINDLE_PEER_PATCH") == "install":
    import spindle.torch

    spindle.torch.install()
