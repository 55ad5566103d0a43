#!/usr/bin/env bash
# Builds the Python package as a wheel, conveyor-<version>-py3-none-linux_x86_64.whl: the .py
# files, libconveyor_c.so.1 and libconveyor_video.so.1, for any CPython 3.9+ on this platform
# (docs/python.md).
#   tools/wheel.sh [OUT_DIR]          # default out/wheel; the libraries from $CONVEYOR_LIBRARY,
#                                     # $CONVEYOR_VIDEO_LIBRARY (or beside it), else build/
#                                     # (built there if missing)
# No package index is needed: setuptools and wheel come from the interpreter ($PYTHON, default
# Debian's /usr/bin/python3 with python3-setuptools and python3-wheel).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/out/wheel}"
PYTHON="${PYTHON:-/usr/bin/python3}"
mkdir -p "$OUT"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
# A copy of the package's sources, so the build leaves nothing in the source tree.
cp -r "$ROOT/python/conveyor" "$ROOT/python/pyproject.toml" "$ROOT/python/setup.py" \
  "$ROOT/python/README.md" "$work/"
find "$work" -name __pycache__ -prune -exec rm -rf {} +
export CONVEYOR_BUILD_DIR="${CONVEYOR_BUILD_DIR:-$ROOT/build}"
export CONVEYOR_SOURCE_DIR="$ROOT"
PIP_NO_INDEX=1 "$PYTHON" -m pip wheel --no-build-isolation --no-deps -q -w "$OUT" "$work"
ls "$OUT"/conveyor-*.whl
