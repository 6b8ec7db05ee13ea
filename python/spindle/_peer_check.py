"""What the drop-ins' compat modules (spindle.torch._compat, spindle.grain._compat) share: looking up
the peer's private names, and the one warning that the peer's own workers run instead of spindle's."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Optional

from .errors import PeerVersionWarning


def has_parameters(fn: Any, *names: str) -> Any:
    """`fn` if its signature has every one of `names`, else TypeError naming those it lacks."""
    parameters = inspect.signature(fn).parameters
    missing = [n for n in names if n not in parameters]
    if missing:
        raise TypeError(f"takes no parameter {', '.join(missing)}")
    return fn


def first_missing(peer: str, version: str, needed: dict[str, Callable[[], Any]]) -> Optional[str]:
    """The reason naming the first of `needed` (name -> its lookup) that `peer` `version` lacks, or None."""
    for name, look_up in needed.items():
        try:
            look_up()
        except Exception as exc:  # noqa: BLE001 - any way a name can be gone or changed
            return f"{peer} {version} has no {name} as spindle.{peer} knows it ({type(exc).__name__}: {exc})"
    return None


class Fallback:
    """Why a drop-in runs on its peer's own workers in this process (None: it does not), warned once."""

    def __init__(self, reason: Optional[str], words: str) -> None:
        self.reason = reason
        self._words = words  # what runs instead, before the reason
        self._warned = False

    def warn(self, stacklevel: int) -> None:
        if self.reason is None or self._warned:
            return
        self._warned = True
        warnings.warn(f"{self._words}: {self.reason}", PeerVersionWarning, stacklevel=stacklevel + 1)
