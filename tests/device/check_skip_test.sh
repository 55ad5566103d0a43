#!/usr/bin/env bash
# tools/device_check.sh's raw-data folder and its accounting, without a GPU: a check that ran is
# "passed" with its log in the run's folder (named by CONVEYOR_CHECK_NAME here, by device and date
# by default) and the folder packed as RUN.tgz; checks the deadline left out are "skipped", with
# passed false, and the run's summary is not passed (exit status 1).
#   check_skip_test.sh CONVEYOR_CLI PYTHON_PACKAGE_DIR WORK_DIR
set -euo pipefail
CLI="$1"; PKG="$2"; WORK="$3"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$WORK"; mkdir -p "$WORK/bundle"
fail() { echo "check_skip_test: FAILED: $*" >&2; exit 1; }
# A bundle as device_check.sh reads one: the CLI and the Python package.
printf '#!/bin/sh\nexec %q "$@"\n' "$CLI" > "$WORK/bundle/conveyor"
chmod +x "$WORK/bundle/conveyor"
ln -s "$PKG" "$WORK/bundle/python"
run() {  # run NAME EXTRA_ENV... : device_check.sh's exit status
  env CONVEYOR_DEVICE_PYTHON=/usr/bin/python3 OUT="$WORK/out" CONVEYOR_CHECK_NAME="$1" \
    CONVEYOR_CHECK_CPU=1 "${@:2}" bash "$ROOT/tools/device_check.sh" "$WORK/bundle" \
    > "$WORK/$1.out" 2>&1
}
summary() {  # summary RUN EXPR: a Python expression over d (the run's device_check.json)
  /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" \
    "$WORK/out/$1/device_check.json"
}

echo "== one check that runs"
run ran CONVEYOR_CHECK_ONLY=python_env || fail "python_env alone: $(tail -5 "$WORK/ran.out")"
summary ran 'd["passed"] and d["run"] == "ran" and d["skipped"] == [] and d["checks"]["python_env"]["status"] == "passed"' ||
  fail "the summary of a passed run: $(cat "$WORK/out/ran/device_check.json")"
[[ -s "$WORK/out/ran/python_env.log" ]] || fail "no python_env.log in the run's folder"
# (The listing is read whole before grep: tar writes a line at a time, and a grep -q that stops at
# the match would make tar's next write a SIGPIPE, which pipefail reports as a failure.)
listing="$(tar -tzf "$WORK/out/ran.tgz")" || fail "cannot list ran.tgz"
grep -qx 'ran/python_env.log' <<< "$listing" || fail "ran.tgz lacks ran/python_env.log: $listing"

echo "== checks past the deadline"
if run late CONVEYOR_CHECK_ONLY="python_env synth" CONVEYOR_CHECK_DEADLINE=-1; then
  fail "a run whose checks were all skipped exited 0"
fi
summary late 'not d["passed"] and d["skipped"] == ["python_env", "synth"] and d["ran"] == 0 and all(c["status"] == "skipped" and c["passed"] is False for c in d["checks"].values())' ||
  fail "skipped checks: $(cat "$WORK/out/late/device_check.json")"
grep -q "SKIPPED" "$WORK/late.out" || fail "the table does not say SKIPPED"
echo "check_skip_test: passed"
