#!/usr/bin/env bash
# What a trainer loads: libconveyor_c.so.1 (every `import conveyor` loads it) and the shared C++
# client libconveyor_client.so.1 link the client only, so neither may need a library of the data
# path (docs/architecture.md "What a trainer links"): FFmpeg, libjpeg-turbo, curl, yaml-cpp,
# HDF5, NVCUVID or the CUDA runtime (device/ loads libcudart with dlopen where a GPU is asked
# for). Checked on each library's DT_NEEDED (readelf -d) and on the whole closure the dynamic
# loader resolves (ldd). A control first: libconveyor_video.so.1, which carries the data path, must
# be caught, or the check checks nothing.
#   capi_needed_test.sh LIBCONVEYOR_VIDEO LIBRARY...
set -euo pipefail
VIDEO="$1"; shift
FORBIDDEN='^lib(avcodec|avformat|avutil|swscale|swresample|turbojpeg|jpeg|curl|yaml-cpp|hdf5[a-z_]*|nvcuvid|cudart)\.so'
command -v readelf >/dev/null || { echo "FAIL: readelf not found (binutils)"; exit 1; }

needed() {  # the DT_NEEDED names of $1
  readelf -d "$1" | sed -n 's/.*(NEEDED).*Shared library: \[\(.*\)\]/\1/p'
}
closure() {  # every library the loader resolves for $1, by name
  ldd "$1" | awk '{print $1}'
}
forbidden_in() {  # the forbidden names among $1's needs and closure
  { needed "$1"; closure "$1"; } | grep -E "$FORBIDDEN" | sort -u || true
}

for f in "$VIDEO" "$@"; do
  [[ -f "$f" ]] || { echo "FAIL: $f not built"; exit 1; }
done
control="$(forbidden_in "$VIDEO")"
if [[ -z "$control" ]]; then
  echo "FAIL: the control $VIDEO needs nothing of the data path: the check is not reading it"
  needed "$VIDEO"
  exit 1
fi
echo "control: $(basename "$VIDEO") needs $(echo $control)"

fail=0
for lib in "$@"; do
  hits="$(forbidden_in "$lib")"
  if [[ -n "$hits" ]]; then
    echo "FAIL: $(basename "$lib") needs $(echo $hits) (DT_NEEDED: $(needed "$lib" | tr '\n' ' '))"
    fail=1
  else
    echo "ok: $(basename "$lib") needs $(needed "$lib" | wc -l) libraries, none of the data path"
  fi
done
exit $fail
