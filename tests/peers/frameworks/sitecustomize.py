"""Runs a training framework's own tests with every torch DataLoader on spindle's workers.

With this folder on PYTHONPATH and SPINDLE_PEER_PATCH=install, every
interpreter (pytest, and each process the tests start: multiprocessing's
spawned children, ``torchrun``/``python -c`` subprocesses, spindle's own
spawned workers) calls ``spindle.torch.install()`` as it starts, the one call a
user adds to a training script. That routes every torch DataLoader with
``num_workers > 0`` (torch's class, the frameworks' subclasses, the loaders
they build inside) through spindle. The tests and the frameworks are not
changed.

With SPINDLE_PEER_COUNT_DIR set (stock runs too), each interpreter counts the
iterators that torch's ``DataLoader._get_iterator`` built for loaders with
workers (one per epoch; one for all epochs of persistent workers), by whose
workers serve them (spindle's, or torch's: a fallback, or a stock run), and
writes "<spindle> <torch>" to SPINDLE_PEER_COUNT_DIR/iterators.<pid> at exit:
how much of a suite ran on spindle's workers at all. A class that builds
its own iterator (torchdata's StatefulDataLoader) is not counted. A forked
child exits without running exit handlers, so it writes nothing.

Used by tests/peers/frameworks/run.sh; the frameworks' tests stay outside this
repository (tests/peers/frameworks/prepare.sh exports them).
"""

import os

if os.environ.get("SPINDLE_PEER_PATCH") == "install":
    import spindle.torch

    spindle.torch.install()

if os.environ.get("SPINDLE_PEER_COUNT_DIR"):
    import atexit

    import torch.utils.data.dataloader as _dataloader

    _iterators = {"spindle": 0, "torch": 0}
    _pid = os.getpid()
    _get_iterator = _dataloader.DataLoader._get_iterator

    def _counting_get_iterator(self):
        iterator = _get_iterator(self)
        if self.num_workers > 0:
            _iterators["spindle" if type(iterator).__module__.startswith("spindle") else "torch"] += 1
        return iterator

    def _write_counts():
        if os.getpid() == _pid and any(_iterators.values()):
            with open(os.path.join(os.environ["SPINDLE_PEER_COUNT_DIR"], f"iterators.{_pid}"), "w") as f:
                f.write(f"{_iterators['spindle']} {_iterators['torch']}\n")

    _dataloader.DataLoader._get_iterator = _counting_get_iterator
    atexit.register(_write_counts)
