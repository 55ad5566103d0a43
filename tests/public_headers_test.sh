#!/usr/bin/env bash
# Public headers must not pull a heavy dependency into whoever includes them: no FFmpeg, gRPC,
# protobuf (generated .pb.h included), CUDA or yaml-cpp, directly or through the project headers
# they include. Checked: every public header of the libraries below (internal/ folders are
# private to their library and exempt). The read side names the shard index messages through
# readers/format_fwd.h and YAML::Node through a forward declaration (decoders/yaml_config.h);
# the .cc files that read their fields include the generated header and yaml-cpp themselves.
set -euo pipefail
ROOT="$1"
LIBRARIES=(base device readers decoders shuffle pipeline client server trainer)
# Left, and why: the write side of the format. EpisodeData::Stream and MuxedStream carry the
# format's CodecParams by value, filled in field by field by synth, import, extract and the
# LeRobot reader's .cc, so these headers include the generated shard messages on purpose. No read
# side header (Dataset, the decoders, the sample spec and assembler, shuffle/, pipeline/) includes
# them. No public header includes CUDA.
LEFT=(
  readers/dataset_writer.h  # EpisodeData (CodecParams by value); DatasetWriter's ShardDirectory
  decoders/media_demux.h    # DemuxedStream holds an EpisodeData::Stream; ProbeImage* return one
  decoders/media_encoder.h  # Finish() returns an EpisodeData::Stream
  decoders/media_writer.h   # MuxedStream (CodecParams by value)
)
CLEAN=()
while IFS= read -r h; do
  [[ " ${LEFT[*]} " == *" $h "* ]] || CLEAN+=("$h")
done < <(cd "$ROOT" && find "${LIBRARIES[@]}" -name '*.h' -not -path '*/internal/*' | sort)
for h in "${LEFT[@]}"; do
  [[ -f "$ROOT/$h" ]] || { echo "FAIL: $h is listed as left but missing: take it off LEFT"; exit 1; }
done
FORBIDDEN='^#include [<"](libav|libsw|grpc|grpcpp/|google/protobuf|cuda|yaml-cpp/|.*\.pb\.h)'
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
for h in "${CLEAN[@]}"; do
  check "$h" "$h"
done
# The CLI reaches FFmpeg through the decoders' public headers (media_encoder.h, media_writer.h,
# media_demux.h), never directly and never through a library's internal/ headers.
while IFS= read -r hit; do
  echo "FAIL: $hit: tools/ uses public, FFmpeg-free calls (docs/architecture.md)"
  fail=1
done < <(cd "$ROOT" && grep -nE '^#include [<"]((libav|libsw)[a-z]*/|[a-z_]+/internal/)' tools/*.cc tools/*.h || true)
if [[ $fail -eq 0 ]]; then
  echo "public headers: ${#CLEAN[@]} checked, none includes FFmpeg, gRPC, protobuf, CUDA or yaml-cpp (${#LEFT[@]} write-side headers left); tools/ includes no FFmpeg or internal header"
else
  exit 1
fi
