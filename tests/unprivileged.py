"""Run a Python script as an unprivileged uid under `ulimit -u`.

Root is exempt from RLIMIT_NPROC, so a thread-limit claim is only shown by a
process of another uid. That uid cannot read /root (where a per-user Python
may live), so the script runs on Debian's /usr/bin/python3 (numpy from the
python3-numpy package) with a copy of the installed spindle package staged in
a world-readable temporary directory. Used by tests/python and bench/python.

RLIMIT_NPROC counts every task of the real uid, so a limit only means what a
test expects when nothing else runs as that uid meanwhile: a second test run
in another worktree, a benchmark. So by default each test process runs its
scripts as a throwaway uid of its own (``throwaway_uid()``: a uid no account
and no other live test process has), and the limit is computed inside the
limited process, from that uid's tasks at the moment it starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from spindle.bench.tree import uid_tasks  # noqa: F401 - one /proc count, shared with spindle bench

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
# Throwaway uids: THROWAWAY_BASE + the test process's pid. No two live processes share a pid, so two
# suites running side by side never share a uid; the base is past any account a distribution makes.
THROWAWAY_BASE = 1_000_000

# Run by the limited interpreter before the script: RLIMIT_NPROC = the tasks its uid has now (itself
# included: the +1 of run_limited) + headroom, counted here and not before the switch, so tasks of the
# uid that came or went before it started do not shift the limit.
_LIMIT_THEN_RUN = """\
import os, resource, runpy, sys
def _tasks(uid):
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
            except OSError:
                continue
            if int(fields["Uid"].split()[0]) == uid:
                n += int(fields["Threads"])
    return n
_limit = _tasks(os.getuid()) + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NPROC, (_limit, _limit))
os.environ["SPINDLE_TEST_NPROC_LIMIT"] = str(_limit)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def throwaway_uid() -> int:
    """A uid for this test process alone: no account has it, and no other live process derives it."""
    return THROWAWAY_BASE + os.getpid()


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
        # The distribution's metadata too: a front end checks its peer's release with
        # importlib.metadata (spindle.grain's _compat), which finds nothing in a bare copy.
        for dist in distributions.get(name, ()):
            try:
                files = importlib.metadata.distribution(dist).files or []
            except importlib.metadata.PackageNotFoundError:
                continue
            info = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info")), None)
            if info is not None and not (dest / info).exists():
                shutil.copytree(Path(importlib.metadata.distribution(dist).locate_file(info)), dest / info)
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


def run_limited(script: str, headroom: int, *, uid: Optional[int] = None, timeout: float = 300,
                packages: tuple[str, ...] = ("spindle",), python: str = SYSTEM_PYTHON,
                extra_path: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Runs `script` as `uid` (default: ``throwaway_uid()``) with RLIMIT_NPROC = tasks the uid has
    when the limited interpreter starts (itself included: the +1) + headroom, so `headroom` is what
    the script may add. The script sees the limit in $SPINDLE_TEST_NPROC_LIMIT.

    Returns the completed process (stdout/stderr captured as text). A throwaway uid's node-budget
    ledger (/dev/shm/spindle-ledger.<uid>) is removed afterwards: no later process has that uid.
    """
    own = uid is None
    uid = throwaway_uid() if uid is None else uid
    with tempfile.TemporaryDirectory(prefix="spindle-unpriv-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        stage(root / "pkg", list(packages))
        (root / "script.py").write_text(script)
        (root / "limited.py").write_text(_LIMIT_THEN_RUN)
        for name in ("script.py", "limited.py"):
            os.chmod(root / name, 0o644)
        # USER and LOGNAME: a throwaway uid has no passwd entry for getpass.getuser() to find.
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "USER": "spindle-test",
               "LOGNAME": "spindle-test", "PYTHONPATH": os.pathsep.join([str(root / "pkg"), *extra_path]),
               "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
               python, str(root / "limited.py"), str(headroom), str(root / "script.py")]
        try:
            return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        finally:
            if own:
                Path(f"/dev/shm/spindle-ledger.{uid}").unlink(missing_ok=True)
