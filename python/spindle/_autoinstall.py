"""``SPINDLE_TORCH=1``: spindle.torch.install() for a program that is not edited.

The package's ``spindle-torch.pth`` imports this module at interpreter start when the variable
is set. Importing torch (or spindle.torch) here would make every Python start pay for it, and
torch may be mid-import when its DataLoader module loads; so this only watches for
``torch.utils.data.dataloader`` and, once that module has run, puts a stand-in in place of its
multi-process iterator that imports spindle.torch (and installs it) when the first loader with
workers is iterated.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

_MODULE = "torch.utils.data.dataloader"


class _Deferred:
    """torch's ``_MultiProcessingDataLoaderIter`` until the first loader with workers is iterated."""

    _spindle_stand_in = True

    def __new__(cls, loader: Any) -> Any:
        import spindle.torch

        spindle.torch.install()  # puts spindle's iterator where this stand-in was
        return sys.modules[_MODULE]._MultiProcessingDataLoaderIter(loader)


def _patch(module: Any) -> None:
    _Deferred._torch_iterator = module._MultiProcessingDataLoaderIter  # type: ignore[attr-defined]
    module._MultiProcessingDataLoaderIter = _Deferred


class _Finder:
    """Finds nothing itself: it wraps the real spec of torch's dataloader module so that the
    module is patched right after it runs."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _MODULE in sys.modules:
    _patch(sys.modules[_MODULE])
else:
    sys.meta_path.insert(0, _Finder())
