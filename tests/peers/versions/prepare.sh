#!/bin/bash
# Exports PyTorch's own test/test_dataloader.py (never part of this repository) for each
# torch release of the version matrix, at the commit that release's PyPI wheel was built
# from (its torch.version.git_version; the release tags point at the same trees):
#   OUT_DIR/torch-2.4.1/test/test_dataloader.py    38b96d3399a695e704ed39b60dac733c3fbf20e2
#   OUT_DIR/torch-2.8.0/test/test_dataloader.py    a1cb3cc05d46d198467bebbb6e8fba50a325d4e7
#   OUT_DIR/torch-2.14.1/test/test_dataloader.py   5c4886908584029761b579af026dcfb627c84070
#   OUT_DIR/torch-74436f9/test/test_dataloader.py  74436f9025609987bbc69c617564f98635b67807
# The last is the copy the torch peer suite has used so far (178 tests; bench/results/history/
# 2026-12-03-torch-peer-suites.md): it imports nothing that torch 2.4.1 lacks, so the same
# file also runs against every release of the matrix (what 2026-12-03-peer-versions.md did,
# where no clone of PyTorch could be had). Its sha256 is
# 5184d2bf8bb8a88dd27a4a9c5d6df2a41dd28f38c2230f087bcbc48f9c9cf5eb (118841 bytes).
# test_dataloader.py imports only torch.testing._internal from PyTorch's tree, which every
# torch wheel ships; no sibling file of test/ is needed.
# Usage: prepare.sh OUT_DIR PYTORCH_GIT_DIR [NAME...]
#   PYTORCH_GIT_DIR: a clone (a bare or --filter=blob:none one will do) of pytorch/pytorch
#   holding those commits. NAME: torch-2.4.1 torch-2.8.0 torch-2.14.1 torch-74436f9 (default: all).
# Then: make test-peers-versions TORCH_TESTS=OUT_DIR
set -eu
out=$1; git_dir=$2; shift 2
declare -A commit=(
  [torch-2.4.1]=38b96d3399a695e704ed39b60dac733c3fbf20e2
  [torch-2.8.0]=a1cb3cc05d46d198467bebbb6e8fba50a325d4e7
  [torch-2.14.1]=5c4886908584029761b579af026dcfb627c84070
  [torch-74436f9]=74436f9025609987bbc69c617564f98635b67807
)
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(torch-2.4.1 torch-2.8.0 torch-2.14.1 torch-74436f9)
for name in "${names[@]}"; do
  c=${commit[$name]:?"prepare.sh: unknown NAME $name"}
  mkdir -p "$out/$name/test"
  git -C "$git_dir" show "$c:test/test_dataloader.py" >"$out/$name/test/test_dataloader.py"
  echo "$c" >"$out/$name/COMMIT"
  echo "$out/$name/test/test_dataloader.py ($c)"
done
