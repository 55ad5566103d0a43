#!/usr/bin/env bash
# Builds the container image from the Debian package, without any image registry or daemon:
# a minimal Debian 12 root (mmdebstrap, from Debian's packages), the package installed into it with
# apt (which brings its Depends), turned into an OCI image with umoci (docs/install.md).
#
#   tools/image.sh [DEB] [OUT_DIR]
#     DEB      default: the newest build-package/package/conveyor_*_amd64.deb (tools/package.sh)
#     OUT_DIR  default: the DEB's build tree's image/
#
# Writes OUT_DIR/oci (an OCI image layout, tag VERSION) and OUT_DIR/conveyor-VERSION.oci.tar (the
# same as one oci-archive file), e.g. `skopeo copy oci-archive:FILE:VERSION
# docker://REGISTRY/conveyor:VERSION` to push it to your registry, or `podman pull
# oci:OUT_DIR/oci:VERSION` (one tag, the version: what the manifests in deploy/k8s name).
#
# The minbase root is cached as OUT_DIR/cache/root-KEY.tar and the .deb files apt downloaded are
# kept in OUT_DIR/cache/debs: a rerun needs no network; the first run downloads about 100 MB from
# the Debian mirror.
#
# Runs as root, without user namespaces: the root comes from tools/debian_root.sh (mmdebstrap
# --mode=root; chroot). The Debian mirror is the one this machine's apt uses, or
# $CONVEYOR_DEBIAN_MIRROR.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEB="${1:-}"
if [[ -z "$DEB" ]]; then
  DEB="$(ls -t "${CONVEYOR_BUILD_DIR:-$ROOT/build}-package"/package/conveyor_*_amd64.deb 2>/dev/null | head -1)"
  [[ -n "$DEB" ]] || { echo "image: no .deb found; run tools/package.sh first" >&2; exit 1; }
fi
DEB="$(realpath "$DEB")"
OUT="${2:-$(dirname "$(dirname "$DEB")")/image}"
for tool in mmdebstrap umoci dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "image: $tool not found (apt-get install mmdebstrap umoci)" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "image: must run as root (mmdebstrap --mode=root, chroot)" >&2; exit 1; }
VERSION="$(dpkg-deb -f "$DEB" Version)"
start=$SECONDS

# The root: bookworm minbase, then `apt-get install ./conveyor_VERSION_amd64.deb` in it (apt brings
# the Depends from Debian's packages), then apt's lists and caches dropped.
WORK="$OUT/work"
rm -rf "$WORK"; mkdir -p "$WORK"
bash "$ROOT/tools/debian_root.sh" make "$OUT/cache" "$WORK/rootfs"
bash "$ROOT/tools/debian_root.sh" install "$WORK/rootfs" "$OUT/cache" "$DEB" >"$WORK/apt.log" 2>&1 ||
  { cat "$WORK/apt.log" >&2; exit 1; }
rm -rf "$WORK/rootfs/var/lib/apt/lists/"* "$WORK/rootfs/var/cache/apt/"*.bin \
       "$WORK/rootfs/var/log/apt" "$WORK/rootfs/var/log/dpkg.log"
chroot "$WORK/rootfs" /usr/bin/conveyor --version >/dev/null
rootfs_bytes=$(du -sb "$WORK/rootfs" | cut -f1)

# The OCI image: an empty image, the root as its one layer, then its configuration: the CLI as the
# entrypoint, `serve --help` as the default arguments (a Deployment gives the real ones), 7700 (gRPC)
# and 9464 (metrics) exposed.
rm -rf "$OUT/oci"
umoci init --layout "$OUT/oci"
umoci new --image "$OUT/oci:$VERSION"
umoci insert --image "$OUT/oci:$VERSION" "$WORK/rootfs" / >/dev/null
umoci config --image "$OUT/oci:$VERSION" --author "Conveyor" \
  --config.entrypoint /usr/bin/conveyor --config.cmd serve --config.cmd --help \
  --config.workingdir / --config.exposedports 7700/tcp --config.exposedports 9464/tcp \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.label "org.opencontainers.image.title=conveyor" \
  --config.label "org.opencontainers.image.version=$VERSION" \
  --config.label "org.opencontainers.image.description=Conveyor data server and CLI (Debian 12, conveyor_${VERSION}_amd64.deb)"
umoci gc --layout "$OUT/oci"
rm -f "$OUT/conveyor-$VERSION.oci.tar"
tar -C "$OUT/oci" -cf "$OUT/conveyor-$VERSION.oci.tar" .
rm -rf "$WORK"

archive=$(stat -c %s "$OUT/conveyor-$VERSION.oci.tar")
echo "image: $OUT/oci:$VERSION, $OUT/conveyor-$VERSION.oci.tar: $((archive / 1024 / 1024)) MiB (root filesystem $((rootfs_bytes / 1024 / 1024)) MiB unpacked) in $((SECONDS - start)) s"
