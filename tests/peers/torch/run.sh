#!/bin/bash
# Runs PyTorch's own test/test_dataloader.py (kept outside this repository)
# with spindle.torch.DataLoader patched in for every interpreter
# (sitecustomize.py beside this script), or unpatched for the baseline.
# Usage: run.sh PYTHON TEST_FILE [patched|torch] [pytest args...]
#   PYTHONPATH must also reach torch's test dependencies (expecttest).
#   START_METHOD=spawn (or forkserver) sets multiprocessing's start method
#   globally before any test runs (sitecustomize.py); unset, the tests run
#   with the platform's default (fork on Linux), as PyTorch's CI runs them.
#   The whole TEST_FILE is always given to pytest, so a node id among the
#   pytest args adds to it rather than selecting: select tests with -k.
set -eu
py=$1; case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac  # it runs after a cd
test_file=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); mode=${3:-patched}
shift $(( $# > 2 ? 3 : 2 ))
here=$(cd "$(dirname "$0")" && pwd)
if [ "$mode" = patched ]; then export SPINDLE_PEER_PATCH=torch; else export SPINDLE_PEER_PATCH=off; fi
export SPINDLE_PEER_START_METHOD=${START_METHOD:-}
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
cd "$(dirname "$test_file")"
exec "$py" -m pytest -p no:cacheprovider -q -rfE --timeout 120 "$test_file" "$@"
