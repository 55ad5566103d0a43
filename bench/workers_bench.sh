#!/usr/bin/env bash
# Worker scaling (issue 17 item 2): samples/s of `conveyor batches --threads T` at 1 and 2
# threads, in alternating runs, beside the machine's own scaling for the same decoder: the ffmpeg
# CLI decoding cam0 of the same dataset (`ffmpeg -threads 1 -f null`) as one process, then as two
# processes at once. Two CLI processes are the most two decode workers can gain here (the same
# decoder, the same frames, the cores' shared caches and memory bandwidth, nothing else).
# Workload: synth's default H.264 dataset (3 cameras 224x224 GOP 30), anchored at cam0, one
# frame per camera, batch 32, GOP schedule 2, two epochs (the h264-cam row of schedule_bench.sh).
#
# shellcheck disable=SC2034,SC2154  # rate/cli are read through a nameref; bench_setup sets work, bench_dir
# Usage: bash bench/workers_bench.sh BUILD_DIR [--runs N] [--work DIR]
# Writes bench/out/workers_bench.json and prints a markdown table.
set -euo pipefail
# shellcheck source=bench/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
runs=3
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
bench_setup workers_bench "${args[@]}"
bench_datasets
cat > "$work/h264-cam.yaml" <<'EOF'
anchor: cam0
streams:
  cam0: {delta_timestamps: [0.0]}
  cam1: {}
  cam2: {}
pipeline: {global_batch_size: 32, seed: 0, max_epochs: 2, schedule: {mode: gop}}
EOF
mp4="$work/h264-cam0.mp4"
[[ -s $mp4 ]] || "$cli" extract "$work/h264" --episode 0 --stream cam0 --out "$mp4" > /dev/null
frames=$(ffprobe -v error -count_packets -select_streams v:0 -show_entries stream=nb_read_packets -of csv=p=0 "$mp4")

# The CLI decoding the file `passes` times in each of P processes at once: aggregate frames/s.
cli_fps() {
  local procs=$1 passes=8 t0 t1 pids=()
  t0=$(date +%s.%N)
  for _ in $(seq "$procs"); do
    (for _ in $(seq $passes); do ffmpeg -v error -threads 1 -i "$mp4" -f null -; done) &
    pids+=($!)
  done
  wait "${pids[@]}"
  t1=$(date +%s.%N)
  awk -v f="$frames" -v n="$((procs * passes))" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", n * f / (b - a)}'
}

samples_per_s() {
  "$cli" batches "$work/h264" --config "$work/h264-cam.yaml" --steps 1000000 --threads "$1" --stats 2>&1 > /dev/null |
    tee "$work/stats-$1.txt" | sed -n 's/.* = \([0-9.]*\) samples\/s.*/\1/p'
}

declare -A rate cli
for r in $(seq "$runs"); do
  for t in 1 2; do
    say "workers_bench: run $r, conveyor batches --threads $t"
    rate[$t,$r]=$(samples_per_s "$t")
    say "workers_bench: run $r, ffmpeg x $t processes"
    cli[$t,$r]=$(cli_fps "$t")
  done
done

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
json="$bench_dir/out/workers_bench.json"
: > "$json"
printf '| | 1 | 2 | 2 / 1 |\n|---|---|---|---|\n'
for what in rate cli; do
  declare -n m=$what
  one=() two=()
  for r in $(seq "$runs"); do one+=("${m[1,$r]}"); two+=("${m[2,$r]}"); done
  m1=$(median "${one[@]}")
  m2=$(median "${two[@]}")
  ratio=$(awk -v a="$m1" -v b="$m2" 'BEGIN {printf "%.3f", b / a}')
  label="conveyor batches, samples/s (threads)"
  [[ $what == cli ]] && label="ffmpeg -threads 1 cam0, frames/s (processes at once)"
  printf '| %s | %s (%s) | %s (%s) | **%s** |\n' "$label" "$m1" "${one[*]}" "$m2" "${two[*]}" "$ratio"
  printf '{"bench":"workers","what":"%s","runs_1":[%s],"runs_2":[%s],"median_1":%s,"median_2":%s,"ratio":%s}\n' \
    "$what" "$(IFS=,; echo "${one[*]}")" "$(IFS=,; echo "${two[*]}")" "$m1" "$m2" "$ratio" >> "$json"
  unset -n m
done
say "workers_bench: --stats of the last 2-thread run:"
grep -E "stage seconds|amplification" "$work/stats-2.txt" >&2 || true
