"""Persistent workers at a new epoch: reset the kept runtime in place, or start a new one.

Every front end with persistent workers (spindle.DataLoader, spindle.torch's map-style and
stream epochs, spindle.grain's restarts after set_state) keeps one runtime Loader across
epochs. At a new epoch it asks the runtime to start over (``Loader.reset`` with the epoch's
order, or ``Loader.reset_streams``); a runtime that a failure closed (a worker died, a
timeout) cannot, and is replaced by a new one. This is that one decision.
"""

from __future__ import annotations

from typing import Callable, Optional

from .. import _core
from ..errors import SpindleError


def reset_or_restart(kept: Optional[_core.Loader], reset: Callable[[_core.Loader], None],
                     start: Callable[[], _core.Loader], *, close: Callable[[], None],
                     failures: tuple[type[BaseException], ...] = (SpindleError,)) -> tuple[_core.Loader, bool]:
    """The runtime for the next epoch and whether it is new.

    `kept` (the front's persistent runtime, or None) is reset in place by ``reset(kept)``.
    If a failure closed it, or ``reset`` raises one of `failures` (a worker died last epoch,
    already reported), the front lets it go (``close()``, which also forgets it) and
    ``start()`` makes a new one; other errors of ``reset`` propagate. With nothing kept,
    ``start()`` runs without ``close()``.
    """
    if kept is not None and kept.closed:
        close()
        kept = None
    if kept is not None:
        try:
            reset(kept)
            return kept, False
        except failures:
            close()
    return start(), True
