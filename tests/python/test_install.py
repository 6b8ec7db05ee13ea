"""The package installs and runs with its declared dependencies only.

One wheel is built from this checkout (``pip wheel``, reusing the build tree that ``make
install-py`` left, so nothing is compiled again) and installed into a fresh virtualenv made
without system site packages: numpy and threadpoolctl come from the package index, nothing
else is there. The README's install section describes the same steps.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The wheel build (no compile: the build tree is reused) and the index's numpy take most of it.
pytestmark = pytest.mark.timeout(600)


def run(cmd, **kwargs):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=540, **kwargs)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """(python of a fresh venv with only the spindle wheel and its declared dependencies, its env)."""
    tmp = tmp_path_factory.mktemp("install")
    built = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                 "-w", tmp / "wheel", REPO], cwd=REPO)
    assert built.returncode == 0, built.stderr[-4000:]
    wheels = list((tmp / "wheel").glob("spindle-*.whl"))
    assert len(wheels) == 1, wheels
    made = run([sys.executable, "-m", "venv", tmp / "venv"])  # no --system-site-packages
    assert made.returncode == 0, made.stderr
    python = tmp / "venv" / "bin" / "python"
    installed = run([python, "-m", "pip", "install", "-q", wheels[0]])
    assert installed.returncode == 0, installed.stderr[-4000:]
    # Away from the checkout, so nothing of it is importable; a HOME of its own.
    env = {"PATH": f"{tmp / 'venv' / 'bin'}:/usr/bin:/bin", "HOME": str(tmp), "LANG": "C.UTF-8"}
    return python, env, tmp


def test_the_wheel_installs_only_the_declared_dependencies(fresh):
    """Proves: the fresh venv sees no system site packages (numpy is its own), and the wheel brought
    numpy and threadpoolctl (the declared dependencies) and nothing else."""
    python, env, tmp = fresh
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in declared}
    listed = run([python, "-m", "pip", "list", "--format=freeze"], cwd=tmp, env=env)
    have = {line.split("==")[0].lower() for line in listed.stdout.split()}
    assert have - {"pip", "setuptools", "wheel"} == names | {"spindle"}, have
    where = run([python, "-c", "import numpy; print(numpy.__file__)"], cwd=tmp, env=env)
    assert where.stdout.startswith(str(tmp / "venv")), where


def test_import_version_and_doctor_work_with_the_base_dependencies(fresh):
    """Proves: `import spindle` (and a spindle.DataLoader epoch with workers), `spindle --version`
    (pyproject's version) and `spindle doctor` work in the fresh venv."""
    python, env, tmp = fresh
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    code = ("import numpy as np, spindle\n"
            "class D:\n"
            "    def __len__(self): return 64\n"
            "    def __getitem__(self, i): return np.full(4, i, np.int32), i\n"
            "n = sum(len(y) for _, y in spindle.DataLoader(D(), batch_size=8, num_workers=2))\n"
            "print(spindle.__version__, n)\n")
    done = run([python, "-c", code], cwd=tmp, env=env)
    assert done.returncode == 0 and done.stdout.split() == [version, "64"], done.stderr[-3000:]
    spindle_cmd = python.parent / "spindle"
    shown = run([spindle_cmd, "--version"], cwd=tmp, env=env)
    assert shown.returncode == 0 and shown.stdout.strip() == f"spindle {version}", shown
    doctor = run([spindle_cmd, "doctor"], cwd=tmp, env=env)
    assert doctor.returncode == 0 and "Traceback" not in doctor.stderr, doctor.stderr[-3000:]
    assert doctor.stdout.strip(), doctor


def test_what_needs_an_extra_stops_first_naming_it(fresh):
    """Proves: without the extras, `spindle bench --quick` stops before any work (no image folder, no
    results) with one line naming pip install 'spindle[bench]', and importing spindle.torch or spindle.grain
    raises an ImportError naming its extra."""
    python, env, tmp = fresh
    out = tmp / "bench-out"
    done = run([python.parent / "spindle", "bench", "--quick", "--out", out], cwd=tmp, env=env)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'spindle[bench]'" in lines[0] and "PIL" in lines[0], lines
    assert not out.exists() and done.stdout == ""  # no image folder made, no epoch run, no results
    for front, extra in (("spindle.torch", "torch"), ("spindle.grain", "grain")):
        imported = run([python, "-c", f"import {front}"], cwd=tmp, env=env)
        assert imported.returncode == 1, imported
        last = imported.stderr.strip().splitlines()[-1]
        assert last.startswith("spindle._extras.MissingExtraError") and f"pip install 'spindle[{extra}]'" in last, last
