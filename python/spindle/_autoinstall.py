"""``SPINDLE_TORCH=1``: spindle.torch.install() for a program that is not edited.

The package's ``spindle-torch.pth`` imports this module at interpreter start when the variable
is set. Importing torch (or spindle.torch) here would make every Python start pay for it, and
torch may be mid-import when its DataLoader module loads; so this only watches for
``torch.utils.data.dataloader`` (the runtime table's post-import hook, ``after_import``) and, once
that module has run, puts a stand-in in place of its multi-process iterator that imports
spindle.torch (and installs it) when the first loader with workers is iterated.
"""

from __future__ import annotations

import sys
from typing import Any

from ._budget.runtimes import after_import

# torch's module and the name of its multi-process iterator in it: the same as spindle.torch._compat's
# ITERATOR_MODULE and ITERATOR_NAME (test_torch_compat checks), written out here because this
# module must not import torch.
_MODULE = "torch.utils.data.dataloader"
_NAME = "_MultiProcessingDataLoaderIter"


class _Deferred:
    """torch's ``_MultiProcessingDataLoaderIter`` until the first loader with workers is iterated."""

    _spindle_stand_in = True

    def __new__(cls, loader: Any) -> Any:
        import spindle.torch

        spindle.torch.install()  # puts spindle's iterator where this stand-in was
        module = sys.modules[_MODULE]
        if getattr(module, _NAME) is cls:  # install() declined (a torch it was not checked on): torch's own
            setattr(module, _NAME, cls._torch_iterator)  # type: ignore[attr-defined]
        return getattr(module, _NAME)(loader)


def _patch(module: Any) -> None:
    _Deferred._torch_iterator = getattr(module, _NAME)  # type: ignore[attr-defined]
    setattr(module, _NAME, _Deferred)


after_import(_MODULE, _patch)
