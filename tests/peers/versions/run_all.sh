#!/bin/bash
# The version matrix of issue 31: the peers' own suites against each peer release, in the
# venvs venv.sh makes (build/versions/NAME). For each torch venv, PyTorch's
# test/test_dataloader.py (prepare.sh exports it) with fork (the platform default) and with
# spawn set before any test, unpatched (mode torch) and with spindle.torch patched in
# (tests/peers/torch/run.sh); for each grain venv, grain's own multi-process tests from its
# wheel, unpatched and patched (tests/peers/grain/run.sh). One line of counts per run; each
# run's pytest output goes to LOG_DIR/NAME-START-MODE.log.
# Usage: run_all.sh LOG_DIR TORCH_TESTS [WHEEL]
#   TORCH_TESTS: the folder prepare.sh filled. Each torch venv runs
#     TORCH_TESTS/NAME/test/test_dataloader.py where there is one, else TORCH_TESTS/$TORCH_TEST_COPY
#     (default torch-74436f9)/test/test_dataloader.py, and the table says which.
#   WHEEL: spindle's cp311 wheel, force-reinstalled (--no-deps) into each venv before its
#     patched runs; without it the patched runs use whatever spindle the venv has.
#   VERSIONS (default: the five venvs), STARTS (fork spawn), TORCH_MODES (torch patched),
#   GRAIN_MODES (grain patched), PYTEST_ARGS (--tb=line) narrow or change the runs.
set -u
export COLUMNS=${COLUMNS:-250}  # pytest cuts the -rfE summary lines to the terminal width
logs=$1; torch_tests=$2; wheel=${3:-}
versions=${VERSIONS:-torch-2.4.1 torch-2.8.0 torch-2.14.1 grain-0.2.12 grain-0.2.18}
starts=${STARTS:-fork spawn}
torch_modes=${TORCH_MODES:-torch patched}
grain_modes=${GRAIN_MODES:-grain patched}
pytest_args=${PYTEST_ARGS:---tb=line}
root=${VERSIONS_ROOT:-build/versions}
here=$(cd "$(dirname "$0")" && pwd)
peers=$(dirname "$here")
mkdir -p "$logs"
status=0
summary=$logs/summary.txt
printf '%-14s %-6s %-8s %7s %7s %7s %7s %6s  %s\n' venv start mode passed failed skipped errors secs 'test file' | tee "$summary"

# run NAME START MODE LOG TESTFILE COMMAND...: one row of the table.
run() {
  local name=$1 start=$2 mode=$3 log=$4 file=$5; shift 5
  local t0 rc last secs
  t0=$(date +%s)
  "$@" >"$log" 2>&1; rc=$?
  secs=$(( $(date +%s) - t0 ))
  last=$(grep -E '^=*.*[0-9]+ (passed|failed|error|skipped).* in [0-9.]+s' "$log" | tail -1)
  count() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' || echo 0; }
  printf '%-14s %-6s %-8s %7s %7s %7s %7s %6s  %s\n' "$name" "$start" "$mode" "$(count passed)" "$(count failed)" \
    "$(count skipped)" "$(count error)" "$secs" "$file" | tee -a "$summary"
  [ -n "$last" ] || { echo "  no pytest summary (exit $rc): see $log" | tee -a "$summary"; status=1; }
}

for name in $versions; do
  py=$root/$name/bin/python
  [ -f "$root/$name/.versions-ok" ] || { echo "$name: no venv (tests/peers/versions/venv.sh $name)" | tee -a "$summary"; status=1; continue; }
  case $name in
    torch-*)
      file=$torch_tests/$name/test/test_dataloader.py
      [ -f "$file" ] || file=$torch_tests/${TORCH_TEST_COPY:-torch-74436f9}/test/test_dataloader.py
      copy=$(basename "$(dirname "$(dirname "$file")")")
      for mode in $torch_modes; do
        if [ "$mode" = patched ] && [ -n "$wheel" ]; then
          "$py" -m pip install -q --force-reinstall --no-deps "$wheel" || { status=1; continue; }
        fi
        for start in $starts; do
          [ "$start" = fork ] && sm= || sm=$start
          run "$name" "$start" "$mode" "$logs/$name-$start-$mode.log" "$copy" \
            env START_METHOD="$sm" "$peers/torch/run.sh" "$py" "$file" "$mode" $pytest_args
        done
      done ;;
    grain-*)
      for mode in $grain_modes; do
        if [ "$mode" = patched ] && [ -n "$wheel" ]; then
          "$py" -m pip install -q --force-reinstall --no-deps "$wheel" || { status=1; continue; }
        fi
        run "$name" - "$mode" "$logs/$name-$mode.log" "grain's wheel" "$peers/grain/run.sh" "$py" "$mode" $pytest_args
      done ;;
  esac
done
exit $status
