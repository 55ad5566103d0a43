#!/usr/bin/env bash
# Public headers that must not pull a heavy dependency into whoever includes them: no FFmpeg,
# gRPC, protobuf (generated .pb.h included), CUDA or yaml-cpp, directly or through the project
# headers they include. The list grows as headers are cleaned (docs/architecture.md says which
# are left: the dataset and decoder headers still expose the shard index protos).
set -euo pipefail
ROOT="$1"
CLEAN=(
  base/types.h base/cancel.h base/strings.h base/status_macros.h base/mix.h
  client/client.h
  device/upload.h device/gpu.h device/host_buffer.h
  server/server.h
  shuffle/order.h
  readers/storage.h readers/memory_storage.h readers/parquet/parquet_file.h
  readers/lerobot/lerobot_meta.h
)
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
  [[ -f "$ROOT/$h" ]] || { echo "FAIL: $h listed but missing"; fail=1; continue; }
  check "$h" "$h"
done
# The CLI reaches FFmpeg through the decoders' public headers (media_encoder.h, media_writer.h,
# media_demux.h), never directly and never through a library's internal/ headers.
while IFS= read -r hit; do
  echo "FAIL: $hit: tools/ uses public, FFmpeg-free calls (docs/architecture.md)"
  fail=1
done < <(cd "$ROOT" && grep -nE '^#include [<"]((libav|libsw)[a-z]*/|[a-z_]+/internal/)' tools/*.cc tools/*.h || true)
if [[ $fail -eq 0 ]]; then
  echo "public headers: ${#CLEAN[@]} checked, none includes FFmpeg, gRPC, protobuf, CUDA or yaml-cpp; tools/ includes no FFmpeg or internal header"
else
  exit 1
fi
