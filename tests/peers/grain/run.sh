#!/bin/bash
# Runs grain's own tests of its multi-process stages, from the installed wheel,
# with spindle.grain patched in (sitecustomize.py beside this script).
# Usage: run.sh PYTHON [patched|grain] [pytest args...]
#   patched (default): spindle.grain replaces grain's DataLoader and mp_prefetch;
#   grain: grain unpatched, for the baseline count.
set -eu
py=$1; mode=${2:-patched}; shift $(( $# > 1 ? 2 : 1 ))
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac  # it runs after a cd
here=$(cd "$(dirname "$0")" && pwd)
src=$("$py" -c 'import grain, os; print(os.path.dirname(grain.__file__))')/_src/python
tests=$(grep -v '^#' "$here/tests.txt" | sed "s#^#$src/#")
# An older grain (the version matrix goes back to 0.2.12) lacks some of these files and
# tests: keep what its wheel has, and say what it does not.
# (--rootdir=/: node ids then name the files by their full paths, less the leading /)
have=$(cd "$here" && "$py" -m pytest -c "$here/pytest.ini" --rootdir=/ -p no:cacheprovider -q --collect-only \
  $(for t in $tests; do [ -f "${t%%::*}" ] && echo "${t%%::*}"; done | sort -u) 2>/dev/null | grep '::' || true)
kept=""
for t in $tests; do
  case $t in
    *::*) grep -qF -- "${t#/}::" <<<"$have"$'\n' || grep -qxF -- "${t#/}" <<<"$have" \
            && kept="$kept $t" || echo "run.sh: not in this grain: ${t#"$src"/}" ;;
    *) [ -f "$t" ] && kept="$kept $t" || echo "run.sh: not in this grain: ${t#"$src"/}" ;;
  esac
done
tests=$kept
if [ "$mode" = patched ]; then export SPINDLE_PEER_PATCH=grain; else export SPINDLE_PEER_PATCH=off; fi
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
cd "$here"
# shellcheck disable=SC2086
exec "$py" -m pytest -c "$here/pytest.ini" -p no:cacheprovider -q -rfE $tests "$@"
