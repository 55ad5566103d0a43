#!/usr/bin/env bash
# ctest version_test: one version everywhere, and `conveyor --version` lists exactly the schedule
# versions the binary accepts.
#
#   tests/package/version_test.sh CLI PROJECT_VERSION BUILD_PYTHON_DIR
#
# - line 1 is "conveyor PROJECT_VERSION" (the top-level project(VERSION));
# - "schedule versions: 1 ... N (default N)": `conveyor batches --schedule-version V` runs for every
#   V listed and refuses N + 1, so the list is the one the code enforces;
# - the Python package's _version.py (generated into the build tree) and, when the package imports
#   here, conveyor.__version__ say the same version.
set -euo pipefail
CLI="$1"; VERSION="$2"; PYDIR="$(realpath "$3")"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$SRC/tests/package/common.sh"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
"$CLI" --version | tee "$TMP/version.txt"
[[ "$(sed -n 1p "$TMP/version.txt")" == "conveyor $VERSION" ]] || fail "line 1 is not 'conveyor $VERSION'"
line="$(grep '^schedule versions: ' "$TMP/version.txt")" || fail "no 'schedule versions:' line"
read -r -a versions <<< "$(sed -E 's/^schedule versions: ([0-9 ]+) \(default ([0-9]+)\)$/\1/' <<< "$line")"
default="$(sed -E 's/.*\(default ([0-9]+)\)$/\1/' <<< "$line")"
[[ "${versions[0]}" == 1 ]] || fail "schedule versions do not start at 1: $line"
max="${versions[-1]}"
[[ "$default" == "$max" ]] || fail "the default ($default) is not the newest version ($max)"
grep -Eq '^protocol version: [0-9]+$' "$TMP/version.txt" || fail "no 'protocol version:' line"

"$CLI" synth --out "$TMP/ds" --episodes 1 --episode-seconds 3 --cameras 1 --audio-codec none > /dev/null
cat > "$TMP/spec.yaml" <<'YAML'
anchor: action
streams:
  cam0: {delta_timestamps: [0.0], size: [32, 32]}
  action: {delta_timestamps: [0.0]}
pipeline: {global_batch_size: 4, seed: 0, schedule: {mode: gop}}
YAML
for v in "${versions[@]}"; do
  "$CLI" batches "$TMP/ds" --config "$TMP/spec.yaml" --steps 1 --schedule-version "$v" --digest > /dev/null ||
    fail "conveyor batches --schedule-version $v failed, though --version lists it"
done
if "$CLI" batches "$TMP/ds" --config "$TMP/spec.yaml" --steps 1 --schedule-version $((max + 1)) > /dev/null 2>&1; then
  fail "conveyor batches accepted --schedule-version $((max + 1)), which --version does not list"
fi
echo "ok: batches accepts schedule versions ${versions[*]} and refuses $((max + 1))"

[[ -f "$PYDIR/conveyor/_version.py" ]] || fail "no $PYDIR/conveyor/_version.py"
got="$(/usr/bin/python3 -c "import runpy; print(runpy.run_path('$PYDIR/conveyor/_version.py')['__version__'])")"
[[ "$got" == "$VERSION" ]] || fail "_version.py says $got"
if got="$(cd / && PYTHONPATH="$PYDIR" /usr/bin/python3 -c 'import conveyor; print(conveyor.__version__)' 2>"$TMP/py.err")"; then
  [[ "$got" == "$VERSION" ]] || fail "conveyor.__version__ is $got"
  echo "ok: conveyor.__version__ $got"
else
  echo "skipped: import conveyor from $PYDIR ($(tail -1 "$TMP/py.err"))"
fi
echo "PASS: version $VERSION in --version, _version.py and the schedule versions the binary accepts"
