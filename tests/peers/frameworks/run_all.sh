#!/bin/bash
# Runs each file of tests.txt (under FRAMEWORK_TESTS_DIR, as prepare.sh
# exports them) stock and then with spindle installed, one after the other in
# the same run, and prints one line of counts per file and mode: pytest's, and
# how many DataLoader iterators with workers ran on spindle's workers and on
# torch's (sitecustomize.py's SPINDLE_PEER_COUNT_DIR). Each run's pytest
# output goes to LOG_DIR/<file>.<mode>.log.
# Usage: run_all.sh PYTHON FRAMEWORK_TESTS_DIR LOG_DIR [modes...] (default: stock patched)
set -u
py=$1; dir=$2; logs=$3; shift 3
modes=${*:-stock patched}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$logs"
status=0
printf '%-72s %-8s %7s %7s %7s %7s %8s %8s %6s\n' file mode passed failed skipped errors 'on spdl' 'on torch' secs
for f in $(grep -v '^#' "$here/tests.txt"); do
  for mode in $modes; do
    log=$logs/$(echo "$f" | tr / _).$mode.log
    counts=$(mktemp -d)
    start=$(date +%s)
    SPINDLE_PEER_COUNT_DIR=$counts "$here/run.sh" "$py" "$dir/$f" "$mode" --tb=short >"$log" 2>&1; rc=$?
    iterators=$(cat "$counts"/iterators.* 2>/dev/null | awk '{s += $1; t += $2} END {print s + 0, t + 0}')
    rm -rf "$counts"
    secs=$(( $(date +%s) - start ))
    last=$(grep -E '^=*.*[0-9]+ (passed|failed|error|skipped).* in [0-9.]+s' "$log" | tail -1)
    count() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' || echo 0; }
    printf '%-72s %-8s %7s %7s %7s %7s %8s %8s %6s\n' "$f" "$mode" "$(count passed)" "$(count failed)" "$(count skipped)" \
      "$(count error)" ${iterators% *} ${iterators#* } "$secs"
    [ -n "$last" ] || { echo "  no pytest summary (exit $rc): see $log"; status=1; }
  done
done
exit $status
