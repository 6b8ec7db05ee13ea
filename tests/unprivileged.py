"""Run a Python script as an unprivileged uid under `ulimit -u`.

Root is exempt from RLIMIT_NPROC, so a thread-limit claim is only shown by a
process of another uid. That uid cannot read /root (where a per-user Python
may live), so the script runs on Debian's /usr/bin/python3 (numpy from the
python3-numpy package) with a copy of the installed spindle package staged in
a world-readable temporary directory. Used by tests/python and bench/python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from spindle.bench.tree import uid_tasks  # noqa: F401 - one /proc count, shared with spindle bench

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"


def stage(dest: Path, packages: list[str]) -> None:
    """Copies importable packages or modules (by name) into `dest`, readable by everyone; a
    wheel's bundled libraries (`<name>.libs` or `<distribution>.libs` beside the package, e.g.
    numpy's OpenBLAS, opencv-python-headless's libraries for cv2) too."""
    import importlib
    import importlib.metadata

    distributions = importlib.metadata.packages_distributions()

    for name in packages:
        module = importlib.import_module(name)
        if getattr(module, "__file__", None) is None:  # a namespace package (google, for protobuf)
            for part in module.__path__:
                shutil.copytree(part, dest / name, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
            continue
        path = Path(module.__file__)
        if path.name != "__init__.py":  # a one-file module
            shutil.copy(path, dest / path.name)
            continue
        shutil.copytree(path.parent, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        for owner in (name, *(d.replace("-", "_") for d in distributions.get(name, ()))):
            libs = path.parent.with_name(owner + ".libs")
            if libs.is_dir() and not (dest / libs.name).exists():
                shutil.copytree(libs, dest / libs.name)
    for root, dirs, files in os.walk(dest):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)


def import_closure(*modules: str) -> tuple[str, ...]:
    """The top-level packages and modules from this interpreter's site-packages that importing
    `modules` loads (to stage for an unprivileged run: a venv's folder may not be readable by
    that uid)."""
    code = ("import json, sys\n"
            f"for m in {list(modules)!r}: __import__(m)\n"
            "print(json.dumps(sorted({n.split('.')[0] for n, m in list(sys.modules.items())\n"
            "                         if 'site-packages' in (getattr(m, '__file__', None) or '')})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    return tuple(json.loads(done.stdout.strip().splitlines()[-1]))


def run_limited(script: str, headroom: int, *, uid: int = NOBODY, timeout: float = 300,
                packages: tuple[str, ...] = ("spindle",), python: str = SYSTEM_PYTHON,
                extra_path: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Runs `script` as `uid` with RLIMIT_NPROC = tasks the uid has + 1 + headroom.

    The +1 is the interpreter itself, so `headroom` is what the script may add.
    Returns the completed process (stdout/stderr captured as text).
    """
    with tempfile.TemporaryDirectory(prefix="spindle-unpriv-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        stage(root / "pkg", list(packages))
        (root / "script.py").write_text(script)
        os.chmod(root / "script.py", 0o644)
        limit = uid_tasks(uid) + 1 + headroom
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8",
               "PYTHONPATH": os.pathsep.join([str(root / "pkg"), *extra_path]),
               "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "bash", "-c",
               f"ulimit -u {limit} && exec {python} {root / 'script.py'}"]
        return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
