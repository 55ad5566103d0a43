#!/usr/bin/env bash
# GOP schedule versions (issue 17 item 1, docs/pipeline.md "Schedule versions"): decode
# amplification, samples/s and shuffle quality of `conveyor batches --stats` over two whole
# epochs, for the naive order and GOP schedules 1 and 2, in the same run, on:
#   h264-cam   synth default (3 cameras 224x224 H.264 GOP 30, 30 fps), anchored at cam0, one frame
#              per camera (the configuration of issue 17's table)
#   h264-50hz  the same dataset anchored at the 50 Hz actions
#   h264-back  anchored at cam0, cam0 reaching 0.1 s back (delta_timestamps [-0.1, 0])
#   av1-gop2   LeRobot's default encoding: AV1 (libsvtav1) GOP 2, 2 cameras 224x224, at the camera
# and beside them the ffmpeg CLI's sequential decode of one camera of the same dataset
# (`ffmpeg -threads 1 -i cam0.mp4 -f null -`, frames/s per core), the decoder's own speed.
#
# Usage: bash bench/schedule_bench.sh BUILD_DIR [--threads T] [--work DIR]
# Writes bench/out/schedule_bench.json (one object per row) and prints a markdown table.
set -euo pipefail
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_setup schedule_bench "$@"
bench_datasets

config() {  # NAME ANCHOR CAM0_DELTAS CAMERAS
  local name=$1 anchor=$2 deltas=$3 cams=$4 c
  {
    echo "anchor: $anchor"
    echo "streams:"
    echo "  cam0: {delta_timestamps: $deltas}"
    for c in $(seq 1 $((cams - 1))); do echo "  cam$c: {}"; done
    [[ $anchor == action ]] && echo "  action: {}"
    echo "pipeline: {global_batch_size: 32, seed: 0, max_epochs: 2, schedule: {mode: gop}}"
  } > "$work/$name.yaml"
}
config h264-cam cam0 "[0.0]" 3
config h264-50hz action "[0.0]" 3
config h264-back cam0 "[-0.1, 0.0]" 3
config av1-gop2 cam0 "[0.0]" 2


json="$bench_dir/out/schedule_bench.json"
: > "$json"
printf '| workload | order | samples/s | amplification | frames decoded / delivered | same-episode neighbours (uniform) | episodes per batch (uniform) | ffmpeg -threads 1 fps |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for w in h264-cam h264-50hz h264-back av1-gop2; do
  ds=$work/h264
  [[ $w == av1-gop2 ]] && ds=$work/av1
  fps=$(bench_ffmpeg_fps "$ds")
  for order in naive v1 v2; do
    args=(--schedule gop --schedule-version "${order#v}")
    [[ $order == naive ]] && args=(--schedule naive)
    say "schedule_bench: $w $order"
    out=$("$cli" batches "$ds" --config "$work/$w.yaml" --steps 1000000 --threads "$threads" --stats "${args[@]}" 2>&1 > /dev/null)
    rate=$(sed -n 's/.* = \([0-9.]*\) samples\/s.*/\1/p' <<< "$out")
    amp=$(sed -n 's/.*amplification \([0-9.]*\);.*/\1/p' <<< "$out")
    dec=$(sed -n 's/.*video: \([0-9]*\) frames decoded for \([0-9]*\) delivered.*/\1 \2/p' <<< "$out")
    q=$(sed -n 's/.*same-episode neighbours \([0-9.]*\) (uniform shuffle \([0-9.]*\)), episodes per batch \([0-9.]*\) (uniform \([0-9.]*\)).*/\1 \2 \3 \4/p' <<< "$out")
    read -r decoded delivered <<< "$dec"
    read -r same same_u eps eps_u <<< "$q"
    printf '| %s | %s | %s | %s | %s / %s | %s (%s) | %s (%s) | %s |\n' "$w" "$order" "$rate" "$amp" \
      "$decoded" "$delivered" "$same" "$same_u" "$eps" "$eps_u" "$fps"
    printf '{"bench":"schedule","workload":"%s","order":"%s","threads":%s,"samples_per_s":%s,"amplification":%s,"frames_decoded":%s,"frames_delivered":%s,"same_episode_neighbours":%s,"same_episode_uniform":%s,"episodes_per_batch":%s,"episodes_per_batch_uniform":%s,"ffmpeg_fps":%s}\n' \
      "$w" "$order" "$threads" "$rate" "$amp" "$decoded" "$delivered" "$same" "$same_u" "$eps" "$eps_u" "$fps" >> "$json"
  done
done
say "schedule_bench: wrote $json"
