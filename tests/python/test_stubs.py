"""The committed type stubs of the extension match the built module."""

import subprocess
import sys
from pathlib import Path

import pytest

import spindle

REPO = Path(__file__).resolve().parents[2]


def test_core_stubs_are_generated_from_the_built_module(tmp_path):
    """pybind11-stubgen over spindle._core reproduces python/spindle/_core.pyi (run `make stubs` if not)."""
    stubgen = Path(sys.executable).parent / "pybind11-stubgen"
    if not stubgen.exists():
        pytest.skip("pybind11-stubgen is not installed (make deps installs it)")
    subprocess.run([str(stubgen), "spindle._core", "-o", str(tmp_path)], check=True, cwd=tmp_path,
                   capture_output=True)
    generated = (tmp_path / "spindle" / "_core.pyi").read_text()
    committed = (REPO / "python" / "spindle" / "_core.pyi").read_text()
    assert generated == committed, "python/spindle/_core.pyi is stale: run `make stubs`"
    installed = Path(spindle.__file__).parent / "_core.pyi"
    assert installed.read_text() == committed
