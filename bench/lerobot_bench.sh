#!/usr/bin/env bash
# LeRobot in place (issue 14, docs/lerobot.md): samples/s of a LeRobot v3.0 dataset read in place
# against the same dataset imported into the native format (`conveyor import --lerobot`), with
# the same spec and threads, in the same run; and the time to open a 1,000-episode v3.0 dataset and
# deliver its first batch, with a cold and a warm packet-index cache, with its peak memory; and the
# LeRobot-style PyAV DataLoader peer (bench/peers) on the same episodes.
#
# Usage: bash bench/lerobot_bench.sh BUILD_DIR [--steps N] [--repeat R] [--work DIR]
#          [--episodes E] [--cameras C] [--size WxH] [--codec av1|h264]
# Writes bench/out/lerobot_bench.json and prints markdown tables. Needs node and npm (the Parquet
# writer the test fixtures use, tests/fixtures/parquet) and ffmpeg with libsvtav1/libx264.
#
# Goals (issue 14): in place >= 0.9 x imported; open + first batch < 2 s with a warm index cache.
set -euo pipefail
usage="usage: bash bench/lerobot_bench.sh BUILD_DIR [--steps N] [--repeat R] [--work DIR] [--episodes E] [--cameras C] [--size WxH] [--codec av1|h264]"
build=$(realpath "${1:?$usage}")
shift
steps=40 repeat=3 work="" episodes=20 cameras=3 size=224x224 codec=av1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --episodes) episodes=$2; shift 2 ;;
    --cameras) cameras=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --codec) codec=$2; shift 2 ;;
    *) echo "lerobot_bench: unknown flag $1 ($usage)" >&2; exit 2 ;;
  esac
done
cli="$build/tools/conveyor"
[[ -x "$cli" ]] || { echo "lerobot_bench: $cli not found (cmake --build $build --target conveyor)" >&2; exit 1; }
bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src_dir=$(dirname "$bench_dir")
mkdir -p "$bench_dir/out"
if [[ -z "$work" ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
export CONVEYOR_INDEX_CACHE_DIR="$work/index-cache"

# The Parquet writer: the npm packages the fixtures pin, installed once into the build tree.
npm_dir="$build/tests/parquet_npm"
bash "$src_dir/tests/fixtures/lerobot/make_lerobot.sh" "$npm_dir" "$build/tests/lerobot_fixtures" >&2
cp "$bench_dir/lerobot/make_lerobot_bench.mjs" "$npm_dir/"
make() {  # NAME ARGS...
  local name=$1; shift
  if [[ ! -f "$work/$name/meta/info.json" ]]; then
    node "$npm_dir/make_lerobot_bench.mjs" "$work/$name" "$@"
  fi
}

# 1. Throughput: E episodes of 10 s at 30 fps, C cameras, 10 episodes per mp4 and per data file.
make tp "$episodes" 300 "$cameras" "$size" "$codec" 30 10 10
if [[ ! -f "$work/tp_native/manifest.json" ]]; then
  "$cli" import --lerobot "$work/tp" --out "$work/tp_native" --quiet
fi
{
  echo "anchor: action"
  echo "streams:"
  for ((c = 0; c < cameras; ++c)); do echo "  observation.images.cam$c: {delta_timestamps: [0.0]}"; done
  echo "  observation.state: {delta_timestamps: [0.0], normalize: mean_std}"
  echo "  action: {delta_timestamps: {start: 0.0, step: 0.0333333, count: 10}, normalize: min_max}"
  echo "  instruction: {}"
  echo "pipeline: {seed: 0, global_batch_size: 32, schedule: {mode: gop}}"
} > "$work/config.yaml"

rate() {  # DATASET THREADS -> median samples/s of $repeat runs
  local r=()
  for _ in $(seq "$repeat"); do
    local out
    out=$("$cli" batches "$1" --config "$work/config.yaml" --steps "$steps" --threads "$2" --stats 2>&1 >/dev/null)
    [[ "$out" == *samples/s* ]] || { echo "lerobot_bench: $1: $out" >&2; exit 1; }
    r+=("$(sed -n 's/.* = \([0-9.]*\) samples\/s.*/\1/p' <<<"$out" | head -1)")
  done
  printf '%s\n' "${r[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
# Baseline: the ffmpeg CLI decoding one camera's first mp4 whole, one thread.
first_mp4="$work/tp/videos/observation.images.cam0/chunk-000/file-000.mp4"
frames=$(ffprobe -v error -count_packets -select_streams v:0 -show_entries stream=nb_read_packets -of csv=p=0 "$first_mp4")
t0=$(date +%s.%N)
ffmpeg -hide_banner -loglevel error -nostdin -threads 1 -i "$first_mp4" -f null - 
t1=$(date +%s.%N)
ffmpeg_fps=$(awk -v f="$frames" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", f / (b - a)}')
echo "lerobot_bench: ffmpeg -threads 1 decodes $frames frames of $first_mp4 at $ffmpeg_fps frames/s" >&2

declare -A rates
for threads in 1 2; do
  rates[inplace_$threads]=$(rate "$work/tp" "$threads")
  rates[native_$threads]=$(rate "$work/tp_native" "$threads")
  echo "lerobot_bench: $threads threads: in place ${rates[inplace_$threads]}, imported ${rates[native_$threads]} samples/s" >&2
done

# 2. Open: 1,000 episodes of 16 frames, one 96x96 camera, 250 episodes per mp4, 500 per data file.
make open 1000 16 1 96x96 "$codec" 30 250 500
cat > "$work/open.yaml" <<'YAML'
anchor: action
streams:
  observation.images.cam0: {delta_timestamps: [0.0]}
  observation.state: {delta_timestamps: [0.0]}
  action: {delta_timestamps: {start: 0.0, step: 0.0333333, count: 10}}
pipeline: {seed: 0, global_batch_size: 32, schedule: {mode: gop}}
YAML
open_run() {  # -> "seconds max_rss_kb"
  /usr/bin/time -f '%e %M' -o "$work/time.txt" "$cli" batches "$work/open" --config "$work/open.yaml" \
    --steps 1 --threads 2 --digest > /dev/null
  cat "$work/time.txt"
}
rm -rf "$CONVEYOR_INDEX_CACHE_DIR"
read -r cold_s cold_kb < <(open_run)
read -r warm_s warm_kb < <(open_run)
echo "lerobot_bench: open + first batch of 1,000 episodes: cold index cache ${cold_s} s, warm ${warm_s} s (peak RSS ${warm_kb} KiB)" >&2

# 3. The LeRobot-style PyAV DataLoader peer (bench/peers/lerobot_style.py) on the same episodes:
# it needs one mp4 per episode and camera, which `conveyor extract` writes from the import (the
# same packets); its Conveyor rows run on the import too. Checked sample by sample first.
{
  echo "anchor: action"
  echo "streams:"
  for ((c = 0; c < cameras; ++c)); do echo "  observation.images.cam$c: {delta_timestamps: [-0.0333333, 0.0]}"; done
  echo "  observation.state: {delta_timestamps: [0.0], normalize: mean_std}"
  echo "  action: {delta_timestamps: {start: 0.0, step: 0.0333333, count: 10}, normalize: min_max}"
  echo "pipeline: {seed: 0, global_batch_size: 32, queue_bytes: 1073741824, schedule: {mode: gop}}"
} > "$work/peer.yaml"
PYTHONPATH="$build/python" /usr/bin/python3 "$bench_dir/peers/lerobot_style.py" --cli "$cli" \
  --dataset "$work/tp_native" --peer-spec "$work/peer.yaml" --specs peer --workers 0,1,2 \
  --threads 1,2 --check 0,999,4321 --batches 20 --gop-steps 60 --naive-steps 16 \
  --json "$bench_dir/out/lerobot_peer.json" > "$work/peer.md"

/usr/bin/python3 - "$bench_dir/out/lerobot_bench.json" "$steps" "$repeat" "$episodes" "$cameras" "$size" "$codec" \
  "$ffmpeg_fps" "${rates[inplace_1]}" "${rates[native_1]}" "${rates[inplace_2]}" "${rates[native_2]}" \
  "$cold_s" "$cold_kb" "$warm_s" "$warm_kb" <<'PY'
import json, os, sys
a = sys.argv
out, steps, repeat, episodes, cameras, size, codec = a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), a[6], a[7]
ffmpeg_fps = float(a[8])
rates = {1: (float(a[9]), float(a[10])), 2: (float(a[11]), float(a[12]))}
cold_s, cold_kb, warm_s, warm_kb = float(a[13]), int(a[14]), float(a[15]), int(a[16])
doc = {
    "bench": "lerobot_bench", "steps": steps, "repeat": repeat, "batch": 32, "nproc": os.cpu_count(),
    "dataset": {"episodes": episodes, "frames_per_episode": 300, "fps": 30, "cameras": cameras,
                "size": size, "codec": codec, "episodes_per_mp4": 10},
    "ffmpeg_cli_decode_frames_per_s_1_thread": ffmpeg_fps,
    "samples_per_s": {str(t): {"in_place": r[0], "imported": r[1], "ratio": r[0] / r[1]}
                      for t, r in rates.items()},
    "open_1000_episodes": {"cold_index_cache_s": cold_s, "cold_peak_rss_kib": cold_kb,
                           "warm_index_cache_s": warm_s, "warm_peak_rss_kib": warm_kb},
}
json.dump(doc, open(out, "w"), indent=2)
print(f"LeRobot v3.0, {episodes} episodes x 10 s, {cameras} {codec} cameras {size} at 30 fps; "
      f"batches of 32, {steps} steps, median of {repeat}")
print()
print("| threads | in place (samples/s) | imported (samples/s) | in place / imported |")
print("|---|---|---|---|")
for t, (i, n) in rates.items():
    print(f"| {t} | {i:.1f} | {n:.1f} | {i / n:.2f} |")
print(f"\nbaseline: the ffmpeg CLI decodes one camera at {ffmpeg_fps:.0f} frames/s on one thread "
      f"({ffmpeg_fps / cameras:.0f} samples/s for {cameras} cameras)")
print()
print("| 1,000 episodes: open + first batch | seconds | peak RSS |")
print("|---|---|---|")
print(f"| cold packet-index cache (demuxes 4 mp4s) | {cold_s:.2f} | {cold_kb / 1024:.0f} MiB |")
print(f"| warm packet-index cache | {warm_s:.2f} | {warm_kb / 1024:.0f} MiB |")
print(f"lerobot_bench: wrote {out}", file=sys.stderr)
PY
echo
echo "The LeRobot-style PyAV DataLoader peer on the same episodes (bench/out/lerobot_peer.json; its"
echo "Conveyor rows read the import; the in-place rows are the first table's):"
echo
cat "$work/peer.md"
