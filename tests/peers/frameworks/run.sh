#!/bin/bash
# Runs one test file of a training framework's own suite (Lightning's
# tests_pytorch, accelerate's tests; kept outside this repository, exported by
# prepare.sh beside this script) with spindle.torch.install() called in every
# interpreter (sitecustomize.py beside this script), or stock for the baseline.
# Usage: run.sh PYTHON TEST_FILE [patched|env|stock] [pytest args...]
#   patched: install() from sitecustomize.py; env: SPINDLE_TORCH=1 instead
#   (spindle's own hook at interpreter start); stock: neither.
#   pytest runs from the framework's repository root (the folder above its
#   tests/), so the framework's own pytest settings (pyproject.toml) and
#   conftest.py files apply as in its CI.
#   TIMEOUT: seconds per test (default 120). SPINDLE_PEER_COUNT_DIR: see
#   sitecustomize.py (run_all.sh sets it).
set -eu
py=$1; test_file=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); mode=${3:-patched}
shift $(( $# > 2 ? 3 : 2 ))
here=$(cd "$(dirname "$0")" && pwd)
unset SPINDLE_TORCH  # set only by the env mode
case "$mode" in
  patched) export SPINDLE_PEER_PATCH=install ;;
  stock) export SPINDLE_PEER_PATCH=off ;;
  env) export SPINDLE_PEER_PATCH=off SPINDLE_TORCH=1 ;;  # the package's own start hook, for programs not edited
  *) echo "run.sh: mode is patched, env or stock, not '$mode'" >&2; exit 2 ;;
esac
if [ "$mode" != stock ] && ! "$py" -c 'import spindle.torch; spindle.torch.install; spindle.torch.uninstall' 2>/dev/null; then
  echo "run.sh: this spindle has no spindle.torch.install()/uninstall(); $mode mode needs them" >&2; exit 2
fi
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
# The repository root: the first folder above the test file that holds tests/.
root=$(dirname "$test_file")
while [ "$root" != / ] && [ "$(basename "$root")" != tests ]; do root=$(dirname "$root"); done
[ "$root" = / ] && { echo "run.sh: $test_file is not under a tests/ folder" >&2; exit 2; }
cd "$(dirname "$root")"
exec "$py" -m pytest -p no:cacheprovider -q -rfE --color=no --timeout "${TIMEOUT:-120}" "$test_file" "$@"
