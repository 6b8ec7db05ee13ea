#!/bin/bash
# Makes one virtualenv per peer release of the version matrix (issue 31: spindle.torch on
# torch 2.4.1 through 2.14.1, spindle.grain on grain 0.2.12 through 0.2.18), from
# Debian's /usr/bin/python3 (3.11, no system site packages), with what that peer's own
# tests need. spindle itself is not installed here: `make test-peers-versions` and
# `make test-torch-oldest` force-reinstall a wheel into it.
# Usage: venv.sh NAME [DEST_ROOT]
#   NAME: torch-2.4.1 | torch-2.8.0 | torch-2.14.1 | grain-0.2.12 | grain-0.2.18
#   DEST_ROOT: where DEST_ROOT/NAME goes (default build/versions).
#   TORCH_INSTALL=minimal (default): torch --no-deps, its pure-Python requirements, and
#     only the CUDA wheels that `import torch` loads on a machine without a GPU (the
#     libraries libtorch_cuda.so, libtorch_python.so and libtorch_global_deps.so name as
#     DT_NEEDED); not triton, cusolver, cuda-bindings, nor (CUDA 12) nvrtc, which torch
#     loads only when a GPU kernel needs them (torch 2.14.1 does load nvrtc and nvshmem).
#     PyPI has no CPU-only build of these releases, and PyTorch's own CPU index is out
#     of reach here.
#   TORCH_INSTALL=full: `pip install torch==X` with everything it requires.
#   PEER_WHEELS (default ~/.cache/spindle/peer-wheels): every wheel is downloaded there
#     first and installed from there (--no-index), so a second venv, or the same one made
#     again, downloads nothing. pip keeps no HTTP cache on these machines; this folder is
#     that cache. Delete it for a cold start.
# Writes DEST_ROOT/NAME/.versions-ok (with `pip freeze`) when the venv imports its peer.
set -eu
name=$1; root=${2:-build/versions}
dest=$root/$name
wheels=${PEER_WHEELS:-$HOME/.cache/spindle/peer-wheels}
variant=${TORCH_INSTALL:-minimal}
# threadpoolctl: spindle's own requirement (its wheel goes in with --no-deps).
test_pkgs="pytest pytest-timeout threadpoolctl"
torch_test_pkgs="expecttest hypothesis pillow psutil requests urllib3"

case $name in
  # torchdata: the newest release for that torch with torchdata.stateful_dataloader
  # (0.8.0 shipped beside torch 2.4; 0.11.0, beside 2.7, is the last release).
  # numpy<2: not for torch (2.4.1 runs with numpy 2.2 too) but so that the oldest venv also
  # runs spindle on numpy 1.x (its floor is 1.24).
  # expecttest, hypothesis, pillow, psutil: what torch's test_dataloader.py and spindle's tests import;
  # requests, urllib3: torchdata's requirements.
  # torchdata goes in with --no-deps (its `torch>=2` would let pip move torch).
  torch-2.4.1)  peer="torch==2.4.1";  torchdata="torchdata==0.8.0";  extra="numpy<2" ;;
  torch-2.8.0)  peer="torch==2.8.0";  torchdata="torchdata==0.11.0"; extra="numpy" ;;
  torch-2.14.1) peer="torch==2.14.1"; torchdata="torchdata==0.11.0"; extra="numpy" ;;
  # jax/jaxlib of each grain release's month (grain names no jax pin; its tests import
  # jax): 0.2.12 is of 2025-08 (jax 0.7.1), 0.2.18 of 2026-06 (jax 0.10.2, as .venv).
  # parameterized, dill, attrs, jaxtyping: grain's `testing` extra, as its tests import them.
  grain-0.2.12) peer="grain==0.2.12"; extra="jax==0.7.1 jaxlib==0.7.1 parameterized absl-py dill attrs cloudpickle" ;;
  grain-0.2.18) peer="grain==0.2.18"; extra="jax==0.10.2 jaxlib==0.10.2 parameterized absl-py dill attrs cloudpickle" ;;
  *) echo "venv.sh: unknown NAME $name (torch-2.4.1, torch-2.8.0, torch-2.14.1, grain-0.2.12, grain-0.2.18)" >&2; exit 2 ;;
esac

mkdir -p "$wheels" "$root"
rm -f "$dest/.versions-ok"
[ -x "$dest/bin/python" ] || /usr/bin/python3 -m venv "$dest"
py=$dest/bin/python
pip() { "$py" -m pip --disable-pip-version-check "$@"; }
# $(fetch_install ARGS...): download ARGS' wheels (and their requirements) into $wheels,
# then install them from there alone.
fetch_install() { pip download -q -d "$wheels" "$@" && pip install -q --no-index --find-links "$wheels" "$@"; }

case $name in
  torch-*)
    if [ "$variant" = full ]; then
      fetch_install "$peer" $extra $test_pkgs $torch_test_pkgs
    else
      pip download -q --no-deps -d "$wheels" "$peer"
      pip install -q --no-deps --no-index --find-links "$wheels" "$peer"
      # torch's own requirements, less the CUDA parts it does not load on import.
      reqs=$("$py" - <<'EOF'
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
drop = {"triton", "cuda-bindings", "nvidia-cusolver-cu12", "nvidia-cuda-nvrtc-cu12", "setuptools"}
for text in requires("torch"):
    r = Requirement(text)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if r.name in drop:
        continue
    if r.name == "cuda-toolkit":  # torch 2.14's CUDA 13 libraries, as extras of one package
        r.extras = {e for e in r.extras if e not in {"cusolver", "nvtx"}}
    r.marker = None
    print(str(r))
EOF
)
      # shellcheck disable=SC2086
      fetch_install $reqs $extra $test_pkgs $torch_test_pkgs
      pip check >/dev/null 2>&1 || true  # torch names the CUDA wheels it does not need
    fi
    pip download -q --no-deps -d "$wheels" "$torchdata"
    pip install -q --no-deps --no-index --find-links "$wheels" "$torchdata"
    "$py" -c 'import torch, torchdata.stateful_dataloader; torch.utils.data.DataLoader(range(4), batch_size=2)
print("venv.sh:", torch.__version__, "imports and runs on CPU")'
    ;;
  grain-*)
    fetch_install "$peer" $extra $test_pkgs
    "$py" -c 'import grain, jax; print("venv.sh: grain", grain.__version__ if hasattr(grain, "__version__") else "", "jax", jax.__version__)'
    ;;
esac
pip freeze >"$dest/.versions-ok"
