#!/usr/bin/env bash
# Bundles Conveyor's binaries and Python package with every shared library they load, so they run
# on the GPU machine (another system image, no Debian libraries, no package registry) from a
# carried archive.
#
#   tools/device_bundle.sh [BUILD_DIR] [OUT_DIR]      # here: writes OUT_DIR/conveyor-bundle.tar.xz
#   CONVEYOR_BUNDLE_DIR=DIR tools/device_bundle.sh    # the unpacked bundle in DIR, no archive
#   (on the device)  tar -xJf conveyor-bundle.tar.xz -C /tmp && /tmp/conveyor-bundle/run conveyor --help
#                    tools/device_check.sh            # every GPU check, one JSON summary
#
# The binaries run under the bundled dynamic loader with only the bundled libraries on the path
# (glibc included), so the host's glibc version does not matter. Taken from the host instead: the
# CUDA driver (libcuda.so.1, libnvidia-*), which must match the host's kernel module, and NCCL
# (libnccl.so.2, 190 MB, which alone would break the carry limit; GPU images ship it with CUDA or
# PyTorch). `run` picks a libnccl.so.2 the bundled loader can load: the directories in
# $CONVEYOR_HOST_LIBS (a ':' list) first, then the pip NCCL of Python environments (nvidia/nccl/lib),
# then the system's; each candidate is checked with the bundled loader before it is used (an image
# whose system NCCL needs a newer glibc than the bundle's is skipped, saying so).
#
# The Python package (python/conveyor, pure Python) is in python/, its libconveyor_c.so.1 (and
# libconveyor_video.so.1, conveyor.video's) in lib/ beside the libraries it loads (found through its DT_RPATH $ORIGIN): any Python 3.9+ of the device
# imports it with PYTHONPATH=BUNDLE/python, in its own process with its own glibc (newer than the
# bundle's, which the bundled libraries accept); the package loads the interpreter's libstdc++
# first so that the bundle's older one never shadows torch's.
#
# Binaries and libraries are stripped and the archive is xz -9e: Debian's libavcodec links every
# codec library Debian has (x265, SVT-AV1, aom, codec2, librsvg and ICU through it), about 175 MB
# uncompressed, 54 MiB packed; the device tool carries 64 MiB at most, sources included.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
OUT="${2:-$ROOT/out/device}"
MAX_BYTES=$((60 * 1024 * 1024))
BINARIES=(tools/conveyor tests/upload_test tests/client_device_test tests/capi_test
          tests/nvdec_test tests/device_frames_test tests/decode_backend_test bench/upload_bench
          bench/nvdec_bench)
if [[ -n "${CONVEYOR_BUNDLE_DIR:-}" ]]; then
  STAGE="$(dirname "$CONVEYOR_BUNDLE_DIR")"; B="$CONVEYOR_BUNDLE_DIR"
  rm -rf "$B"
else
  STAGE="$(mktemp -d)"; trap 'rm -rf "$STAGE"' EXIT
  B="$STAGE/conveyor-bundle"
fi
mkdir -p "$B/bin" "$B/lib" "$B/python/conveyor/lib"

# Every library the loader resolves for $1, except the GPU driver's and NCCL, which must come
# from the host.
copy_libraries() {
  while read -r lib; do
    case "$(basename "$lib")" in
      libcuda.so*|libnvidia-*|libnccl.so*|linux-vdso*) continue ;;
    esac
    [[ -e "$B/lib/$(basename "$lib")" ]] || cp -L "$lib" "$B/lib/"
  done < <(ldd "$1" | awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}')
}

for rel in "${BINARIES[@]}"; do
  src="$BUILD/$rel"
  if [[ ! -x "$src" ]]; then echo "device_bundle: skipping $rel (not built)" >&2; continue; fi
  cp "$src" "$B/bin/"
  strip --strip-unneeded "$B/bin/$(basename "$rel")"
  copy_libraries "$src"
done

# The Python package: its .py files, and libconveyor_c.so.1 and libconveyor_video.so.1 in lib/
# (links from the package's lib/, resolved by the package before loading, so $ORIGIN is the
# bundle's lib/). libconveyor_c loads the CUDA runtime with dlopen through that $ORIGIN: it is in
# lib/ because libconveyor_video and the binaries link it.
capi="$BUILD/python/conveyor/lib/libconveyor_c.so.1"
if [[ -e "$capi" ]]; then
  cp "$BUILD"/python/conveyor/*.py "$BUILD"/python/conveyor/py.typed "$B/python/conveyor/"
  for so in libconveyor_c.so.1 libconveyor_video.so.1; do
    if [[ ! -e "$BUILD/python/conveyor/lib/$so" ]]; then
      echo "device_bundle: no $so (not built)" >&2
      continue
    fi
    cp -L "$BUILD/python/conveyor/lib/$so" "$B/lib/$so"
    copy_libraries "$BUILD/python/conveyor/lib/$so"
    ln -s "../../../lib/$so" "$B/python/conveyor/lib/$so"
  done
  cp -r "$ROOT/python/tests" "$ROOT/python/examples" "$B/python/"
else
  echo "device_bundle: no Python package ($capi not built)" >&2
fi
# SentencePiece's module, loaded by a config with a tokenizer from lib/conveyor/ (the bundled
# loader is the running executable, in lib/; docs/sampling.md "Tokenized text").
spm="$BUILD/lib/conveyor/libconveyor_sentencepiece.so"
if [[ -e "$spm" ]]; then
  mkdir -p "$B/lib/conveyor"
  cp -L "$spm" "$B/lib/conveyor/"
  copy_libraries "$spm"
fi
for f in "$B"/lib/*.so* "$B"/lib/conveyor/*.so; do strip --strip-unneeded "$f" 2>/dev/null || true; done
loader="$(basename "$(ls "$B"/lib/ld-linux-x86-64.so.* | head -1)")"

cat > "$B/run" <<RUN
#!/bin/sh
# run NAME [ARGS...]: runs bin/NAME with the bundled loader and libraries; the host's CUDA driver
# and an NCCL the bundled loader can load are appended to the search path. CONVEYOR_HOST_LIBS: a
# ':' list of directories searched first. Exports CONVEYOR_CLI (the tests' CLI) as this bundle's.
here="\$(cd "\$(dirname "\$0")" && pwd)"
name="\$1"; shift
export CONVEYOR_CLI="\${CONVEYOR_CLI:-\$here/conveyor}"
driver=""
nccl=""
for d in \$(echo "\${CONVEYOR_HOST_LIBS:-}" | tr ':' ' '); do
  [ -d "\$d" ] && driver="\$driver:\$d"
done
# The CUDA driver: from its usual places.
for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/local/cuda/compat; do
  if [ -e "\$d/libcuda.so.1" ]; then driver="\$driver:\$d"; break; fi
done
# NCCL: the first libnccl.so.2 the bundled loader can load (its glibc may be older than the
# host's): CONVEYOR_HOST_LIBS, then Python environments' pip NCCL, then the system's.
for d in \$(echo "\${CONVEYOR_HOST_LIBS:-}" | tr ':' ' ') \\
         /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib \\
         /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib \\
         /usr/lib/python3*/site-packages/nvidia/nccl/lib \\
         /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/local/nvidia/lib64; do
  [ -e "\$d/libnccl.so.2" ] || continue
  # Loadable means the CLI (which links NCCL) starts with it.
  # Before the driver's directory, which may hold a system NCCL the bundled loader cannot load.
  if "\$here/lib/$loader" --library-path "\$here/lib:\$d\$driver" "\$here/bin/conveyor" \\
       --version >/dev/null 2>&1; then
    nccl="\$d"; break
  fi
  [ -n "\${CONVEYOR_BUNDLE_QUIET:-}" ] || echo "run: skipping \$d/libnccl.so.2 (the bundled loader cannot load it)" >&2
done
[ -n "\$nccl" ] && driver=":\$nccl\$driver"
exec "\$here/lib/$loader" --library-path "\$here/lib\$driver" "\$here/bin/\$name" "\$@"
RUN
chmod +x "$B/run"
# The CLI as a program of its own (tests run it by path: CONVEYOR_CLI).
cat > "$B/conveyor" <<'CLI'
#!/bin/sh
exec "$(cd "$(dirname "$0")" && pwd)/run" conveyor "$@"
CLI
chmod +x "$B/conveyor"
cp "$ROOT/tools/device_bundle.sh" "$ROOT/tools/device_check.sh" "$B/"

if [[ -n "${CONVEYOR_BUNDLE_DIR:-}" ]]; then
  echo "device_bundle: $B: $(du -sm "$B" | cut -f1) MB, $(ls "$B/bin" | wc -w) binaries, $(ls "$B/lib" | wc -w) libraries"
  exit 0
fi
mkdir -p "$OUT"
echo "device_bundle: compressing $(du -sm "$B" | cut -f1) MB (xz -9e, a few minutes)" >&2
tar -C "$STAGE" -cf - conveyor-bundle | xz -9e -T0 > "$OUT/conveyor-bundle.tar.xz"
size=$(stat -c %s "$OUT/conveyor-bundle.tar.xz")
echo "device_bundle: $OUT/conveyor-bundle.tar.xz: $((size / 1024 / 1024)) MiB, $(ls "$B/bin" | wc -w) binaries, $(ls "$B/lib" | wc -w) libraries"
if (( size > MAX_BYTES )); then
  echo "device_bundle: over $((MAX_BYTES / 1024 / 1024)) MiB: the device tool carries 64 MiB at most" >&2
  exit 1
fi
