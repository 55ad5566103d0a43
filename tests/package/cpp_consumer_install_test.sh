#!/usr/bin/env bash
# ctest cpp_consumer_install_test: `cmake --install` of this build tree into a temporary prefix
# gives a CMake package a C++ program finds with find_package(Conveyor) (examples/cpp_consumer),
# links as Conveyor::client (the shared libconveyor_client.so.1) and runs: the batches it receives
# from a server are those `conveyor fetch --ids` lists. The clean-root test of the .deb
# (deb_install_test) checks the same in a fresh Debian 12.
#
#   tests/package/cpp_consumer_install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD="$(realpath "$1")"; SRC="$(realpath "$2")"
source "$SRC/tests/package/common.sh"
TMP="$(mktemp -d)"
server=""
trap '[[ -z "$server" ]] || kill -KILL "$server" 2>/dev/null || true; rm -rf "$TMP"' EXIT
cmake --install "$BUILD" --prefix "$TMP/prefix" > "$TMP/install.log"
PREFIX="$TMP/prefix"
CLI="$PREFIX/bin/conveyor"
for f in include/conveyor/client/client.h include/conveyor/client/launch_env.h include/conveyor/base/types.h \
         include/conveyor/base/tensor_desc.h include/conveyor/base/coverage.h include/conveyor/base/mix.h \
         lib/*/cmake/Conveyor/ConveyorConfig.cmake lib/*/cmake/Conveyor/ConveyorConfigVersion.cmake \
         lib/*/libconveyor_client.so.1 share/conveyor/examples/cpp_consumer/CMakeLists.txt \
         lib/python3/dist-packages/conveyor/__init__.py lib/python3/dist-packages/conveyor/_version.py \
         lib/python3/dist-packages/conveyor/_loader.py lib/python3/dist-packages/conveyor/py.typed \
         share/doc/conveyor/CHANGELOG.md; do
  compgen -G "$PREFIX/$f" > /dev/null || fail "cmake --install did not install $f"
done
cmake -S "$PREFIX/share/conveyor/examples/cpp_consumer" -B "$TMP/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release > "$TMP/cmake.log" 2>&1 ||
  { cat "$TMP/cmake.log"; fail "find_package(Conveyor) failed"; }
cmake --build "$TMP/consumer" > "$TMP/build.log" 2>&1 || { cat "$TMP/build.log"; fail "building the consumer failed"; }
ldd "$TMP/consumer/conveyor_consumer" | grep "libconveyor_client.so.1 => $PREFIX/" ||
  fail "the consumer does not load the installed libconveyor_client.so.1"
help="$("$TMP/consumer/conveyor_consumer" --help)" || fail "conveyor_consumer --help exited $?"
grep -q -- '--servers' <<< "$help" || fail "conveyor_consumer --help names no --servers"

"$CLI" synth --out "$TMP/ds" --episodes 2 --episode-seconds 4 --seed 2 > /dev/null
"$CLI" serve "$TMP/ds" --config "$SRC/examples/pipeline.yaml" --listen 127.0.0.1:0 \
  --ready-file "$TMP/ready" 2> "$TMP/serve.log" &
server=$!
wait_ready "$TMP/ready" "$server" || { cat "$TMP/serve.log"; fail "conveyor serve did not start"; }
addr="$(cut -d' ' -f1 "$TMP/ready")"
"$TMP/consumer/conveyor_consumer" --servers "$addr" --steps 3 | tee "$TMP/consumer.txt"
"$CLI" fetch --servers "$addr" --steps 3 --ids > "$TMP/ids.txt"
[[ $(wc -l < "$TMP/consumer.txt") -eq 3 ]] || fail "expected 3 batches"
diff <(ids_of_fetch "$TMP/ids.txt") <(ids_of_consumer "$TMP/consumer.txt") ||
  fail "the consumer's batches differ from conveyor fetch --ids"
kill -TERM "$server"; wait "$server"; server=""
echo "PASS: find_package(Conveyor) from cmake --install; the consumer receives conveyor fetch's batches"
