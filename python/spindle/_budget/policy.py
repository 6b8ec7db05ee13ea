"""The short-budget policy's warning (see docs/architecture.md, "The node budget ledger").

The policy itself (its names, ``$SPINDLE_BUDGET_POLICY``, the default and the error for a bad name)
is the core's: a front end resolves it with ``_core.resolve_budget_policy`` (``_core.BUDGET_POLICIES``
lists the names).
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import ThreadBudgetWarning


def warn_if_shrunk(runtime: Any, stacklevel: int) -> None:
    """One warning with the numbers when the runtime Loader started fewer workers than asked."""
    note = runtime.budget_note
    if note:
        warnings.warn(note, ThreadBudgetWarning, stacklevel=stacklevel + 1)
