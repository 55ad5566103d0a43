#!/usr/bin/env bash
# The decoded-frame cache (issue 20, docs/pipeline.md "The decoded-frame cache"): samples/s of
# `conveyor batches` in epoch 1 and in epochs 2-3 of one run, beside the limits measured in the
# same run:
#   decode limit: the ffmpeg CLI's sequential decode of one camera (`ffmpeg -threads 1`, frames/s
#     per core) x the worker threads / the frames each sample decodes (its cameras)
#   memcpy: GB/s of numpy copying a 256 MiB array (one core)
# Caches: none; in memory holding the whole dataset (full), a third (pin and lru); the node-wide
# store (--frame-cache-dir) in /dev/shm holding everything (shm), the same store read by a second
# process once warm (shm-warm: what a node's second server or a restarted job sees), and on disk
# with lz4 and zstd (disk-lz4, disk-zstd).
# Datasets: `conveyor synth` defaults (3 cameras 224x224 H.264 GOP 30), LeRobot's encoding in the
# native format (AV1 GOP 2, 2 cameras 224x224), and a LeRobot v3.0 directory read in place (AV1
# GOP 2, 2 cameras 224x224, written by bench/lerobot/make_lerobot_bench.mjs; needs node and npm),
# all anchored at the first camera with one frame per camera.
#
# Usage: bash bench/frame_cache_bench.sh BUILD_DIR [--threads T] [--work DIR]
# Writes bench/out/frame_cache_bench.json and prints a markdown table.
set -euo pipefail
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_setup frame_cache_bench "$@"
bench_datasets

config() {  # FILE CAMERAS
  { echo "anchor: cam0"; echo "streams:"
    for c in $(seq 0 $(($2 - 1))); do echo "  cam$c: {}"; done
    echo "pipeline: {global_batch_size: 32, seed: 0, schedule: {mode: gop}}"; } > "$1"
}
config "$work/h264.yaml" 3
config "$work/av1.yaml" 2
# The LeRobot v3.0 directory: 8 episodes of 300 frames (30 fps), 2 cameras, read in place.
src_dir=$(dirname "$bench_dir")
npm_dir="$build/tests/parquet_npm"
bash "$src_dir/tests/fixtures/lerobot/make_lerobot.sh" "$npm_dir" "$build/tests/lerobot_fixtures" >&2
cp "$bench_dir/lerobot/make_lerobot_bench.mjs" "$npm_dir/"
[[ -f $work/lerobot/meta/info.json ]] || node "$npm_dir/make_lerobot_bench.mjs" "$work/lerobot" 8 300 2 224x224 av1 30 4 4 >&2
{ echo "anchor: observation.images.cam0"; echo "streams:"
  for c in 0 1; do echo "  observation.images.cam$c: {}"; done
  echo "pipeline: {global_batch_size: 32, seed: 0, schedule: {mode: gop}}"; } > "$work/lerobot.yaml"
shm_store=/dev/shm/conveyor-frame-cache-bench.$$
bench_cleanup+=("$shm_store")

memcpy_gbs=$(/usr/bin/python3 -c '
import numpy as np, time
a = np.ones(256 << 20, dtype=np.uint8); b = np.empty_like(a); np.copyto(b, a)
t = time.perf_counter()
for _ in range(8): np.copyto(b, a)
print(f"{8 * a.nbytes / (time.perf_counter() - t) / 1e9:.1f}")')

# One run of 3 epochs: prints "EPOCH1_SECONDS EPOCHS_2_3_SECONDS FRAMES_DECODED". The times are
# taken from the batch lines as they arrive (conveyor batches flushes each): epoch 1 from the
# start to its last line (start-up included), epochs 2-3 from there to the last line.
timed() {  # DATASET CONFIG STEPS ARGS...
  local ds=$1 cfg=$2 steps=$3
  shift 3
  local err=$work/timed.err
  "$cli" batches "$ds" --config "$cfg" --steps $((3 * steps)) --threads "$threads" --stats "$@" 2> "$err" |
    /usr/bin/python3 -c '
import sys, time
t0, steps, marks = time.perf_counter(), int(sys.argv[1]), []
for n, _ in enumerate(sys.stdin, 1):
    if n in (steps, 3 * steps):
        marks.append(time.perf_counter())
print(f"{marks[0] - t0:.3f} {marks[1] - marks[0]:.3f}", end=" ")' "$steps"
  sed -n 's/.*video: \([0-9]*\) frames decoded.*/\1/p' "$err"
}

json="$bench_dir/out/frame_cache_bench.json"
: > "$json"
printf '| dataset | cache | epoch 1 samples/s | epochs 2-3 samples/s | epochs 2-3 / decode limit | frames decoded in 3 epochs | store size (pixels / stored) | decode limit samples/s | memcpy GB/s |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
for name in h264 av1 lerobot; do
  ds=$work/$name cfg=$work/$name.yaml
  cams=3
  [[ $name != h264 ]] && cams=2
  if [[ $name == lerobot ]]; then
    fps=$(bench_ffmpeg_fps_mp4 "$work/lerobot/videos/observation.images.cam0/chunk-000/file-000.mp4")
  else
    fps=$(bench_ffmpeg_fps "$ds")
  fi
  limit=$(awk -v f="$fps" -v t="$threads" -v c="$cams" 'BEGIN {printf "%.0f", f * t / c}')
  samples=$("$cli" inspect "$ds" --json | /usr/bin/python3 -c 'import json,sys; m=json.load(sys.stdin); print([s for s in m["streams"] if s["name"] in ("cam0", "observation.images.cam0")][0]["total_frames"])' 2> /dev/null || echo 0)
  steps=$((samples / 32))
  # The whole dataset decoded, in bytes (RGB24 224x224), to size the caches.
  full=$((samples * cams * 224 * 224 * 3 + (64 << 20)))
  rm -rf "$shm_store" "$work/disk-store"
  for mode in none full pin-third lru-third shm shm-warm disk-lz4 disk-zstd; do
    args=()
    case $mode in
      full) args=(--frame-cache-bytes "$full") ;;
      pin-third) args=(--frame-cache-bytes $((full / 3)) --frame-cache-policy pin) ;;
      lru-third) args=(--frame-cache-bytes $((full / 3)) --frame-cache-policy lru) ;;
      shm) args=(--frame-cache-dir "$shm_store" --frame-cache-dir-bytes "$full") ;;
      shm-warm) args=(--frame-cache-dir "$shm_store" --frame-cache-dir-bytes "$full") ;;  # warm from shm
      disk-lz4|disk-zstd) rm -rf "$work/disk-store"
        args=(--frame-cache-dir "$work/disk-store" --frame-cache-dir-bytes "$full" --frame-cache-compression "${mode#disk-}") ;;
    esac
    say "frame_cache_bench: $name $mode ($steps steps per epoch)"
    read -r one rest decoded < <(timed "$ds" "$cfg" "$steps" "${args[@]}")
    r1=$(awk -v s="$steps" -v t="$one" 'BEGIN {printf "%.0f", 32 * s / t}')
    r2=$(awk -v s="$steps" -v t="$rest" 'BEGIN {printf "%.0f", 64 * s / t}')
    x=$(awk -v r="$r2" -v l="$limit" 'BEGIN {printf "%.2f", r / l}')
    stored=""
    case $mode in
      shm*) stored=$("$cli" cache info "$shm_store" --json | /usr/bin/python3 -c 'import json,sys; u=json.load(sys.stdin); b=u["bytes"]; print("%.0f MB (%.2fx)" % (b / 1e6, u["pixel_bytes"] / max(b, 1)))') ;;
      disk-*) stored=$("$cli" cache info "$work/disk-store" --json | /usr/bin/python3 -c 'import json,sys; u=json.load(sys.stdin); b=u["bytes"]; print("%.0f MB (%.2fx)" % (b / 1e6, u["pixel_bytes"] / max(b, 1)))') ;;
    esac
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$mode" "$r1" "$r2" "$x" "$decoded" "${stored:--}" "$limit" "$memcpy_gbs"
    printf '{"bench":"frame_cache","dataset":"%s","cache":"%s","threads":%s,"steps_per_epoch":%s,"epoch1_samples_per_s":%s,"epochs2_3_samples_per_s":%s,"frames_decoded_3_epochs":%s,"store":"%s","decode_limit_samples_per_s":%s,"ffmpeg_fps":%s,"memcpy_gb_per_s":%s}\n' \
      "$name" "$mode" "$threads" "$steps" "$r1" "$r2" "${decoded:-0}" "$stored" "$limit" "$fps" "$memcpy_gbs" >> "$json"
  done
done
say "frame_cache_bench: wrote $json"
