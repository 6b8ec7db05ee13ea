#!/bin/bash
# Runs grain's own tests of its multi-process stages, from the installed wheel,
# with spindle.grain patched in (sitecustomize.py beside this script).
# Usage: run.sh PYTHON [patched|grain] [pytest args...]
#   patched (default): spindle.grain replaces grain's DataLoader and mp_prefetch;
#   grain: grain unpatched, for the baseline count.
set -eu
py=$1; mode=${2:-patched}; shift $(( $# > 1 ? 2 : 1 ))
here=$(cd "$(dirname "$0")" && pwd)
src=$("$py" -c 'import grain, os; print(os.path.dirname(grain.__file__))')/_src/python
tests=$(grep -v '^#' "$here/tests.txt" | sed "s#^#$src/#")
if [ "$mode" = patched ]; then export SPINDLE_PEER_PATCH=grain; else export SPINDLE_PEER_PATCH=off; fi
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
cd "$here"
# shellcheck disable=SC2086
exec "$py" -m pytest -c "$here/pytest.ini" -p no:cacheprovider -q -rfE $tests "$@"
