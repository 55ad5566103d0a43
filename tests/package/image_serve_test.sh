#!/usr/bin/env bash
# ctest image_serve_test: tools/image.sh makes the container image from the Debian package, and
# the image serves a dataset (made by its own `conveyor synth`) whose batches, fetched from
# outside it over 127.0.0.1, equal `conveyor batches --digest` of the build tree and of the image.
#
#   tests/package/image_serve_test.sh CLI SOURCE_DIR PACKAGE_BUILD_DIR
#
# The image is run as this machine allows without a container runtime: its layers unpacked by
# umoci (as a runtime would), its entrypoint started in that root with its own mount and PID
# namespaces and the host's network (tools/debian_root.sh exec), as the non-root user the
# Kubernetes manifests name (65532). Skipped (77) when not root, without mmdebstrap/umoci, or
# when tools/package.sh has not made the .deb (./run test makes it before ctest).
set -euo pipefail
CLI="$(realpath "$1")"; SRC="$(realpath "$2")"; PB="$3"
source "$SRC/tests/package/common.sh"
[[ $(id -u) -eq 0 ]] || skip "needs root (mmdebstrap --mode=root, chroot, namespaces)"
for t in mmdebstrap umoci jq; do command -v $t >/dev/null || skip "no $t (tools/setup.sh installs it)"; done
deb="$(ls -t "$PB"/package/conveyor_*_amd64.deb 2>/dev/null | head -1 || true)"
[[ -n "$deb" ]] || skip "no .deb in $PB/package: tools/package.sh makes it (./run test does)"
version="$("$CLI" --version | head -1 | cut -d' ' -f2)"
[[ "$(dpkg-deb -f "$deb" Version)" == "$version" ]] ||
  fail "$deb is version $(dpkg-deb -f "$deb" Version), the build tree $version: run tools/package.sh"
start=$SECONDS

bash "$SRC/tools/image.sh" "$deb" "$PB/image"
echo "image built in $((SECONDS - start)) s"

TMP="$(mktemp -d "$PB/image/run.XXXXXX")"
server=""
cleanup() {
  if [[ -n "$server" ]] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
umoci unpack --image "$PB/image/oci:$version" "$TMP/bundle" >/dev/null
R="$TMP/bundle/rootfs"
# What the image's configuration runs: the entrypoint and its default arguments.
mapfile -t args < <(jq -r '.process.args[]' "$TMP/bundle/config.json")
[[ "${args[0]}" == /usr/bin/conveyor ]] || fail "entrypoint ${args[*]}, expected /usr/bin/conveyor"
in_image() { bash "$SRC/tools/debian_root.sh" exec "$R" "$@"; }
in_image "${args[@]}" > "$TMP/default.txt" || fail "the image's default command (${args[*]}) failed"
grep -q -- '--listen' "$TMP/default.txt" || fail "the default command is not serve --help"
in_image "${args[0]}" --version | tee "$TMP/version.txt"
diff <("$CLI" --version) "$TMP/version.txt" || fail "the image's conveyor --version differs from the build tree's"

# A dataset made inside the image, readable by the server's user.
in_image "${args[0]}" synth --out /data/ds --episodes 3 --episode-seconds 4:6 --seed 3 >/dev/null
CONFIG=/usr/share/conveyor/examples/pipeline.yaml
# $! is unshare's PID (debian_root.sh execs it); its child is the server, PID 1 of its namespace.
bash "$SRC/tools/debian_root.sh" exec "$R" setpriv --reuid=65532 --regid=65532 --clear-groups \
  "${args[0]}" serve /data/ds --config "$CONFIG" --listen 127.0.0.1:0 --ready-file /tmp/ready \
  2> "$TMP/serve.log" &
server=$!
wait_ready "$R/tmp/ready" "$server" || { cat "$TMP/serve.log"; fail "the image's server did not start"; }
addr="$(cut -d' ' -f1 "$R/tmp/ready")"
pid1="$(pgrep -P "$server")"
[[ "$(stat -c %u "/proc/$pid1")" == 65532 ]] || fail "the server does not run as uid 65532"
echo "the image serves on $addr as uid 65532; fetching from outside"

"$CLI" fetch --servers "$addr" --steps 4 --digest > "$TMP/served.txt"
"$CLI" batches "$R/data/ds" --config "$SRC/examples/pipeline.yaml" --steps 4 --digest > "$TMP/offline.txt"
in_image "${args[0]}" batches /data/ds --config "$CONFIG" --steps 4 --digest > "$TMP/offline_image.txt"
cat "$TMP/served.txt"
[[ $(wc -l < "$TMP/served.txt") -eq 4 ]] || fail "expected 4 batches"
diff "$TMP/offline.txt" "$TMP/served.txt" || fail "served batches differ from the build tree's conveyor batches"
diff "$TMP/offline_image.txt" "$TMP/served.txt" || fail "served batches differ from the image's conveyor batches"

# SIGTERM to the server, PID 1 of its namespace as in a container (no init: it blocks the signal
# and takes it with sigwait, which a namespace's init receives): it drains and exits 0.
kill -TERM "$pid1"
wait "$server" || { cat "$TMP/serve.log"; fail "the server did not exit cleanly on SIGTERM"; }
grep -q 'SIGTERM: draining' "$TMP/serve.log" || fail "the server did not drain on SIGTERM"
server=""
echo "PASS: the image ($(du -h "$PB/image/conveyor-$version.oci.tar" | cut -f1) oci-archive) serves" \
     "batches equal to conveyor batches --digest ($((SECONDS - start)) s in all)"
