"""The optional parts of the package and what each needs beyond the base (numpy, threadpoolctl).

pyproject.toml's ``[project.optional-dependencies]`` declares the same extras; here a part
that needs one checks for it before doing any work, and stops with one line naming the
``pip install`` that adds it, instead of a ModuleNotFoundError from deep inside.
"""

from __future__ import annotations

import importlib.util
from typing import Iterable


class MissingExtraError(ImportError):
    """A part of spindle needs an extra that is not installed; ``extra`` and ``missing`` name it."""

    def __init__(self, message: str, extra: str, missing: tuple[str, ...]) -> None:
        super().__init__(message)
        self.extra = extra
        self.missing = missing


def missing_modules(modules: Iterable[str]) -> tuple[str, ...]:
    """The modules of `modules` that cannot be imported here (found without importing them)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a broken one
            found = False
        if not found:
            missing.append(name)
    return tuple(missing)


def require_extra(extra: str, modules: Iterable[str], what: str) -> None:
    """Raises MissingExtraError, one line naming ``pip install 'spindle[<extra>]'``, if any of
    `modules` (import names) is missing; `what` is the part of spindle that needs them."""
    missing = missing_modules(modules)
    if missing:
        raise MissingExtraError(
            f"{what} needs {', '.join(missing)}, which is not installed: pip install 'spindle[{extra}]'",
            extra, missing)
