# shellcheck shell=bash disable=SC2034  # the variables bench_setup sets are the sourcing script's
# Shared by bench/schedule_bench.sh and bench/frame_cache_bench.sh (sourced, not run):
#   bench_setup NAME "$@"   parses BUILD_DIR [--threads T] [--work DIR]; sets cli, threads, work,
#                           bench_dir (a temporary work directory is removed at exit)
#   bench_datasets          synth's default H.264 dataset ($work/h264: 8 episodes, 3 cameras
#                           224x224 GOP 30) and LeRobot's encoding ($work/av1: AV1 GOP 2, 2 cameras)
#   bench_ffmpeg_fps DS     the ffmpeg CLI's sequential decode of DS's cam0 (episode 0), frames/s
#   bench_ffmpeg_fps_mp4 F  the same for an mp4 file
#                           on one core (`ffmpeg -threads 1 -f null`, 3 runs): the decode limit
#   say TEXT                progress on stderr

say() { printf '%s\n' "$*" >&2; }

# Paths removed when the bench exits (its temporary work directory, stores under /dev/shm).
bench_cleanup=()
trap 'rm -rf "${bench_cleanup[@]}"' EXIT

bench_setup() {
  local name=$1
  shift
  local usage="usage: bash bench/$name.sh BUILD_DIR [--threads T] [--work DIR]"
  build=$(realpath "${1:?$usage}")
  shift
  threads=2 work=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --threads) threads=$2; shift 2 ;;
      --work) work=$2; shift 2 ;;
      *) echo "$name: unknown flag $1 ($usage)" >&2; exit 2 ;;
    esac
  done
  cli="$build/tools/conveyor"
  [[ -x "$cli" ]] || { echo "$name: $cli not found" >&2; exit 1; }
  bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  mkdir -p "$bench_dir/out"
  if [[ -z "$work" ]]; then
    work=$(mktemp -d)
    bench_cleanup+=("$work")
  fi
  mkdir -p "$work"
}

bench_datasets() {
  [[ -d $work/h264 ]] || "$cli" synth --out "$work/h264" --episodes 8 --seed 0 --quiet
  [[ -d $work/av1 ]] || "$cli" synth --out "$work/av1" --episodes 6 --cameras 2 --size 224x224 \
    --video-codec av1 --gop 2 --audio-codec none --seed 1 --quiet
}

bench_ffmpeg_fps() {
  local mp4="$work/$(basename "$1")-cam0.mp4"
  [[ -s $mp4 ]] || "$cli" extract "$1" --episode 0 --stream cam0 --out "$mp4" > /dev/null
  bench_ffmpeg_fps_mp4 "$mp4"
}

# The same for an mp4 file (a LeRobot directory's video).
bench_ffmpeg_fps_mp4() {
  local mp4=$1 frames t0 t1
  frames=$(ffprobe -v error -count_packets -select_streams v:0 -show_entries stream=nb_read_packets -of csv=p=0 "$mp4")
  t0=$(date +%s.%N)
  for _ in 1 2 3; do ffmpeg -v error -threads 1 -i "$mp4" -f null -; done
  t1=$(date +%s.%N)
  awk -v f="$frames" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", 3 * f / (b - a)}'
}
