"""The short-budget policy of the Python front ends (see docs/architecture.md, "The node budget ledger")."""

from __future__ import annotations

import os
import warnings
from typing import Any, Optional

from ..errors import ThreadBudgetWarning

POLICIES = ("shrink", "wait", "fail")
ENV = "SPINDLE_BUDGET_POLICY"


def resolve_policy(value: Optional[str]) -> str:
    """`value`, else $SPINDLE_BUDGET_POLICY, else "shrink"; raises ValueError for anything else."""
    source = "budget_policy"
    if value is None:
        value, source = os.environ.get(ENV) or "shrink", ENV
    if value not in POLICIES:
        raise ValueError(f"{source} should be one of {', '.join(map(repr, POLICIES))}, but got {value!r}")
    return value


def warn_if_shrunk(runtime: Any, stacklevel: int) -> None:
    """One warning with the numbers when the runtime Loader started fewer workers than asked."""
    note = runtime.budget_note
    if note:
        warnings.warn(note, ThreadBudgetWarning, stacklevel=stacklevel + 1)
