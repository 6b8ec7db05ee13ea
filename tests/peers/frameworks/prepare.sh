#!/bin/bash
# Exports the frameworks' own tests (never part of this repository) into
# OUT_DIR, at the commits matching the releases `make deps` installs:
#   OUT_DIR/lightning   Lightning's tests/ at tag 2.6.5, imports adjusted to the
#                       pytorch-lightning package by Lightning's own tool, as its
#                       CI does for that package (.actions/assistant.py
#                       copy_replace_imports); the pytorch_lightning and
#                       lightning_fabric sources of 2.6.5 and 2.6.6 differ only
#                       outside data loading (version, changelog, 4 files).
#   OUT_DIR/accelerate  accelerate's tests/ at 16cb6eb (its src/accelerate is
#                       1.15.0's but for a few files; data_loader.py is the same).
# Usage: prepare.sh OUT_DIR LIGHTNING_GIT_DIR ACCELERATE_GIT_DIR
#   *_GIT_DIR: a clone (or bare repository) of Lightning-AI/pytorch-lightning
#   and of huggingface/accelerate holding those commits.
set -eu
out=$1; lightning_git=$2; accelerate_git=$3
LIGHTNING_COMMIT=be98784a1a03581b7051a355ae1084fd352d7cea    # tag 2.6.5
ACCELERATE_COMMIT=16cb6eb80dd9aa8b4df1a63ef57863e455d53b83   # 1.15.0's data_loader.py
py=${PYTHON:-python3}

mkdir -p "$out/lightning" "$out/accelerate"
git -C "$lightning_git" archive "$LIGHTNING_COMMIT" tests/tests_pytorch pyproject.toml .actions/assistant.py \
  | tar -x -C "$out/lightning"
# The function its CI calls through the script's command line (which needs jsonargparse).
(cd "$out/lightning" && "$py" -c 'import sys; sys.path.insert(0, ".actions"); import assistant
assistant.copy_replace_imports("./tests", ["lightning.fabric", "lightning.pytorch"], ["lightning_fabric", "pytorch_lightning"])' >/dev/null)
git -C "$accelerate_git" archive "$ACCELERATE_COMMIT" tests pyproject.toml | tar -x -C "$out/accelerate"
echo "$out/lightning/tests/tests_pytorch and $out/accelerate/tests ready"
