#!/usr/bin/env bash
# Public headers must not pull a heavy dependency into whoever includes them: no FFmpeg, gRPC,
# protobuf (generated .pb.h included), CUDA, yaml-cpp or SentencePiece, directly or through the project headers
# they include. Checked: every public header of the libraries below, without exception (internal/
# folders are private to their library and exempt). Headers name the shard index messages through
# format/format_fwd.h, hold a CodecParams by value through format/codec_params_value.h (the
# write side: EpisodeData::Stream, MuxedStream) and name YAML::Node through a forward declaration
# (sample/yaml_config.h); the .cc files that read or write their fields include the generated
# header and yaml-cpp themselves. No public header includes CUDA.
# The folders are every folder of cmake/floors.txt but tests/ (test support may reach anything it
# tests), so a new folder is covered from the day it has a floor.
set -euo pipefail
ROOT="$1"
EXEMPT=(tests)
LIBRARIES=()
while read -r dir; do
  [[ " ${EXEMPT[*]} " == *" $dir "* ]] || LIBRARIES+=("$dir")
done < <(grep -v '^#' "$ROOT/cmake/floors.txt" | tr -s ' \t' '\n' | grep .)
[[ " ${LIBRARIES[*]} " == *" base "* && " ${LIBRARIES[*]} " == *" capi "* ]] ||
  { echo "FAIL: no floors read from $ROOT/cmake/floors.txt (got: ${LIBRARIES[*]})"; exit 1; }
HEADERS=()
while IFS= read -r h; do
  HEADERS+=("$h")
done < <(cd "$ROOT" && find "${LIBRARIES[@]}" -name '*.h' -not -path '*/internal/*' | sort)
[[ ${#HEADERS[@]} -gt 0 ]] || { echo "FAIL: no public header found under $ROOT"; exit 1; }
FORBIDDEN='^#include [<"](libav|libsw|grpc|grpcpp/|google/protobuf|cuda|yaml-cpp/|sentencepiece|.*\.pb\.h)'
fail=0
# Follows project includes ("dir/file.h") transitively.
check() {
  local header="$1" seen="$2" line inc
  while IFS= read -r line; do
    if [[ "$line" =~ $FORBIDDEN ]]; then
      echo "FAIL: $header includes $line (via $seen)"
      fail=1
    fi
    if [[ "$line" =~ ^#include\ \"([a-z_/]+\.h)\" ]]; then
      inc="${BASH_REMATCH[1]}"
      if [[ -f "$ROOT/$inc" && " $seen " != *" $inc "* ]]; then
        check "$inc" "$seen $inc"
      fi
    fi
  done < <(grep -E '^#include ' "$ROOT/$header")
}
for h in "${HEADERS[@]}"; do
  check "$h" "$h"
done
# The CLI reaches FFmpeg through media/'s public headers (media_encoder.h, media_writer.h,
# media_demux.h), never directly and never through a library's internal/ headers.
while IFS= read -r hit; do
  echo "FAIL: $hit: tools/ uses public, FFmpeg-free calls (docs/architecture.md)"
  fail=1
done < <(cd "$ROOT" && grep -nE '^#include [<"]((libav|libsw)[a-z]*/|[a-z_]+/internal/)' tools/*.cc tools/*.h || true)
if [[ $fail -eq 0 ]]; then
  echo "public headers: ${#HEADERS[@]} checked in ${LIBRARIES[*]}, none includes FFmpeg, gRPC, protobuf, CUDA or yaml-cpp; tools/ includes no FFmpeg or internal header"
else
  exit 1
fi
