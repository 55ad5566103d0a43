#!/usr/bin/env bash
# The GPU machine's bundle (tools/device_bundle.sh) built and used as the device uses it, with a
# clean environment (env -i): the CLI under the bundled loader, CONVEYOR_HOST_LIBS as a ':' list,
# a C++ test that finds the CLI through $CONVEYOR_CLI (the bundle's wrapper), and the Python
# package imported by another process from the bundle, its libraries (gRPC, protobuf, absl) taken
# from the bundle's lib/ rather than the system's, streaming batches equal to the CLI's.
#   bundle_test.sh BUILD_DIR WORK_DIR
set -euo pipefail
BUILD="$1"; WORK="$2"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rm -rf "$WORK"; mkdir -p "$WORK"
B="$WORK/conveyor-bundle"
CONVEYOR_BUNDLE_DIR="$B" bash "$ROOT/tools/device_bundle.sh" "$BUILD"
fail() { echo "bundle_test: FAILED: $*" >&2; exit 1; }

echo "== the CLI under the bundled loader, nothing from the environment"
v="$(env -i "$B/run" conveyor --version)" || fail "run conveyor --version"
echo "$v"
grep -q "$(sed -n 's/^project(conveyor VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")" <<<"$v" ||
  fail "--version does not print the project's version: $v"
env -i CONVEYOR_HOST_LIBS="/nonexistent/a:/nonexistent/b:" "$B/run" conveyor --version >/dev/null ||
  fail "CONVEYOR_HOST_LIBS as a ':' list"
env -i "$B/conveyor" synth --out "$WORK/ds" --episodes 2 --episode-seconds 3 --quiet ||
  fail "the bundle's conveyor wrapper"
env -i "$B/run" conveyor inspect "$WORK/ds" | head -3

echo "== a C++ test finding the CLI through CONVEYOR_CLI (exported by run)"
env -i "$B/run" capi_test --gtest_brief=1 || fail "capi_test from the bundle"

echo "== the Python package from the bundle, in another process"
env -i PYTHONPATH="$B/python" /usr/bin/python3 - "$B" <<'PY' || fail "import from the bundle"
import sys
from pathlib import Path
import conveyor, conveyor._lib as lib
bundle = Path(sys.argv[1]).resolve()
assert Path(lib.path).resolve().parent == bundle / "lib", lib.path
maps = Path("/proc/self/maps").read_text()
for name in ("libgrpc++.so", "libprotobuf.so", "libabsl_"):
    paths = {l.split()[-1] for l in maps.splitlines() if name in l}
    assert paths and all(p.startswith(str(bundle / "lib")) for p in paths), (name, paths)
print(f"conveyor {conveyor.__version__}: {lib.path}; gRPC, protobuf, absl from the bundle")
# The CUDA runtime only where a GPU is asked for, loaded by libconveyor_c with dlopen through its
# $ORIGIN: the bundle's, not the host's.
assert "libcudart" not in maps, "import conveyor loaded libcudart"
conveyor.device_supported()
cudart = {l.split()[-1] for l in Path("/proc/self/maps").read_text().splitlines() if "libcudart" in l}
if any((bundle / "lib").glob("libcudart.so.*")):  # a CUDA build
    assert cudart and all(p.startswith(str(bundle / "lib")) for p in cudart), cudart
# conveyor.video's library only when DeviceFrames is used, from the bundle too.
assert "libconveyor_video" not in maps, "import conveyor loaded libconveyor_video"
from conveyor import video
where = Path(video._library()._name).resolve()
assert where == bundle / "lib" / "libconveyor_video.so.1", where
print(f"conveyor.video: {where}")
PY
env -i PYTHONPATH="$B/python" CONVEYOR_CLI="$B/conveyor" CONVEYOR_SOURCE_DIR="$ROOT" \
  /usr/bin/python3 -m unittest discover -s "$B/python/tests" -p test_loader.py -k BatchesTest \
  2>&1 | tail -3
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "the package's BatchesTest from the bundle"
echo "bundle_test: passed"
