#!/usr/bin/env bash
# HDF5 in place (docs/hdf5.md): shuffled samples/s of ALOHA-style HDF5 episodes beside the decode
# bound, in the same run (`conveyor bench`'s image rows): for raw uint8 arrays (served as PPM, the
# decode a copy) memcpy of a frame's rgb24 bytes, one thread per thread; for ACT's JPEG rows
# tjbench on the dataset's first JPEG, one process per thread. Two datasets of the same frames:
#   raw:  cam_high chunked one frame per chunk with gzip level 4, cam_low contiguous
#   jpeg: both cameras as JPEG rows (cjpeg -quality 90) with /compress_len
# and the open: the first (every lowdim dataset read for the statistics, episode 0 indexed) against
# the next (moments and index from the index cache).
#
# Usage: bash bench/hdf5_bench.sh BUILD_DIR [--threads T] [--work DIR]
#          [--episodes E] [--steps S] [--size N]
# Writes bench/hdf5/hdf5_bench_raw.json, hdf5_bench_jpeg.json (conveyor bench's rows, with .md
# beside them) and bench/hdf5/hdf5_open.json.
#
# Goal: shuffled >= 0.9 of the decode bound (tjbench for JPEG rows, memcpy for raw arrays).
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
bench_setup hdf5_bench "${args[@]}"
out="$bench_dir/hdf5"
mkdir -p "$out"
ds="$work/aloha_${episodes}x${steps}_${size}"
if [[ ! -f "$ds/jpeg/episode_$((episodes - 1)).hdf5" ]]; then
  say "hdf5_bench: writing $episodes episodes x $steps steps, two ${size}x${size} cameras, raw and JPEG rows (h5py, cjpeg)"
  /usr/bin/python3 "$bench_dir/../tests/fixtures/hdf5/make_hdf5.py" --bench-aloha "$episodes" "$steps" "$size" "$ds"
fi
export CONVEYOR_INDEX_CACHE_DIR="$work/index-cache"
rm -rf "$CONVEYOR_INDEX_CACHE_DIR"

open_s() { local t0 t1; t0=$(date +%s.%N); "$cli" inspect "$1" >/dev/null 2>&1; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
printf '{"episodes": %s, "steps": %s, "size": %s' "$episodes" "$steps" "$size" > "$out/hdf5_open.json"
for v in raw jpeg; do
  bytes=$(du -cb "$ds/$v"/*.hdf5 | tail -1 | cut -f1)
  cold=$(open_s "$ds/$v")
  warm=$(open_s "$ds/$v")
  say "hdf5_bench: $v ($((bytes / 1048576)) MiB): first open ${cold} s, from the index cache ${warm} s"
  printf ', "%s_bytes": %s, "%s_open_cold_s": %s, "%s_open_warm_s": %s' "$v" "$bytes" "$v" "$cold" "$v" "$warm" >> "$out/hdf5_open.json"
done
printf '}\n' >> "$out/hdf5_open.json"

for v in raw jpeg; do
  say "hdf5_bench: conveyor bench $v, $threads threads"
  "$cli" bench "$ds/$v" --modality image --threads "$threads" --seconds 5 --no-serve \
    --json "$out/hdf5_bench_$v.json" --markdown "$out/hdf5_bench_$v.md" 2>/dev/null
done
