#!/usr/bin/env bash
# The decoded-frame cache (issue 20, docs/pipeline.md "The decoded-frame cache"): samples/s of
# `conveyor batches` in epoch 1 and in epochs 2-3 of one run, with the cache holding the whole dataset, with
# it holding a third (pin and lru), and without it, in the same run, beside the limits measured
# in the same run:
#   decode limit: the ffmpeg CLI's sequential decode of one camera (`ffmpeg -threads 1`, frames/s
#     per core) x the worker threads / the frames each sample decodes (its cameras)
#   memcpy: GB/s of numpy copying a 256 MiB array (one core)
# Datasets: `conveyor synth` defaults (3 cameras 224x224 H.264 GOP 30) and LeRobot's encoding
# (AV1 GOP 2, 2 cameras 224x224), both anchored at cam0 with one frame per camera.
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
printf '| dataset | cache | epoch 1 samples/s | epochs 2-3 samples/s | epochs 2-3 / decode limit | frames decoded in 3 epochs | decode limit samples/s | memcpy GB/s |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for name in h264 av1; do
  ds=$work/$name cfg=$work/$name.yaml
  cams=3
  [[ $name == av1 ]] && cams=2
  fps=$(bench_ffmpeg_fps "$ds")
  limit=$(awk -v f="$fps" -v t="$threads" -v c="$cams" 'BEGIN {printf "%.0f", f * t / c}')
  samples=$("$cli" inspect "$ds" --json | /usr/bin/python3 -c 'import json,sys; m=json.load(sys.stdin); print([s for s in m["streams"] if s["name"]=="cam0"][0]["total_frames"])' 2> /dev/null || echo 0)
  steps=$((samples / 32))
  # The whole dataset decoded, in bytes (RGB24 224x224), to size the caches.
  full=$((samples * cams * 224 * 224 * 3 + (64 << 20)))
  for mode in none full pin-third lru-third; do
    args=()
    case $mode in
      full) args=(--frame-cache-bytes "$full") ;;
      pin-third) args=(--frame-cache-bytes $((full / 3)) --frame-cache-policy pin) ;;
      lru-third) args=(--frame-cache-bytes $((full / 3)) --frame-cache-policy lru) ;;
    esac
    say "frame_cache_bench: $name $mode ($steps steps per epoch)"
    read -r one rest decoded < <(timed "$ds" "$cfg" "$steps" "${args[@]}")
    r1=$(awk -v s="$steps" -v t="$one" 'BEGIN {printf "%.0f", 32 * s / t}')
    r2=$(awk -v s="$steps" -v t="$rest" 'BEGIN {printf "%.0f", 64 * s / t}')
    x=$(awk -v r="$r2" -v l="$limit" 'BEGIN {printf "%.2f", r / l}')
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$mode" "$r1" "$r2" "$x" "$decoded" "$limit" "$memcpy_gbs"
    printf '{"bench":"frame_cache","dataset":"%s","cache":"%s","threads":%s,"steps_per_epoch":%s,"epoch1_samples_per_s":%s,"epochs2_3_samples_per_s":%s,"frames_decoded_3_epochs":%s,"decode_limit_samples_per_s":%s,"ffmpeg_fps":%s,"memcpy_gb_per_s":%s}\n' \
      "$name" "$mode" "$threads" "$steps" "$r1" "$r2" "${decoded:-0}" "$limit" "$fps" "$memcpy_gbs" >> "$json"
  done
done
say "frame_cache_bench: wrote $json"
