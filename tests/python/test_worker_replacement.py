"""A lost worker is replaced (on_worker_death="replace"): its batch is produced again by a new
process, so the epoch has every sample exactly once, in the order of an undisturbed run; a sample at
two losses, or more losses than allowed, ends the epoch with a WorkerDiedError that names them."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import numpy as np
import pytest

import spindle
from toy_datasets import KillsItselfAt, Waits


class DiesOnceAt:
    """The first read of each sample in `bad` kills its worker (a marker file says it happened)."""

    def __init__(self, n: int, bad: set[int], marks: str) -> None:
        self.n, self.bad, self.marks = n, bad, marks

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.bad:
            mark = os.path.join(self.marks, str(i))
            if not os.path.exists(mark):
                open(mark, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
        return np.full(2, i, np.int64)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_random_sigkills_over_many_epochs_leave_every_epoch_as_an_undisturbed_runs(caplog):
    """Proves: SIGKILL of a random worker at random moments, over 12 epochs of a persistent loader with
    shuffling: every epoch yields the undisturbed run's batches, in its order (every sample once), and
    each loss is one WARNING naming the worker, its pid and the batch posted again."""
    undisturbed = spindle.DataLoader(Waits(240, 0.001, 4), batch_size=8, num_workers=3, shuffle=True, seed=5,
                                     persistent_workers=True)
    expected = [[b[:, 0].tolist() for b in undisturbed] for _ in range(12)]
    undisturbed.close()
    loader = spindle.DataLoader(Waits(240, 0.001, 4), batch_size=8, num_workers=3, shuffle=True, seed=5,
                                persistent_workers=True)
    rng = np.random.default_rng(11)
    kills = 0
    with caplog.at_level(logging.WARNING, logger="spindle"):
        for epoch in range(12):
            it = iter(loader)
            victims = list(it.worker_pids)
            timers = []
            for delay in rng.uniform(0.0, 0.05, size=2):
                victim = int(rng.choice(victims))
                timers.append(threading.Timer(float(delay), os.kill, (victim, signal.SIGKILL)))
                victims.remove(victim)  # each kill a live worker of this epoch's start
            for t in timers:
                t.start()
            got = [b[:, 0].tolist() for b in it]
            for t in timers:
                t.join()
            kills += len(timers)
            assert got == expected[epoch], f"epoch {epoch}"
            assert sorted(i for batch in got for i in batch) == list(range(240))
    loader.close()
    replaced = [r.getMessage() for r in caplog.records if "started again as pid" in r.getMessage()]
    # A kill that lands after the epoch's last batch is found at the next epoch's start: each is
    # replaced once, and none is missed.
    assert kills - 2 <= len(replaced) <= kills, replaced
    assert all("was killed by signal 9" in m for m in replaced), replaced


def test_a_poison_sample_is_named_at_its_second_loss_and_not_retried():
    """Proves: a sample that kills every worker reading it is tried twice: the second loss raises
    WorkerDiedError naming the sample, both losses and that it is not retried; nothing is left running."""
    it = iter(spindle.DataLoader(KillsItselfAt(123, n=300), batch_size=10, num_workers=2))
    pids = set(it.worker_pids)
    with pytest.raises(spindle.WorkerDiedError) as info:
        for _ in it:
            pids |= set(it.worker_pids)
    died = info.value
    assert died.sample == 123 and died.batch == 12 and died.signal == 9
    message = str(died)
    assert "Sample index 123 was being produced at an earlier loss too" in message, message
    assert message.count("at sample index 123") == 2, message  # both losses, each with its pid
    assert "is not retried again" in message
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not all(gone(p) for p in pids | set(it.worker_pids)):
        time.sleep(0.02)
    assert all(gone(p) for p in pids | set(it.worker_pids))


def test_more_losses_than_allowed_raise_naming_the_limit_and_every_loss(tmp_path):
    """Proves: with one worker, three losses at three samples are replaced (max(3, num_workers)); the
    fourth raises WorkerDiedError naming max_replacements=3 and the three earlier losses."""
    bad = {5, 17, 29, 41}
    loader = spindle.DataLoader(DiesOnceAt(60, bad, str(tmp_path)), batch_size=4, num_workers=1)
    with pytest.raises(spindle.WorkerDiedError) as info:
        list(loader)
    message = str(info.value)
    assert "max_replacements=3" in message, message
    assert info.value.sample == 41
    for sample in (5, 17, 29):
        assert f"at sample index {sample}" in message, message
    # The same epoch with the losses behind it (the marks exist now): every sample, in order.
    assert np.concatenate([b[:, 0] for b in loader]).tolist() == list(range(60))


def test_losses_below_the_limit_give_every_sample_in_order(tmp_path):
    """Proves: three samples that each kill their worker once, with 2 workers in order: the epoch
    is every sample once, in order, and the loader reports the three replacements."""
    loader = spindle.DataLoader(DiesOnceAt(90, {3, 40, 77}, str(tmp_path)), batch_size=5, num_workers=2)
    it = iter(loader)
    got = np.concatenate([b[:, 0] for b in it]).tolist()
    assert got == list(range(90))
    assert it._runtime.replaced == 3


def test_on_worker_death_raise_keeps_the_first_loss_fatal_and_bad_values_are_refused():
    """Proves: on_worker_death="raise" raises at the first loss, naming it; an unknown value is a
    ValueError naming the choices, at construction."""
    with pytest.raises(spindle.WorkerDiedError, match=r"killed by signal 9 .*sample index 7\. The loader is closed"):
        list(spindle.DataLoader(KillsItselfAt(7, n=20), batch_size=4, num_workers=2, on_worker_death="raise"))
    with pytest.raises(ValueError, match=r"on_worker_death should be one of 'replace', 'raise', but got 'retry'"):
        spindle.DataLoader(Waits(8, 0), num_workers=1, on_worker_death="retry")


def test_spawned_workers_are_replaced_too(tmp_path):
    """Proves: a lost spawned worker (spindle.torch, multiprocessing_context="spawn") is spawned again
    from the kept payload, with on_worker_death="replace": torch's batches, in order."""
    torch = pytest.importorskip("torch")
    import spindle.torch as st

    dataset = DiesOnceAt(40, {13}, str(tmp_path))
    loader = st.DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="spawn",
                           on_worker_death="replace")
    got = torch.cat([b[:, 0] for b in loader]).tolist()
    assert got == list(range(40))


def test_spindle_torch_keeps_torchs_error_unless_asked(tmp_path):
    """Proves: spindle.torch raises at a lost worker as torch does by default; with
    on_worker_death="replace" the same epoch completes with torch's batches in torch's order."""
    torch = pytest.importorskip("torch")
    import spindle.torch as st

    with pytest.raises(RuntimeError, match=r"killed by signal"):
        list(st.DataLoader(KillsItselfAt(9, n=40), batch_size=4, num_workers=2))
    dataset = DiesOnceAt(40, {9, 30}, str(tmp_path))
    reference = [b.tolist() for b in torch.utils.data.DataLoader(Waits(40, 0, 4), batch_size=4, shuffle=True,
                                                                 generator=torch.Generator().manual_seed(3))]
    loader = st.DataLoader(dataset, batch_size=4, num_workers=2, shuffle=True, on_worker_death="replace",
                           generator=torch.Generator().manual_seed(3))
    got = [b[:, 0].tolist() for b in loader]
    assert got == [[row[0] for row in batch] for batch in reference]


def test_an_iterable_datasets_lost_worker_says_why_it_is_not_replaced():
    """Proves: spindle.torch with on_worker_death="replace" over an IterableDataset: a lost worker
    ends the epoch with an error that says a stream's position went with it."""
    torch = pytest.importorskip("torch")
    import spindle.torch as st

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            for i in range(info.id, 40, info.num_workers):
                if i == 17:
                    os.kill(os.getpid(), signal.SIGKILL)
                yield i

    with pytest.raises(RuntimeError, match=r"A stream's worker cannot be replaced: its stream's position went with it"):
        list(st.DataLoader(Stream(), batch_size=2, num_workers=2, on_worker_death="replace"))
