#!/usr/bin/env bash
# The package as a user installs it: a fresh venv (--system-site-packages: Debian's numpy and
# torch, as a conda or pip environment would bring its own), `pip install --no-build-isolation`
# of the source tree with no package index, then a wheel built by tools/wheel.sh installed into a
# second venv; each runs the package's tests against its installed copy (not the build tree).
#
#   venv_install_test.sh PYTHON WORKDIR LIBRARY
# LIBRARY is the built libconveyor_c.so (setup.py takes it through $CONVEYOR_LIBRARY instead of
# building it again, and libconveyor_video.so.1 from beside it). CONVEYOR_CLI and friends come from ctest's environment.
set -euo pipefail
PYTHON="$1"; WORK="$2"; LIBRARY="$3"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$WORK"; mkdir -p "$WORK"
export CONVEYOR_LIBRARY="$(readlink -f "$LIBRARY")"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1

check_installed() {  # VENV: the package imports from the venv, its library from inside it
  local venv="$1"
  (cd "$WORK" && env -u CONVEYOR_LIBRARY -u PYTHONPATH "$venv/bin/python" - "$venv" <<'PY'
import sys
from pathlib import Path
import conveyor, conveyor._lib as lib
venv = Path(sys.argv[1]).resolve()
where = Path(conveyor.__file__).resolve()
assert venv in where.parents, f"conveyor imported from {where}, not from the venv {venv}"
assert venv in Path(lib.path).resolve().parents, f"library from {lib.path}, not the venv's"
assert (where.parent / "py.typed").is_file(), f"no py.typed in {where.parent}: not typed for users"
print(f"venv: conveyor {conveyor.__version__} from {where.parent}, library {lib.path}")
# conveyor.video's library is installed too, and loaded only when DeviceFrames is used.
assert "libconveyor_video" not in Path("/proc/self/maps").read_text(), "loaded by import"
from conveyor import video
video_path = Path(video._library()._name).resolve()
assert venv in video_path.parents, f"libconveyor_video from {video_path}, not the venv's"
print(f"venv: conveyor.video's library {video_path}")
PY
  )
}

run_tests() {  # VENV: the unittest suite with the installed package
  (cd "$WORK" && env -u CONVEYOR_LIBRARY -u PYTHONPATH "$1/bin/python" -m unittest discover \
     -s "$ROOT/python/tests" -p 'test_loader.py' -k BatchesTest -k ZeroCopyTest \
     -k DeviceTest -k StateTest -k ErrorTest 2>&1 | tail -5)
}

echo "== pip install ./python into a fresh venv"
"$PYTHON" -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install --no-build-isolation --no-deps -q "$ROOT/python"
check_installed "$WORK/venv"
run_tests "$WORK/venv"

echo "== tools/wheel.sh, then the wheel into a second venv"
PYTHON="$PYTHON" bash "$ROOT/tools/wheel.sh" "$WORK/dist"
wheel=$(ls "$WORK"/dist/conveyor-*-py3-none-linux_x86_64.whl)
echo "wheel: $(basename "$wheel") ($(stat -c %s "$wheel") bytes)"
"$PYTHON" -m venv --system-site-packages "$WORK/venv2"
"$WORK/venv2/bin/pip" install --no-deps -q "$wheel"
check_installed "$WORK/venv2"
run_tests "$WORK/venv2"
echo "venv_install_test: passed"
