#!/usr/bin/env bash
# Clean Debian 12 roots for the package and the image (tools/image.sh, tests/package/), from
# Debian's packages only, as root and without user namespaces (mmdebstrap --mode=root, chroot).
#
#   tools/debian_root.sh make CACHE_DIR ROOT [PACKAGES]
#       ROOT becomes a fresh bookworm minbase root plus PACKAGES (comma-separated). The root is
#       made once with mmdebstrap and kept as CACHE_DIR/root-KEY.tar (KEY: a hash of PACKAGES and
#       this recipe); later calls only unpack it. apt's package lists are kept in it, so that
#       `install` below resolves dependencies without asking the mirror again.
#   tools/debian_root.sh install ROOT CACHE_DIR DEB
#       `apt-get install ./DEB` in ROOT: apt resolves the package's Depends from Debian's packages
#       as on any Debian 12 system. The .deb files it needs are kept in CACHE_DIR/debs (bind-mounted
#       as apt's archive), so only the first run downloads them.
#   tools/debian_root.sh exec ROOT COMMAND [ARGS...]
#       COMMAND in ROOT as a container sees it: its own mount and PID namespaces (COMMAND is PID 1
#       there), /proc, a private /dev/shm, /dev's usual nodes; the host's network (127.0.0.1), so
#       a test reaches a server in ROOT the way a pod's neighbour would.
#
# The mirror is the one this machine's apt uses (its Debian entries in /etc/apt/sources.list*),
# or $CONVEYOR_DEBIAN_MIRROR (e.g. http://deb.debian.org/debian).
set -euo pipefail
SUITE=bookworm
RECIPE=1  # bump when the recipe changes, so cached roots are not reused

debian_mirrors() {
  if [[ -n "${CONVEYOR_DEBIAN_MIRROR:-}" ]]; then echo "$CONVEYOR_DEBIAN_MIRROR"; return; fi
  local f found=0
  # This machine's Debian sources (deb822 or one-line), not third-party repositories.
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -s "$f" ]] || continue
    if grep -Eq "^[^#]*([[:space:]]|^Suites:[[:space:]]*)$SUITE(-updates|-security)?([[:space:]]|$)" "$f"; then
      echo "$f"; found=1
    fi
  done
  [[ $found -eq 1 ]] || echo "http://deb.debian.org/debian"
}

cmd_make() {
  local cache="$1" root="$2" packages="${3:-}"
  mkdir -p "$cache/debs"
  cache="$(realpath "$cache")"
  local key tar
  key="$(printf '%s\n' "$RECIPE" "$SUITE" "$packages" | sha256sum | cut -c1-16)"
  tar="$cache/root-$key.tar"
  if [[ ! -s "$tar" ]]; then
    command -v mmdebstrap >/dev/null || { echo "debian_root: no mmdebstrap (apt-get install mmdebstrap)" >&2; return 1; }
    local mirrors=() start=$SECONDS
    mapfile -t mirrors < <(debian_mirrors)
    echo "debian_root: mmdebstrap $SUITE minbase${packages:+ + $packages} (mirror: ${mirrors[*]})" >&2
    local include=()
    [[ -z "$packages" ]] || include=(--include="$packages")
    # Docs, man pages and translations of what is installed are left out (dpkg path-exclude,
    # kept in the root for what is installed later); Conveyor's own docs stay.
    mmdebstrap --mode=root --variant=minbase --quiet "${include[@]}" \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-include=/usr/share/doc/conveyor/*' \
      --skip=cleanup/apt/lists --skip=essential/unlink \
      --setup-hook='mkdir -p "$1/var/cache/apt/archives"' \
      --setup-hook="sync-in '$cache/debs' /var/cache/apt/archives/" \
      --customize-hook="sync-out /var/cache/apt/archives '$cache/debs'" \
      --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb' \
      "$SUITE" "$cache/partial-$key.tar" "${mirrors[@]}"
    mv "$cache/partial-$key.tar" "$tar"
    echo "debian_root: $tar in $((SECONDS - start)) s ($(( $(stat -c %s "$tar") / 1024 / 1024 )) MiB)" >&2
  fi
  rm -rf "$root"; mkdir -p "$root"
  tar -C "$root" -xf "$tar"
}

# Mounts what a process in the root expects; runs in the private mount namespace of `exec` and
# `install`, so nothing stays mounted after them.
mount_root() {
  local root="$1" n
  mount -t proc proc "$root/proc"
  mkdir -p "$root/dev/shm"
  mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
  for n in null zero full random urandom tty; do
    if [[ ! -c "$root/dev/$n" ]]; then
      rm -f "$root/dev/$n"; touch "$root/dev/$n"; mount --bind "/dev/$n" "$root/dev/$n"
    fi
  done
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
}

cmd_install() {
  local root="$1" cache="$2" deb="$3"
  mkdir -p "$cache/debs/partial"
  cp "$deb" "$root/tmp/$(basename "$deb")"
  unshare --mount --propagation private /bin/bash -c '
    set -e; root="$1"; cache="$2"; deb="$3"
    '"$(declare -f mount_root)"'
    mount_root "$root"
    mount --bind "$cache/debs" "$root/var/cache/apt/archives"
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends "/tmp/$deb"
  ' sh "$root" "$(realpath "$cache")" "$(basename "$deb")"
  rm -f "$root/tmp/$(basename "$deb")"
}

cmd_exec() {
  local root="$1"; shift
  exec unshare --mount --pid --fork --kill-child --propagation private /bin/bash -c '
    set -e; root="$1"; shift
    '"$(declare -f mount_root)"'
    mount_root "$root"
    exec chroot "$root" "$@"
  ' sh "$root" "$@"
}

[[ $(id -u) -eq 0 ]] || { echo "debian_root: must run as root (mmdebstrap --mode=root, chroot)" >&2; exit 1; }
case "${1:-}" in
  make) shift; cmd_make "$@" ;;
  install) shift; cmd_install "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  *) echo "usage: tools/debian_root.sh make|install|exec ..." >&2; exit 2 ;;
esac
