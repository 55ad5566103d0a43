#!/usr/bin/env bash
# Builds the Debian package: PACKAGE_BUILD_DIR/package/conveyor_<version>_amd64.deb (docs/install.md).
#
#   tools/package.sh [PACKAGE_BUILD_DIR]     # default: build-package beside build/ ($CONVEYOR_BUILD_DIR-package)
#
# Its own build tree, configured for what a Debian system has: CUDA off (the CUDA runtime and NCCL
# under /usr/local/cuda are no Debian packages, so a package linking them would not install on a
# clean Debian 12; the package is the CPU build, GPU machines use the source build or
# tools/device_bundle.sh), no tests or benchmarks, installed under /usr. ccache makes a rebuild
# after a small change quick; from nothing it compiles the libraries and the CLI once more.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PB="${1:-${CONVEYOR_BUILD_DIR:-$ROOT/build}-package}"
JOBS="${CONVEYOR_JOBS:-$(nproc)}"
export CCACHE_DIR="${CCACHE_DIR:-$ROOT/.cache/ccache}"
# Paths under the checkout are hashed relative to the build directory, so build/ and
# build-package/ (siblings, the same flags but their own generated headers) share compiled objects.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
if [[ ! -f "$PB/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$PB" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -DCMAKE_INSTALL_PREFIX=/usr -DCONVEYOR_CUDA=OFF \
    -DCONVEYOR_BUILD_TESTS=OFF -DCONVEYOR_BUILD_BENCH=OFF -DCONVEYOR_FAST_BUILD=ON >/dev/null
fi
cmake --build "$PB" -j "$JOBS"
rm -f "$PB"/package/conveyor_*.deb
(cd "$PB" && cpack --config CPackConfig.cmake) > "$PB/cpack.log" 2>&1 || { cat "$PB/cpack.log" >&2; exit 1; }
deb="$(ls "$PB"/package/conveyor_*_amd64.deb)"
echo "package: $deb ($(( $(stat -c %s "$deb") / 1024 / 1024 )) MiB)"
