"""Starting workers from a consumer that already runs other runtimes' threads."""

import os
import threading

import numpy as np
import pytest

import spindle
from toy_datasets import Images

torch = pytest.importorskip("torch")


def test_loaders_start_and_stop_repeatedly_while_torch_and_python_threads_run():
    """With torch intra-op threads busy and a Python thread churning locks, 20 loader
    lifecycles finish without a hang and leave no worker or thread behind."""
    torch.set_num_threads(2)
    stop = threading.Event()

    def busy():
        a = torch.randn(256, 256)
        while not stop.is_set():
            (a @ a).sum().item()                 # torch's pool is mid-flight at fork time
            np.linalg.norm(np.ones(1000))
            __import__("json").dumps({"x": 1})   # takes the import lock

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    try:
        before = spindle.count_process_threads(os.getpid())
        for epoch in range(20):
            loader = spindle.DataLoader(Images(600), batch_size=50, num_workers=4, shuffle=True, seed=epoch)
            total = sum(int(b.shape[0]) for b in loader)
            assert total == 600
        # A loader dropped mid-epoch stops its workers too.
        it = iter(spindle.DataLoader(Images(600), batch_size=50, num_workers=4))
        next(it)
        pids = it.worker_pids
        del it
        assert not any(os.path.exists(f"/proc/{p}") for p in pids)
        assert spindle.count_process_threads(os.getpid()) <= before + spindle.ThreadBudget().cpus
    finally:
        stop.set()
        t.join()
