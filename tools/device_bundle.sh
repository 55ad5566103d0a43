#!/usr/bin/env bash
# Bundles Conveyor's binaries with every shared library they load, so they run on the GPU machine
# (another system image, no Debian libraries, no package registry) from a carried archive.
#
#   tools/device_bundle.sh [BUILD_DIR] [OUT_DIR]      # here: writes OUT_DIR/conveyor-bundle.tar.xz
#   (on the device)  tar -xJf conveyor-bundle.tar.xz -C /tmp && /tmp/conveyor-bundle/run conveyor --help
#
# The binaries run under the bundled dynamic loader with only the bundled libraries on the path
# (glibc included), so the host's glibc version does not matter. Taken from the host instead: the
# CUDA driver (libcuda.so.1, libnvidia-*), which must match the host's kernel module, and NCCL
# (libnccl.so.2, 190 MB, which alone would break the carry limit; GPU images ship it with CUDA or
# PyTorch). Binaries and libraries are stripped and the archive is xz -9e: Debian's libavcodec
# links every codec library Debian has (x265, SVT-AV1, aom, codec2, librsvg and ICU through it),
# about 175 MB uncompressed, 54 MiB packed; the device tool carries 64 MiB at most, sources included.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
OUT="${2:-$ROOT/out/device}"
MAX_BYTES=$((60 * 1024 * 1024))
BINARIES=(tools/conveyor tests/upload_test tests/client_device_test tests/pipeline_test
          tests/trainer_test bench/upload_bench bench/pipeline_bench)
STAGE="$(mktemp -d)"; trap 'rm -rf "$STAGE"' EXIT
B="$STAGE/conveyor-bundle"
mkdir -p "$B/bin" "$B/lib"
for rel in "${BINARIES[@]}"; do
  src="$BUILD/$rel"
  if [[ ! -x "$src" ]]; then echo "device_bundle: skipping $rel (not built)" >&2; continue; fi
  cp "$src" "$B/bin/"
  strip --strip-unneeded "$B/bin/$(basename "$rel")"
  # Every library the loader resolves, except the GPU driver's, which must come from the host.
  while read -r lib; do
    case "$(basename "$lib")" in
      libcuda.so*|libnvidia-*|libnccl.so*|linux-vdso*) continue ;;
    esac
    [[ -e "$B/lib/$(basename "$lib")" ]] || cp -L "$lib" "$B/lib/"
  done < <(ldd "$src" | awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}')
done
for f in "$B"/lib/*.so*; do strip --strip-unneeded "$f" 2>/dev/null || true; done
loader="$(basename "$(ls "$B"/lib/ld-linux-x86-64.so.* | head -1)")"
cat > "$B/run" <<RUN
#!/bin/sh
# run NAME [ARGS...]: runs bin/NAME with the bundled loader and libraries; the host's CUDA driver
# and NCCL (in their usual places, or \$CONVEYOR_HOST_LIBS) are appended to the search path.
here="\$(cd "\$(dirname "\$0")" && pwd)"
name="\$1"; shift
driver=""
for d in \${CONVEYOR_HOST_LIBS:-} /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 \\
         /usr/local/cuda/compat /usr/local/cuda/lib64 /usr/local/cuda/lib \\
         /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib /usr/lib/python3*/site-packages/nvidia/nccl/lib; do
  if [ -e "\$d/libcuda.so.1" ] || [ -e "\$d/libnccl.so.2" ]; then driver="\$driver:\$d"; fi
done
exec "\$here/lib/$loader" --library-path "\$here/lib\$driver" "\$here/bin/\$name" "\$@"
RUN
chmod +x "$B/run"
cp "$ROOT/tools/device_bundle.sh" "$B/"
mkdir -p "$OUT"
echo "device_bundle: compressing $(du -sm "$B" | cut -f1) MB (xz -9e, a few minutes)" >&2
tar -C "$STAGE" -cf - conveyor-bundle | xz -9e -T0 > "$OUT/conveyor-bundle.tar.xz"
size=$(stat -c %s "$OUT/conveyor-bundle.tar.xz")
echo "device_bundle: $OUT/conveyor-bundle.tar.xz: $((size / 1024 / 1024)) MiB, $(ls "$B/bin" | wc -w) binaries, $(ls "$B/lib" | wc -w) libraries"
if (( size > MAX_BYTES )); then
  echo "device_bundle: over $((MAX_BYTES / 1024 / 1024)) MiB: the device tool carries 64 MiB at most" >&2
  exit 1
fi
