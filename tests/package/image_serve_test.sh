#!/usr/bin/env bash
# ctest image_serve_test: tools/image.sh makes the container image from the Debian package, and
# the image serves a dataset (made by its own `conveyor synth`) whose batches, fetched from
# outside it over 127.0.0.1, equal `conveyor batches --digest` of the build tree and of the image.
#
#   tests/package/image_serve_test.sh CLI SOURCE_DIR PACKAGE_BUILD_DIR
#
# The image runs in podman when podman runs containers here (this machine: with runc, crun refuses
# cgroups' hybrid mode; rlimits no higher than the host's hard limits; the host's network), else
# as a container runtime would without one: its layers unpacked by umoci, its entrypoint started
# in that root with its own mount and PID namespaces and the host's network (tools/debian_root.sh
# exec); CONVEYOR_IMAGE_RUNNER=podman|chroot picks one. Either way the server runs as the user the
# Kubernetes manifests name (65532), as PID 1. Skipped (77) when not root, without
# mmdebstrap/umoci, or when tools/package.sh has not made the .deb (./run test makes it first).
set -euo pipefail
CLI="$(realpath "$1")"; SRC="$(realpath "$2")"; PB="$(realpath -m "$3")"
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
chmod 755 "$TMP"
server=""
NAME="conveyor-image-test-$$"
TAG="localhost/conveyor-image-test:$version"
PODMAN=()
id=""
cleanup() {
  if [[ -n "$server" ]] && kill -0 "$server" 2>/dev/null; then kill -KILL "$server" 2>/dev/null || true; fi
  if command -v podman >/dev/null; then
    podman rm -f "$NAME" >/dev/null 2>&1 || true
    # By ID: the pull also names the image after the layout's path.
    [[ -z "$id" ]] || podman rmi -f "$id" >/dev/null 2>&1 || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
CONFIG=/usr/share/conveyor/examples/pipeline.yaml
runner="${CONVEYOR_IMAGE_RUNNER:-auto}"

# podman: the OCI layout imported as it is; the flags this machine needs, found by trying.
if [[ "$runner" != chroot ]] && command -v podman >/dev/null; then
  why=""
  limits=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
  if id="$(podman pull -q "oci:$PB/image/oci:$version" 2>"$TMP/pull.log")" && podman tag "$id" "$TAG"; then
    for try in "podman" "podman --runtime runc --cgroup-manager=cgroupfs"; do
      read -r -a candidate <<< "$try"
      if "${candidate[@]}" run --rm --network host "${limits[@]}" "$TAG" --version > "$TMP/version.txt" 2>"$TMP/podman.log"; then
        PODMAN=("${candidate[@]}"); break
      fi
    done
    [[ ${#PODMAN[@]} -gt 0 ]] || why="$(tail -1 "$TMP/podman.log")"
  else
    why="podman pull: $(tail -1 "$TMP/pull.log")"
  fi
  if [[ -z "$why" ]]; then
    runner=podman
  else
    [[ "$runner" != podman ]] || fail "podman cannot run the image here: $why"
    echo "podman cannot run the image here ($why); using a chroot"
  fi
fi
[[ "$runner" == podman ]] || runner=chroot

if [[ "$runner" == podman ]]; then
  echo "running the image with ${PODMAN[*]}"
  DATA="$TMP/data"; mkdir -m 777 "$DATA"
  RUN=("${PODMAN[@]}" run --rm --network host "${limits[@]}" -v "$DATA:/data")
  "${RUN[@]}" "$TAG" > "$TMP/default.txt" || fail "the image's default command failed"
  image_conveyor() { "${RUN[@]}" "$TAG" "$@"; }
  image_conveyor synth --out /data/ds --episodes 3 --episode-seconds 4:6 --seed 3 >/dev/null
  "${PODMAN[@]}" run -d --name "$NAME" --network host "${limits[@]}" --user 65532:65532 \
    -v "$DATA:/data" "$TAG" serve /data/ds --config "$CONFIG" --listen 127.0.0.1:0 \
    --ready-file /data/ready > /dev/null
  for _ in $(seq 600); do
    [[ -s "$DATA/ready" ]] && break
    [[ "$("${PODMAN[@]}" inspect -f '{{.State.Running}}' "$NAME")" == true ]] || break
    sleep 0.1
  done
  [[ -s "$DATA/ready" ]] || { "${PODMAN[@]}" logs "$NAME"; fail "the image's server did not start"; }
  addr="$(cut -d' ' -f1 "$DATA/ready")"
  [[ "$("${PODMAN[@]}" exec "$NAME" cat /proc/1/status | awk '/^Uid:/ {print $2}')" == 65532 ]] ||
    fail "the server is not PID 1 as uid 65532"
  DATASET="$DATA/ds"
else
  # chroot: the image's layers unpacked as a runtime would, its configuration read from the
  # runtime config umoci writes.
  umoci unpack --image "$PB/image/oci:$version" "$TMP/bundle" >/dev/null
  R="$TMP/bundle/rootfs"
  mapfile -t args < <(jq -r '.process.args[]' "$TMP/bundle/config.json")
  [[ "${args[0]}" == /usr/bin/conveyor ]] || fail "entrypoint ${args[*]}, expected /usr/bin/conveyor"
  in_image() { bash "$SRC/tools/debian_root.sh" exec "$R" "$@"; }
  in_image "${args[@]}" > "$TMP/default.txt" || fail "the image's default command (${args[*]}) failed"
  image_conveyor() { in_image "${args[0]}" "$@"; }
  image_conveyor --version > "$TMP/version.txt"
  image_conveyor synth --out /data/ds --episodes 3 --episode-seconds 4:6 --seed 3 >/dev/null
  # $! is unshare's PID (debian_root.sh execs it); its child is the server, PID 1 of its namespace.
  bash "$SRC/tools/debian_root.sh" exec "$R" setpriv --reuid=65532 --regid=65532 --clear-groups \
    "${args[0]}" serve /data/ds --config "$CONFIG" --listen 127.0.0.1:0 --ready-file /tmp/ready \
    2> "$TMP/serve.log" &
  server=$!
  wait_ready "$R/tmp/ready" "$server" || { cat "$TMP/serve.log"; fail "the image's server did not start"; }
  addr="$(cut -d' ' -f1 "$R/tmp/ready")"
  pid1="$(pgrep -P "$server")"
  [[ "$(stat -c %u "/proc/$pid1")" == 65532 ]] || fail "the server does not run as uid 65532"
  DATASET="$R/data/ds"
fi
grep -q -- '--listen' "$TMP/default.txt" || fail "the image's default command is not serve --help"
cat "$TMP/version.txt"
diff <("$CLI" --version) "$TMP/version.txt" || fail "the image's conveyor --version differs from the build tree's"
echo "the image ($runner) serves on $addr as uid 65532, PID 1; fetching from outside"

"$CLI" fetch --servers "$addr" --steps 4 --digest > "$TMP/served.txt"
"$CLI" batches "$DATASET" --config "$SRC/examples/pipeline.yaml" --steps 4 --digest > "$TMP/offline.txt"
image_conveyor batches /data/ds --config "$CONFIG" --steps 4 --digest > "$TMP/offline_image.txt"
cat "$TMP/served.txt"
[[ $(wc -l < "$TMP/served.txt") -eq 4 ]] || fail "expected 4 batches"
diff "$TMP/offline.txt" "$TMP/served.txt" || fail "served batches differ from the build tree's conveyor batches"
diff "$TMP/offline_image.txt" "$TMP/served.txt" || fail "served batches differ from the image's conveyor batches"

# SIGTERM to the server, PID 1 as in a container (no init: it blocks the signal and takes it with
# sigwait, which a PID namespace's init receives): it drains and exits 0.
if [[ "$runner" == podman ]]; then
  "${PODMAN[@]}" stop -t 30 "$NAME" > /dev/null
  code="$("${PODMAN[@]}" inspect -f '{{.State.ExitCode}}' "$NAME")"
  "${PODMAN[@]}" logs "$NAME" > "$TMP/serve.log" 2>&1
  [[ "$code" == 0 ]] || { cat "$TMP/serve.log"; fail "the server exited $code on SIGTERM"; }
else
  kill -TERM "$pid1"
  wait "$server" || { cat "$TMP/serve.log"; fail "the server did not exit cleanly on SIGTERM"; }
  server=""
fi
grep -q 'SIGTERM: draining' "$TMP/serve.log" || { cat "$TMP/serve.log"; fail "the server did not drain on SIGTERM"; }
echo "PASS: the image ($(du -h "$PB/image/conveyor-$version.oci.tar" | cut -f1) oci-archive, run with $runner)" \
     "serves batches equal to conveyor batches --digest ($((SECONDS - start)) s in all)"
