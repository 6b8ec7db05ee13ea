"""What spindle.grain does when a worker process is lost: its iterators start the workers again from
the state of the last element delivered (as from a checkpoint), unless replacements are off, the limit
is reached, or the workers were lost at the same state before (a poison element)."""

from __future__ import annotations

import logging

from .. import _core
from .._runtime.start import replacements_for
from ..errors import WorkerDiedError


class Losses:
    """One iterator's lost workers: at most ``max(3, num_workers)``, none twice at the same state."""

    def __init__(self, on_worker_death: str, num_workers: int) -> None:
        self.limit = _core.replacement_limit(num_workers) if replacements_for(on_worker_death) else 0
        self._seen: list[tuple[int, str, bytes]] = []  # (worker, what the error said, the state it was lost at)

    def start_again(self, died: WorkerDiedError, at: bytes) -> None:
        """Returns if the workers are to start again from state `at` (its bytes name the state: the
        same bytes at two losses of the same worker are a poison element); else raises, in grain's
        words for a worker that exited (e.g. ``sys.exit`` in a transform) first."""
        kept = dict(pid=died.pid, exitcode=died.exitcode, signal=died.signal, worker=died.worker,
                    sample=died.sample, batch=died.batch)
        words = "" if died.exitcode is None else \
            f"Worker process was terminated unexpectedly with exit code {died.exitcode}. "
        if not self.limit or died.worker is None:
            if not words:
                raise died
            raise WorkerDiedError(f"{words}{died}", **kept) from None
        what = str(died).split(". The loader is closed")[0]
        earlier = [text for worker, text, state in self._seen if worker == died.worker and state == at]
        if earlier:
            raise WorkerDiedError(f"{words}{what}, at the same elements as an earlier loss ({earlier[0]}): a worker "
                                  "lost there is not restarted again. Fix or skip that element.", **kept) from None
        if len(self._seen) >= self.limit:
            raise WorkerDiedError(f"{words}{what}. {len(self._seen)} lost workers were replaced already, the most "
                                  f"allowed ({self.limit}): " + "; ".join(t for _, t, _ in self._seen),
                                  **kept) from None
        self._seen.append((died.worker, what, at))
        logging.getLogger("spindle").warning(
            "%s; the workers start again from each slice's state after its last element (loss %d of at most %d).",
            what, len(self._seen), self.limit)
