#!/usr/bin/env bash
# RLDS in place (issue 39, docs/rlds.md): shuffled samples/s of an RLDS dataset of JPEG cameras
# beside the decode bound (tjbench on the dataset's own JPEG, one process per thread, in the same
# run: `conveyor bench`'s image rows), with the read amplification of each shuffled order, the
# episode cache a third of the dataset so that the order matters; and the record index: the first
# open (index built by reading every shard) against the second (index from the cache).
#
# Usage: bash bench/rlds_bench.sh BUILD_DIR [--threads T] [--work DIR]
#          [--episodes E] [--steps S] [--size N]
# Writes bench/rlds/rlds_bench.json (conveyor bench's rows) and bench/rlds/rlds_open.json.
#
# Goals (issue 39): shuffled >= 0.9 of the decode bound; read amplification <= 1.1 in bytes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
episodes=24 steps=100 size=224
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --episodes) episodes=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
bench_setup rlds_bench "${args[@]}"
out="$bench_dir/rlds"
mkdir -p "$out"
ds="$work/rlds_${episodes}x${steps}_${size}"
if [[ ! -f "$ds/dataset_info.json" ]]; then
  say "rlds_bench: writing $episodes episodes x $steps steps, two ${size}x${size} JPEG cameras (python3-protobuf, cjpeg)"
  /usr/bin/python3 "$bench_dir/../tests/fixtures/rlds/make_rlds.py" --bench "$episodes" "$steps" "$size" 4 "$ds" 2>/dev/null
fi
bytes=$(du -cb "$ds"/*.tfrecord-* | tail -1 | cut -f1)
cache_mb=$(( bytes / 3 / 1048576 ))
export CONVEYOR_INDEX_CACHE_DIR="$work/index-cache"
rm -rf "$CONVEYOR_INDEX_CACHE_DIR"

# The record index: built on the first open (every shard read), read from the cache on the next.
open_s() { local t0 t1; t0=$(date +%s.%N); "$cli" inspect "$ds#rate=10" >/dev/null 2>&1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
cold=$(open_s)
warm=$(open_s)
say "rlds_bench: open with the index built: ${cold} s; from the index cache: ${warm} s ($((bytes / 1048576)) MiB of shards)"
printf '{"dataset_bytes": %s, "episodes": %s, "steps": %s, "size": %s, "open_cold_s": %s, "open_warm_s": %s}\n' \
  "$bytes" "$episodes" "$steps" "$size" "$cold" "$warm" > "$out/rlds_open.json"

"$cli" bench "$ds#rate=10&cache_mb=$cache_mb" --modality image --threads "$threads" --seconds 5 --no-serve \
  --json "$out/rlds_bench.json" --markdown "$out/rlds_bench.md" 2>/dev/null
