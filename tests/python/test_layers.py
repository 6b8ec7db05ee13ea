"""The package's layers, checked from the imports in its source (no import is run).

The rule (spindle/_runtime/__init__.py): front ends (spindle.dataloader, spindle.torch,
spindle.grain, spindle.pipeline) use the runtime, budget and state layers (spindle._runtime,
spindle._budget, spindle._state), spindle._core and spindle.errors, never another front end
or its private names; the layers never import a front end.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "spindle"
FRONTS = ("spindle.dataloader", "spindle.torch", "spindle.grain", "spindle.pipeline")
LAYERS = ("spindle._runtime", "spindle._budget", "spindle._state")


def sources(root: Path = PACKAGE) -> dict[str, str]:
    """Module name -> source text, for every .py file of the package."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path.read_text()
    return found


def _within(module: str, roots: tuple[str, ...]) -> Optional[str]:
    """The root of `roots` that `module` is or is inside of, else None."""
    return next((r for r in roots if module == r or module.startswith(r + ".")), None)


def _imports(name: str, source: str, modules: set[str], is_package: bool) -> Iterator[tuple[str, Optional[str]]]:
    """(module, name) for each thing `name`'s source imports from spindle: name is None when a
    whole module is imported (``import spindle.x``, or ``from spindle import x`` naming a module)."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "spindle":
                    yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "spindle":
                continue
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    yield f"{module}.{alias.name}", None
                else:
                    yield module, alias.name


def violations(found: dict[str, str]) -> list[str]:
    """Every import that breaks the rule, as "importer: imports what (why)"."""
    modules = set(found)
    packages = {m for m in modules if any(other.startswith(m + ".") for other in modules)}
    broken = []
    for importer, source in sorted(found.items()):
        mine = _within(importer, FRONTS)
        layer = _within(importer, LAYERS)
        for module, name in _imports(importer, source, modules, importer in packages):
            what = module if name is None else f"{module}.{name}"
            theirs = _within(module, FRONTS)
            if theirs is None and name is not None:
                theirs = _within(what, FRONTS)  # `from spindle import torch`
            if theirs is None or theirs == mine:
                continue
            if layer is not None:
                broken.append(f"{importer}: imports {what} (the layer {layer} imports the front end {theirs})")
            elif mine is not None:
                broken.append(f"{importer}: imports {what} (the front end {mine} imports the front end {theirs})")
            elif name is not None and name.startswith("_") and not name.startswith("__"):
                broken.append(f"{importer}: imports {what} (a private name of the front end {theirs})")
            elif any(part.startswith("_") for part in what[len(theirs):].split(".")):
                broken.append(f"{importer}: imports {what} (a private module of the front end {theirs})")
    return broken


def test_front_ends_and_layers_import_by_the_rule():
    """No front end imports another front end, no module imports a front end's private names, and no
    layer (_runtime, _budget, _state) imports a front end."""
    found = sources()
    assert set(FRONTS) <= set(found), sorted(set(FRONTS) - set(found))
    assert all(any(m == layer or m.startswith(layer + ".") for m in found) for layer in LAYERS)
    broken = violations(found)
    assert not broken, "imports that break the layer rule (spindle/_runtime/__init__.py):\n" + "\n".join(broken)


def test_the_check_names_the_importer_and_the_name_of_each_bad_import():
    """The check fails, naming importer and imported name, for each kind of bad import added to the real package."""
    bad = {
        "spindle.grain": "from ..dataloader import ArrayBatches\n",
        "spindle.pipeline": "from spindle.torch import _draw\n",
        "spindle._runtime.epoch": "from ..grain import DataLoader\n",
        "spindle._state.checkpoint": "import spindle.pipeline\n",
        "spindle.doctor": "from .torch._transport import CollatedBatches\nfrom .dataloader import _setup_worker\n",
    }
    found = sources()
    for module, line in bad.items():
        found[module] += line
    broken = violations(found)
    assert broken == [
        "spindle._runtime.epoch: imports spindle.grain.DataLoader (the layer spindle._runtime imports the front end "
        "spindle.grain)",
        "spindle._state.checkpoint: imports spindle.pipeline (the layer spindle._state imports the front end "
        "spindle.pipeline)",
        "spindle.doctor: imports spindle.torch._transport.CollatedBatches (a private module of the front end "
        "spindle.torch)",
        "spindle.doctor: imports spindle.dataloader._setup_worker (a private name of the front end spindle.dataloader)",
        "spindle.grain: imports spindle.dataloader.ArrayBatches (the front end spindle.grain imports the front end "
        "spindle.dataloader)",
        "spindle.pipeline: imports spindle.torch._draw (the front end spindle.pipeline imports the front end "
        "spindle.torch)",
    ], broken


def test_each_layer_index_lists_its_modules():
    """Proves: the docstring of each layer's __init__.py (spindle._runtime, _budget, _state) names every
    module of that layer as ``name``, and no module that is not there: the index a newcomer reads first is
    the layer's whole table of contents."""
    import re

    found = sources()
    for layer in LAYERS:
        modules = {m.rpartition(".")[2] for m in found if m.rpartition(".")[0] == layer}
        doc = ast.get_docstring(ast.parse(found[layer])) or ""
        listed = set(re.findall(r"^- ``(\w+)``", doc, flags=re.M))
        listed |= {name for line in re.findall(r"^- (``\w+``(?: / ``\w+``)+)", doc, flags=re.M)
                   for name in re.findall(r"``(\w+)``", line)}
        assert modules - listed == set(), f"{layer}/__init__.py does not list {sorted(modules - listed)}"
        assert listed - modules == set(), f"{layer}/__init__.py lists modules it lacks: {sorted(listed - modules)}"
