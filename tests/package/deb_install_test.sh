#!/usr/bin/env bash
# ctest deb_install_test: `apt-get install ./conveyor_VERSION_amd64.deb` on a clean Debian 12 (a
# fresh minbase root from mmdebstrap, plus g++, cmake, make and libabsl-dev to build a C++
# consumer) gives a working `conveyor` (--version; synth, serve, fetch --digest equal to batches
# --digest), a C++ consumer built with find_package(Conveyor) that receives the batches `conveyor
# fetch --ids` lists, and `import conveyor` in Debian's python3.
#
#   tests/package/deb_install_test.sh SOURCE_DIR PACKAGE_BUILD_DIR
#
# apt resolves the package's Depends from Debian's packages; what it downloads is kept in
# PACKAGE_BUILD_DIR/image/cache/debs and the roots as tarballs beside it (tools/debian_root.sh),
# so only the first run needs the mirror. Skipped (77) when not root, without mmdebstrap, or when
# tools/package.sh has not made the .deb (./run test makes it before ctest).
set -euo pipefail
SRC="$(realpath "$1")"; PB="$(realpath -m "$2")"
source "$SRC/tests/package/common.sh"
[[ $(id -u) -eq 0 ]] || skip "needs root (mmdebstrap --mode=root, chroot, namespaces)"
command -v mmdebstrap >/dev/null || skip "no mmdebstrap (tools/setup.sh installs it)"
deb="$(ls -t "$PB"/package/conveyor_*_amd64.deb 2>/dev/null | head -1 || true)"
[[ -n "$deb" ]] || skip "no .deb in $PB/package: tools/package.sh makes it (./run test does)"
start=$SECONDS
R="$PB/image/deb-root"
trap 'rm -rf "$R"' EXIT
bash "$SRC/tools/debian_root.sh" make "$PB/image/cache" "$R" "g++,cmake,make,libabsl-dev"
dpkg-query --admindir="$R/var/lib/dpkg" -W conveyor 2>/dev/null && fail "conveyor is in the clean root already"
echo "\$ apt-get install ./$(basename "$deb")"
bash "$SRC/tools/debian_root.sh" install "$R" "$PB/image/cache" "$deb" > "$PB/image/deb-install-apt.log" 2>&1 ||
  { cat "$PB/image/deb-install-apt.log"; fail "apt-get install ./$(basename "$deb") failed"; }
grep -E '^[0-9]+ upgraded' "$PB/image/deb-install-apt.log" || true
cp "$SRC/tests/package/common.sh" "$SRC/tests/package/in_root_check.sh" "$R/tmp/"
bash "$SRC/tools/debian_root.sh" exec "$R" /bin/bash /tmp/in_root_check.sh
echo "PASS: the package installs and works in a clean Debian 12 root ($((SECONDS - start)) s)"
